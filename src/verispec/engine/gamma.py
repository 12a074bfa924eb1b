"""Draft length chosen by the cost model: ``γ = auto``.

Before each step :class:`AutoGamma` picks the number of draft tokens ``g`` that maximises the
expected tokens per unit of time,

    E[tokens | g] / cost(g) = (1 − α^{g+1}) / (1 − α)  /  cost(g, α),

where ``cost`` is the machine's :class:`~verispec.engine.costs.CostProfile` (``g·c + v(g)`` plus the
draft's catch-up and the work per logits row outside the models) and ``α``
is the per-position acceptance of *this* generation so far (accepted / verified draft positions,
shrunk towards a prior of ``prior_alpha`` worth ``prior_weight`` positions).  The i.i.d.-acceptance
model behind ``E[tokens | g]`` is the one of Leviathan et al. (2023, eq. 1).  ``g = 0`` -- a plain
target step, no draft -- is chosen when no ``g >= 1`` beats it (``1 / v(0) = 1`` token per step);
since such a step teaches nothing about α, every ``explore_every``-th consecutive plain step drafts
one token instead -- unless drafting cannot pay even at α → 1 (``(g + 1) / cost(g, 1) <= 1 / cost(0)``
for every ``g``: the draft is too slow for its target on this machine), where every step is plain.

The choice depends only on past steps, never on the tokens it is about to verify, so a lossless
rule stays exactly lossless (each verification is exact whatever ``g`` was chosen).  A lossy rule's
output law depends on ``γ`` (where blocks end, bonus tokens are drawn from the target), as it does
with a fixed ``γ``; its acceptance is learned the same way, so lossy rules, which accept more, get
longer drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verispec.engine.costs import CostProfile


def expected_tokens(alpha: float, g: int) -> float:
    """Expected tokens emitted by a step drafting ``g`` tokens at per-position acceptance ``alpha``."""
    if alpha >= 1.0:
        return float(g + 1)
    return (1.0 - alpha ** (g + 1)) / (1.0 - alpha)


def best_gamma(profile: CostProfile, alpha: float, g_max: int | None = None) -> int:
    """``argmax_g E[tokens | g] / (g·c + v(g))`` over ``g = 0 .. g_max`` (ties: the smaller ``g``)."""
    top = profile.g_max if g_max is None else min(g_max, profile.g_max)
    rates = [expected_tokens(alpha, g) / profile.step_cost(g, alpha) for g in range(top + 1)]
    return max(range(top + 1), key=lambda g: (rates[g], -g))


@dataclass
class AutoGamma:
    """Per-step draft length from the cost model and the acceptance seen so far (see the module)."""

    profile: CostProfile
    g_max: int | None = None
    prior_alpha: float = 0.7
    prior_weight: float = 4.0
    explore_every: int = 8
    accepted: int = 0
    verified: int = 0
    plain_run: int = 0
    chosen: list[int] = field(default_factory=list)
    can_pay: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        if not 0.0 < self.prior_alpha < 1.0:
            raise ValueError(f"prior_alpha must lie in (0, 1), got {self.prior_alpha}")
        if self.prior_weight < 0 or self.explore_every < 1:
            raise ValueError("prior_weight must be >= 0 and explore_every >= 1")
        self.g_max = self.profile.g_max if self.g_max is None else min(int(self.g_max), self.profile.g_max)
        if self.g_max < 1:
            raise ValueError(f"g_max must be >= 1, got {self.g_max}")
        self.can_pay = best_gamma(self.profile, 1.0, self.g_max) > 0

    @property
    def alpha(self) -> float:
        """Current estimate of the per-position acceptance."""
        return (self.accepted + self.prior_alpha * self.prior_weight) / (self.verified + self.prior_weight)

    def next(self) -> int:
        """Draft length for the next step (0: a plain target step)."""
        g = best_gamma(self.profile, self.alpha, self.g_max)
        if g == 0:
            self.plain_run += 1
            if self.can_pay and self.plain_run >= self.explore_every:
                g, self.plain_run = 1, 0
        else:
            self.plain_run = 0
        self.chosen.append(g)
        return g

    def update(self, n_accepted: int, g: int) -> None:
        """Record a verified step: ``n_accepted`` of ``g`` drafts accepted (positions verified: the
        accepted ones and the first rejected one, if any)."""
        self.accepted += n_accepted
        self.verified += min(n_accepted + 1, g)
