"""What a speculative-decoding call asks for, checked and resolved before any model runs.

:func:`resolve` turns the arguments of :func:`verispec.engine.generate` that describe the drafting --
the rule, ``gamma`` (an integer, ``"auto"`` or an :class:`AutoGamma`), a tree shape, ``draft_stop``, the
cost profile, and which draft sources exist -- into one :class:`SDConfig`, refusing every combination
that has no meaning with a message that says what to drop or add. It needs no model, so every rule of
combination is tested on its own. :meth:`SDConfig.plan` then gives each generation its
:class:`~verispec.engine.plan.DraftPlan` (fresh policies: they learn from the steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from verispec.engine.costs import CostProfile
from verispec.engine.gamma import AutoGamma, LookupGamma
from verispec.engine.plan import DraftPlan
from verispec.engine.tree import TreeShape
from verispec.rules import Rule
from verispec.rules import get as get_rule
from verispec.rules.tree import DETERMINISTIC
from verispec.settings import MAX_GAMMA


class DraftHead(Protocol):
    """What the engine needs of a draft head (:class:`~verispec.models.eagle3.Eagle3Drafter`): the shape of
    the trees it grows, and the calls :mod:`verispec.engine.sources` makes."""

    top_k: int
    depth: int
    nodes: int

    def reset(self) -> None: ...
    def observe(self, tokens, target_hidden) -> None: ...
    def grow(self, root_token: int) -> tuple[list[int], list[int], object]: ...


@dataclass(frozen=True)
class SDConfig:
    """A resolved drafting configuration (see :func:`resolve`).

    ``gamma``: the deepest a step drafts (the chain length, a policy's cap, a tree's or head's depth);
    ``tree``: the draft model's tree (None: chains); ``tree_label``: what :class:`Stats` records as the
    tree (``""`` for chains); ``draft_stop``: the draft probability below which a static tree or chain
    stops growing; ``auto``: the cost model chooses the draft model's γ per step; ``stop_auto``: and
    decides token by token whether to draft one more; ``fixed_cap``: with ``stop_auto`` and an integer
    ``gamma``, the most a step drafts; ``lookup_auto``: the cost model decides how many of prompt
    lookup's tokens to verify; ``profile``: the cost profile the modelled speedup of chains reads (None:
    none, or trees and heads, which it does not model); ``policy``: a caller's own :class:`AutoGamma`."""

    rule: Rule
    gamma: int
    tree: TreeShape | None = None
    tree_label: str = ""
    draft_stop: float = 0.0
    auto: bool = False
    stop_auto: bool = False
    fixed_cap: int | None = None
    lookup_auto: bool = False
    profile: CostProfile | None = None
    policy: AutoGamma | None = None

    @property
    def keep_raw(self) -> bool:
        """Whether the draft must keep its raw rows (the rule reads untruncated distributions)."""
        return self.rule.needs_raw

    @property
    def gamma_policy(self) -> str:
        """What :class:`Stats` records: ``fixed`` or ``auto``, ``+stop`` with a per-token stop."""
        if self.policy is not None:
            base = "fixed" if self.policy.fixed is not None else "auto"
            return base + "+stop" if self.policy.by_confidence else base
        if self.stop_auto:
            return "auto+stop" if self.auto else "fixed+stop"
        return "auto" if self.auto or self.lookup_auto else "fixed"

    def plan(self) -> DraftPlan:
        """The draft plan of one generation, with fresh policies."""
        policy = self.policy
        if policy is None and self.stop_auto:
            policy = AutoGamma(self.profile, by_confidence=True, fixed=self.fixed_cap)
        elif policy is None and self.auto:
            policy = AutoGamma(self.profile)
        lookup = LookupGamma(self.profile) if self.lookup_auto else None
        return DraftPlan(self.gamma, policy=policy, lookup=lookup, profile=self.profile)


def default_draft_stop(auto: bool, costs: bool, draft: bool, lookup: bool, chain: bool) -> float | str:
    """``draft_stop`` where none is given: ``"auto"`` for ``gamma="auto"`` on the draft model's chains alone
    (with ``costs``, no prompt lookup, tree or head), else 0.0 (draft every token the step chose).

    The per-token stop reads the draft's confidence in each token it drafts, which the step's γ, chosen
    before drafting, cannot: a confident draft drafts long from a generation's first step, where the step's
    γ starts from a prior acceptance and needs several blocks accepted whole to lengthen its drafts. It was
    ahead of the step's γ alone over the four prompt classes of ``benchmarks/auto_gamma.py`` in every run
    (docs/performance.md). With prompt lookup, which competes with the chain's rate at the step's γ
    (:class:`~verispec.engine.gamma.LookupGamma`), the step's γ alone stays the default."""
    return "auto" if auto and costs and draft and not lookup and chain else 0.0


