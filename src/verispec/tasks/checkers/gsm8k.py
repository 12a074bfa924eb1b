"""GSM8K-style numeric answers: a strict and a flexible score, after lm-evaluation-harness.

The two scores follow the two filters of lm-eval's GSM8K tasks (``lm_eval/tasks/gsm8k/gsm8k.yaml``
and ``gsm8k-cot-zeroshot.yaml``, EleutherAI/lm-evaluation-harness, task version 3.0):

strict (``CheckResult.correct``, the primary score)
    Credits only an answer the response *states*.  lm-eval's ``strict-match`` takes the number
    right after ``#### `` (regex ``#### (\\-?[0-9\\.\\,]+)``) or after ``The answer is ``
    (``The answer is (\\-?[0-9\\.\\,]+).``); our zero-shot prompt asks for "The answer is N." and
    allows ``\\boxed{N}``, so a stated answer is, last occurrence first: a complete ``\\boxed{}``
    holding a number (after its last ``=``, so ``\\boxed{x = 5}`` is 5), else the number right
    after "the answer is" / "final answer (is|:)" / "answer:" / "####" (``$``, ``**``, ``\\(``
    may sit in between; "The answer is: she makes 9 * 2 = 18" states nothing).  Deviation: we
    take the *last* stated answer, lm-eval the first -- its few-shot generations stop at the next
    "Question:", ours run on, and a model that corrects itself states its final answer last.
flexible (``CheckResult.correct_flexible``)
    lm-eval's ``flexible-extract``: the last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)`` in the
    whole response, with ``,`` ``$`` and a trailing ``.`` dropped -- but only for a response that
    ended on its own.  A response cut off by the token limit (``truncated=True``) whose last
    number is wherever the computation stopped gets it only through a stated answer: then the
    flexible verdict is the strict one, else it is wrong ("truncated before a final answer").

Comparison: numeric, not lm-eval's string match -- exact when the gold is an integer (``18.00``
matches ``18``), else within 1e-6; ``\\frac{a}{b}`` and ``a/b`` are evaluated, thousands
separators dropped.  The gold is the number after ``####`` in the dataset's solution.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from .base import TRUNCATED_NO_ANSWER, CheckResult, _strip_latex, last_boxed

# A number as written in a stated answer: thousands separators, decimals, a fraction a/b.
_NUMBER_RE = re.compile(
    r"(?<![\w.])[-\u2212]?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|(?<![\w.])[-\u2212]?\.\d+"
)
# The cue of a stated answer and the number right after it (only markup in between).
# Every quantifier before the number is possessive: the number can start only where the markup
# run ends (no markup character starts a number), so giving characters back never finds a match;
# it only made a cue followed by a run of spaces cost cubic time (three quantifiers sharing them).
_STATED_RE = re.compile(
    r"(?:the\s++(?:final\s++)?+answer\s++is|final\s++answer\s*+(?:is)?+\s*+[:：]?+|answer\s*+[:：]|####)"
    r"(?:\s|[:：*$]|\\\(|\\\[|\\\$)*+"
    r"(?P<num>(?>[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-\u2212]?\.\d+))"
    # ... that does not start an expression ("The answer is 9 * 2 = 18" states no number).
    r"(?!\s*+(?:[-+/×÷=^]|\*(?!\*)|\\times|\\cdot))",
    re.IGNORECASE,
)
# lm-eval flexible-extract, verbatim.
_FLEX_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def _to_number(s: str) -> float | None:
    s = s.replace("\u2212", "-").replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        if "/" in s:
            a, b = s.split("/", 1)
            return float(Fraction(a.strip("()")) / Fraction(b.strip("()")))
        return float(s)
    except (ValueError, ZeroDivisionError, OverflowError):  # OverflowError: a fraction beyond floats
        return None


def _fmt(x: float) -> str:
    if math.isfinite(x) and float(x).is_integer():
        return str(int(x))
    return repr(x)


def stated_gsm8k_answer(text: str) -> tuple[str | None, str]:
    """The answer ``text`` states: ``(number as written, how)``, ``how`` in boxed / answer-is / none."""
    boxed = last_boxed(text)
    if boxed is not None:
        rhs = _strip_latex(boxed).rsplit("=", 1)[-1]
        m = _NUMBER_RE.search(rhs)
        if m:
            return m.group(0).strip(), "boxed"
    hits = list(_STATED_RE.finditer(text))
    if hits:
        return hits[-1].group("num").strip(), "answer-is"
    return None, "none"


def flexible_gsm8k_answer(text: str) -> str | None:
    """lm-eval's flexible-extract: the last number-like run of the whole text (``,`` ``$`` kept)."""
    hits = _FLEX_RE.findall(text)
    if not hits:
        return None
    a, b = hits[-1]
    return a or b


def extract_gsm8k_answer(text: str) -> tuple[str | None, str]:
    """``(number as text, how)``: the stated answer, else the flexible last number (``last-number``)."""
    raw, how = stated_gsm8k_answer(text)
    if raw is not None:
        return raw, how
    flex = flexible_gsm8k_answer(text)
    return (flex, "last-number") if flex is not None else (None, "none")


def _same(value: float, gold: float) -> bool:
    return value == gold if gold.is_integer() else math.isclose(value, gold, rel_tol=1e-9, abs_tol=1e-6)


def grade(problem, completion: str, timeout_s: float = 10.0, *, truncated: bool = False) -> CheckResult:
    gold = _to_number(str(problem.answer))
    if gold is None:
        return CheckResult(False, None,
                           f"gold answer {problem.answer!r} is not a number; fix the dataset's answer field")
    raw, how = stated_gsm8k_answer(completion)
    stated = _to_number(raw) if raw is not None else None
    strict = stated is not None and _same(stated, gold)
    if stated is not None:
        strict_why = f"{how}: {_fmt(stated)} {'==' if strict else '!='} gold {_fmt(gold)}"
    else:
        strict_why = TRUNCATED_NO_ANSWER if truncated else "no stated answer (boxed / 'The answer is N' / '#### N')"

    if truncated and stated is None:
        flexible, flex_why, flex_raw = False, TRUNCATED_NO_ANSWER, None
    elif truncated:
        flexible, flex_why, flex_raw = strict, "truncated: the stated answer", raw
    else:
        flex_raw = flexible_gsm8k_answer(completion)
        value = _to_number(flex_raw) if flex_raw is not None else None
        flexible = value is not None and _same(value, gold)
        flex_why = "no number" if flex_raw is None else f"last number {flex_raw!r} {'==' if flexible else '!='} gold"
    extracted = _fmt(stated) if stated is not None else (flex_raw if not truncated else None)
    return CheckResult(strict, extracted, f"strict: {strict_why}; flexible: {flex_why}", correct_flexible=flexible)
