"""Answer checkers: did a completion solve a :class:`~verispec.tasks.datasets.Problem`?

``check(problem, completion, truncated=...)`` looks ``problem.checker`` up in :data:`CHECKERS`
and returns ``CheckResult(correct, extracted, detail, correct_flexible)``; ``extracted`` is what
was taken from the completion (the number, the boxed answer, the code, the parsed calls, the
letter), ``detail`` says why.  A checker never raises for anything in the completion.

Two scores.  ``correct`` (strict, the primary score) credits only an answer the response
*states* in the form its prompt asks for: ``\\boxed{}`` or "The answer is N" (GSM8K, after
lm-eval's strict-match), a stated ``\\boxed{}`` / final-answer phrase checked with math-verify
(MATH, AIME), the calls alone decoded and matched like the official BFCL AST checker.
``correct_flexible`` (where a family defines one) also takes an unstated answer -- the last
number (lm-eval's flexible-extract), math-verify's last expression, calls amid prose -- but only
from a response that ended on its own.  A response cut off by the token limit
(``truncated=True``) is credited under either score only for an answer it had already stated;
every family documents its rules in its module docstring.

One module per checker family, each with its own documentation of what it extracts and how it
compares: :mod:`.gsm8k`, :mod:`.latex_math` (MATH-500, AIME), :mod:`.coding` (HumanEval,
HumanEval+, MBPP+; run only in the sandbox), :mod:`.bfcl`, :mod:`.choice`, :mod:`.speed` (speed-only
datasets: never graded).  Each exposes
``grade(problem, completion, timeout_s, *, truncated) -> CheckResult``.
"""

from __future__ import annotations

from collections.abc import Callable

from . import bfcl, choice, coding, gsm8k, latex_math, speed
from .base import TRUNCATED_NO_ANSWER, CheckResult, last_boxed
from .bfcl import ast_checker, bfcl_match, decode_calls, find_calls
from .choice import extract_choice
from .coding import build_code_program, extract_code
from .gsm8k import extract_gsm8k_answer

__all__ = [
    "CHECKERS",
    "CheckResult",
    "TRUNCATED_NO_ANSWER",
    "check",
    "grader_stamp",
    "same_grader",
    "last_boxed",
    "extract_gsm8k_answer",
    "extract_code",
    "extract_choice",
    "decode_calls",
    "find_calls",
    "bfcl_match",
    "ast_checker",
    "build_code_program",
]

Grader = Callable[..., CheckResult]

#: checker name (``Problem.checker``, ``--checker``) -> its ``grade(problem, completion, timeout_s)``.
CHECKERS: dict[str, Grader] = {
    "gsm8k": gsm8k.grade,
    "math": latex_math.grade,
    "code": coding.grade,
    "bfcl": bfcl.grade,
    "choice": choice.grade,
    "speed": speed.grade,
}


def grader_stamp(problem, timeout_s: float) -> dict:
    """What a stored verdict of ``problem`` was decided by, for a sample's meta: code runs the completion, so a
    later grading by the same grader version at the same limit reuses the stored verdict (``regrade``) instead
    of running the program again (a run must learn nothing across gradings); {} for the other checkers."""
    if problem.checker != "code":
        return {}
    return {"grader": coding.GRADER_VERSION, "grader_timeout_s": float(timeout_s)}


def same_grader(problem, meta: dict, timeout_s: float) -> bool:
    """Whether the verdict stored with ``meta`` was decided by today's code grader at ``timeout_s``."""
    stamp = grader_stamp(problem, timeout_s)
    return bool(stamp) and all(meta.get(k) == v for k, v in stamp.items())


def check(problem, completion: str, *, timeout_s: float = 10.0, truncated: bool = False) -> CheckResult:
    """Grade ``completion`` for ``problem`` with the checker its ``checker`` field names.

    ``truncated``: the generation stopped at the token limit (``stop_reason == "length"``), so the
    response never ended on its own; checkers credit only an answer it had already stated.
    """
    if not isinstance(completion, str):
        completion = "" if completion is None else str(completion)
    grade = CHECKERS.get(problem.checker)
    if grade is None:
        return CheckResult(False, None, f"unknown checker {problem.checker!r}; known: {', '.join(CHECKERS)}")
    try:
        return grade(problem, completion, timeout_s, truncated=truncated)
    except Exception as e:  # a checker bug must not take a run down
        return CheckResult(False, None, f"checker error: {type(e).__name__}: {e}")
