"""Measures of verification rules on compressed records, with a per-position bound on the compression error.

:func:`measure_records` applies a rule to the coarsened pair ``(p̄, q̄)`` of each recorded position (kept
tokens plus one rest bucket, :class:`~verispec.diagnose.record.PositionRecorder`) and returns, next to every
measure ``m`` of :mod:`verispec.diagnose.measures`, a bound ``err_<m>`` with ``|m(p, q) − m_records| <=
err_<m>`` (up to float32 rounding of the kept values). With whole supports kept (top-k / top-p) every
measure is exact; the bound of each rule family is derived in ``docs/measures-on-records.md``.
:func:`recorded_block_efficiency` gives the exact tokens per call of sequence-level rules from the
recorded draft blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from verispec import rules as rules_mod
from verispec.diagnose.measures import DISTORTIONS, MEASURES, SNAP_RTOL, ceiling_ratio, measure, snap, tokens_per_call
from verispec.rules.base import Rule
from verispec.rules.block import BlockVerification
from verispec.sets import entropy


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
