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
