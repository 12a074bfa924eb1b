"""Mentored decoding: the largest acceptance a KL budget on the emitted law allows.

Primary sources. V. Tran-Thien, *An optimal lossy variant of speculative decoding* (blog, 2023:
huggingface.co/blog/vivien/optimal-lossy-variant-of-speculative-decoding) and its supplementary
material, github.com/vivien000/mentored_decoding: ``proof.pdf`` (the optimisation problem §1, its
KKT solution §4, Algorithm 1 §6) and ``notebook.ipynb`` (``mentored_sampling``). The later paper
V. Tran-Thien, R. Nock, *Mentored Decoding: Faster Inference meets Boosting* (arXiv 2609.30474; only
its abstract was reachable) generalises the budget to every f-divergence; the KL case implemented here
is the one of the blog, proof and notebook. **The sources write p for the draft and q for the target;
below, as everywhere in verispec, p is the target and q the draft.**

Problem (proof §1). Over all single-position rules ``(h, r)`` maximise the acceptance ``Σ q·h``
subject to ``KL(p‖π) = Σ p log(p/π) <= D`` (nats), ``π`` the emitted law (eq. 0.1). Solution (proof
§4): two numbers ``α <= 1 <= β`` such that ``p/π`` is ``α`` on the tokens the draft overshoots,
``β`` on those it undershoots, and ``π = q`` between::

    h(x) = min(1, p(x)/(α q(x)))      r ∝ (p/β − q)_+      π = clip(q, p/β, p/α)       (M.1)

(``clip(q, lo, hi) = min(max(q, lo), hi)``). ``α = β = 1`` is lossless speculative sampling.

The mechanism induces (M.1) exactly when β normalises π (the algebra the tests check):

* yield ``y = q·h = min(q, p/α)``, acceptance ``A = Σ min(q, p/α)``; rejected mass
  ``1 − A = Σ (q − p/α)_+`` (plus ``q`` off ``supp p``, where ``h = 0``);
* the residual's mass ``Σ (p/β − q)_+`` sits where ``q < p/β <= p/α``, i.e. where ``y = q``;
* eq. (0.1): ``π = y + (1 − A)·(p/β − q)_+ / Σ (p/β − q)_+``. Under the consistency condition

      Σ (p/β − q)_+ = 1 − A                                                              (M.2)

  (proof eqs. 25 and 28, both equal to ``1 − R``) this is ``min(q, p/α) + (p/β − q)_+``, which is
  ``clip(q, p/β, p/α)`` token by token because ``p/β <= p/α``; and (M.2) is exactly ``Σ π = 1``.
* (M.2) has a solution with ``α <= 1 <= β`` (possibly ``β = ∞``): ``g(t) = Σ (t p − y)_+``
  (``t = 1/β``) is continuous and non-decreasing, ``g(0) = 0 <= 1 − A``; at ``t = 1/α``
  ``g − (1 − A) = 1/α − 1 >= 0``; at ``t = 1`` ``g >= Σ (p − q)_+ >= 1 − A``. :func:`normalising_beta`
  solves it exactly (no iteration): sort by ``q/p``; ``g`` is linear between the breakpoints
  ``c_k = y_k/p_k``, ``g(c_k) = c_k P_k − Y_k`` (prefix sums of ``p`` and ``y``); with ``k`` the last
  breakpoint where ``g(c_k) <= 1 − A``, ``t = (1 − A + Y_k)/P_k``.

α per position (budget mode, ``mentored:D``). Along the family ``α ∈ [0, 1]`` the acceptance
``A(α)`` and ``KL(p‖π_α)`` both decrease (proof §4, §6; tested), ``KL = 0`` at ``α = 1``. The
rule takes the smallest α with ``KL <= D``: ``α = 0`` if that endpoint is within budget, else a
bisection on ``log α`` over ``[log α_min, 0]`` in float64, batched over rows, where ``α_min`` is the
smallest ``p/q`` on the common support (no token is capped below it, so the law there is the ``α = 0``
law, already over budget). :data:`BISECTION_STEPS` = 40 halvings keep the feasible end: the returned α
satisfies ``KL(p‖π) <= D`` (up to float64 rounding of the KL sum) and lies above the optimal α by a
factor at most ``exp(log(1/α_min)/2^40)`` — a relative ``<= 6.8e-10`` for any float64 ``α_min``
(:data:`LOG_ALPHA_TOLERANCE`; ``≈ 4e-11`` for ``α_min ≈ 1e-17``). A bisection on α itself would not do:
with tiny target probabilities under large draft ones the optimal α can be ``1e-13`` or smaller.
Where ``0 < α`` the budget binds (``KL = D`` at the optimum, proof §3 eq. 7). β then follows from
(M.2). :meth:`Mentored.solve` computes ``(α, β)`` once per row; the sampler (``verify``), the closed
form (``induced``) and ``acceptance_rate`` all read them, so sampler and law agree exactly. ``D = 0``
is lossless (``α = β = 1``, set exactly).

Fixed-α mode (``mentored:alpha``): the sources index every optimal solution by α (proof §6: "we can
build all solutions ... with α varying from 0 to 1"); ``alpha=`` fixes it (β from (M.2)), which is
the minimal-KL law at acceptance ``Σ min(q, p/α)`` (proof §4, the auxiliary problem).

Relation to lenience and the overshoot ceiling (docs/verification-rules.md §2.1, §2.4; tested). Mentored decoding with a
fixed ``α = ℓ`` has **the same** ``h = min(1, p/(ℓq))``, yield ``min(q, p/ℓ)``, acceptance and
ceiling ``π <= p/ℓ`` as ``lenience:ell=ℓ`` = ``ceiling:kappa=1/ℓ`` (base p), and the same law on
``{q >= p}``. They differ only in where the rejected mass goes: lenience keeps the lossless residual,
i.e. it is the mechanism (M.1) with ``β`` forced to 1 rather than normalising, and spreads the mass
``∝ (p − q)_+`` (law ``Δp + (1 − Δ)q`` on ``{q < p}``, eq. 2.3); mentored decoding water-fills the
most under-estimated tokens up to the common level ``p/β`` (``max(q, p/β)`` on ``{q < p}``). Given
the yield, ``max(y, p/β)`` is the minimiser of ``KL(p‖π)`` over all residuals, so
``KL(p‖mentored_ℓ) <= KL(p‖lenience_ℓ)`` at identical acceptance, with equality iff the laws agree
(for instance when ``q/p`` is constant on ``{q < p}``). Both laws exceed ``p`` only on the capped
overshoot tokens, so ``TV(π, p) = A − (1 − d(p, q))`` for both: the least TV any rule with acceptance
``A`` can have (``d(p, q) <= TV(π, p) + d(π, q)`` and ``d(π, q) <= 1 − A``); at equal acceptance TV does
not tell them apart, KL(p‖·) does. The budget mode picks α per position so that ``KL = D``, where
lenience keeps one ℓ for all positions; its likelihood-ratio ceiling ``max π/p = 1/α`` then varies
by position and is large where the budget is loose, since ``KL(p‖π)`` barely charges overshoot on
tokens ``p`` finds unlikely (on random pairs at equal mean acceptance: lower mean KL than lenience,
equal TV, a much larger ``max π/p``).

Place in the taxonomy: **collaborative** (the emitted law interpolates the draft and the target:
``q`` where they roughly agree, capped or raised relative to ``p`` elsewhere). Lossy for ``D > 0``
(``α < 1``); true baseline: the plain processed target ``p``.

Deliberate differences from the sources, with reasons:

1. Support. The sources assume every probability positive (proof footnote 1; the notebook adds
   ``1e-12`` to both distributions), and accept every draft when ``KL(p‖q) <= D`` (notebook quick
   path, proof §6), which would emit tokens the processed target excludes (top-k/top-p zeros) — a
   distortion ``KL(p‖π)`` does not charge. Here ``π`` is restricted to ``supp p``: ``h = 0`` and
   ``π = 0`` where ``p = 0``, and the ``α = 0`` endpoint is ``π = max(q, p/β)`` on ``supp p``
   (acceptance ``q(supp p)``). Where ``supp q ⊆ supp p`` (in particular with full supports, the
   sources' setting) this is exactly the sources' solution (``α = 0``: ``π = q``, accept always).
   Under the restriction the clip form is still optimal (KKT of the concave problem; tested against
   random feasible laws).
2. Budget accuracy. The sources stop the bisection once ``KL ∈ [(1 − γ)D, (1 + γ)D]`` (notebook:
   ``γ = 0.2``, at most 10 steps), so the emitted law may exceed the budget by up to 20 %; here the
   budget is never exceeded and the bisection runs a fixed number of steps (above).
3. The notebook first tests ``u·q(x) < p(x)`` (plain SD acceptance) before computing α, a shortcut
   with the same law since ``h >= min(1, p/q)``; here α is computed for every position (batched).
"""

