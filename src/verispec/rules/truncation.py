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

The allowed sets come from :mod:`verispec.sets`, the same functions the sampling warpers use, and the
acceptance test reads the same mask as the closed form: each rule's sampler, law and ``reference``
agree with target-only sampling under the matching warper, ties included (the η set keeps only the
first argmax when the maximum itself is below the threshold, which needs δ > 1).
"""

from __future__ import annotations

import math

import torch

from verispec import sets
from verispec.params import Param, in_range, one_of
from verispec.rules.base import ExactTargetRule, InducedForm, PerTokenRule, check_pair

P_BASE = Param("p_base", float, in_range(0, 1), "a number with 0 <= p_base <= 1", "min-p fraction of max p")
EPS = Param("eps", float, in_range(0, 1, lo_open=True, hi_open=True),
            "a number with 0 < eps < 1 (the range of η-sampling, its baseline)", "η-set ε")
DELTA = Param("delta", float, lambda v: v > 0, "a number > 0", "η-set δ (default √ε)")
CASCADE_RULES = ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3")
CASCADE_RULE = Param("rule", str, one_of(*CASCADE_RULES), "one of " + ", ".join(CASCADE_RULES), "deferral rule",
                     "token_v3")
ALPHA = Param("alpha", float, lambda v: True,
              "a real number (chow/token_v3: [0, 1]; diff/token_v1/token_v2: [-1, 1])", "deferral knob α")
_ALPHA_RANGE = {
    "chow": (0.0, 1.0), "token_v3": (0.0, 1.0), "diff": (-1.0, 1.0), "token_v1": (-1.0, 1.0), "token_v2": (-1.0, 1.0),
}


class _AllowedSetRule(PerTokenRule):
    """Accept iff the draft is in ``A(p)``; reject -> sample ``p``. Subclasses define ``allowed``.

    ``h`` is read from the same keep-mask as the closed form and the true baseline (a
    :mod:`verispec.sets` function), so the sampler, the law and the baseline agree even on ties.
    """

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        """Boolean keep-mask ``[..., V]`` of the allowed set."""
        raise NotImplementedError

    def accept_prob_at(self, p, q, x):
        idx = x.unsqueeze(-1)
        inside = self.allowed(p).gather(-1, idx)[..., 0]
        return (inside & (q.gather(-1, idx)[..., 0] > 0)).to(p.dtype)

    def accept_prob_all(self, p, q):
        return (self.allowed(p) & (q > 0)).to(p.dtype)

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
    taxonomy = "truncation set"
    PARAMS = (P_BASE,)

    def __init__(self, p_base: float) -> None:
        p_base = P_BASE.check(self.name, p_base)   # built directly or from a spec: the same validation
        super().__init__(p_base=p_base)
        self.p_base = p_base

    def describe(self) -> str:
        return f"SpecCascade (min-p acceptance) p_base={self.p_base:g}: accept iff p(x) >= p_base·max p, else sample p"

    def allowed(self, p):
        return sets.min_p_mask(p, self.p_base)

    def induced_form(self):
        if self.p_base == 0:   # every draft token is accepted: P = q
            return InducedForm("mixture", lam=0.0)
        return InducedForm("min_p_set", p_base=self.p_base)

    def baseline_truncation(self):
        return {"min_p": self.p_base}


class Typical(_AllowedSetRule):
    name = "typical"
    family = "typical"
    taxonomy = "truncation set"
    PARAMS = (EPS, DELTA)

    def __init__(self, eps: float, delta: float | None = None) -> None:
        eps = EPS.check(self.name, eps)
        delta = None if delta is None else DELTA.check(self.name, delta)
        if delta is None:
            super().__init__(eps=eps)
        else:
            super().__init__(eps=eps, delta=delta)
        self.eps = eps
        self.delta = math.sqrt(eps) if delta is None else delta

    def describe(self) -> str:
        return (f"typical acceptance ε={self.eps:g}, δ={self.delta:g}: "
                "accept iff p(x) >= min(ε, δ·exp(-H(p))), else sample p")

    def allowed(self, p):
        return sets.eta_mask(p, self.eps, self.delta)

    def induced_form(self):
        return InducedForm("eta_set", eps=self.eps, delta=self.delta)

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
    taxonomy = "deferral"
    PARAMS = (CASCADE_RULE, ALPHA)

    def __init__(self, rule: str = "token_v3", alpha: float = 0.5) -> None:
        rule, alpha = CASCADE_RULE.check(self.name, rule), ALPHA.check(self.name, alpha)
        lo_hi = _ALPHA_RANGE.get(rule)
        if lo_hi is not None and not lo_hi[0] <= alpha <= lo_hi[1]:
            raise ValueError(f"cascade: alpha={alpha} is out of range for rule={rule}; "
                             f"expected {lo_hi[0]} <= alpha <= {lo_hi[1]}")
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

    def induced_form(self):
        if self.rule != "token_v3":
            return InducedForm("other")
        if self.alpha == 1:    # T holds every token: π = q
            return InducedForm("mixture", lam=0.0)
        # SpecCascade's law with p_base = 1 − α, but β = 1 − d(π, q) rather than q(A)
        return InducedForm("min_p_set", p_base=1 - self.alpha, acceptance_is_set_mass=False)
