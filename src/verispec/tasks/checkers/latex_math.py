"""MATH-style answers (MATH-500, AIME, custom math), compared with math-verify.

What counts as the answer
    strict (``CheckResult.correct``, the primary score) credits only an answer the response
    *states*; the math prompt asks for it "within \\boxed{}" (``tasks/prompts.py``):

    1. the last *complete* ``\\boxed{...}`` -- the MATH convention (Hendrycks'
       ``last_boxed_only_string``, Qwen2.5-Math's evaluation).  It alone is parsed, as
       ``parse("\\boxed{...}")``: math-verify run on a whole response with several boxes joins
       them into a set, so "\\boxed{2} ... no, \\boxed{3}" would match neither 2 nor 3.  A box
       left open by the token limit is not an answer; an earlier complete one still is.
    2. else an explicit final-answer phrase -- "final answer", "the answer is", "answer:" (its
       last occurrence) -- and what math-verify's *anchored* extraction finds from there on:
       ``parse(text[cue:], [LatexExtractionConfig(try_extract_without_anchor=False),
       ExprExtractionConfig(try_extract_without_anchor=False)])`` (math-verify 0.9: anchors
       "final answer ... is" at priority 0/50, "answer:" 100, "answer ..." 200).

    Nothing else is an answer: not the last expression of a derivation, not a restated
    question.  This holds whether or not the response was cut off by the token limit
    (``truncated=True``): a truncated response is credited only for an answer it had stated.
flexible (``CheckResult.correct_flexible``)
    The strict verdict when an answer is stated; otherwise, for a response that ended on its
    own, math-verify's default extraction (``parse(text)``: anchors, then the last LaTeX
    environment or plain expression/number, priority 300).  A truncated response without a
    stated answer is wrong under both scores ("truncated before a final answer") -- its last
    expression is wherever the computation stopped (``... = (322 - 60) + 3 =``).

Comparison
    ``verify(parse("$" + gold + "$"), answer)``, gold first (math-verify's order: units,
    ``x = 5`` vs ``5``, ``0.5`` vs ``\\frac{1}{2}``, sets and intervals).  Two integers (AIME)
    are compared directly.  math-verify's timeouts use ``signal.alarm``, which works only in
    the main thread: there they are passed through (whole seconds); in any other thread the
    check runs in a fresh helper process (whose main thread it is), killed if it has not answered
    within ``timeout_s`` plus 60 s for the process start and the sympy import.  Without
    ``math-verify`` installed, a normalised string comparison of the boxed answer is used and
    ``detail`` says so.
"""

from __future__ import annotations

import math
import multiprocessing
import re
import signal
import threading

from .base import TRUNCATED_NO_ANSWER, CheckResult, _strip_latex, last_boxed

# An explicit final-answer phrase (its last occurrence starts the anchored extraction).
_CUE_RE = re.compile(r"final\s+answer|the\s+answer\s+is|answer\s*[:：]", re.IGNORECASE)


def _stated_source(text: str) -> tuple[str | None, str | None, str]:
    """``(string to parse, boxed content or None, how)``; how in boxed / answer-phrase / none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return "\\boxed{" + boxed + "}", boxed, "boxed"
    cues = list(_CUE_RE.finditer(text))
    if cues:
        return text[cues[-1].start():], None, "answer-phrase"
    return None, None, "none"


def _verify(gold: str, source: str | None, flexible_text: str | None, timeout: int | None):
    """math-verify in this process: ``(strict ok, strict shown, flexible ok or None, flexible shown)``.

    ``source`` is the stated answer (parsed with anchored extraction), ``flexible_text`` the whole
    response for the unanchored fallback (None: no fallback).
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    g = parse("$" + gold + "$", parsing_timeout=timeout)
    ok, shown = False, None
    if source is not None:
        anchored = [LatexExtractionConfig(try_extract_without_anchor=False),
                    ExprExtractionConfig(try_extract_without_anchor=False)]
        p = parse(source, extraction_config=anchored, parsing_timeout=timeout)
        ok = bool(verify(g, p, timeout_seconds=timeout)) if g and p else False
        shown = _shown(p)
    fok, fshown = None, None
    if flexible_text is not None:
        p = parse(flexible_text, parsing_timeout=timeout)
        fok = bool(verify(g, p, timeout_seconds=timeout)) if g and p else False
        fshown = _shown(p)
    return ok, shown, fok, fshown


def _shown(parsed: list) -> str | None:
    if not parsed:
        return None
    return str(parsed[-1]) if isinstance(parsed[-1], str) else str(parsed[0])


