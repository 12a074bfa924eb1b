"""Per-generation statistics: calls, acceptance, timings and the cost-model speedup."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class CallCosts:
    """Measured seconds per model call on this hardware (medians).

    ``draft_token``: one draft forward of one token; ``target_token``: one target forward of one
    token (a plain decoding step); ``target_block``: one target forward of ``gamma + 1`` tokens.
    """

    gamma: int
    draft_token: float
    target_token: float
    target_block: float

    @property
    def c(self) -> float:
        """Draft-to-target cost ratio per token."""
        return self.draft_token / self.target_token

    @property
    def v(self) -> float:
        """Cost of verifying γ+1 tokens relative to one target decoding step, v(γ)."""
        return self.target_block / self.target_token

    def speedup(self, block_efficiency: float) -> float:
        """Cost-model speedup ``BE / (γ·c + v(γ))`` over target-only decoding."""
        return block_efficiency / (self.gamma * self.c + self.v)


@dataclass
class Stats:
    """What one generation did. Times in seconds."""

    mode: str                       # "sd" or "target_only"
    rule: str                       # rule spec ("" for target-only)
    gamma: int                      # 0 for target-only
    new_tokens: int = 0
    target_calls: int = 0           # target forwards after the prefill (verifications or decode steps)
    draft_calls: int = 0            # draft forwards after the prefill
    accepted_hist: list[int] = field(default_factory=list)   # index n: steps that accepted n drafts
    position_reached: list[int] = field(default_factory=list)   # steps whose draft position i was verified
    position_accepted: list[int] = field(default_factory=list)  # ... and accepted
    prefill_s: float = 0.0
    draft_s: float = 0.0            # draft model forwards
    verify_s: float = 0.0           # target model forwards (verification / decoding)
    rule_s: float = 0.0             # sampling pipelines (draft and target), draft sampling, rule.verify
    wall_s: float = 0.0             # whole generation after the prefill
    stop_reason: str = ""           # "eos", "stop", "length"
    cost_model_speedup: float | None = None
    gamma_policy: str = ""          # "fixed" or "auto" for SD, "+stop" with draft_stop="auto" ("": target-only)
    gamma_hist: list[int] = field(default_factory=list)  # index g: steps that drafted g tokens (0: plain)
    tree: str = ""                  # tree spec ("" for chains); accepted_hist then counts path lengths
    tree_nodes: int = 0             # draft nodes verified, over all target calls
    lookup_steps: int = 0           # steps drafted by prompt lookup (n-gram) instead of the draft model
    lookup_accepted: int = 0        # draft tokens those steps had accepted

    @property
    def nodes_per_call(self) -> float:
        """Draft nodes (tokens) per verification: γ for a chain."""
        steps = sum(self.accepted_hist)
        return self.tree_nodes / steps if steps else 0.0

    @property
    def other_s(self) -> float:
        """Time outside model forwards (sampling pipelines, rules, bookkeeping, detokenisation)."""
        return max(self.wall_s - self.draft_s - self.verify_s, 0.0)

    @property
    def block_efficiency(self) -> float:
        """Emitted tokens per target call, bonus tokens included."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / r if r else float("nan") for a, r in zip(self.position_accepted, self.position_reached)]

    @property
    def mean_accepted(self) -> float:
        steps = sum(self.accepted_hist)
        return sum(n * c for n, c in enumerate(self.accepted_hist)) / steps if steps else 0.0

    def timing(self, name: str) -> "_Timer":
        """``with stats.timing("verify_s"): ...`` adds the block's wall seconds to that field."""
        return _Timer(self, name)

    @property
    def mean_gamma(self) -> float:
        """Mean draft tokens per step (plain target steps count as 0)."""
        steps = sum(self.gamma_hist)
        return sum(g * k for g, k in enumerate(self.gamma_hist)) / steps if steps else 0.0

    def record_gamma(self, g: int) -> None:
        while len(self.gamma_hist) <= g:
            self.gamma_hist.append(0)
        self.gamma_hist[g] += 1

    def record_step(self, n_accepted: int, gamma: int) -> None:
        while len(self.accepted_hist) <= gamma:
            self.accepted_hist.append(0)
        while len(self.position_reached) < gamma:
            self.position_reached.append(0)
            self.position_accepted.append(0)
        self.accepted_hist[n_accepted] += 1
        for i in range(min(n_accepted + 1, gamma)):
            self.position_reached[i] += 1
            if i < n_accepted:
                self.position_accepted[i] += 1

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            other_s=self.other_s,
            block_efficiency=self.block_efficiency,
            tokens_per_s=self.tokens_per_s,
            per_position_acceptance=self.per_position_acceptance,
            mean_accepted=self.mean_accepted,
            mean_gamma=self.mean_gamma,
            nodes_per_call=self.nodes_per_call,
        )
        return out


class _Timer:
    """Context manager behind :meth:`Stats.timing` (a plain class: it runs several times per token)."""

    __slots__ = ("stats", "name", "t0")

    def __init__(self, stats: Stats, name: str) -> None:
        if not name.endswith("_s") or not hasattr(stats, name):
            raise ValueError(f"Stats has no timing field {name!r}; use one of prefill_s, draft_s, verify_s, rule_s")
        self.stats, self.name = stats, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        setattr(self.stats, self.name, getattr(self.stats, self.name) + time.perf_counter() - self.t0)
