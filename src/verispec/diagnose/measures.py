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

Measures on compressed records, with error bounds, are :mod:`verispec.diagnose.on_records`; corpus
summaries and their writers :mod:`verispec.diagnose.summary`.
"""

from __future__ import annotations

import math

import torch

from verispec import rules as rules_mod
from verispec.rules.base import Rule, check_distribution

MEASURES = ("tv", "kl", "kl_reverse", "overshoot", "ceiling_ratio", "tail_leak", "acceptance", "tokens_per_call")
DISTORTIONS = ("tv", "kl", "kl_reverse", "overshoot", "ceiling_ratio", "tail_leak")

__all__ = ["MEASURES", "DISTORTIONS", "measure", "tv_distance", "overshoot_mass", "ceiling_ratio", "tokens_per_call",
           "snap", "check_measurable"]


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
