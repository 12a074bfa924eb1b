"""Typed, validated rule parameters: one declaration per parameter, one error wording for all rules."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Param:
    """A rule parameter: its name, type, default (``None`` = required), valid range and meaning."""

    name: str
    kind: type
    valid: Callable[[object], bool]
    valid_text: str
    help: str
    default: object = None

    def convert(self, rule: str, raw: object) -> object:
        try:
            value = self.kind(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{rule}: parameter {self.name}={raw!r} is not a valid {self.kind.__name__}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{rule}: parameter {self.name} must be finite, got {raw!r}")
        if not self.valid(value):
            raise ValueError(f"{rule}: parameter {self.name}={raw!r} is out of range; expected {self.valid_text}")
        return value


def in_range(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Callable[[object], bool]:
    def check(v: object) -> bool:
        x = float(v)  # type: ignore[arg-type]
        return (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)

    return check


def one_of(*choices: str) -> Callable[[object], bool]:
    return lambda v: v in choices
