"""How much one generation drafts at each step, and what the cost model says that costs.

A :class:`DraftPlan` owns the draft length: a fixed ``γ``, or the cost model's choice per step
(:class:`~verispec.engine.gamma.AutoGamma`, also deciding token by token where the chain ends with
``by_confidence``), and whether and how much of a prompt-lookup draft to verify
(:class:`~verispec.engine.gamma.LookupGamma`). It learns from every verified step and adds up the
modelled cost of the steps taken, in target decoding steps, for ``Stats.cost_model_speedup``. Every
choice reads only the past, so a lossless rule stays exactly lossless.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from verispec.engine.costs import CostProfile
from verispec.engine.gamma import AutoGamma, LookupGamma
from verispec.engine.stats import Stats
from verispec.engine.tree import LOOKUP, MODEL, DraftProposal


class DraftPlan:
    """The draft length of one generation (see the module docstring). ``gamma``: the deepest a step drafts;
    ``policy`` / ``lookup``: the cost model's choices for the draft model's chains / prompt lookup (None:
    fixed ``gamma`` / all of lookup's tokens); ``profile``: the cost model of chains (None: no modelled
    speedup, or a tree)."""

    def __init__(self, gamma: int, *, policy: AutoGamma | None = None, lookup: LookupGamma | None = None,
                 profile: CostProfile | None = None) -> None:
        self.gamma, self.policy, self.lookup, self.profile = gamma, policy, lookup, profile
        self.modelled = 0.0     # the cost model's time of the steps taken, in target steps

    @property
    def defers_draft(self) -> bool:
        """Whether the draft model's prefill should wait for its first draft: the cost model finds that no
        draft length can pay even at acceptance 1, so every step is plain (the draft never runs)."""
        return self.policy is not None and self.policy.fixed is None and not self.policy.pays_at_all

    @property
    def keep_drafting(self) -> Callable[[list[float]], bool] | None:
        """The per-token stop of the draft model's chain (``draft_stop="auto"``), or None."""
        return self.policy.keep_drafting if self.policy is not None and self.policy.by_confidence else None

    def length(self, unseen: int | None, cap: int) -> int:
        """The draft model's depth for the next step (0: a plain step), at most ``cap``; ``unseen``: tokens
        the draft model has not fed yet (None without a draft model)."""
        return min(self.policy.next(unseen) if self.policy is not None else self.gamma, cap)

    def lookup_choice(self, g: int, unseen: int | None, cap: int) -> tuple[int | None, Callable | None]:
        """``(how many tokens lookup may propose, choose(n, match) -> how many to verify)`` for a step whose
        draft-model depth is ``g``: (None, None) verifies all of lookup's proposal, up to ``g``."""
        if self.lookup is None:
            return None, None
        rival = self.policy.rate(g, unseen) if self.policy is not None else 1.0 / self.profile.verify_cost(0)
        return min(self.lookup.g_max, cap), functools.partial(self.lookup.choose, rival=rival)

    def count(self, proposal: DraftProposal | None, drafted: int, unseen: int | None) -> None:
        """Add the modelled cost of a step that drafted ``drafted`` tokens (0: a plain step)."""
        if self.profile is None:
            return
        free = proposal is not None and proposal.source == LOOKUP
        self.modelled += self.profile.verify_cost(drafted) if free else self.profile.step_cost(drafted, unseen=unseen)

    def learn(self, proposal: DraftProposal, n_accepted: int, drafted: int, lookup_match: int) -> None:
        """Record a verified step: ``n_accepted`` of ``drafted`` tokens accepted; ``lookup_match``: the
        length of the suffix a lookup draft continued."""
        if self.policy is not None and proposal.source == MODEL:
            confidences = None
            if self.policy.by_confidence:   # the draft's probability of each drafted token (row i drafted token i)
                rows = torch.arange(drafted, device=proposal.q.device)
                confidences = proposal.q[rows, torch.tensor(proposal.tokens, device=rows.device)].tolist()
            self.policy.update(n_accepted, drafted, confidences)
        if proposal.source == LOOKUP and self.lookup is not None:
            self.lookup.update(lookup_match, n_accepted, drafted)

    def speedup(self, stats: Stats) -> float | None:
        """The cost model's speedup of this generation over target-only sampling (None: not modelled)."""
        if self.profile is None or not self.modelled:
            return None
        return self.profile.speedup(stats.new_tokens, self.modelled)
