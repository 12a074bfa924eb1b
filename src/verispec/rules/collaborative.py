"""Collaborative verification: the draft and target probabilities are interpolated (docs/verification-rules.md §2).

* ``lenience:ell`` (Leviathan et al. App. A.5): ``h = min(1, p/(ℓq))``, lossless residual
  ``norm((p − q)_+)``; induced law eq. (2.3), bounded by ``p/ℓ``.
* ``cos_we:lam`` (CoS weighted ensemble, λ = weight on the **target**, the paper's convention):
  ``h = min(1, λp/q + 1 − λ)``, residual ``norm((p − q)_+)``; induced ``λp + (1 − λ)q``.
* ``cos_cd:mu`` (CoS contrastive): exact speculative sampling against ``π_CD ∝ p·q^{−μ}``.
  Deliberate deviation from the reference code (§2.3 (7)): the rule only sees processed
  probabilities, where top-k/top-p leave ``q = 0`` on tokens the target keeps, making ``q^{−μ}``
  infinite. We floor ``q`` at the smallest non-zero draft probability of the row, i.e. a token the
  draft truncated is treated as being as unlikely as its least likely kept token. Where ``q > 0``
  on all of ``supp(p)`` this is exactly ``π_CD``.
* ``ceiling:kappa,base=p|we|cd`` (overshoot ceiling). On ``base=p`` the yield form
  ``y = min(q, κp)``, ``h = min(1, κp/q)``, ``r = norm((p − y)_+)`` — identical to lenience with
  ``ℓ = 1/κ`` (tested). On a collaborative base ``π`` (``we``: ``π_WE`` with ``lam``; ``cd``:
  ``π_CD`` with ``mu``) exact speculative sampling against ``π^κ = norm(min(π, κp))``.

At temperature 0 (one-hot p and q) lenience and the ceiling on p collapse to exact matching; CoS
rules do not: their formula on one-hot rows mixes the two argmaxes (``λδ_{argmax p} + (1 − λ)δ_{argmax q}``
for CoS-WE) and their true baseline stays ``p`` (docs/verification-rules.md §2.2(7)).
"""

from __future__ import annotations

import torch

from verispec.params import Param, in_range, one_of
from verispec.rules.base import (
    ExactTargetRule,
    InducedForm,
    PerTokenRule,
    check_pair,
    normalize_or,
    positive_part,
    ratio,
    total_variation,
)

ELL = Param("ell", float, in_range(0, 1, lo_open=True), "a number with 0 < ell <= 1", "lenience ℓ (1 = lossless)")
LAM = Param("lam", float, in_range(0, 1), "a number with 0 <= lam <= 1", "CoS-WE weight λ on the target", 0.5)
MU = Param("mu", float, in_range(0, 1), "a number with 0 <= mu <= 1", "CoS-CD contrast strength μ", 0.1)
KAPPA = Param("kappa", float, lambda v: v >= 1, "a number >= 1", "ceiling κ on P/p (κ = 1/ℓ)")
BASE = Param("base", str, one_of("p", "we", "cd"), "one of p, we, cd", "collaborative base under the ceiling", "p")


def lossless_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return normalize_or(positive_part(p - q), p)