def _verify_child(conn, args) -> None:  # pragma: no cover - runs in a helper process
    try:
        conn.send(("ok", _verify(*args)))
    except BaseException as e:
        conn.send(("err", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _verify_in_process(args: tuple, timeout_s: float):
    """Run :func:`_verify` in a fresh process (its main thread, so math-verify's alarms work).

    Only for callers off the main thread (the bench grades in its main thread); costs a process
    start and a math-verify import per call.  Returns None on timeout.
    """
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_verify_child, args=(child, args), daemon=True, name="verispec-math-verify")
    proc.start()
    child.close()
    try:
        # generous start-up allowance: spawning and importing sympy take seconds on a busy machine
        if not parent.poll(timeout_s + 60.0):
            return None
        status, payload = parent.recv()
    except EOFError:
        raise RuntimeError("math-verify helper process died") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        parent.close()
    if status != "ok":
        raise RuntimeError(payload)
    return payload


def _norm_answer(s: str) -> str:
    s = _strip_latex(s)
    s = re.sub(r"\\(?:displaystyle|,|;|!|quad)", "", s)
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    return re.sub(r"\s+", "", s).rstrip(".").lower()


#: Longest integer (in digits) compared directly; a longer one goes to math-verify like any other
#: answer (Python refuses to convert one of over 4,300 digits; gold answers have a handful).
MAX_DIRECT_INT_DIGITS = 1000


def _int_or_none(s: str | None) -> int | None:
    if s is None:
        return None
    t = _norm_answer(s)
    m = re.fullmatch(r"\(?([-+]?\d+)\)?", t)  # AoPS writes AIME answers as \textbf{(073)}
    if m is None or len(m.group(1)) > MAX_DIRECT_INT_DIGITS:
        return None
    return int(m.group(1))


def grade(problem, completion: str, timeout_s: float = 10.0, *, truncated: bool = False) -> CheckResult:
    gold = str(problem.answer).strip()
    source, boxed, how = _stated_source(completion)
    fallback_text = completion if (source is None and not truncated) else None
    no_answer = TRUNCATED_NO_ANSWER if truncated else "no stated answer (\\boxed{} / 'final answer')"

    gi, bi = _int_or_none(gold), _int_or_none(boxed)
    if gi is not None and bi is not None:  # AIME: two integers, no sympy needed
        ok = gi == bi
        return CheckResult(ok, boxed, f"strict: boxed integer {bi} {'==' if ok else '!='} gold {gi}; flexible: same",
                           correct_flexible=ok)
    try:
        import math_verify  # noqa: F401
    except ImportError:
        if boxed is None:
            return CheckResult(False, None, f"{no_answer} (math-verify not installed: only \\boxed{{}} is read)",
                               correct_flexible=False)
        ok = _norm_answer(boxed) == _norm_answer(gold)
        return CheckResult(ok, boxed, "string comparison of the boxed answer (math-verify not installed)",
                           correct_flexible=ok)
    if source is None and fallback_text is None:
        return CheckResult(False, None, f"strict: {no_answer}; flexible: {no_answer}", correct_flexible=False)

    args = (gold, source, fallback_text, max(1, int(math.ceil(timeout_s))))
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM"):
        res = _verify(*args)
    else:
        try:
            res = _verify_in_process(args, timeout_s)
        except Exception as e:
            return CheckResult(False, boxed, f"math-verify helper error: {e}", correct_flexible=False)
        if res is None:
            return CheckResult(False, boxed, f"math-verify timed out after {timeout_s:g}s", correct_flexible=False)
    ok, shown, fok, fshown = res
    verdict = lambda good: "equivalent" if good else "not equivalent"  # noqa: E731
    if source is not None:
        extracted = boxed if boxed is not None else shown
        if extracted is None:
            return CheckResult(False, None, f"strict: {how} found but math-verify extracted nothing from it; "
                               "flexible: same", correct_flexible=False)
        return CheckResult(ok, extracted, f"strict: {how} {extracted!r} {verdict(ok)} to gold {gold!r}; flexible: same",
                           correct_flexible=ok)
    # no stated answer, response ended on its own: only the flexible score can credit it
    fdetail = ("nothing extracted" if fshown is None
               else f"last expression {fshown!r} {verdict(bool(fok))} to gold {gold!r}")
    return CheckResult(False, fshown, f"strict: {no_answer}; flexible: {fdetail}", correct_flexible=bool(fok))
