"""Draft length chosen by the cost model: ``γ = auto``.

Before each step :class:`AutoGamma` picks the number of draft tokens ``g`` that maximises the
expected tokens per unit of time,

    E[tokens | g] / cost(g) = (1 − α^{g+1}) / (1 − α)  /  cost(g, α),

where ``cost`` is the machine's :class:`~verispec.engine.costs.CostProfile` (``g·c + v(g)`` plus the
draft's catch-up and the work per logits row outside the models) and ``α``
is the per-position acceptance of *this* generation so far in the policy's current *state* (accepted /
verified draft positions of the steps taken after a block accepted whole, or after a rejection, shrunk
towards the generation's overall acceptance, itself shrunk towards a prior of ``prior_alpha`` worth
``prior_weight`` positions): acceptance comes in runs, so a block accepted whole predicts a long next
one and the policy lengthens its drafts at once, riding the run, taken optimistically:
the choice reads ``α + optimism · sd``, the Beta posterior's mean plus ``optimism`` standard
deviations (``sd² = α(1 − α)/(n + 1)`` after ``n`` positions, prior included). Early in a generation,
when α is barely known, this drafts where drafting *may* pay and so measures α; the bonus shrinks as
positions are verified, and the choice tends to the plain argmax (optimism in the face of
uncertainty, as in UCB bandits).  The i.i.d.-acceptance model behind ``E[tokens | g]`` is the one
of Leviathan et al. (2023, eq. 1).  ``g = 0`` -- a plain target step, no draft -- is chosen when no
``g >= 1`` beats it (``1 / v(0) = 1`` token per step); since such a step teaches nothing about α
(the optimistic α does not move), after ``explore_every`` consecutive plain steps one step drafts one
token instead (with the per-token stop below: up to ``g_max``, the stop ending it), and each such probe
doubles the wait before the next (up to ``MAX_EXPLORE_WAIT``; a chosen draft resets it), so a pair
that keeps losing costs a logarithmic number of probes -- unless
drafting cannot pay even at α → 1 (``(g + 1) / cost(g, 1) <= 1.05 / cost(0)`` for every ``g``, a margin for
timing noise, :data:`PAY_MARGIN`: the draft is too slow for its target on this machine), where every step is
plain (and the engine never runs the draft model: :attr:`~verispec.engine.plan.DraftPlan.defers_draft`).
Both decisions count what the draft's first forward of the step costs: after ``k`` plain steps it
feeds the ``k + 1`` tokens it has not seen (``unseen``, told by the engine), so a long plain run
makes the next draft dearer, and exploring stops where even α → 1 would not repay that catch-up.

**Per token** (``by_confidence=True``, ``--draft-stop auto``; the default of ``gamma="auto"`` with a draft
model alone, :func:`~verispec.engine.config.default_draft_stop`): within a step the draft keeps drafting
while the cost model says one more token pays, given the draft's own probabilities of the tokens it
drafted so far. ``a(c)``, the chance that a drafted token with draft probability ``c`` is accepted
(its predecessors accepted), is estimated per bin of ``c`` from this generation's verified positions,
shrunk towards ``1 − λ·(1 − c)``: ``λ`` is one number learned from all of them (rejections over
``Σ (1 − c)``, from ``λ = 1``: a draft's confidence approximates its acceptance, as EAGLE-2 found, so a
confident draft drafts on from the first step). On the embedded pair ``λ`` is 0.5 on code, where unsure
tokens are accepted nearly always, and 1.4 on prose. After ``k`` tokens with probabilities
``c_1..c_k``, all ``k`` survive with ``S_k = Π a(c_i)``; stopping there yields ``T_k = 1 + Σ_{i<=k} S_i``
tokens at ``cost(k)``. Drafting goes on iff some ``h`` in ``k+1 .. g_max`` has
``(T_k + S_k·(b + … + b^{h−k})) / cost(h) > T_k / cost(k)``: the full look-ahead, since ``v(g)`` need not
be convex. The tokens not yet drafted count with ``b``, the generation's acceptance over every verified
position shrunk towards the last drafted token's ``a(c_k)`` (:meth:`AutoGamma.ahead_acceptance`; before the
first token, the state's mean acceptance): their confidences are not known yet, and on the embedded pair an
unsure token does not announce unsure ones (the next position after an accepted token with ``c < 0.9`` is
accepted 0.97 / 1.00 / 0.60 of the time on code / arithmetic / prose, ``benchmarks/confidence_acceptance.py``).
Counting them at ``a(c_k)`` instead ended a chain at every unsure token: on the arithmetic prompt (transformers
backend, seeds 1 / 1001 / 2001) every generation then took 5 target calls for 48 tokens, and 4 with ``b``
(docs/performance.md, fifth round). This scores every draft slot by its survival probability against the
profiled cost of the step, as vLLM's adaptive verification does. The decision reads
the draft alone, like ``--draft-stop P``. Since the draft's confidence decides where a step ends, a
generation's first step drafts (where drafting can pay at all, :meth:`AutoGamma.can_pay`) and so does every
probe after a run of plain steps, each up to ``g_max`` tokens, the per-token stop ending it: a prior
acceptance of 0.7 makes plain steps the step γ's choice on a pair whose draft costs a third of its target,
which kept the first eight steps of every generation plain where the pair accepts nearly every token
(``benchmarks/gamma_sim.py`` at acceptance 1 on the transformers profile of docs/performance.md: 0.90x of the
best fixed γ, 1.00x with a drafted first step).

**Prompt lookup** (:class:`LookupGamma`): lookup's drafts cost nothing to make, only to verify
(:meth:`~verispec.engine.costs.CostProfile.verify_cost`: ``v(k)`` and the engine's work). Before a
step the proposal's first ``k`` tokens are verified for the ``k`` that maximises
``E[tokens | k] / verify_cost(k)`` at the acceptance seen so far of lookup drafts continuing a
suffix of the same length, if that beats the step it replaces (a plain step, or the draft model's
chain at its chosen γ); else the step goes to the draft model or is plain.

The choice depends only on past steps, never on the tokens it is about to verify, so a lossless
rule stays exactly lossless (each verification is exact whatever ``g`` was chosen).  A lossy rule's
output law depends on ``γ`` (where blocks end, bonus tokens are drawn from the target), as it does
with a fixed ``γ``; its acceptance is learned the same way, so lossy rules, which accept more, get
longer drafts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from verispec.engine.costs import CostProfile


def expected_tokens(alpha: float, g: int) -> float:
    """Expected tokens emitted by a step drafting ``g`` tokens at per-position acceptance ``alpha``."""
    if alpha >= 1.0:
        return float(g + 1)
    return (1.0 - alpha ** (g + 1)) / (1.0 - alpha)


def best_gamma(profile: CostProfile, alpha: float, g_max: int | None = None, unseen: int | None = None,
               free: bool = False) -> int:
    """``argmax_g E[tokens | g] / cost(g)`` over ``g = 0 .. g_max`` (ties: the smaller ``g``); ``unseen``:
    tokens the draft has not yet fed, where known (:meth:`CostProfile.step_cost`); ``free``: drafts
    that cost nothing to make (prompt lookup, :meth:`CostProfile.verify_cost`)."""
    top = profile.g_max if g_max is None else min(g_max, profile.g_max)
    rates = [step_rate(profile, alpha, g, unseen, free) for g in range(top + 1)]
    return max(range(top + 1), key=lambda g: (rates[g], -g))


def step_rate(profile: CostProfile, alpha: float, g: int, unseen: int | None = None, free: bool = False) -> float:
    """Expected tokens per unit of cost (target steps) of a step drafting ``g`` tokens at per-position
    acceptance ``alpha`` (``free``: drafts that cost nothing to make, see :func:`best_gamma`)."""
    cost = profile.verify_cost(g) if free else profile.step_cost(g, alpha, unseen)
    return expected_tokens(alpha, g) / cost


def _shrunk(accepted: float, verified: float, prior: float, weight: float) -> float:
    """Acceptance ``accepted / verified`` shrunk towards ``prior`` worth ``weight`` positions."""
    return (accepted + prior * weight) / (verified + weight)


def _optimistic(alpha: float, positions: float, optimism: float) -> float:
    """``alpha`` plus ``optimism`` standard deviations of its Beta posterior after ``positions``."""
    return min(alpha + optimism * math.sqrt(alpha * (1.0 - alpha) / (positions + 1.0)), 1.0)


def expected_tokens_along(acceptance: Sequence[float], g: int) -> float:
    """Expected tokens of a step drafting ``g`` tokens when draft position ``i`` is accepted with probability
    ``acceptance[i]`` given that the ones before it were: ``1 + Σ_{k<=g} Π_{i<k} acceptance[i]``."""
    tokens, survive = 1.0, 1.0
    for a in acceptance[:g]:
        survive *= a
        tokens += survive
    return tokens


def best_length(profile: CostProfile, acceptance: Sequence[float], g_max: int, unseen: int | None = None) -> int:
    """``argmax_g E[tokens | g] / cost(g)`` over ``g = 0 .. g_max`` (ties: the smaller ``g``) with acceptance
    by draft position (:func:`expected_tokens_along`); the catch-up of the draft's first forward reads the
    chance that the previous block was accepted whole as ``Π acceptance[:g]`` where ``unseen`` is not known."""
    top = min(g_max, len(acceptance), profile.g_max)
    rates = [_rate_along(profile, acceptance, g, unseen) for g in range(top + 1)]
    return max(range(top + 1), key=lambda g: (rates[g], -g))


def _rate_along(profile: CostProfile, acceptance: Sequence[float], g: int, unseen: int | None = None) -> float:
    whole = math.prod(acceptance[:g])
    per_position = whole ** (1.0 / g) if g else 0.0     # step_cost reads the whole-block chance as α^g
    return expected_tokens_along(acceptance, g) / profile.step_cost(g, per_position, unseen)


#: longest run of plain steps between two one-token probes (:class:`AutoGamma`'s back-off)
MAX_EXPLORE_WAIT = 256
#: how much faster than a plain step a draft length must be at acceptance α → 1 for drafting to count as able to
#: pay (:meth:`AutoGamma.can_pay`): a profile's forwards carry a few per cent of timing noise, and no pair accepts
#: every position of a long draft, so a draft that wins by less at α → 1 loses at any real acceptance (the
#: llama.cpp profile of the 2-core VM: γ = 15 at α → 1 was 1% faster than a plain step -- 16 rows cost 6.7
#: target steps there, 15 cost 8.6 -- and preparing the draft for it cost 12% of target-only's speed)
PAY_MARGIN = 1.05


@dataclass
class AutoGamma:
    """Per-step draft length from the cost model and the acceptance seen so far (see the module)."""

    profile: CostProfile
    g_max: int | None = None
    prior_alpha: float = 0.7
    prior_weight: float = 4.0
    explore_every: int = 8
    #: posterior standard deviations added to each acceptance for the choice of γ (0: the posterior mean);
    #: the compromise in simulations of 32- to 96-token generations at i.i.d. acceptance 0.5 .. 1 and in runs
    #: (``benchmarks/gamma_sim.py``: 1.0 lost up to 19% to the best fixed γ at acceptance 0.7, 0.0 ramped too
    #: slowly where every draft is accepted; 0.5 stayed within 0.89-1.01x of the best fixed γ)
    optimism: float = 0.5
    by_confidence: bool = False
    #: with ``by_confidence``: every step drafts up to this many tokens instead of the cost model's γ
    fixed: int | None = None
    accepted: int = 0
    verified: int = 0
    plain_run: int = 0
    chosen: list[int] = field(default_factory=list)
    #: per bin of the draft's probability of its token: accepted and verified positions
    bin_accepted: list[int] = field(default_factory=lambda: [0] * CONFIDENCE_BINS)
    bin_verified: list[int] = field(default_factory=lambda: [0] * CONFIDENCE_BINS)
    #: ``Σ (1 − c)`` over the verified positions with a confidence (:attr:`miscalibration`)
    calibration_slack: float = 0.0
    #: 1 when the last verified block was accepted whole (a run of full acceptances goes on), else 0
    state: int = 0
    #: per state (the one before the step): accepted and verified positions
    state_accepted: list[int] = field(default_factory=lambda: [0, 0])
    state_verified: list[int] = field(default_factory=lambda: [0, 0])
    #: plain steps before the next one-token probe (doubles after each probe that changes nothing)
    explore_wait: int = field(init=False)
    pays_at_all: bool = field(init=False)

    def __post_init__(self) -> None:
        if self.prior_weight < 0 or self.explore_every < 1 or self.optimism < 0:
            raise ValueError("prior_weight and optimism must be >= 0 and explore_every >= 1")
        self.g_max = _checked_cap(self.profile, self.g_max, self.prior_alpha)
        self.explore_wait = self.explore_every
        #: some draft length can pay at all (:meth:`can_pay` with one unseen token, the least a step feeds);
        #: where none can, every step is plain
        self.pays_at_all = self.can_pay(1)

    @property
    def alpha(self) -> float:
        """Current estimate of the per-position acceptance, all positions together."""
        return _shrunk(self.accepted, self.verified, self.prior_alpha, self.prior_weight)

    @property
    def alpha_upper(self) -> float:
        """``alpha`` plus ``optimism`` posterior standard deviations."""
        return _optimistic(self.alpha, self.verified + self.prior_weight, self.optimism)

    def acceptance(self, optimistic: bool = True) -> list[float]:
        """Acceptance of each draft position ``0 .. g_max − 1`` (given the ones before it accepted) for the
        next step: that of the positions verified in steps taken in the same state -- after a block
        accepted whole, or not -- shrunk towards ``alpha``; ``optimistic``: plus ``optimism`` posterior
        standard deviations. Acceptance comes in runs (boilerplate, repeats, code the draft knows), so a
        block accepted whole predicts a long next one, and the policy rides the run."""
        s = self.state
        a = _shrunk(self.state_accepted[s], self.state_verified[s], self.alpha, self.prior_weight)
        if optimistic:
            a = _optimistic(a, self.state_verified[s] + self.prior_weight, self.optimism)
        return [a] * self.g_max

    def next(self, unseen: int | None = None) -> int:
        """Draft length for the next step (0: a plain target step); with ``by_confidence`` the most the
        step may draft (:meth:`keep_drafting` stops it earlier). ``unseen``: the tokens the draft
        model has not fed yet (its first forward of the step feeds them), where the caller knows."""
        if self.fixed is not None:
            self.chosen.append(self.fixed)
            return self.fixed
        if not self.pays_at_all:
            self.chosen.append(0)
            return 0
        g = best_length(self.profile, self.acceptance(), self.g_max, unseen)
        if self.by_confidence and g > 0:
            g = self.g_max
        if g == 0:
            self.plain_run += 1
            self.state = 0
            first = self.by_confidence and not self.chosen
            if (first or self.plain_run >= self.explore_wait) and self.can_pay(unseen):
                g, self.plain_run = (self.g_max if self.by_confidence else 1), 0
                if not first:
                    self.explore_wait = min(2 * self.explore_wait, MAX_EXPLORE_WAIT)
        else:
            self.plain_run = 0
            self.explore_wait = self.explore_every
        self.chosen.append(g)
        return g

    def rate(self, g: int, unseen: int | None = None) -> float:
        """Expected tokens per unit of cost (target steps) of a step drafting ``g`` tokens, at the
        optimistic acceptance that chose it (what a prompt-lookup draft has to beat)."""
        return _rate_along(self.profile, self.acceptance(), g, unseen)

    def can_pay(self, unseen: int | None = None) -> bool:
        """Whether some draft length beats a plain step by :data:`PAY_MARGIN` at acceptance α → 1 (with
        ``unseen`` tokens to feed the draft first): where it does not, exploring cannot pay either."""
        plain = step_rate(self.profile, 1.0, 0, unseen)
        return any(step_rate(self.profile, 1.0, g, unseen) > PAY_MARGIN * plain for g in range(1, self.g_max + 1))

    def update(self, n_accepted: int, g: int, confidences: list[float] | None = None) -> None:
        """Record a verified step: ``n_accepted`` of ``g`` drafts accepted (positions verified: the
        accepted ones and the first rejected one, if any); ``confidences``: the draft's probability of
        each drafted token, for :meth:`acceptance_at`."""
        reached = min(n_accepted + 1, g)
        self.accepted += n_accepted
        self.verified += reached
        self.state_accepted[self.state] += n_accepted
        self.state_verified[self.state] += reached
        for i, c in enumerate((confidences or [])[:reached]):
            b = _bin(c)
            self.bin_verified[b] += 1
            self.bin_accepted[b] += i < n_accepted
            self.calibration_slack += 1.0 - c
        self.state = int(g > 0 and n_accepted >= g)

    @property
    def miscalibration(self) -> float:
        """``λ`` of ``a(c) = 1 − λ·(1 − c)``: the verified positions' rejections over ``Σ (1 − c)``, shrunk
        towards 1 (a calibrated draft) worth :data:`CALIBRATION_WEIGHT` of ``Σ (1 − c)``. Below 1 where the
        pair accepts unsure tokens more often than the draft's confidence says (code: 0.5 on the embedded
        pair), above 1 where less (prose: 1.4)."""
        rejected = sum(self.bin_verified) - sum(self.bin_accepted)
        return (rejected + CALIBRATION_WEIGHT) / (self.calibration_slack + CALIBRATION_WEIGHT)

    def acceptance_at(self, confidence: float) -> float:
        """Estimated acceptance of a drafted token the draft gave probability ``confidence``: that of the
        verified positions in its bin of confidence, shrunk towards ``1 − λ·(1 − confidence)``
        (:attr:`miscalibration`; before any position is verified ``λ = 1``: a draft's confidence approximates
        its acceptance, EAGLE-2, Li et al. 2024, §3), so that a confident draft drafts on from the first
        step, and the one parameter ``λ``, learned from every verified position, sets every bin's prior
        while the bins themselves have seen few positions."""
        b = _bin(confidence)
        prior = min(1.0, max(0.0, 1.0 - self.miscalibration * (1.0 - confidence)))
        return _shrunk(self.bin_accepted[b], self.bin_verified[b], prior, self.prior_weight)

    def ahead_acceptance(self, last: float) -> float:
        """Estimated acceptance of each token not yet drafted, after a drafted token whose own estimate is
        ``last``: this generation's acceptance over every verified position, shrunk towards ``last`` worth
        ``prior_weight`` positions. The next token's confidence is unknown, and an unsure token does not
        announce unsure ones (see the module docstring)."""
        return _shrunk(self.accepted, self.verified, last, self.prior_weight)

    def keep_drafting(self, confidences: list[float]) -> bool:
        """Whether to draft one more token after drafting tokens of these draft probabilities (see the
        module docstring); never beyond ``g_max`` (or ``fixed``)."""
        k = len(confidences)
        top = self.fixed if self.fixed is not None else self.g_max
        if k >= top:
            return False
        if not self.by_confidence:
            return True
        drafted = [self.acceptance_at(c) for c in confidences]
        ahead = [self.ahead_acceptance(drafted[-1])] * top if drafted else self.acceptance(optimistic=False)
        now = _rate_along(self.profile, drafted, k)
        for h in range(k + 1, top + 1):
            if _rate_along(self.profile, drafted + ahead[k:h], h) > now:
                return True
        return False


@dataclass
class LookupGamma:
    """How many tokens of a prompt-lookup draft to verify (0: none), from the machine's cost of
    verifying drafts that cost nothing to make (:meth:`CostProfile.verify_cost`) and the acceptance
    seen so far of lookup drafts whose matched suffix had the same length (1, 2, ..., ``max_match``
    and longer). The chance that a copied continuation is right depends mostly on how long a suffix
    it continues: a 1-token match is often chance, a 3-token one in code is usually a real repeat.

    Per bucket: per-position acceptance ``α`` (accepted / verified lookup positions, shrunk towards
    ``prior_alpha`` worth ``prior_weight`` positions), read optimistically (``α + optimism · sd``,
    as :class:`AutoGamma`). :meth:`choose` keeps the ``k <= available`` tokens that maximise
    ``E[tokens | k] / verify_cost(k)`` and drafts them iff that beats ``rival``, the rate of the
    step it would replace (a plain step's ``1 / cost(0)``, or the draft model's chosen chain). The
    optimism lets an untried bucket draft; one that keeps failing falls below the rival, and since
    a declined draft teaches nothing, two unlucky early failures could shut a good bucket for the
    whole generation: so every ``explore_every``-th consecutive decline in a bucket verifies one
    token anyway, and each such probe doubles the wait before the next (a bucket that really is
    bad costs a logarithmic number of one-token probes). Like :class:`AutoGamma` the choice reads only the
    text so far and past steps, so lossless rules stay exact."""

    profile: CostProfile
    g_max: int | None = None
    prior_alpha: float = 0.5
    prior_weight: float = 2.0
    optimism: float = 1.0
    max_match: int = 4
    explore_every: int = 8
    #: per bucket of matched-suffix length: accepted and verified lookup positions
    accepted: list[int] = field(init=False)
    verified: list[int] = field(init=False)
    #: per bucket: consecutive declines, and how many of them trigger the next one-token probe
    declined: list[int] = field(init=False)
    probe_after: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if self.prior_weight <= 0 or self.optimism < 0 or self.max_match < 1 or self.explore_every < 1:
            raise ValueError("prior_weight must be > 0, optimism >= 0, max_match and explore_every >= 1")
        self.g_max = _checked_cap(self.profile, self.g_max, self.prior_alpha)
        self.accepted = [0] * self.max_match
        self.verified = [0] * self.max_match
        self.declined = [0] * self.max_match
        self.probe_after = [self.explore_every] * self.max_match

    def _bucket(self, match: int) -> int:
        if match < 1:
            raise ValueError(f"a lookup draft continues a matched suffix of >= 1 token, got {match}")
        return min(match, self.max_match) - 1

    def alpha(self, match: int) -> float:
        """Estimated per-position acceptance of lookup drafts continuing a ``match``-token suffix."""
        b = self._bucket(match)
        return _shrunk(self.accepted[b], self.verified[b], self.prior_alpha, self.prior_weight)

    def alpha_upper(self, match: int) -> float:
        return _optimistic(self.alpha(match), self.verified[self._bucket(match)] + self.prior_weight, self.optimism)

    def choose(self, available: int, match: int, rival: float) -> int:
        """How many of ``available`` proposed tokens to verify (0: leave the step to ``rival``)."""
        if available < 1:
            return 0
        alpha = self.alpha_upper(match)
        best, best_rate = 0, rival
        for k in range(1, min(available, self.g_max) + 1):
            rate = step_rate(self.profile, alpha, k, free=True)
            if rate > best_rate:
                best, best_rate = k, rate
        b = self._bucket(match)
        if best > 0:
            self.declined[b] = 0
            return best
        self.declined[b] += 1
        if self.declined[b] < self.probe_after[b]:
            return 0
        self.declined[b] = 0
        self.probe_after[b] *= 2
        return 1

    def update(self, match: int, n_accepted: int, g: int) -> None:
        """Record a verified lookup step: ``n_accepted`` of its ``g`` tokens accepted."""
        b = self._bucket(match)
        self.accepted[b] += n_accepted
        self.verified[b] += min(n_accepted + 1, g)


def _checked_cap(profile: CostProfile, g_max: int | None, prior_alpha: float) -> int:
    """The policy's longest draft (``g_max`` within the profile's range) after checking its prior."""
    if not 0.0 < prior_alpha < 1.0:
        raise ValueError(f"prior_alpha must lie in (0, 1), got {prior_alpha}")
    cap = profile.g_max if g_max is None else min(int(g_max), profile.g_max)
    if cap < 1:
        raise ValueError(f"g_max must be >= 1, got {cap}")
    return cap


#: bins of the draft's probability of its token, for the per-token stop rule
CONFIDENCE_BINS = 10
#: how much ``Σ (1 − c)`` the prior ``λ = 1`` of :attr:`AutoGamma.miscalibration` is worth. Replays of the
#: embedded pair's positions (``benchmarks/gamma_sim.py --records``, transformers profile, 32 / 48 / 96
#: tokens), over the best fixed γ: with the bins' middle confidences as their priors code 0.94 / 0.96 /
#: 0.98x and the repetitive list 0.98 / 0.99 / 0.99x; with ``λ`` at weight 3, 0.96 / 0.97 / 0.99x and
#: 1.00x; arithmetic, prose and the four pooled within 0.8% of before; weights 1 and 10 within 1% of 3
CALIBRATION_WEIGHT = 3.0


def _bin(confidence: float) -> int:
    return min(CONFIDENCE_BINS - 1, max(0, int(confidence * CONFIDENCE_BINS)))