class Lenience(PerTokenRule):
    name = "lenience"
    family = "lenience"
    taxonomy = "collaborative"
    pointwise_acceptance = True
    PARAMS = (ELL,)

    def __init__(self, ell: float) -> None:
        ell = ELL.check(self.name, ell)   # built directly or from a spec: the same validation
        super().__init__(ell=ell)
        self.ell = ell

    @property
    def is_lossless(self) -> bool:  # type: ignore[override]
        return self.ell == 1.0

    def describe(self) -> str:
        return f"lenience ℓ={self.ell:g}: accept min(1, p/(ℓq)), lossless residual; P_R <= p/ℓ"

    def accept_prob(self, p, q, px, qx):
        return torch.clamp(ratio(px, qx) / self.ell, max=1.0)

    def residual(self, p, q):
        return lossless_residual(p, q)

    def closed_form(self, p, q):
        """Eq. (2.3): adaptive mixture where q <= p, q where p < q < p/ℓ, p/ℓ where q >= p/ℓ."""
        cap = p / self.ell
        rejection = 1 - torch.minimum(q, cap).sum(-1, keepdim=True)           # ρ, eq. (2.1)
        tv = total_variation(p, q).unsqueeze(-1)
        delta = torch.where(tv > 0, rejection / torch.where(tv > 0, tv, torch.ones_like(tv)), torch.ones_like(tv))
        under = delta * p + (1 - delta) * q
        return torch.where(q <= p, under, torch.where(q < cap, q, cap))

    def closed_form_acceptance(self, p, q):
        """``½ + 1/(2ℓ) − ½‖q − p/ℓ‖₁``."""
        return 0.5 + 0.5 / self.ell - 0.5 * (q - p / self.ell).abs().sum(-1)

    def induced_form(self):
        return InducedForm("capped", ell=self.ell)


