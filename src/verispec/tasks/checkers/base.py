"""What every checker returns, and the ``\\boxed{}`` / LaTeX helpers shared by the math checkers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass
class CheckResult:
    """A verdict.  ``correct`` is the primary (strict) score; ``correct_flexible`` is the lenient
    score where a checker family defines one (e.g. GSM8K's flexible extraction), else ``None``."""

    correct: bool
    extracted: str | None
    detail: str
    correct_flexible: bool | None = None


#: ``detail`` for a response cut off by the token limit before it stated its answer: never credited.
TRUNCATED_NO_ANSWER = "truncated before a final answer"


_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_BARE_ANSWER_RE = re.compile(r"[^\s$\\]+")
_ESCAPED_RE = re.compile(r"\\.", re.DOTALL)  # a backslash and the character it escapes
_BRACE_RE = re.compile(r"[{}]")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), or ``\\boxed 5``.

    An unbalanced box (a truncated output) is skipped for an earlier one.  Linear in ``len(text)``:
    every box's closing brace comes from one pass over the text (:func:`_closing_braces`), not
    from a scan per box (quadratic on a text of unclosed ``\\boxed{``).
    """
    matches = list(_BOXED_RE.finditer(text))
    opens = [m.end() for m in matches if text.startswith("{", m.end())]
    closing = _closing_braces(text, opens) if opens else {}
    for m in reversed(matches):
        i = m.end()
        if text.startswith("{", i):
            j = closing.get(i)
            if j is not None:
                return text[i + 1 : j].strip()
            continue  # unbalanced (truncated output): try an earlier one
        m2 = _BARE_ANSWER_RE.match(text, i)
        if m2:
            return m2.group(0).strip()
    return None


def _closing_braces(text: str, opens: list[int]) -> dict[int, int]:
    """``{position of "{": position of its closing "}"}`` for the braces at ``opens`` (ascending)
    that close.

    A backslash escapes the next character, as in a scan from any box's ``{``: every such scan
    passes through the same positions as this one (a box's ``{`` follows ``boxed``/``fbox`` or a
    space, never a backslash, so no scan can skip it), hence one pass serves them all.
    """
    wanted = set(opens)
    plain = _ESCAPED_RE.sub("\0\0", text)  # escaped pairs as two NULs: same positions, no braces
    closing: dict[int, int] = {}
    stack: list[int] = []
    for brace in _BRACE_RE.finditer(plain, opens[0]):
        j = brace.start()
        if plain[j] == "{":
            stack.append(j)
        elif stack:
            i = stack.pop()
            if i in wanted:
                closing[i] = j
    return closing


def _strip_latex(s: str) -> str:
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox|textnormal|operatorname)\s*\{([^{}]*)\}", r" \1 ", s)
    s = s.replace("\\$", "").replace("\\%", "").replace("\\!", "").replace("\\,", "").replace("\\;", "")
    s = s.replace("\\left", "").replace("\\right", "").replace("$", "")
    s = re.sub(r"\\[dt]?frac\s*\{\s*(-?[\d.]+)\s*\}\s*\{\s*([\d.]+)\s*\}", r"\1/\2", s)
    s = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", s)
    return s
