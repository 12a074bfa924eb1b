"""Truncation-based verification: accept the draft token iff it lies in a target allowed set (spec §3).

* ``speccascade:p_base`` — SpecCascade as analysed by the paper (reference code ``min_p_spd``):
  ``h = 1[x ∈ A]`` with the min-p set ``A = {p >= p_base·max p}``; on rejection ``z ~ p`` (the full
  processed target, not a residual). ``P_R = q·1_A + (1 − q(A))·p``, ``β = q(A)``. True baseline:
  ``p_A``, the target sampled with min-p ``p_base``.
* ``typical:eps[,delta]`` — typical acceptance with the η set ``A = {p >= min(ε, δ·exp(−H(p)))}``
  (``δ = √ε`` default; HF's ``>=``; the argmax is always in ``A`` as in the η warper). On rejection
  ``z ~ p`` (reference code); law and baseline as above with the η set.
* ``cascade:rule=…,alpha`` — the original speculative cascades (Narasimhan et al.): exact
  speculative sampling against the deferral target ``π`` (table of spec §3.3). Deliberate deviation:
  the deferral statistics use the same processed probabilities as ``π`` (the official colab uses
  temperature-1 ones), because rules only receive processed probabilities. ``token_v3`` with
  ``α = 1 − p_base`` has exactly SpecCascade's law (tested) and the same true baseline ``p_A``;
  the other deferral rules are judged against the plain target ``p``.

The allowed sets come from :mod:`verispec.sets`, the same functions the sampling warpers use, so
each rule's ``reference`` is exactly what target-only sampling with the matching warper produces.
"""

from __future__ import annotations

import math

import torch

from verispec import sets
from verispec.rules.base import ExactTargetRule, PerTokenRule, check_pair
from verispec.rules.params import Param, in_range, one_of

P_BASE = Param("p_base", float, in_range(0, 1), "0 <= p_base <= 1", "min-p fraction of max p")
EPS = Param("eps", float, in_range(0, 1, lo_open=True), "0 < eps <= 1", "η-set ε")
DELTA = Param("delta", float, lambda v: v > 0, "delta > 0", "η-set δ (default √ε)")
CASCADE_RULES = ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3")
CASCADE_RULE = Param("rule", str, one_of(*CASCADE_RULES), "one of " + ", ".join(CASCADE_RULES), "deferral rule", "token_v3")
ALPHA = Param("alpha", float, lambda v: True, "a real number (chow/token_v3: [0, 1]; diff/token_v1/token_v2: [-1, 1])", "deferral knob α")
_ALPHA_RANGE = {"chow": (0.0, 1.0), "token_v3": (0.0, 1.0), "diff": (-1.0, 1.0), "token_v1": (-1.0, 1.0), "token_v2": (-1.0, 1.0)}


class _AllowedSetRule(PerTokenRule):
    """Accept iff the draft is in ``A(p)``; reject -> sample ``p``. Subclasses define ``allowed``."""

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        """Boolean keep-mask ``[..., V]`` of the allowed set."""
        raise NotImplementedError

    def residual(self, p, q):
        return p

    def closed_form(self, p, q):
        """``q·1_A + (1 − q(A))·p``."""
        inside = torch.where(self.allowed(p), q, torch.zeros_like(q))
        return inside + (1 - inside.sum(-1, keepdim=True)) * p

    def closed_form_acceptance(self, p, q):
        return torch.where(self.allowed(p), q, torch.zeros_like(q)).sum(-1)

    def reference(self, p, q=None, *, own_target=False):
        """The true baseline ``p_A`` (target sampling with the same truncation)."""
        p, _ = check_pair(p, None)
        return sets.restrict(p, self.allowed(p))


