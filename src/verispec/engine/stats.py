"""Per-generation statistics (calls, acceptance, timings, the cost-model speedup) and the timer of sections."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


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
    #: per verification step that verified drafts, in order: drafts accepted, and draft tokens verified (γ of a
    #: chain, the nodes of a tree): vLLM's per-request ``per_step_accepted`` / ``per_step_drafted``
    step_accepted: list[int] = field(default_factory=list)
    step_drafted: list[int] = field(default_factory=list)

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

    def timing(self, name: str) -> "Section":
        """``with stats.timing("verify_s"): ...`` adds the block's wall seconds to that field."""
        return Section(name, self)

    @property
    def mean_gamma(self) -> float:
        """Mean draft tokens per step (plain target steps count as 0)."""
        steps = sum(self.gamma_hist)
        return sum(g * k for g, k in enumerate(self.gamma_hist)) / steps if steps else 0.0

    def record_gamma(self, g: int) -> None:
        while len(self.gamma_hist) <= g:
            self.gamma_hist.append(0)
        self.gamma_hist[g] += 1

    def record_step(self, n_accepted: int, gamma: int, lookup: bool = False, nodes: int | None = None) -> None:
        """A verified step: ``n_accepted`` of ``gamma`` drafted positions accepted (``lookup``: drafted by
        prompt lookup; ``nodes``: the draft tokens verified, for a tree; a chain's are its ``gamma``)."""
        self.step_accepted.append(n_accepted)
        self.step_drafted.append(gamma if nodes is None else nodes)
        if lookup:
            self.lookup_accepted += n_accepted
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


class Section:
    """``with Section("verify_s", *accounts): ...`` adds the block's wall seconds to the field of that name
    of every account (:class:`Stats`, a batch's totals); with no account it only runs the block. A plain
    class: it runs several times per token."""

    __slots__ = ("name", "accounts", "t0")

    def __init__(self, name: str, *accounts) -> None:
        for account in accounts:
            if not name.endswith("_s") or not hasattr(account, name):
                raise ValueError(f"{type(account).__name__} has no timing field {name!r}; use one of prefill_s, "
                                 "draft_s, verify_s, rule_s")
        self.name, self.accounts = name, accounts

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        dt = time.perf_counter() - self.t0
        for account in self.accounts:
            setattr(account, self.name, getattr(account, self.name) + dt)
