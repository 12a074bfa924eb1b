"""Cactus: constrained-acceptance speculative sampling (docs/verification-rules.md §2.6).

Source. Hao, Mou. *Cactus: Accelerating Auto-Regressive Decoding with Constrained Acceptance Speculative
Sampling.* ICLR 2026 (arXiv 2604.04987); code github.com/MANGA-UOFA/Cactus at commit 3b01b81,
``cactus/cactus.py`` (``solve_constraint``, ``CactusRejectionSampler._get_accepted`` /
``_get_recovered_probs``, a subclass of vLLM's v0 rejection sampler) and the Triton kernel
``cactus/triton/rejection_sampling.py`` (the same rule, fused). The sources call the target ``q`` and
the draft ``p``; here, as everywhere in verispec, ``p`` is the target and ``q`` the draft.

Rule (``cactus:delta=δ``). At a position where the draft proposed ``x ~ q``, the target is replaced by
a *raised* target ``π_x`` that gives the drafted token more mass and scales every other token down in
proportion::

    t(x)   = min(1, p(x) + sqrt(2δ·p(x)(1 − p(x))))          the raised probability of x
    c(x)   = (1 − t(x)) / (1 − p(x))   (1 where p(x) = 1)     the factor on every other token
    π_x(v) = t(x) if v = x, else c(x)·p(v)

and ``x`` is verified against ``π_x`` as lossless SD would: accept with ``h(x) = min(1, t(x)/q(x))``;
on rejection draw from ``r_x = norm((π_x − q)_+)``; bonus ``z ~ p``. ``δ = 0`` gives ``π_x = p``:
lossless SD.

Where the raised probability comes from (verispec's derivation; the paper's text beyond its abstract
was not available). Among all distributions ``π`` with ``π(x) = t``, the Pearson divergence
``χ²(π‖p) = Σ (π − p)²/p`` is smallest when the other tokens keep ``p``'s proportions (Cauchy–Schwarz),
and then equals ``(t − p(x))² / (p(x)(1 − p(x)))``. So ``t(x)`` above is *exactly* the largest
``π(x)`` with ``½χ²(π‖p) ≤ δ``, and ``π_x`` the distribution that attains it: the code's formula is
the closed-form solution of "raise the drafted token as far as a ½χ² budget δ allows". For the KL
budget the README names, the optimal ``π`` has the same shape (proportional scaling, by the log-sum
inequality) and ``t`` is the root of the binary divergence ``kl(t‖p(x)) = δ``, which has no closed
form; ``½χ²`` is its second-order expansion around ``t = p(x)``, and ``KL(π_x‖p) <= log(1 + χ²) <=
log(1 + 2δ)`` bounds the KL the code's choice actually spends. verispec implements the code's ``t``.

Law. ``π_x`` depends on the drafted token, so this is not SD against one target and the law is not
``π``. With ``y(x) = min(q(x), t(x))`` (the yield) and ``m(x) = (q(x) − t(x))_+`` (the mass rejected
at ``x``), and since a rejection needs ``q(x) > t(x) >= p(x) >= c(x)p(x)`` (so ``r_x(x) = 0``)::

    P(v) = y(v) + Σ_x m(x) · (c(x)p(v) − q(v))_+ / F(c(x)),   F(c) = Σ_u (c·p(u) − q(u))_+
    β    = Σ_x min(q(x), t(x))

``F`` is piecewise linear in ``c`` with breakpoints at the ratios ``q/p``, so :meth:`closed_form`
evaluates the double sum in ``O(V log V)`` per row (two sorts and prefix sums) instead of ``O(V²)``;
:meth:`induced_mechanism` builds the ``V × V`` table of ``r_x`` token by token (for the tests).
True baseline: ``p``.

Deliberate differences from the source (none changes the law): a drafted token with ``q(x) = 0`` is
rejected here (the source's ratio is then ``inf``: such a token is never drafted); ``u < h`` (the
source: ``u < h`` in PyTorch, ``u·q < t`` in Triton); a residual without mass falls back to ``p`` (the
source's ``nan_to_num`` leaves zeros; it happens only through rounding).

Taxonomy: collaborative. Like lenience it keeps the lossless test's shape ``min(1, ·/q)`` and inflates
the target side at the drafted token, so the law moves from ``p`` towards the draft where the draft
overshoots, by an amount the budget bounds; it uses no target-side allowed set and no gate.
"""

from __future__ import annotations

import torch

from verispec.checks import MASS_EPS
from verispec.params import Param
from verispec.rules.base import (
    InducedForm,
    PerTokenRule,
    check_pair,
    normalize_or,
    positive_part,
    ratio,
)

DELTA = Param("delta", float, lambda v: v >= 0,
              "a number >= 0 (the divergence budget: ½χ²(π‖p) <= δ per drafted token; 0 = lossless SD)",
              "Cactus budget δ: raise the drafted token's target probability to p + sqrt(2δp(1-p))")


def raised(px: torch.Tensor, delta: float) -> torch.Tensor:
    """``t = min(1, p + sqrt(2δ·p(1 − p)))``: the drafted token's raised target probability (``[...]``)."""
    return (px + torch.sqrt((2 * delta * px * (1 - px)).clamp_min(0))).clamp(0.0, 1.0)