class SpecCascade(_AllowedSetRule):
    name = "speccascade"
    family = "speccascade"
    PARAMS = (P_BASE,)

    def __init__(self, p_base: float) -> None:
        super().__init__(p_base=p_base)
        self.p_base = p_base

    def describe(self) -> str:
        return f"SpecCascade (min-p acceptance) p_base={self.p_base:g}: accept iff p(x) >= p_base·max p, else sample p"

    def allowed(self, p):
        return sets.min_p_mask(p, self.p_base)

    def accept_prob(self, p, q, px, qx):
        return (px >= self.p_base * p.amax(-1, keepdim=True)).to(p.dtype)

    def baseline_truncation(self):
        return {"min_p": self.p_base}


class Typical(_AllowedSetRule):
    name = "typical"
    family = "typical"
    PARAMS = (EPS, DELTA)

    def __init__(self, eps: float, delta: float | None = None) -> None:
        if delta is None:
            super().__init__(eps=eps)
        else:
            super().__init__(eps=eps, delta=delta)
        self.eps = eps
        self.delta = math.sqrt(eps) if delta is None else delta

    def describe(self) -> str:
        return f"typical acceptance ε={self.eps:g}, δ={self.delta:g}: accept iff p(x) >= min(ε, δ·exp(-H(p))), else sample p"

    def allowed(self, p):
        return sets.eta_mask(p, self.eps, self.delta)

    def accept_prob(self, p, q, px, qx):
        threshold = sets.eta_threshold(p, self.eps, self.delta)
        is_max = px >= p.amax(-1, keepdim=True)
        return ((px >= threshold) | is_max).to(p.dtype)

    def baseline_truncation(self):
        if "delta" in self.params:
            return {"eta": self.eps, "eta_delta": self.delta}
        return {"eta": self.eps}  # the η warper's default δ is √ε too


def cascade_target(p: torch.Tensor, q: torch.Tensor, rule: str, alpha: float) -> torch.Tensor:
    """Deferral target ``π`` of the original speculative cascades (spec §3.3). ``[..., V]``."""
    max_p = p.amax(-1, keepdim=True)
    max_q = q.amax(-1, keepdim=True)
    if rule in ("chow", "diff", "opt"):
        if rule == "chow":
            use_draft = max_q >= 1 - alpha
        elif rule == "diff":
            use_draft = max_q >= max_p - alpha
        else:
            use_draft = max_q >= max_p - alpha * (q - p).clamp_min(0).sum(-1, keepdim=True)
        return torch.where(use_draft, q, p)
    if rule == "token_v1":
        in_t = q >= max_p - alpha
    elif rule == "token_v2":
        in_t = p >= max_p - alpha
    else:
        in_t = p >= (1 - alpha) * max_p
    inside = torch.where(in_t, q, torch.zeros_like(q))
    return inside + (1 - inside.sum(-1, keepdim=True)) * p


class Cascade(ExactTargetRule):
    name = "cascade"
    family = "cascade"
    PARAMS = (CASCADE_RULE, ALPHA)

    def __init__(self, rule: str = "token_v3", alpha: float = 0.5) -> None:
        lo_hi = _ALPHA_RANGE.get(rule)
        if lo_hi is not None and not lo_hi[0] <= alpha <= lo_hi[1]:
            raise ValueError(f"cascade: alpha={alpha} is out of range for rule={rule}; expected {lo_hi[0]} <= alpha <= {lo_hi[1]}")
        super().__init__(rule=rule, alpha=alpha)
        self.rule, self.alpha = rule, alpha

    def describe(self) -> str:
        return f"speculative cascade ({self.rule}, α={self.alpha:g}): exact SD against the deferral target π"

    def target(self, p, q):
        return cascade_target(p, q, self.rule, self.alpha)

    def reference(self, p, q=None, *, own_target=False):
        if not own_target and self.rule == "token_v3":
            p, _ = check_pair(p, None)
            return sets.restrict(p, sets.min_p_mask(p, 1 - self.alpha))
        return super().reference(p, q, own_target=own_target)

    def baseline_truncation(self):
        return {"min_p": 1 - self.alpha} if self.rule == "token_v3" else {}
