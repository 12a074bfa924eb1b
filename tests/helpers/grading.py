"""Problems of the offline datasets for grading tests, and the completions several of them share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from verispec.tasks.datasets import Problem, load_dataset

DATA = Path(os.environ.get("VERISPEC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"benchmark data not found at {DATA}")
_CACHE: dict[str, dict[str, Problem]] = {}


def problem(dataset: str, pid: str) -> Problem:
    if dataset not in _CACHE:
        _CACHE[dataset] = {p.id: p for p in load_dataset(dataset, data_dir=DATA).problems}
    return _CACHE[dataset][pid]


def fenced(src: str) -> str:
    return "```python\n" + src.strip("\n") + "\n```"


HE0 = [("humaneval", "HumanEval/0"), ("humaneval_plus", "HumanEval/0")]
CORRECT_HE0 = """
def has_close_elements(numbers, threshold):
    s = sorted(numbers)
    return any(b - a < threshold for a, b in zip(s, s[1:]))
"""