from __future__ import annotations

import math

import torch

from verispec.params import Param, in_range
from verispec.rules.base import (
    InducedForm,
    PerTokenRule,
    as_float,
    check_verify_inputs,
    normalize_or,
    positive_part,
    ratio,
    run_chain,
)

#: Halvings of the ``log α`` bracket in budget mode.
BISECTION_STEPS = 40
#: Worst-case width of the final ``log α`` bracket: ``log(1/α_min) / 2^40`` with ``α_min`` at least the
#: smallest positive float64 (the returned α is at most this much above the optimum, relatively).
LOG_ALPHA_TOLERANCE = -math.log(math.ulp(0.0)) / 2.0 ** BISECTION_STEPS
#: Default KL budget (nats): the smallest non-zero budget of the notebook's experiments.
DEFAULT_D = 0.1

D_BUDGET = Param("D", float, lambda v: v >= 0, "a number >= 0 (budget on KL(p‖π) in nats; 0 = lossless)",
                 "KL(p‖π) budget per position, nats", DEFAULT_D)
FIXED_ALPHA = Param("alpha", float, in_range(0, 1), "a number with 0 <= alpha <= 1 (1 = lossless) or none",
                    "fixed α instead of a budget", "none", nullable=True)


# -- the per-row solve (float64, rows [N, V]) ----------------------------------------------------------

