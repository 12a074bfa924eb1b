"""Exact per-position distortion and speed measures of verification rules, and their corpus summaries.

Measures (per position; ``P = rule.induced(p, q)``, ``Ref = rule.reference(p, q)``, all in float64)
===================================================================================================

=================== ===============================================================================
``tv``              ``½‖P − Ref‖₁``
``kl``              ``KL(P ‖ Ref)`` in nats; ``inf`` when ``P`` puts mass where ``Ref = 0`` (every
                    truncation rule that leaks tail mass; summaries also give its quantiles and the
                    fraction of infinite values)
``kl_reverse``      ``KL(Ref ‖ P)``: the finite companion of ``kl`` for truncation rules (their
                    ``P`` covers the baseline's support); ``inf`` when ``P`` drops baseline tokens
``overshoot``       ``Σ_v (P(v) − p(v))_+`` (mass pushed above the *target* ``p``)
``ceiling_ratio``   ``max_{v: p(v)>0} P(v)/p(v)``; ``inf`` if ``P`` puts mass where ``p = 0``
``tail_leak``       ``P(supp(Ref)ᶜ)``: mass emitted outside the true baseline's support
``acceptance``      per-position acceptance probability ``β`` (closed form of the rule)
``tokens_per_call`` ``(1 − β^{γ+1})/(1 − β)`` (``γ + 1`` at ``β = 1``): expected tokens per target call
                    for i.i.d. positions with this β
=================== ===============================================================================

Induced probabilities with ``P(v) <= 1e-10·p(v)`` are set to exactly 0 first (:func:`snap`): closed
forms leave rounding residue (e.g. ``(1 − q(A))·p`` with ``q(A) = 1`` up to rounding) that would
otherwise make ``kl`` infinite for a rule that leaks nothing.

Lossless sequence-level rules (``block``, ``hsd``) have no per-position law; their sequence law is ``p``,
so the distortion measures are 0, ``ceiling_ratio`` is 1 and ``acceptance``/``tokens_per_call``
are NaN ("n/a" in summaries). :func:`recorded_block_efficiency` gives an exact replacement for the
latter computed from recorded draft blocks. Lossy sequence-level rules (FLy, the HSD variants that are
not lossless) and settings that read raw distributions are refused (:func:`check_measurable`).

Compression error (measures on :class:`~verispec.diagnose.record.PositionRecorder` records)
==========================================================================================
:func:`measure_records` applies the rule to the coarsened pair ``(p̄, q̄)`` (kept tokens + one rest
bucket) and returns, next to every measure ``m``, a per-position bound ``err_<m>`` with
``|m(p, q) − m_records| <= err_<m>`` (up to floating-point rounding: the kept values are float32,
so allow ~1e-6 relative). Where a measure's exact value is computable from the stored statistics it
is reported instead of the coarse one (noted below). Notation: ``K`` kept tokens, ``R`` the rest,
``a = p(R)``, ``b = q(R)``; ``t⁺ = max_R q/p``, ``t⁻ = min_R q/p``, ``H`` the exact target entropy
(all stored in the record).

* ``a = b = 0`` (whole supports kept; always the case with top-k/top-p): every rule treats the
  zero bucket and the zero padding as absent tokens, so **every measure is exact** (bound 0).
* Lossless, block, hsd: ``P = Ref`` is a function of ``p`` alone: distortion bound 0.
  Lossless acceptance ``1 − d(p, q)``: the coarse ``d`` misses ``Σ_R (p−q)_+ − (a−b)_+ <= min(a, b)``.
* Greedy: ``P = Ref = δ_argmax``: distortion 0 on any record; overshoot, ceiling and acceptance
  exact whenever ``argmax p ∈ K`` and the bucket is below ``max_K p`` (else ``inf``).
* CoS-WE ``λ`` (``P = λp + (1−λ)q`` is linear, so exact on ``K``; only the split inside ``R`` is
  unknown): ``tv``, ``overshoot`` ``<= (1−λ)·min(a, b)``; ``tail_leak`` reported exactly (coarse
  value + ``(1−λ)·q(R ∩ {p=0})``); ``ceiling_ratio`` reported exactly: ``max(K part, λ + (1−λ)t⁺)``,
  ``inf`` if ``q(R ∩ {p=0}) > 0``; ``kl`` reported exactly as ``inf`` in that case, otherwise the rest
  contributes between ``x·log(x/a)`` (log-sum inequality; this is what the coarse
  bucket gives) and ``x·log(λ + (1−λ)t⁺)`` with ``x = P(R)``; ``kl_reverse`` likewise with
  ``a·log(1/(λ + (1−λ)t⁻))``; acceptance ``1 − λd``: ``<= λ·min(a, b)``.
* Lenience ``ℓ`` / ceiling ``κ = 1/ℓ`` on ``p``: ``P`` on ``K`` is exact except through the adaptive
  weight ``Δ = ρ/d``; with ``Σ_R min(q, p/ℓ) ∈ [0, min(b, a/ℓ)]`` and ``Σ_R (p−q)_+ ∈ [(a−b)_+, a]``
  the true ``Δ`` lies in a computable interval, whose half-width ``w`` gives ``‖P_K − P̄_K‖₁ <= e =
  w·Σ_K(p−q)_+`` and ``|P(R) − P̄(R)| <= e`` (mass conservation). Then ``tv <= e + min(P̄(R) + e, a)``
  (``½Σ|x−y| − ½|Σx−Σy| <= min(Σx, Σy)`` on ``R``); ``overshoot <= max(min(b, (1/ℓ−1)a), e)``
  (``P <= min(q, p/ℓ)`` where ``q > p``); ``tail_leak = 0`` (``P <= p/ℓ``); ``ceiling_ratio`` reported
  exactly: ``max(1, min(q/p, 1/ℓ) on K where q > p, min(t⁺, 1/ℓ))``; ``kl``/``kl_reverse``: Lipschitz bound in
  ``Δ`` on ``K`` (derivatives bounded with ``Δ >= Δ_lo``) plus the rest-bucket sandwich as for CoS-WE
  with ``sup_R P/p <= max(1, min(t⁺, 1/ℓ))`` and ``inf_R P/p >= min(1, Δ_lo + (1−Δ_lo)t⁻)``;
  acceptance ``Σ min(q, p/ℓ)``: ``<= min(b, a/ℓ)``.
* SpecCascade ``p_base > 0`` / cascade ``token_v3`` (min-p set ``A``) and typical (η set): if the
  certificate "no rest token and not the bucket can be in ``A``, and every kept token has the same
  membership under the coarse and the true threshold" holds (min-p: ``a, max_R p < p_base·max_K p``;
  η: ``a, max_R p`` below both thresholds ``min(ε, δe^{−H})`` / ``min(ε, δe^{−H̄})`` and no kept token
  between them), the coarse computation reproduces ``A``, ``q(A)``, ``P`` on ``K`` and
  ``P(R) = (1 − q(A))·a`` exactly, and ``Ref(R) = 0``: **every measure is exact**, except the
  acceptance of ``token_v3`` (``1 − d(π, q)``, ``<= min((1 − q(A))a, b)``). Otherwise ``inf``.
  ``p_base = 0`` (accept everything, ``P = q``) is CoS-WE with ``λ = 0``.
* Any other rule with ``a + b > 0`` (cos_cd, ceiling on we/cd, cascade chow/diff/opt/token_v1/v2):
  no bound is derived: ``inf``. Record with top-k/top-p (exact) or lower ``tol`` for those.

``tokens_per_call`` bounds follow from the acceptance interval (the function is increasing in β;
an unknown acceptance still has the finite bound ``max(β̄, 1 − β̄)``). A coarse value that is
``inf`` with a non-zero bound gets the bound ``inf``, and lower bounds on ``P/p`` at the snapping
level count as 0. Positions with any infinite bound are counted as ``n_uncertain`` in summaries.
The bounds are checked against full 152k-token rows and against heavily coarsened random rows in
``tests/test_diagnose.py``. In practice, with ``tol = 1e-4`` the bounds are ``<= ~4(a + b)``
(order 1e-4) for TV/overshoot/acceptance; they grow with the rest mass of capped rows.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verispec import rules as rules_mod
from verispec.rules.base import Rule, check_distribution
from verispec.rules.block import BlockVerification
from verispec.sets import entropy

MEASURES = ("tv", "kl", "kl_reverse", "overshoot", "ceiling_ratio", "tail_leak", "acceptance", "tokens_per_call")
DISTORTIONS = ("tv", "kl", "kl_reverse", "overshoot", "ceiling_ratio", "tail_leak")
#: default target-entropy bin edges (nats)
ENTROPY_EDGES = (0.0, 0.05, 0.25, 0.5, 1.0, 2.0, math.inf)
QUANTILES = (0.1, 0.5, 0.9)

__all__ = [
    "MEASURES",
    "measure",
    "tv_distance",
    "overshoot_mass",
    "ceiling_ratio",
    "measure_records",
    "tokens_per_call",
    "summarize",
    "recorded_block_efficiency",
    "write_diagnostics_json",
    "diagnostics_markdown",
    "write_diagnostics_markdown",
    "distortion_by_rule",
    "rank_correlation",
]


# ---------------------------------------------------------------------------------------------------
# per-position measures


def tokens_per_call(beta: torch.Tensor, gamma: int) -> torch.Tensor:
    """``(1 − β^{γ+1})/(1 − β) = Σ_{i=0}^{γ} β^i`` (``γ + 1`` at ``β = 1``), elementwise."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    beta = torch.as_tensor(beta, dtype=torch.float64)
    out = torch.zeros_like(beta)
    term = torch.ones_like(beta)
    for _ in range(gamma + 1):
        out = out + term
        term = term * beta
    return out


