"""Speed-only datasets (Spec-Bench): the output is timed and its tokens counted, never graded.

Every verdict is :data:`NOT_GRADED`; the bench report shows such runs' accuracy as "speed only" and compares
them on speed alone (:func:`verispec.bench.rows.is_speed_only`).
"""

from __future__ import annotations

from .base import CheckResult

#: ``detail`` of every verdict of this checker: how stored samples of speed-only runs are recognised.
NOT_GRADED = "speed only: not graded"


def grade(problem, completion: str, timeout_s: float = 10.0, *, truncated: bool = False) -> CheckResult:
    return CheckResult(False, None, NOT_GRADED)
