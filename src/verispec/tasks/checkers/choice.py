"""Multiple-choice letters.

choice
    strict (``correct``): a letter A-J the response states -- ``\\boxed{X}``, "Answer: X",
    "the answer is (X)", "option X is correct" (last occurrence; the prompt asks for
    "Answer: X").  flexible (``correct_flexible``): the stated letter, else, for a response that
    ended on its own, the last "(X)" or a lone letter at the very end.  A response cut off by the
    token limit without a stated letter is wrong under both ("truncated before a final answer").
"""

from __future__ import annotations

import re

from .base import TRUNCATED_NO_ANSWER, CheckResult

_STATED_PATTERNS = [
    re.compile(r"\\boxed\s*\{\s*(?:\\text\{)?\(?([A-J])\)?\}?\s*\}"),
    # Possessive up to the letter: no quantifier before it can give back a character that would
    # let a capital A-J match (an "IS" given back leaves "I" before a word character); backtracking
    # only made "answer" followed by a run of spaces cost quadratic time or worse.
    re.compile(r"(?i:answer)\s*+(?i:is|:|：)?+\s*+(?i:option\s*+)?+[\(\[]?+\*{0,2}+([A-J])\b"),
    re.compile(r"(?i:option|choice)\s+\(?([A-J])\)?\b(?i:\s+is\s+(?:correct|right))"),
]
_LOOSE_PATTERN = re.compile(r"\(([A-J])\)")
_TRAILING_LETTER = re.compile(r"(?:^|\s|\*)([A-J])[.)\*]*\s*$")


def _stated_choice(text: str, letters: str) -> str | None:
    for pat in _STATED_PATTERNS:
        hits = [m.group(1).upper() for m in pat.finditer(text) if m.group(1).upper() in letters]
        if hits:
            return hits[-1]
    return None


def _loose_choice(text: str, letters: str) -> str | None:
    hits = [m.group(1) for m in _LOOSE_PATTERN.finditer(text) if m.group(1) in letters]
    if hits:
        return hits[-1]
    m = _TRAILING_LETTER.search(text.strip())
    return m.group(1) if m and m.group(1) in letters else None


def extract_choice(text: str, n_options: int = 4) -> str | None:
    """The stated letter, else the loose one (last "(X)" / a lone letter at the end), else None."""
    letters = "ABCDEFGHIJ"[:n_options]
    return _stated_choice(text, letters) or _loose_choice(text, letters)


def grade(problem, completion: str, timeout_s: float = 10.0, *, truncated: bool = False) -> CheckResult:
    n = len(problem.meta.get("options", [])) or 4
    letters = "ABCDEFGHIJ"[:n]
    gold = str(problem.answer).strip().upper()
    stated = _stated_choice(completion, letters)
    if stated is not None:
        ok = stated == gold
        return CheckResult(ok, stated, f"stated {stated} {'==' if ok else '!='} gold {gold}", correct_flexible=ok)
    if truncated:
        return CheckResult(False, None, TRUNCATED_NO_ANSWER, correct_flexible=False)
    loose = _loose_choice(completion, letters)
    if loose is None:
        return CheckResult(False, None, "no answer letter found", correct_flexible=False)
    ok = loose == gold
    return CheckResult(False, loose, f"strict: no stated letter; flexible: {loose} {'==' if ok else '!='} gold {gold}",
                       correct_flexible=ok)