def _prep(t: torch.Tensor, name: str) -> torch.Tensor:
    t = torch.as_tensor(t).double()
    check_distribution(t, name)
    return t / t.sum(-1, keepdim=True)


def _kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``Σ a log(a/b)`` over the last dim, 0·log 0 = 0, ``inf`` where ``a > 0 = b``."""
    pos = a > 0
    both = pos & (b > 0)
    one = torch.ones_like(a)
    terms = torch.where(both, a * (torch.where(both, a, one).log() - torch.where(both, b, one).log()),
                        torch.zeros_like(a))
    out = terms.sum(-1).clamp_min(0.0)
    return torch.where((pos & (b == 0)).any(-1), torch.full_like(out, math.inf), out)


def tv_distance(P: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``½‖P − ref‖₁`` over the last dimension. ``[..., V] -> [...]``."""
    return 0.5 * (P - ref).abs().sum(-1)


def overshoot_mass(P: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``Σ_v (P(v) − p(v))_+``: mass pushed above the target. ``[..., V] -> [...]``."""
    return (P - p).clamp_min(0).sum(-1)


def ceiling_ratio(P: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``max_{v: p(v) > 0} P(v)/p(v)``, ``inf`` where ``P`` puts mass on ``p = 0``. ``[..., V] -> [...]``."""
    ratio = torch.where(p > 0, P / torch.where(p > 0, p, torch.ones_like(p)), torch.zeros_like(p)).amax(-1)
    return torch.where(((P > 0) & (p == 0)).any(-1), torch.full_like(ratio, math.inf), ratio)


def _distortion(P: torch.Tensor, ref: torch.Tensor, p: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "tv": tv_distance(P, ref),
        "kl": _kl(P, ref),
        "kl_reverse": _kl(ref, P),
        "overshoot": overshoot_mass(P, p),
        "ceiling_ratio": ceiling_ratio(P, p),
        "tail_leak": torch.where(ref > 0, torch.zeros_like(P), P).sum(-1),
    }


def _sequence_level(p: torch.Tensor) -> dict[str, torch.Tensor]:
    shape = p.shape[:-1]
    z = torch.zeros(shape, dtype=torch.float64)
    nan = torch.full(shape, math.nan, dtype=torch.float64)
    return {"tv": z, "kl": z.clone(), "kl_reverse": z.clone(), "overshoot": z.clone(),
            "ceiling_ratio": torch.ones(shape, dtype=torch.float64), "tail_leak": z.clone(),
            "acceptance": nan, "tokens_per_call": nan.clone()}


#: induced probabilities below this fraction of max(p, q) are rounding residue (see :func:`snap`)
SNAP_RTOL = 1e-10


def snap(P: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Set ``P(v) = 0`` where ``P(v) <= SNAP_RTOL·p(v)`` (and where rounding made it negative).

    Closed forms such as ``q·1_A + (1 − q(A))·p`` or ``Δp + (1 − Δ)q`` leave rounding residue
    (``1 − q(A) ≈ 1e-16`` when it is mathematically 0) that would turn a zero tail leak into
    ``KL = inf`` or a meaningless huge finite ``KL(ref‖P)``. The residue is a rounding-level weight
    (float64 sums over the vocabulary: far below 1e-10) times ``p``, so likelihood ratios
    ``P/p <= 1e-10`` are treated as exact zeros. This moves at most ``1e-10`` of probability mass;
    ``q``-only mass (``p = 0``) is never touched, and ``P = p`` is left exactly as it is.
    """
    return torch.where(P <= SNAP_RTOL * p, torch.zeros_like(P), P)


def check_measurable(rule: Rule) -> None:
    """Refuse rules whose distortion cannot be measured position by position on recorded ``(p, q)``:
    lossy sequence-level rules (their law does not factor per position: exact laws come from
    :mod:`verispec.rules.block_law` on toy models, accuracy from ``verispec bench``) and rules that
    read raw (untruncated) distributions, which the records do not hold."""
    if not rule.per_token and not rule.is_lossless:
        raise ValueError(f"{rule.spec()}: a lossy sequence-level rule has no per-position law, so diagnose cannot "
                         "measure its distortion on recorded positions; compare its accuracy with `verispec bench`, "
                         "or compute its exact block law on toy models (verispec.rules.block_law)")
    if getattr(rule, "needs_raw", False):
        raise ValueError(f"{rule.spec()}: this setting reads the raw (temperature 1, untruncated) distributions, "
                         "which recorded positions do not hold; use its on=processed setting in diagnose")


def measure(rule: Rule | str, p: torch.Tensor, q: torch.Tensor, *, gamma: int) -> dict[str, torch.Tensor]:
    """Every measure of ``rule`` at each position: ``p, q: [..., V]`` -> ``{name: [...]}`` (float64).

    Inputs are processed probabilities; they are upcast to float64 and renormalised. Columns where
    ``p = q = 0`` in every row are dropped first (every rule gives them zero induced and reference
    mass), which makes top-k/top-p rows cheap.
    """
    rule = rules_mod.get(rule)
    check_measurable(rule)
    p, q = _prep(p, "target p"), _prep(q, "draft q")
    if not rule.per_token:
        return _sequence_level(p)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    # tokens with p = q = 0 in every row get P = Ref = 0 under every rule: drop those columns
    cols = ((p > 0) | (q > 0)).reshape(-1, p.shape[-1]).any(0)
    if not bool(cols.all()):
        p, q = p[..., cols], q[..., cols]
    P = snap(rule.induced(p, q), p, q)
    ref = rule.reference(p, q)
    out = _distortion(P, ref, p)
    beta = rule.acceptance_rate(p, q).clamp(0.0, 1.0)
    out["acceptance"] = beta
    out["tokens_per_call"] = tokens_per_call(beta, gamma)
    return out


# ---------------------------------------------------------------------------------------------------
# compression-error bounds on coarsened records


def _safe_log(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x.clamp_min(1e-300).log(), torch.full_like(x, -math.inf))


def _xlogx_over(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``x·log(x/a)`` with 0·log 0 = 0 (``a > 0`` where used)."""
    ok = (x > 0) & (a > 0)
    one = torch.ones_like(x)
    return torch.where(ok, x * (torch.where(ok, x, one).log() - torch.where(ok, a, one).log()), torch.zeros_like(x))


def _gap(true_hi: torch.Tensor, coarse: torch.Tensor, true_lo: torch.Tensor) -> torch.Tensor:
    """``max(true_hi − coarse, coarse − true_lo, 0)`` with inf − inf treated as 0."""
    up = true_hi - coarse
    lo = coarse - true_lo
    up = torch.where(torch.isnan(up), torch.zeros_like(up), up)
    lo = torch.where(torch.isnan(lo), torch.zeros_like(lo), lo)
    return torch.maximum(torch.maximum(up, lo), torch.zeros_like(up))


def _snapped(ratio_lower_bound: torch.Tensor) -> torch.Tensor:
    """A lower bound on ``P/p`` near the snapping level may be an exact 0 after :func:`snap`."""
    return torch.where(ratio_lower_bound <= 2 * SNAP_RTOL, torch.zeros_like(ratio_lower_bound), ratio_lower_bound)


class _Ctx:
    """Everything the bounds need for one chunk of positions."""

    def __init__(self, pbar, qbar, P, ref, vals, stats):
        self.pbar, self.qbar, self.P, self.ref, self.vals, self.st = pbar, qbar, P, ref, vals, stats
        self.pK, self.qK = pbar[:, :-1], qbar[:, :-1]
        self.a, self.b = pbar[:, -1], qbar[:, -1]
        self.PR = P[:, -1]
        n = pbar.shape[0]
        self.zero = torch.zeros(n, dtype=torch.float64)
        self.inf = torch.full((n,), math.inf, dtype=torch.float64)
        self.maxK = self.pK.amax(-1) if self.pK.shape[-1] else self.zero

    def acceptance_interval(self, lo_gap, hi_gap=None):
        beta = self.vals["acceptance"]
        hi_gap = self.zero if hi_gap is None else hi_gap
        return (beta - lo_gap).clamp(0, 1), (beta + hi_gap).clamp(0, 1)


def _ceiling_K_part(P, p):
    """max P/p over kept columns with p > 0 (and inf if P > 0 = p there)."""
    if p.shape[-1] == 0:
        return torch.zeros(p.shape[0], dtype=torch.float64)
    return ceiling_ratio(P, p)


def _bounds_we(c: _Ctx, lam: float) -> tuple[dict, tuple]:
    a, b = c.a, c.b
    mab = torch.minimum(a, b)
    has_a = a > 0
    t_hi = torch.as_tensor(c.st["qp_rest_max"], dtype=torch.float64)
    t_lo = torch.as_tensor(c.st["qp_rest_min"], dtype=torch.float64)
    m_hi = lam + (1 - lam) * t_hi if lam < 1 else torch.ones_like(t_hi)
    if lam < 1:
        m_lo = lam + (1 - lam) * torch.where(torch.isinf(t_lo), torch.ones_like(t_lo), t_lo)
    else:
        m_lo = torch.ones_like(t_lo)
    m_lo = _snapped(m_lo)
    x = c.PR
    q_p0 = torch.as_tensor(c.st["q_rest_on_p0"], dtype=torch.float64)
    ceil_true = torch.maximum(_ceiling_K_part(c.P[:, :-1], c.pK), m_hi)
    if lam < 1:   # P = (1−λ)q > 0 on a rest token with p = 0
        ceil_true = torch.where(q_p0 > 0, c.inf, ceil_true)
    kl_hi = x * _safe_log(m_hi)
    kl_hi = torch.where(x > 0, kl_hi, torch.zeros_like(kl_hi))
    klr_hi = a * (-_safe_log(m_lo))
    out = {
        "tv": (1 - lam) * mab,
        "overshoot": (1 - lam) * mab,
        "tail_leak": torch.where(has_a, (1 - lam) * torch.as_tensor(c.st["q_rest_on_p0"], dtype=torch.float64), c.zero),
        "ceiling_ratio": c.zero.clone(),
        "kl": torch.where(has_a, _gap(kl_hi, _xlogx_over(x, a), _xlogx_over(x, a)), c.zero),
        "kl_reverse": torch.where(has_a, _gap(klr_hi, _xlogx_over(a, x), _xlogx_over(a, x)), c.zero),
    }
    fixes = {
        # exact values: the sup of P/p over R is λ + (1−λ)t⁺; q mass on {p = 0} inside R leaks
        "ceiling_ratio": torch.where(has_a, ceil_true, c.vals["ceiling_ratio"]),
        "tail_leak": torch.where(has_a, c.vals["tail_leak"] + (1 - lam) * q_p0, c.vals["tail_leak"]),
    }
    out["tail_leak"] = c.zero.clone()
    if lam < 1:
        leaks = has_a & (q_p0 > 0)
        fixes["kl"] = torch.where(leaks, c.inf, c.vals["kl"])
        out["kl"] = torch.where(leaks, c.zero, out["kl"])
    return out, c.acceptance_interval(lam * mab), fixes


def _bounds_lenience(c: _Ctx, ell: float) -> tuple[dict, tuple]:
    pK, qK, a, b = c.pK, c.qK, c.a, c.b
    sK = torch.minimum(qK, pK / ell).sum(-1)
    diffK = (pK - qK).clamp_min(0)
    dK = diffK.sum(-1)
    m_ab = torch.minimum(b, a / ell)
    rho_hi = (1 - sK).clamp_min(0)
    rho_lo = (1 - sK - m_ab).clamp_min(0)
    d_lo = dK + (a - b).clamp_min(0)
    d_hi = dK + a

    def div(r, d):
        return torch.where(d > 0, r / torch.where(d > 0, d, torch.ones_like(d)), torch.ones_like(d)).clamp(0, 1)

    D_bar, D_lo, D_hi = div(rho_lo, d_lo), div(rho_lo, d_hi), div(rho_hi, d_lo)
    # a rounding-level Δ may be exactly 0 in another summation order (P = 0 where q = 0 < p)
    D_lo = torch.where(D_lo < 1e-9, torch.zeros_like(D_lo), D_lo)
    w = torch.maximum(D_bar - D_lo, D_hi - D_bar).clamp_min(0)
    e = w * dK
    x_lo, x_hi = (c.PR - e).clamp_min(0), (c.PR + e).clamp_max(1)
    has_a = a > 0
    t_hi = torch.as_tensor(c.st["qp_rest_max"], dtype=torch.float64)
    t_lo = torch.as_tensor(c.st["qp_rest_min"], dtype=torch.float64)
    # ceiling ratio: exact value from the q > p kept tokens and the stored t⁺
    over = qK > pK
    rK = torch.where(over & (pK > 0),
                     torch.minimum(qK / torch.where(pK > 0, pK, torch.ones_like(pK)), torch.full_like(pK, 1 / ell)),
                     torch.zeros_like(pK))
    ceil_true = torch.maximum(rK.amax(-1) if rK.shape[-1] else c.zero, torch.ones_like(c.zero))
    ceil_true = torch.where(has_a, torch.maximum(ceil_true, torch.clamp(t_hi, max=1 / ell)), ceil_true)
    # KL(P‖p): Lipschitz in Δ on K, sandwich on R
    under = (qK < pK)
    r_min = _snapped(D_lo[:, None] + (1 - D_lo[:, None]) * qK / torch.where(pK > 0, pK, torch.ones_like(pK)))
    lip_kl = torch.where(under, diffK * torch.maximum(torch.ones_like(r_min), (1 + _safe_log(r_min)).abs()),
                         torch.zeros_like(pK)).sum(-1)
    lip_klr = torch.where(under, diffK / r_min, torch.zeros_like(pK)).sum(-1)
    errK_kl = torch.where(w > 0, w * lip_kl, c.zero)
    errK_klr = torch.where(w > 0, w * lip_klr, c.zero)
    M_R = torch.clamp(t_hi, max=1 / ell).clamp_min(1)
    coarse_R = _xlogx_over(c.PR, a)
    x_star = torch.minimum(torch.maximum(a / math.e, x_lo), x_hi)
    kl_R = _gap(x_hi * M_R.log(), coarse_R, _xlogx_over(x_star, a))
    t_lo_finite = torch.where(torch.isinf(t_lo), torch.ones_like(t_lo), t_lo)
    m_R = _snapped(torch.minimum(torch.ones_like(t_lo), D_lo + (1 - D_lo) * t_lo_finite))
    coarse_Rr = _xlogx_over(a, c.PR)
    klr_R = _gap(a * (-_safe_log(m_R)), coarse_Rr, _xlogx_over(a, x_hi))
    out = {
        "tv": e + torch.minimum(c.PR + e, a),
        "overshoot": torch.maximum(torch.minimum(b, (1 / ell - 1) * a), e),
        "tail_leak": c.zero.clone(),
        "ceiling_ratio": c.zero.clone(),
        "kl": errK_kl + torch.where(has_a, kl_R, c.zero),
        "kl_reverse": errK_klr + torch.where(has_a, klr_R, c.zero),
    }
    # exact value: ratios <= 1 where q <= p, min(q/p, 1/ℓ) where q > p (independent of Δ)
    return out, c.acceptance_interval(m_ab), {"ceiling_ratio": ceil_true}


def _certificate_min_p(c: _Ctx, p_base: float) -> torch.Tensor:
    thr = p_base * c.maxK
    rmax = torch.as_tensor(c.st["p_rest_max"], dtype=torch.float64)
    return (c.a < c.maxK) & (rmax <= c.maxK) & (rmax < thr) & (c.a < thr)


def _certificate_eta(c: _Ctx, eps: float, delta: float) -> torch.Tensor:
    h_true = torch.as_tensor(c.st["target_entropy"], dtype=torch.float64)
    h_bar = entropy(c.pbar)
    th_true = torch.clamp(delta * torch.exp(-h_true), max=eps)
    th_bar = torch.clamp(delta * torch.exp(-h_bar), max=eps)
    lo = torch.minimum(th_true, th_bar) * (1 - 1e-5)
    hi = torch.maximum(th_true, th_bar) * (1 + 1e-5)
    pK = c.pK
    is_max = pK >= c.maxK[:, None]
    between = ((pK >= lo[:, None]) & (pK < hi[:, None]) & ~is_max).any(-1)
    rmax = torch.as_tensor(c.st["p_rest_max"], dtype=torch.float64)
    return ~between & (c.a < lo) & (rmax < lo) & (c.a < c.maxK) & (rmax <= c.maxK)


def _exact_if(c: _Ctx, ok: torch.Tensor) -> dict:
    return {m: torch.where(ok, c.zero, c.inf) for m in DISTORTIONS}


def _bounds(rule: Rule, c: _Ctx) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per-position bounds ``err_<measure>`` and exact replacements of coarse values (module docstring).

    The bound depends on the shape of the rule's law, which the rule states itself
    (:meth:`~verispec.rules.base.Rule.induced_form`); rules of kind ``other`` get no finite bound."""
    exact = torch.as_tensor((c.st["p_rest"] == 0) & (c.st["q_rest"] == 0))
    if not rule.per_token:
        out = {m: c.zero.clone() for m in DISTORTIONS}
        out["acceptance"] = c.zero.clone()
        out["tokens_per_call"] = c.zero.clone()
        return {f"err_{k}": v for k, v in out.items()}, {}
    fixes: dict[str, torch.Tensor] = {}
    form = rule.induced_form()
    if form.kind == "target":
        dist = {m: c.zero.clone() for m in DISTORTIONS}
        interval = c.acceptance_interval(torch.minimum(c.a, c.b))
    elif form.kind == "argmax":
        rmax = torch.as_tensor(c.st["p_rest_max"], dtype=torch.float64)
        ok = (c.a < c.maxK) & (rmax < c.maxK)
        dist = _exact_if(c, ok)
        for m in ("tv", "kl", "kl_reverse", "tail_leak"):   # P = Ref = δ_argmax on any row: always 0
            dist[m] = c.zero.clone()
        gap = torch.where(ok, c.zero, c.inf)
        interval = c.acceptance_interval(gap, gap)
    elif form.kind == "capped":
        dist, interval, fixes = _bounds_lenience(c, form.ell)
    elif form.kind == "mixture":
        dist, interval, fixes = _bounds_we(c, form.lam)
    elif form.kind in ("min_p_set", "eta_set"):
        if form.kind == "min_p_set":
            ok = _certificate_min_p(c, form.p_base)
        else:
            ok = _certificate_eta(c, form.eps, form.delta)
        dist = _exact_if(c, ok)
        if form.acceptance_is_set_mass:
            gap = torch.where(ok, c.zero, c.inf)
        else:   # cascade token_v3: β = 1 − d(π, q)
            keep_frac = torch.where(c.a > 0, c.PR / torch.where(c.a > 0, c.a, torch.ones_like(c.a)), c.zero)
            gap = torch.where(ok, torch.minimum(keep_frac * c.a, c.b), c.inf)
        interval = c.acceptance_interval(gap, gap)
    else:
        dist = _exact_if(c, torch.zeros_like(exact))
        interval = c.acceptance_interval(c.inf, c.inf)
    beta = c.vals["acceptance"]
    lo, hi = interval
    out = dict(dist)
    out["acceptance"] = torch.maximum(beta - lo, hi - beta)
    gamma = c.st["gamma"]
    f = tokens_per_call(beta, gamma)
    out["tokens_per_call"] = torch.maximum(f - tokens_per_call(lo, gamma), tokens_per_call(hi, gamma) - f)
    out["tokens_per_call"] = torch.where(torch.isnan(out["tokens_per_call"]), c.inf, out["tokens_per_call"])
    fixes = {k: torch.where(exact, c.vals[k], v) for k, v in fixes.items()}
    for k, v in out.items():   # an infinite coarse value with a non-zero error bound says nothing
        value = fixes.get(k, c.vals[k])
        out[k] = torch.where(torch.isinf(value) & (v > 0), c.inf, v)
    errs = {f"err_{k}": torch.where(exact, c.zero, v) for k, v in out.items()}
    return errs, fixes


def measure_records(rule: Rule | str, records, *, gamma: int, index: Sequence[int] | None = None,
                    chunk_elems: int = 2_000_000) -> dict[str, torch.Tensor]:
    """Measures of ``rule`` on recorded (coarsened) positions, with per-position error bounds.

    Returns ``{measure: [n], "err_" + measure: [n]}`` for every name in :data:`MEASURES` (positions in
    ``index`` order, default all). Positions are processed in chunks of similar width.
    """
    rule = rules_mod.get(rule)
    tokens_per_call(torch.zeros(1), gamma)  # validates gamma
    n_all = len(records)
    idx = np.arange(n_all) if index is None else np.asarray(index, dtype=np.int64)
    arrays = records.arrays
    counts = arrays["counts"][idx]
    order = np.argsort(counts, kind="stable")
    results: dict[str, torch.Tensor] = {}
    start = 0
    n = len(idx)
    while start < n:
        stop = start + 1
        while stop < n and (stop - start + 1) * (int(counts[order[stop]]) + 1) <= chunk_elems:
            stop += 1
        sel = order[start:stop]
        pos = idx[sel]
        pbar, qbar, _ = records.dense(pos)
        vals = measure(rule, pbar, qbar, gamma=gamma)
        st = {k: arrays[k][pos] for k in ("p_rest", "q_rest", "p_rest_max", "q_rest_max", "qp_rest_max",
                                          "qp_rest_min", "q_rest_on_p0", "target_entropy")}
        st["gamma"] = gamma
        if rule.per_token:
            P = snap(rule.induced(pbar, qbar), pbar, qbar)
            ref = rule.reference(pbar, qbar)
        else:
            P = ref = pbar
        errs, fixes = _bounds(rule, _Ctx(pbar, qbar, P, ref, vals, st))
        vals.update(fixes)
        for k, v in {**vals, **errs}.items():
            if k not in results:
                results[k] = torch.empty(n, dtype=torch.float64)
            results[k][torch.from_numpy(sel)] = v.double()
        start = stop
    if n == 0:
        for m in MEASURES:
            results[m] = torch.zeros(0, dtype=torch.float64)
            results["err_" + m] = torch.zeros(0, dtype=torch.float64)
    return results


# ---------------------------------------------------------------------------------------------------
# exact block efficiency from recorded draft blocks


def recorded_block_efficiency(rule: Rule | str, records) -> dict[str, Any]:
    """Exact expected tokens per target call *given the recorded draft blocks*.

    For each recorded step (positions grouped by dataset, problem, step; the ``draft_token`` of every
    position must be known), ``E[1 + n | x_1..x_G] = 1 + Σ_k Π_{i<=k} h_i(x_i)`` for per-token rules
    and ``1 + E[τ]`` from :meth:`BlockVerification.expected_accepted` for ``block`` and ``hsd`` (whose
    transcription has exactly block verification's firing probabilities, see ``rules/hsd.py``). The
    blocks were drafted along the lossless generation's prefixes, so this is the rule's block
    efficiency on those prefixes (not on its own trajectory). Steps are used only where the
    computation is exact on the records: every position lossless (rest 0), or — for rules whose
    ``h(x)`` depends on ``p(x), q(x)`` alone (lossless, lenience, ceiling on p, CoS-WE) — always.

    Returns ``{"tokens_per_call": mean, "n_steps": used, "n_skipped": skipped, "accepted_mean": E[n]}``.
    """
    rule = rules_mod.get(rule)
    a = records.arrays
    n = len(a["counts"])
    if n == 0:
        return {"tokens_per_call": math.nan, "n_steps": 0, "n_skipped": 0, "accepted_mean": math.nan}
    key = np.stack([a["dataset"].astype(np.int64), a["problem_id"].astype(np.int64), a["step"].astype(np.int64)], 1)
    order = np.lexsort((a["position"], key[:, 2], key[:, 1], key[:, 0]))
    groups: list[np.ndarray] = []
    cur = [order[0]]
    for j in order[1:]:
        if (key[j] == key[cur[-1]]).all():
            cur.append(j)
        else:
            groups.append(np.array(cur))
            cur = [j]
    groups.append(np.array(cur))
    tokenwise = rule.pointwise_acceptance
    values, skipped = [], 0
    for g in groups:
        pos = a["position"][g]
        drafted = a["draft_token"][g]
        exact = bool(((a["p_rest"][g] == 0) & (a["q_rest"][g] == 0)).all())
        complete = not (a["step"][g] < 0).any() and not (drafted < 0).any() and np.array_equal(pos, np.arange(len(g)))
        if not complete or not (exact or (tokenwise and rule.per_token)):
            skipped += 1
            continue
        # a common column space: the union of the kept ids of the block, plus one rest bucket per row
        ids_all = np.unique(np.concatenate([a["token_ids"][a["offsets"][i]:a["offsets"][i + 1]] for i in g]))
        col = {int(t): j for j, t in enumerate(ids_all)}
        G, W = len(g), len(ids_all)
        p = torch.zeros(G, W + 1, dtype=torch.float64)
        q = torch.zeros(G, W + 1, dtype=torch.float64)
        for r, i in enumerate(g):
            lo, hi = a["offsets"][i], a["offsets"][i + 1]
            cols = torch.tensor([col[int(t)] for t in a["token_ids"][lo:hi]], dtype=torch.long)
            p[r, cols] = torch.from_numpy(a["p_kept"][lo:hi].astype(np.float64))
            q[r, cols] = torch.from_numpy(a["q_kept"][lo:hi].astype(np.float64))
            p[r, -1] = a["p_rest"][i]
            q[r, -1] = a["q_rest"][i]
        p = p / p.sum(-1, keepdim=True)
        q = q / q.sum(-1, keepdim=True)
        x = torch.tensor([col[int(t)] for t in drafted], dtype=torch.long)
        if rule.per_token:
            h = rule.accept_prob_at(p, q, x)
            e_n = float(torch.cumprod(h, 0).sum())
        else:
            p_ext = torch.cat([p, p[-1:]], 0)[None]            # the bonus row is not used by E[τ]
            e_n = float(BlockVerification().expected_accepted(p_ext, q[None], x[None])[0])
        values.append(e_n)
    if not values:
        return {"tokens_per_call": math.nan, "n_steps": 0, "n_skipped": skipped, "accepted_mean": math.nan}
    mean_n = float(np.mean(values))
    return {"tokens_per_call": 1.0 + mean_n, "n_steps": len(values), "n_skipped": skipped, "accepted_mean": mean_n}


# ---------------------------------------------------------------------------------------------------
# summaries


def _f(x: float) -> float:
    return float(x)


def _stats_of(values: torch.Tensor, quantiles: Sequence[float]) -> dict[str, float]:
    v = values[~torch.isnan(values)]
    if v.numel() == 0:
        return {"mean": math.nan, "max": math.nan, **{f"q{int(round(qq * 100)):02d}": math.nan for qq in quantiles}}
    qs = np.quantile(v.numpy(), list(quantiles), method="nearest")
    out = {"mean": _f(v.mean()), "max": _f(v.max())}
    for qq, val in zip(quantiles, qs):
        out[f"q{int(round(qq * 100)):02d}"] = float(val)
    return out


def _means(vals: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    out: dict[str, float] = {"n": int(mask.sum())}
    for m in MEASURES:
        v = vals[m][mask]
        out[m] = _f(v.mean()) if v.numel() else math.nan
        out["err_" + m] = _f(vals["err_" + m][mask].mean()) if v.numel() else math.nan
    return out


def summarize(corpus, rule_specs: Iterable[str | Rule], *, gamma: int,
              entropy_edges: Sequence[float] = ENTROPY_EDGES, quantiles: Sequence[float] = QUANTILES,
              block_efficiency: bool = True) -> list[dict[str, Any]]:
    """Per rule: corpus means of every measure, quantiles, compression-error bounds and breakdowns.

    ``corpus`` is a :class:`~verispec.diagnose.record.PositionRecorder`. Each entry holds ``rule``
    (canonical spec), ``family``, ``params``, ``is_lossless``, ``per_token``, ``n_positions``, the mean
    of every measure (keys of :data:`MEASURES`; NaN = n/a for sequence-level rules),
    ``tokens_per_call_at_mean_acceptance``, ``kl_inf_fraction``, ``quantiles`` (per measure: mean,
    max and the requested quantiles), ``max_compression_error`` / ``mean_compression_error`` (per
    measure: largest per-position bound, and the bound on the error of the reported mean),
    ``n_uncertain`` (positions with an infinite bound), ``by_entropy`` (target-entropy bins) and
    ``by_position`` (position in the block) with the means of every measure per bin, and — with
    ``block_efficiency`` — ``recorded_blocks`` (:func:`recorded_block_efficiency`).
    """
    meta = corpus.arrays
    ent = torch.as_tensor(meta["target_entropy"].astype(np.float64))
    position = torch.as_tensor(meta["position"].astype(np.int64))
    out = []
    for spec in rule_specs:
        rule = rules_mod.get(spec)
        vals = measure_records(rule, corpus, gamma=gamma)
        n = len(corpus)
        entry: dict[str, Any] = {
            "rule": rule.spec(), "family": rule.family, "params": dict(rule.params),
            "is_lossless": bool(rule.is_lossless), "per_token": bool(rule.per_token),
            "description": rule.describe(), "gamma": gamma, "n_positions": n,
        }
        for m in MEASURES:
            v = vals[m]
            entry[m] = _f(v.mean()) if n else math.nan
        beta_mean = entry["acceptance"]
        entry["tokens_per_call_at_mean_acceptance"] = (
            _f(tokens_per_call(torch.tensor([beta_mean]), gamma)[0]) if not math.isnan(beta_mean) else math.nan)
        entry["kl_inf_fraction"] = _f(torch.isinf(vals["kl"]).double().mean()) if n else math.nan
        entry["kl_reverse_inf_fraction"] = _f(torch.isinf(vals["kl_reverse"]).double().mean()) if n else math.nan
        entry["quantiles"] = {m: _stats_of(vals[m], quantiles) for m in MEASURES}
        entry["max_compression_error"] = {m: _f(vals["err_" + m].max()) if n else 0.0 for m in MEASURES}
        entry["mean_compression_error"] = {m: _f(vals["err_" + m].mean()) if n else 0.0 for m in MEASURES}
        any_inf = torch.zeros(n, dtype=torch.bool)
        for m in MEASURES:
            any_inf |= torch.isinf(vals["err_" + m])
        entry["n_uncertain"] = int(any_inf.sum())
        entry["max_p_rest"] = float(meta["p_rest"].max()) if n else 0.0
        entry["max_q_rest"] = float(meta["q_rest"].max()) if n else 0.0
        bins = []
        for lo, hi in zip(entropy_edges[:-1], entropy_edges[1:]):
            mask = (ent >= lo) & (ent < hi)
            bins.append({"lo": float(lo), "hi": float(hi), **_means(vals, mask)})
        entry["by_entropy"] = bins
        entry["by_position"] = [{"position": int(k), **_means(vals, position == k)}
                                for k in sorted(set(position.tolist()))]
        if block_efficiency:
            entry["recorded_blocks"] = recorded_block_efficiency(rule, corpus)
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------------
# writers


_NA_KEYS = {"acceptance", "tokens_per_call", "tokens_per_call_at_mean_acceptance"}


def to_jsonable(x: Any) -> Any:
    """Plain JSON values: tensors/numpy scalars unwrapped, NaN -> "n/a", ±inf -> "inf"/"-inf"."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, (np.generic,)):
        x = x.item()
    if isinstance(x, torch.Tensor):
        x = x.item()
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
    return x


def write_diagnostics_json(path: str | os.PathLike, summary: Sequence[Mapping[str, Any]]) -> None:
    """Write ``{rule_spec: {"tv", "kl", "overshoot", "ceiling_ratio", "tail_leak", "acceptance",
    "n_positions", ...}}``. Non-finite numbers become strings: NaN -> ``"n/a"`` (e.g. the acceptance of
    sequence-level rules), ``inf`` -> ``"inf"``; everything else in the summary entry is kept."""
    doc = {entry["rule"]: to_jsonable({k: v for k, v in entry.items() if k != "rule"}) for entry in summary}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, allow_nan=False)
        fh.write("\n")


def _cell(x: Any, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        if math.isinf(x):
            return "∞"
        if x != 0 and (abs(x) < 10 ** -(digits - 1) or abs(x) >= 1e5):
            return f"{x:.2e}"
        return f"{x:.{digits}f}"
    return str(x)


def diagnostics_markdown(summary: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table: one row per rule (means over the corpus, medians for KL, error bounds)."""
    head = ["rule", "n", "TV", "KL(P‖ref) median", "KL(ref‖P)", "overshoot", "ceiling max P/p (median)",
            "tail leak", "acceptance", "tokens/call", "max comp. err (TV)", "uncertain"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for e in summary:
        qs = e.get("quantiles", {})
        row = [
            f"`{e['rule']}`", str(e["n_positions"]), _cell(e["tv"]),
            _cell(qs.get("kl", {}).get("q50", e["kl"])), _cell(e["kl_reverse"]), _cell(e["overshoot"]),
            _cell(qs.get("ceiling_ratio", {}).get("q50", e["ceiling_ratio"]), 3), _cell(e["tail_leak"]),
            _cell(e["acceptance"]), _cell(e["tokens_per_call"], 3),
            _cell(e.get("max_compression_error", {}).get("tv", 0.0)), str(e.get("n_uncertain", 0)),
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("Means over positions unless marked; KL(P‖ref) is ∞ wherever a rule leaks mass outside "
                 "the baseline's support, so its median is shown. n/a: sequence-level rule (law = p, no "
                 "per-position acceptance). 'max comp. err' bounds the per-position error due to record "
                 "compression; 'uncertain' counts positions where no finite bound holds.")
    return "\n".join(lines) + "\n"


def write_diagnostics_markdown(path: str | os.PathLike, summary: Sequence[Mapping[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(diagnostics_markdown(summary))


# ---------------------------------------------------------------------------------------------------
# linking to benchmark results


def distortion_by_rule(summary: Sequence[Mapping[str, Any]], measure_name: str = "tv") -> dict[str, float]:
    """``{rule_spec: mean measure}`` from a :func:`summarize` result (for :func:`rank_correlation`)."""
    return {e["rule"]: float(e[measure_name]) for e in summary}


def rank_correlation(distortion_by_rule: Mapping[str, Any], accuracy_gap_by_rule: Mapping[str, Any]) -> dict[str, Any]:
    """Spearman ρ between a distortion measure and the accuracy gap, over the rules present in both.

    Non-numeric or NaN values are dropped (``inf`` is kept: it ranks last). Returns
    ``{"rho", "p_value", "n", "rules"}``; ``rho``/``p_value`` are NaN with fewer than 3 rules or a
    constant input.
    """
    from scipy.stats import spearmanr

    rules_common, xs, ys = [], [], []
    for spec, x in distortion_by_rule.items():
        if spec not in accuracy_gap_by_rule:
            continue
        y = accuracy_gap_by_rule[spec]
        try:
            x, y = float(x), float(y)
        except (TypeError, ValueError):
            continue
        if math.isnan(x) or math.isnan(y):
            continue
        rules_common.append(spec)
        xs.append(x)
        ys.append(y)
    n = len(xs)
    if n < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return {"rho": math.nan, "p_value": math.nan, "n": n, "rules": rules_common}
    res = spearmanr(xs, ys)
    return {"rho": float(res.statistic), "p_value": float(res.pvalue), "n": n, "rules": rules_common}