def resolve(*, rule: Rule | str, gamma: int | str | AutoGamma, tree: TreeShape | str | None,
            draft_stop: float | str | None, costs: CostProfile | None, draft: bool, lookup: bool,
            head: DraftHead | None) -> SDConfig:
    """Check and resolve the drafting arguments of :func:`verispec.engine.generate` (its docstring says
    what each means). ``draft`` / ``lookup``: whether a draft model / prompt lookup is given.
    ``draft_stop=None``: :func:`default_draft_stop`."""
    user_policy = gamma if isinstance(gamma, AutoGamma) else None
    wants_auto = gamma == "auto" if user_policy is None else False
    if draft_stop is None:
        draft_stop = default_draft_stop(wants_auto, costs is not None, draft, lookup, tree is None and head is None)
    if (tree is not None or head is not None) and (user_policy is not None or wants_auto):
        raise ValueError("gamma='auto' chooses the length of a chain; it does not apply to --tree or a head "
                         "(drop one)")
    shape = TreeShape.parse(tree) if tree is not None else None
    if shape is not None and shape.is_chain:
        gamma, shape = shape.depth, None
    if not draft and not lookup and head is None:
        raise ValueError("no draft source: pass a draft model, lookup=NgramDrafter() for prompt lookup, "
                         "or head= an EAGLE-3 drafter")
    if head is not None and (draft or shape is not None):
        raise ValueError("an EAGLE-3 head drafts its own trees (its top_k, depth, nodes): drop the draft model "
                         "and the tree shape")
    if lookup and shape is not None:
        raise ValueError("prompt lookup drafts chains; it does not combine with a tree (drop one)")
    if not draft and user_policy is not None:
        raise ValueError("an AutoGamma policy chooses the draft model's chains: with prompt lookup alone pass "
                         "gamma='auto'")
    if costs is not None and not isinstance(costs, CostProfile):
        raise TypeError(f"costs must be a CostProfile (verispec.engine.cached_profile, measure_profile or "
                        f"measure_costs), got {type(costs).__name__}")
    if costs is not None and draft and not costs.has_draft:
        raise ValueError("the cost profile was measured without a draft model (for prompt lookup alone): measure "
                         "one with this draft model (cached_profile(target, draft, ...))")
    stop_auto = draft_stop == "auto"
    fixed_cap = None
    if stop_auto:
        if shape is not None or head is not None or not draft:
            raise ValueError("draft_stop='auto' decides where the draft model's chain ends: it does not apply to "
                             "trees, heads or prompt lookup alone")
        if costs is None:
            raise ValueError("draft_stop='auto' needs the machine's cost profile: pass costs=CostProfile "
                             "(verispec.engine.cached_profile or measure_profile)")
        if user_policy is None and not wants_auto:
            if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= costs.g_max:
                raise ValueError(f"with draft_stop='auto', gamma is the most a step drafts: an integer in "
                                 f"1..{costs.g_max} (the cost profile's range) or 'auto', got {gamma!r}")
            fixed_cap = gamma
        draft_stop = 0.0
    if wants_auto and costs is None:
        raise ValueError("gamma='auto' needs the machine's cost profile: pass costs=CostProfile "
                         "(verispec.engine.cached_profile or measure_profile)")
    auto = wants_auto and draft
    lookup_auto = wants_auto and lookup
    if user_policy is not None:
        gamma = user_policy.fixed or user_policy.g_max
    elif fixed_cap is not None:
        pass
    elif auto or lookup_auto:
        gamma = costs.g_max
    elif shape is not None or head is not None:
        gamma = shape.depth if shape is not None else head.depth
    elif isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA:
        raise ValueError(f"gamma (draft tokens per step) must be an integer in 1..{MAX_GAMMA} or 'auto', "
                         f"got {gamma!r}")
    elif costs is not None and gamma > costs.g_max:
        raise ValueError(f"the cost profile covers γ = 1..{costs.g_max}, got gamma={gamma}")
    rule = get_rule(rule)
    if rule.needs_raw and (shape is not None or head is not None or lookup):
        raise ValueError(f"rule {rule.spec()!r} reads the draft's raw distribution: it runs on chains of a draft "
                         "model only (no tree, head or prompt lookup)")
    if shape is not None:
        shape.check_rule(rule)
    label = shape.text() if shape is not None else ""
    if head is not None:
        label = f"eagle3:top_k={head.top_k},depth={head.depth},nodes={head.nodes}"
        TreeShape("dynamic", DETERMINISTIC, top_k=head.top_k, depth_limit=head.depth, nodes=head.nodes).check_rule(rule)
    if lookup:
        TreeShape("static", DETERMINISTIC, (1,) * gamma).check_rule(rule)
    if isinstance(draft_stop, bool) or not isinstance(draft_stop, (int, float)) or not 0.0 <= draft_stop < 1.0:
        raise ValueError(f"draft_stop is a draft probability in [0, 1) or 'auto', got {draft_stop!r}")
    profile = costs if shape is None and head is None else None
    return SDConfig(rule, gamma, shape, label, draft_stop, auto, stop_auto, fixed_cap, lookup_auto, profile,
                    user_policy)
