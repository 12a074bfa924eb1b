"""What the result store (:mod:`verispec.bench.store`) holds: a run's identity (:class:`RunKey`, whose
``run_id`` is a short hash of its canonical JSON) and one graded sample (:class:`SampleRecord`: the output,
the grade and the engine's statistics of its generation)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

#: a run's part in a comparison
ROLES = ("method", "baseline", "target_only", "lossless_ref")
RUN_ID_LEN = 16  # hex chars of sha256 (64 bits): collisions are not a practical concern


@dataclass(frozen=True)
class RunKey:
    """Identity of one run of the grid.  ``run_id`` is a short sha256 of :meth:`canonical_json`."""

    dataset: str
    rule: str
    sampling: str
    gamma: int
    draft: str
    target: str
    max_new_tokens: int
    seed: int
    role: str = "method"  # "method" | "baseline" | "target_only" | "lossless_ref"
    tree: str = ""        # draft tree shape (TreeShape.text()); "" = a chain of gamma tokens
    gamma_policy: str = ""  # "auto": γ chosen per step by the cost model, up to ``gamma``; "" = fixed γ

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        for name in ("gamma", "max_new_tokens", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"RunKey.{name} must be int, got {type(v).__name__}")
        for name in ("dataset", "rule", "sampling", "draft", "target", "tree", "gamma_policy"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"RunKey.{name} must be str")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for name in ("tree", "gamma_policy"):
            if not d[name]:
                del d[name]   # fixed-γ chains keep the run ids they had before these fields existed
        return d

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace, UTF-8 kept: the exact bytes that are hashed."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def run_id(self) -> str:
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()[:RUN_ID_LEN]

    @property
    def family(self) -> str:
        """Rule family: the rule name before the first ':' (``"cascade:0.5"`` -> ``"cascade"``)."""
        return self.rule.split(":", 1)[0]

    @classmethod
    def from_dict(cls, d: dict) -> "RunKey":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_json(cls, s: str) -> "RunKey":
        return cls.from_dict(json.loads(s))


#: ``Stats.to_dict()`` fields that the sample table also keeps as columns
STAT_COLUMNS = ("new_tokens", "target_calls", "draft_calls", "accepted_hist", "wall_s", "draft_s", "verify_s",
                 "other_s")


@dataclass
class SampleRecord:
    """One generated sample of one problem in one run.

    ``stats`` is the engine's ``Stats.to_dict()``; build a record from it with :meth:`from_stats`,
    which fills the numeric columns from it.  ``meta`` holds what the bench adds (checker detail,
    ``correct_flexible``, seed, difficulty).
    """

    run_id: str
    problem_id: str
    sample_idx: int
    output: str
    extracted: str | None
    correct: bool
    new_tokens: int
    target_calls: int
    draft_calls: int
    accepted_hist: list[int]  # index = number of draft tokens accepted in a step, value = count
    wall_s: float
    draft_s: float
    verify_s: float
    other_s: float
    meta: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)

    @classmethod
    def from_stats(cls, run_id: str, problem_id: str, sample_idx: int, *, output: str, extracted: str | None,
                   correct: bool, stats: dict, meta: dict | None = None) -> "SampleRecord":
        """A record whose numeric columns come from ``stats`` (an engine ``Stats.to_dict()``)."""
        missing = [k for k in STAT_COLUMNS if k not in stats]
        if missing:
            raise ValueError(f"stats lacks {missing}: pass the engine's Stats.to_dict()")
        return cls(
            run_id=run_id, problem_id=problem_id, sample_idx=sample_idx, output=output, extracted=extracted,
            correct=bool(correct), new_tokens=int(stats["new_tokens"]), target_calls=int(stats["target_calls"]),
            draft_calls=int(stats["draft_calls"]), accepted_hist=[int(v) for v in stats["accepted_hist"]],
            wall_s=float(stats["wall_s"]), draft_s=float(stats["draft_s"]), verify_s=float(stats["verify_s"]),
            other_s=float(stats["other_s"]), meta=dict(meta or {}), stats=dict(stats),
        )

    @property
    def key(self) -> tuple[str, int]:
        return (self.problem_id, self.sample_idx)

    def _stat(self, name: str) -> Any:
        # records built by hand (tests, other tools) may carry engine fields in meta only
        return self.stats[name] if name in self.stats else self.meta.get(name)

    @property
    def stop_reason(self) -> str:
        """``"eos"``, ``"stop"`` or ``"length"`` (the token budget ran out); ``""`` when unknown."""
        return str(self._stat("stop_reason") or "")

    @property
    def truncated(self) -> bool:
        return self.stop_reason == "length"

    @property
    def cost_model_speedup(self) -> Any:
        return self._stat("cost_model_speedup")

    @property
    def correct_flexible(self) -> bool | None:
        """The checker's lenient verdict (e.g. GSM8K flexible extraction); None when it gives none."""
        v = self.meta.get("correct_flexible")
        return None if v is None else bool(v)