class CosWE(PerTokenRule):
    name = "cos_we"
    family = "cos_we"
    taxonomy = "collaborative"
    pointwise_acceptance = True
    PARAMS = (LAM,)

    def __init__(self, lam: float = 0.5) -> None:
        lam = LAM.check(self.name, lam)
        super().__init__(lam=lam)
        self.lam = lam

    @property
    def is_lossless(self) -> bool:  # type: ignore[override]
        return self.lam == 1.0

    def describe(self) -> str:
        return f"CoS weighted ensemble λ={self.lam:g}: emits λp + (1-λ)q (no ceiling on P/p)"

    def ensemble(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return self.lam * p + (1 - self.lam) * q

    def accept_prob(self, p, q, px, qx):
        return torch.clamp(self.lam * ratio(px, qx) + (1 - self.lam), max=1.0)

    def residual(self, p, q):
        # norm((π_WE − q)_+) = norm((λ(p − q))_+) = norm((p − q)_+) for λ > 0.
        return lossless_residual(p, q)

    def closed_form(self, p, q):
        return self.ensemble(p, q)

    def closed_form_acceptance(self, p, q):
        return 1 - self.lam * total_variation(p, q)

    def induced_form(self):
        return InducedForm("mixture", lam=self.lam)

    def reference(self, p, q=None, *, own_target=False):
        if own_target:
            if q is None:
                raise ValueError("cos_we: its own target λp + (1-λ)q depends on the draft; pass q")
            p, q = check_pair(p, q)
            return self.ensemble(p, q)
        return super().reference(p, q)


def contrastive_target(p: torch.Tensor, q: torch.Tensor, mu: float) -> torch.Tensor:
    """``π_CD ∝ p·q̃^{−μ}`` on ``supp(p)``, ``q̃ = max(q, smallest positive q of the row)``."""
    big = torch.finfo(q.dtype).max
    q_floor = torch.where(q > 0, q, torch.full_like(q, big)).amin(-1, keepdim=True)
    q_tilde = torch.maximum(q, q_floor)
    logits = torch.where(p > 0, p.clamp_min(torch.finfo(p.dtype).tiny).log() - mu * q_tilde.log(),
                         torch.full_like(p, -torch.inf))
    return torch.softmax(logits, dim=-1)


class CosCD(ExactTargetRule):
    name = "cos_cd"
    family = "cos_cd"
    taxonomy = "collaborative"
    PARAMS = (MU,)

    def __init__(self, mu: float = 0.1) -> None:
        mu = MU.check(self.name, mu)
        super().__init__(mu=mu)
        self.mu = mu

    @property
    def is_lossless(self) -> bool:  # type: ignore[override]
        return self.mu == 0.0

    def describe(self) -> str:
        return f"CoS contrastive μ={self.mu:g}: exact SD against π ∝ p·q^(-μ)"

    def target(self, p, q):
        return contrastive_target(p, q, self.mu)


class CeilingOnTarget(PerTokenRule):
    """``ceiling:kappa,base=p``: the yield form ``y = min(q, κp)`` of the overshoot ceiling."""

    name = "ceiling"
    family = "ceiling"
    taxonomy = "collaborative"
    pointwise_acceptance = True
    PARAMS = (KAPPA, BASE)

    def __init__(self, kappa: float, base: str = "p") -> None:
        kappa = KAPPA.check(self.name, kappa)
        if base != "p":
            raise ValueError(f"ceiling: CeilingOnTarget is the ceiling on base=p, got base={base!r}")
        super().__init__(kappa=kappa, base=base)
        self.kappa = kappa

    @property
    def is_lossless(self) -> bool:  # type: ignore[override]
        return self.kappa == 1.0

    def describe(self) -> str:
        return f"overshoot ceiling κ={self.kappa:g} on p: keep the draft where q <= κp, cap it at κp elsewhere"

    def accept_prob(self, p, q, px, qx):
        return torch.clamp(self.kappa * ratio(px, qx), max=1.0)

    def residual(self, p, q):
        return normalize_or(positive_part(p - torch.minimum(q, self.kappa * p)), p)

    def closed_form(self, p, q):
        """``min(q, κp) + ρ·norm((p − min(q, κp))_+)`` with ``ρ = 1 − Σ min(q, κp)``."""
        kept = torch.minimum(q, self.kappa * p)
        rejection = (1 - kept.sum(-1, keepdim=True)).clamp_min(0)
        return kept + rejection * normalize_or(positive_part(p - kept), p)

    def induced_form(self):
        return InducedForm("capped", ell=1.0 / self.kappa)   # lenience with ℓ = 1/κ (tested)


class CeilingOnEnsemble(ExactTargetRule):
    """``ceiling:kappa,base=we|cd``: exact SD against ``π^κ = norm(min(π, κp))``."""

    name = "ceiling"
    family = "ceiling"
    taxonomy = "collaborative"
    PARAMS = (KAPPA, BASE, LAM, MU)

    def __init__(self, kappa: float, base: str, lam: float | None = None, mu: float | None = None) -> None:
        kappa = KAPPA.check(self.name, kappa)
        lam = None if lam is None else LAM.check(self.name, lam)
        mu = None if mu is None else MU.check(self.name, mu)
        if base == "we":
            if mu is not None:
                raise ValueError("ceiling: base=we takes lam, not mu")
            lam = LAM.default if lam is None else lam
            super().__init__(kappa=kappa, base=base, lam=lam)
        elif base == "cd":
            if lam is not None:
                raise ValueError("ceiling: base=cd takes mu, not lam")
            mu = MU.default if mu is None else mu
            super().__init__(kappa=kappa, base=base, mu=mu)
        else:
            raise ValueError(f"ceiling: CeilingOnEnsemble needs base we or cd, got {base!r}")
        self.kappa, self.base, self.lam, self.mu = kappa, base, lam, mu

    def describe(self) -> str:
        knob = f"λ={self.lam:g}" if self.base == "we" else f"μ={self.mu:g}"
        return (f"overshoot ceiling κ={self.kappa:g} on CoS-{self.base.upper()} ({knob}): "
                "exact SD against norm(min(π, κp))")

    def base_target(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        if self.base == "we":
            return self.lam * p + (1 - self.lam) * q
        return contrastive_target(p, q, self.mu)

    def target(self, p, q):
        capped = torch.minimum(self.base_target(p, q), self.kappa * p)
        return normalize_or(capped, p)


def make_ceiling(kappa: float, base: str = "p", lam: float | None = None, mu: float | None = None):
    if base == "p":
        if lam is not None or mu is not None:
            raise ValueError("ceiling: base=p takes no lam/mu (give base=we or base=cd)")
        return CeilingOnTarget(kappa, base)
    return CeilingOnEnsemble(kappa, base, lam=lam, mu=mu)