class _SortedRows:
    """Rows of ``p, q: [N, V]`` reordered by ``ρ = q/p`` ascending; tokens with ``p = 0`` last (``ρ = ∞``).

    The order is the same for every α (``y/p = min(ρ, 1/α)`` is monotone in ρ), so it is computed once
    and the bisection only re-scans prefix sums.
    """

    def __init__(self, p: torch.Tensor, q: torch.Tensor) -> None:
        on = p > 0
        rho = torch.where(on, q / torch.where(on, p, torch.ones_like(p)), torch.full_like(p, math.inf))
        rho, order = rho.sort(-1)
        self.rho = rho
        self.p = p.gather(-1, order)
        self.q = q.gather(-1, order)
        self.on = self.p > 0
        self.off_supp = torch.where(self.on, 0.0, math.inf).to(p.dtype)   # added to g: never a breakpoint
        self.P = self.p.cumsum(-1)
        self.p_log_p = torch.xlogy(self.p, self.p).sum(-1)

    def yield_(self, alpha: torch.Tensor) -> torch.Tensor:
        """``y = min(q, p/α)`` on ``supp p``, 0 elsewhere; ``α: [N]`` (0 allowed: ``y = q``)."""
        capped = self.p / alpha.unsqueeze(-1)            # p/0 = ∞ on supp p; off supp p masked below
        return torch.where(self.on, torch.minimum(self.q, capped), torch.zeros_like(self.q))

    def inv_beta(self, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(t = 1/β, y)`` solving (M.2) exactly for ``α: [N]``: ``t [N]`` in ``[0, 1]``, ``y [N, V]``."""
        y = self.yield_(alpha)
        rejected = (1 - y.sum(-1)).clamp_min(0)
        Y = y.cumsum(-1)
        level = torch.minimum(self.rho, alpha.reciprocal().unsqueeze(-1))   # breakpoints c_k = y_k/p_k
        fill = level * self.P - Y + self.off_supp                            # g(c_k), non-decreasing in k
        k = ((fill <= rejected.unsqueeze(-1)).sum(-1, keepdim=True) - 1).clamp_min(0)   # last c_k with g <= 1 − A
        t = (rejected + Y.gather(-1, k)[:, 0]) / self.P.gather(-1, k)[:, 0]
        t = t.clamp(0.0, 1.0)                                # β >= 1 (exact arithmetic; rounding)
        return torch.where(alpha == 1, torch.ones_like(t), t), y

    def kl(self, alpha: torch.Tensor) -> torch.Tensor:
        """``KL(p‖π_α)`` per row, ``π_α = max(y, p/β)`` (= the clip), ``inf`` where π misses ``supp p``."""
        t, y = self.inv_beta(alpha)
        law = torch.maximum(y, self.p * t.unsqueeze(-1))
        return self.p_log_p - torch.xlogy(self.p, law).sum(-1)


def budget_alpha(rows: _SortedRows, D: float) -> torch.Tensor:
    """The smallest ``α ∈ [0, 1]`` with ``KL(p‖π_α) <= D`` (to :data:`LOG_ALPHA_TOLERANCE` in ``log α``), ``[N]``."""
    zero = torch.zeros(rows.p.shape[0], dtype=rows.p.dtype, device=rows.p.device)
    common = rows.on & (rows.q > 0)
    ratio_min = torch.where(common, rows.p / torch.where(common, rows.q, torch.ones_like(rows.q)),
                            torch.full_like(rows.p, math.inf)).amin(-1)
    lo = ratio_min.clamp(max=1.0).log()          # α <= α_min: nothing capped, the law of α = 0 (over budget)
    hi = torch.zeros_like(lo)                    # α = 1: π = p, KL = 0
    for _ in range(BISECTION_STEPS):             # invariant: KL(e^hi) <= D < KL(e^lo)
        mid = 0.5 * (lo + hi)
        ok = rows.kl(mid.exp()) <= D
        hi = torch.where(ok, mid, hi)
        lo = torch.where(ok, lo, mid)
    return torch.where(rows.kl(zero) <= D, zero, hi.exp())


def normalising_beta(p: torch.Tensor, q: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """β of (M.2) for given ``α``: ``p, q: [..., V]``, ``alpha: [...]`` -> ``[...]`` float64 in ``[1, ∞]``."""
    shape = p.shape[:-1]
    rows = _SortedRows(p.double().reshape(-1, p.shape[-1]), q.double().reshape(-1, q.shape[-1]))
    t, _ = rows.inv_beta(alpha.double().reshape(-1))
    return t.reciprocal().reshape(shape)


# -- the rule ------------------------------------------------------------------------------------------

class Mentored(PerTokenRule):
    """``mentored:D`` (KL budget per position) or ``mentored:alpha`` (fixed α); see the module docstring."""

    name = "mentored"
    family = "mentored"
    taxonomy = "collaborative"
    pointwise_acceptance = False          # h depends on α, a statistic of the whole row
    PARAMS = (D_BUDGET, FIXED_ALPHA)

    def __init__(self, D: float | None = None, alpha: float | None = None) -> None:   # D: the sources' name
        alpha = FIXED_ALPHA.check(self.name, alpha)
        if alpha is not None:
            if D is not None:
                raise ValueError("mentored: give either D (a KL budget) or alpha (a fixed α), not both; "
                                 "e.g. mentored:D=0.1 or mentored:alpha=0.5")
            super().__init__(alpha=alpha)
        else:
            D = D_BUDGET.check(self.name, DEFAULT_D if D is None else D)
            super().__init__(D=D)
        self.D: float | None = D
        self.alpha: float | None = alpha

    @property
    def is_lossless(self) -> bool:  # type: ignore[override]
        return self.D == 0.0 or self.alpha == 1.0

    def describe(self) -> str:
        law = "accept min(1, p/(αq)), residual (p/β − q)_+, law clip(q, p/β, p/α)"
        if self.alpha is not None:
            return f"mentored decoding, fixed α={self.alpha:g}: {law}; β normalises"
        return (f"mentored decoding D={self.D:g} nats: {law}; per position the smallest α with "
                "KL(p‖π) <= D, β normalises")

    def induced_form(self):
        return InducedForm("target") if self.is_lossless else InducedForm("other")

    # -- α and β, once per row -----------------------------------------------------------------------
    def solve(self, p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(α, β)`` per row: ``p, q: [..., V]`` -> two float64 ``[...]``; ``0 <= α <= 1 <= β <= ∞``
        (``β = ∞`` where nothing is ever rejected, so no residual is needed)."""
        shape, vocab = p.shape[:-1], p.shape[-1]
        if self.is_lossless:
            one = torch.ones(shape, dtype=torch.float64, device=p.device)
            return one, one.clone()
        rows = _SortedRows(p.double().reshape(-1, vocab), q.double().reshape(-1, vocab))
        if self.alpha is not None:
            alpha = torch.full((rows.p.shape[0],), self.alpha, dtype=torch.float64, device=p.device)
        else:
            alpha = budget_alpha(rows, self.D)
        beta = rows.inv_beta(alpha)[0].reciprocal()
        return alpha.reshape(shape), beta.reshape(shape)

    @staticmethod
    def _h(px: torch.Tensor, qx: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """``min(1, p/(αq))`` for ``px, qx: [..., K]``, ``alpha: [...]``; 0 where ``p = 0`` or ``q = 0``."""
        r = ratio(px.double(), qx.double())
        return torch.where(r > 0, torch.clamp(r / alpha.unsqueeze(-1), max=1.0), torch.zeros_like(r))

    @staticmethod
    def _residual(p: torch.Tensor, q: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """``norm((p/β − q)_+)`` (fallback ``p``) for ``p, q: [..., V]``, ``beta: [...]``."""
        p64 = p.double()
        return normalize_or(positive_part(p64 / beta.unsqueeze(-1) - q.double()), p64).to(p.dtype)

    @staticmethod
    def _clip(p: torch.Tensor, q: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """``clip(q, p/β, p/α)``, 0 where ``p = 0`` (float64 ``[..., V]``)."""
        p64, q64 = p.double(), q.double()
        cap = torch.where(p64 > 0, p64 / alpha.unsqueeze(-1), torch.zeros_like(p64))   # p/α (∞ on supp p at α = 0)
        return torch.maximum(torch.minimum(q64, cap), p64 / beta.unsqueeze(-1))

    # -- PerTokenRule API ----------------------------------------------------------------------------
    def accept_prob(self, p, q, px, qx):
        alpha, _ = self.solve(p, q)
        return self._h(px, qx, alpha).to(as_float(px).dtype)

    def residual(self, p, q):
        _, beta = self.solve(p, q)
        return self._residual(p, q, beta)

    def closed_form(self, p, q):
        """(M.1): ``clip(q, p/β, p/α)`` with ``(α, β)`` from :meth:`solve`."""
        alpha, beta = self.solve(p, q)
        return self._clip(p, q, alpha, beta).to(p.dtype)

    def closed_form_acceptance(self, p, q):
        """``Σ min(q, p/α)`` (0 contribution where ``p = 0``)."""
        alpha, _ = self.solve(p, q)
        p64 = p.double()
        cap = torch.where(p64 > 0, p64 / alpha.unsqueeze(-1), torch.zeros_like(p64))
        return torch.minimum(q.double(), cap).sum(-1).to(p.dtype)

    # -- the chain verifier: (α, β) once per position --------------------------------------------------
    def verify(self, p, q, draft, generator=None):
        """Chain verification. ``p: [B, G+1, V]``, ``q: [B, G, V]``, ``draft: [B, G]`` ->
        ``(n_accepted: [B] int64 in [0, G], next_token: [B] int64)``."""
        p, q, draft = check_verify_inputs(p, q, draft)
        gamma = draft.shape[1]
        alpha, beta = self.solve(p[:, :gamma], q)                                   # [B, G] each
        idx = draft.unsqueeze(-1)
        h = self._h(p[:, :gamma].gather(-1, idx), q.gather(-1, idx), alpha)[..., 0]   # [B, G]
        return run_chain(h, lambda rows, at: self._residual(p[rows, at], q[rows, at], beta[rows, at]),
                         self.bonus(p[:, gamma]), generator)