def scale(px: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``c = (1 − t)/(1 − p)``, the factor on the other tokens (1 where ``p = 1``: they have no mass)."""
    rest = 1 - px
    ok = rest > 0
    return torch.where(ok, (1 - t) / torch.where(ok, rest, torch.ones_like(rest)), torch.ones_like(px))


def raised_target(p: torch.Tensor, x: torch.Tensor, delta: float) -> torch.Tensor:
    """``π_x``: ``p: [..., V]``, ``x: [...]`` -> ``[..., V]`` (``t`` at ``x``, ``c·p`` elsewhere)."""
    idx = x.unsqueeze(-1)
    px = p.gather(-1, idx)
    t = raised(px, delta)
    return (p * scale(px, t)).scatter(-1, idx, t)


def _prefix(t: torch.Tensor) -> torch.Tensor:
    """``[..., V] -> [..., V+1]``: 0 followed by the running sums."""
    return torch.cat([torch.zeros_like(t[..., :1]), t.cumsum(-1)], -1)


class Cactus(PerTokenRule):
    """Cactus with budget ``δ``: verify the drafted token against the raised target ``π_x`` (module docstring)."""

    name = "cactus"
    family = "cactus"
    taxonomy = "collaborative"
    pointwise_acceptance = True
    PARAMS = (DELTA,)

    def __init__(self, delta: float) -> None:
        delta = DELTA.check(self.name, delta)
        super().__init__(delta=delta)
        self.delta = delta

    @property
    def is_lossless(self) -> bool:  # type: ignore[override]
        return self.delta == 0.0

    def describe(self) -> str:
        return (f"Cactus δ={self.delta:g}: raise the drafted token's target probability to p + sqrt(2δp(1-p)) "
                "(others scaled down), accept min(1, raised/q), resample norm((raised target - q)+)")

    def accept_prob(self, p, q, px, qx):
        return torch.clamp(ratio(raised(px, self.delta), qx), max=1.0)

    def correction_at(self, p, q, x):
        """``r_x = norm((π_x − q)_+)`` after rejecting ``x: [...]`` (fallback ``p``: rounding only)."""
        return normalize_or(positive_part(raised_target(p, x, self.delta) - q), p)

    def residual(self, p, q):
        """The rejection law averaged over the drafted token, ``(P − y)/(1 − β)`` (eq. 0.1 then holds).

        Consumers that need one residual per position (vLLM's batched chain path, trees with sampled
        children in the lossless setting) get the law of the emitted token; :meth:`verify` draws from
        :meth:`correction_at`, the source's per-token residual."""
        y = torch.minimum(q, raised(p, self.delta))
        return normalize_or(positive_part(self.closed_form(p, q) - y), p)

    def closed_form(self, p, q):
        """``y(v) + Σ_x m(x)·(c(x)p(v) − q(v))_+ / F(c(x))`` in ``O(V log V)`` per row (module docstring)."""
        t = raised(p, self.delta)
        c = scale(p, t)
        y = torch.minimum(q, t)
        m = positive_part(q - t)
        # F(c) = Σ_{u: q/p < c} (c·p(u) − q(u)), from the tokens sorted by their ratio q/p (inf where p = 0)
        has_p = p > 0
        rho = torch.where(has_p, q / torch.where(has_p, p, torch.ones_like(p)), torch.full_like(p, float("inf")))
        rho_sorted, order = rho.sort(-1)
        p_cum, q_cum = _prefix(p.gather(-1, order)), _prefix(q.gather(-1, order))
        below = torch.searchsorted(rho_sorted.contiguous(), c.contiguous(), right=False)
        mass = positive_part(c * p_cum.gather(-1, below) - q_cum.gather(-1, below))
        usable = (m > 0) & (mass > MASS_EPS)
        w = torch.where(usable, m / torch.where(usable, mass, torch.ones_like(mass)), torch.zeros_like(m))
        fallback = torch.where(usable, torch.zeros_like(m), m).sum(-1, keepdim=True)   # r_x falls back to p
        # Σ_x w(x)·(c(x)p(v) − q(v))_+ = p(v)·Σ_{c(x) > ρ(v)} w(x)c(x) − q(v)·Σ_{c(x) > ρ(v)} w(x)
        c_sorted, c_order = c.sort(-1)
        w_sorted = w.gather(-1, c_order)
        wc_tail = (w_sorted * c_sorted).flip(-1).cumsum(-1).flip(-1)
        w_tail = w_sorted.flip(-1).cumsum(-1).flip(-1)
        zero = torch.zeros_like(w_tail[..., :1])
        wc_tail, w_tail = torch.cat([wc_tail, zero], -1), torch.cat([w_tail, zero], -1)
        above = torch.searchsorted(c_sorted.contiguous(), rho.contiguous(), right=True)
        spill = positive_part(p * wc_tail.gather(-1, above) - q * w_tail.gather(-1, above))
        return y + spill + fallback * p

    def closed_form_acceptance(self, p, q):
        """``β = Σ_x min(q(x), t(x))``."""
        return torch.minimum(q, raised(p, self.delta)).sum(-1)

    def induced_mechanism(self, p, q):
        """The law the sampler realises, token by token: ``Σ_x q(x)[h(x)δ_x + (1 − h(x))·r_x]``.

        Builds the ``[..., V, V]`` table of ``r_x`` (for tests and small vocabularies)."""
        p, q = check_pair(p, q)
        vocab = p.shape[-1]
        tokens = torch.arange(vocab, device=p.device).expand(*p.shape[:-1], vocab)
        table = p.unsqueeze(-2).expand(*p.shape[:-1], vocab, vocab)
        r = self.correction_at(table, q.unsqueeze(-2).expand_as(table), tokens)      # [..., x, V]
        h = self.accept_prob_all(p, q)
        return (q.unsqueeze(-1) * (torch.diag_embed(h) + (1 - h).unsqueeze(-1) * r)).sum(-2)

    def induced_form(self):
        return InducedForm("target") if self.is_lossless else InducedForm("other")
