"""Shared fixtures for the rule tests: (p, q) families and a goodness-of-fit helper."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

#: Significance level for each statistical test. Seeds are fixed, so a run is deterministic; the
#: level only bounds how unlucky a correct implementation could be when seeds change.
ALPHA = 1e-4


def _dirichlet(gen: torch.Generator, conc: float, v: int) -> torch.Tensor:
    g = torch._standard_gamma(torch.full((v,), conc, dtype=torch.float64), generator=gen)
    g = g.clamp_min(1e-300)
    return g / g.sum()


def _truncate(gen: torch.Generator, d: torch.Tensor, keep: int) -> torch.Tensor:
    order = torch.randperm(d.numel(), generator=gen)
    out = torch.zeros_like(d)
    out[order[:keep]] = d[order[:keep]] + 1e-3
    return out / out.sum()


def pq_cases(v: int = 7, seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Named (p, q) pairs, float64 ``[V]``: the regimes a rule must handle."""
    gen = torch.Generator().manual_seed(seed)
    d = lambda conc: _dirichlet(gen, conc, v)  # noqa: E731
    cases: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    cases["dense"] = (d(1.0), d(1.0))
    cases["peaked"] = (d(0.15), d(0.15))
    cases["sparse"] = (_truncate(gen, d(1.0), 4), _truncate(gen, d(1.0), 4))
    p = d(0.7)
    near = p + 0.02 * (d(1.0) - p)
    cases["near_identical"] = (p, near / near.sum())
    p_dis = torch.zeros(v, dtype=torch.float64)
    q_dis = torch.zeros(v, dtype=torch.float64)
    p_dis[: v // 2] = d(1.0)[: v // 2]
    q_dis[v // 2 :] = d(1.0)[v // 2 :]
    cases["disjoint"] = (p_dis / p_dis.sum(), q_dis / q_dis.sum())
    one_p = torch.zeros(v, dtype=torch.float64)
    one_p[2] = 1.0
    cases["one_hot_p"] = (one_p, d(1.0))
    one_q = torch.zeros(v, dtype=torch.float64)
    one_q[3] = 1.0
    cases["one_hot_q"] = (d(1.0), one_q)
    cases["identical"] = (p, p.clone())
    # Draft overshoots the target's tail: what the ceiling and lenience are about.
    tail_p = torch.tensor([0.6, 0.25, 0.1, 0.03, 0.015, 0.004, 0.001][:v], dtype=torch.float64)
    tail_q = torch.tensor([0.3, 0.1, 0.05, 0.05, 0.2, 0.2, 0.1][:v], dtype=torch.float64)
    cases["tail_overshoot"] = (tail_p / tail_p.sum(), tail_q / tail_q.sum())
    return cases


def gof_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; cells with zero expected mass must be empty (else p = 0).

    Cells with small expected counts are pooled so every tested cell expects >= 5.
    """
    counts = np.asarray(counts, dtype=float)
    probs = np.asarray(probs, dtype=float)
    n = counts.sum()
    impossible = probs <= 1e-12
    if counts[impossible].sum() > 0:
        return 0.0
    counts, probs = counts[~impossible], probs[~impossible]
    probs = probs / probs.sum()
    order = np.argsort(probs)
    pooled_c, pooled_e = [], []
    acc_c = acc_e = 0.0
    for i in order:
        acc_c += counts[i]
        acc_e += probs[i] * n
        if acc_e >= 5:
            pooled_c.append(acc_c)
            pooled_e.append(acc_e)
            acc_c = acc_e = 0.0
    if acc_e > 0:
        if pooled_e:
            pooled_c[-1] += acc_c
            pooled_e[-1] += acc_e
        else:
            pooled_c.append(acc_c)
            pooled_e.append(acc_e)
    if len(pooled_c) < 2:
        return 1.0
    return float(stats.chisquare(pooled_c, pooled_e).pvalue)


def binom_pvalue(successes: int, n: int, prob: float) -> float:
    """Two-sided exact binomial test (degenerate probabilities must be matched exactly)."""
    if prob <= 0:
        return 1.0 if successes == 0 else 0.0
    if prob >= 1:
        return 1.0 if successes == n else 0.0
    return float(stats.binomtest(successes, n, prob).pvalue)


def single_position(rule, p: torch.Tensor, q: torch.Tensor, n: int, seed: int, gamma: int = 1, **verify_kwargs):
    """``rule.verify`` on ``n`` identical rows (``p [V]`` at every one of the ``gamma + 1`` positions, ``q [V]``
    at the ``gamma`` drafted ones) with drafts ~ ``q``; ``verify_kwargs`` (e.g. ``raw=``, ``features=``, already
    shaped for the ``n`` rows; None values are left out) go to ``verify``.
    -> ``(emitted first tokens [n], first draft accepted [n], drafts [n, gamma])``."""
    gen = torch.Generator().manual_seed(seed)
    qs = q.expand(n, gamma, -1).contiguous()
    ps = p.expand(n, gamma + 1, -1).contiguous()
    draft = torch.multinomial(q, n * gamma, replacement=True, generator=gen).view(n, gamma)
    extra = {k: v for k, v in verify_kwargs.items() if v is not None}
    n_acc, nxt = rule.verify(ps, qs, draft, generator=gen, **extra)
    return torch.where(n_acc >= 1, draft[:, 0], nxt), n_acc >= 1, draft
