"""Shared fixtures for the rule tests: (p, q) families, goodness-of-fit helpers, truncation sets written from
their definitions, the toy judges, and whole SD runs on toy models."""

from __future__ import annotations

import itertools
import math
from contextlib import contextmanager

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


def random_pairs(n: int, v: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, V]`` float64 Dirichlet pairs with mixed concentrations (0.1 to 3); a quarter of the rows sparse
    (p and q truncated to random supports, so q has mass where p = 0 and the reverse)."""
    gen = torch.Generator().manual_seed(seed)
    concs = torch.tensor([0.1, 0.3, 1.0, 3.0], dtype=torch.float64)

    def draw():
        c = concs[torch.randint(len(concs), (n, 1), generator=gen)].expand(n, v)
        g = torch._standard_gamma(c.contiguous(), generator=gen).clamp_min(1e-300)
        return g / g.sum(-1, keepdim=True)

    p, q = draw(), draw()
    sparse = torch.arange(n) % 4 == 3
    for t in (p, q):
        keep = torch.rand(n, v, generator=gen) < 0.6
        keep[torch.arange(n), torch.randint(v, (n,), generator=gen)] = True
        t[sparse] = torch.where(keep[sparse], t[sparse], torch.zeros_like(t[sparse]))
        t /= t.sum(-1, keepdim=True)
    return p, q


# --- truncation sets written from their definitions (independent of verispec.sets) ------------------------

def naive_truncation_mask(p: np.ndarray, steps: list[tuple[str, float]], eta_delta: float | None = None) -> np.ndarray:
    """The allowed set of one row ``p [V]`` (float64) after the truncation ``steps`` in order, by per-row loops
    over the definitions of ``verispec.sets``: each step runs on the renormalised survivors of the previous
    ones and keeps the argmax; top-k / top-p keep whole tie groups; η and ε keep the first argmax. With at
    least one step the set lies inside ``supp p``."""
    keep = np.ones(p.size, bool)
    for name, v in steps:
        cur = np.where(keep, p, 0.0)
        cur = cur / cur.sum()
        top = int(np.argmax(cur))
        if name == "prob_gap":
            m = cur >= cur.max() - v
        elif name == "top_k":
            m = cur >= np.sort(cur)[::-1][v - 1] if v < p.size else np.ones(p.size, bool)
        elif name == "top_p":
            m = np.array([cur[cur > c].sum() < v and c > 0 for c in cur])
        elif name == "min_p":
            m = cur >= v * cur.max()
        elif name == "eta":
            nz = cur[cur > 0]
            d = math.sqrt(v) if eta_delta is None else eta_delta
            m = cur >= min(v, d * math.exp((nz * np.log(nz)).sum()))
            m[top] = True
        else:
            m = cur >= v
            m[top] = True
        keep &= m
    return keep & (p > 0) if steps else keep


# --- the toy trained judges of the judge rule --------------------------------------------------------------

#: Feature width and the fixed weights of the toy "trained" head of the stochastic judge.
JUDGE_H = 4
JUDGE_W = torch.tensor([0.8, -1.2, 0.5, 2.0], dtype=torch.float64)


def half_max(p, q, tokens, features):
    """Accept iff p(x) >= 0.5·max p: the min-p set of speccascade:p_base=0.5, as a bool predicate."""
    return p.gather(-1, tokens) >= 0.5 * p.amax(-1, keepdim=True)


def soft_judge(p, q, tokens, features):
    """A stochastic judge: a logistic head on the position's features, scaled by how close the token is to
    the target's favourite ((p(x)/max p)^¼), OR-ed softly with standard verification min(1, p/q)."""
    px, qx = p.gather(-1, tokens), q.gather(-1, tokens)
    head = torch.full_like(px, 0.5) if features is None else torch.sigmoid(features.double() @ JUDGE_W)[..., None]
    standard = torch.where(qx > 0, (px / qx.clamp_min(1e-300)).clamp(max=1.0), torch.zeros_like(px))
    return torch.maximum(head * (px / p.amax(-1, keepdim=True)) ** 0.25, standard)


#: The judges the rule tests register: name -> predicate.
TEST_JUDGES = {"half_max": half_max, "soft": soft_judge}


@contextmanager
def test_judges():
    """Register :data:`TEST_JUDGES` for the duration (``judge:name=half_max`` / ``judge:name=soft``); names
    registered before are left as they were."""
    from verispec.rules.judge import judges, register_judge, unregister_judge

    added = [name for name in TEST_JUDGES if name not in judges()]
    for name, predicate in TEST_JUDGES.items():
        register_judge(name, predicate)
    try:
        yield
    finally:
        for name in added:
            if name in judges():
                unregister_judge(name)


test_judges.__test__ = False   # a helper, not a test: keep pytest from collecting it where it is imported


# --- whole speculative-decoding runs on toy models ---------------------------------------------------------

def simulate_sd(rule, target, draft, *, vocab: int, gamma: int, length: int, n: int, seed: int) -> np.ndarray:
    """Run ``n`` independent SD sequences with ``rule.verify`` (batched over the sequences) from the empty
    prefix until each holds ``length`` tokens; ``target`` and ``draft`` are toy models (prefix -> ``[V]``,
    e.g. :class:`verispec.rules.block_law.ToyModel`). -> counts of the first ``length`` tokens,
    ``[V] * length`` (the layout of ``block_law.joint_law(...).law``).

    Every round drafts ``gamma`` tokens per unfinished sequence from ``draft``, reads ``target`` at the
    ``gamma + 1`` positions and appends the accepted tokens and the next token, as an SD loop does."""
    base = vocab + 1                                           # prefix code: Σ (t_i + 1)·base^i, unique per prefix
    longest = length - 1 + gamma                               # the longest prefix a model is asked about
    size = base ** longest
    tables = []
    for model in (target, draft):
        table = torch.zeros(size + 1, vocab, dtype=torch.float64)
        for k in range(longest + 1):
            for prefix in itertools.product(range(vocab), repeat=k):
                table[sum((t + 1) * base**i for i, t in enumerate(prefix))] = model(prefix)
        tables.append(table)
    p_table, q_table = tables
    powers = base ** torch.arange(length + gamma + 1)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(n, length + gamma, dtype=torch.long)
    lengths = torch.zeros(n, dtype=torch.long)
    codes = torch.zeros(n, dtype=torch.long)
    while (active := lengths < length).any():
        rows = active.nonzero()[:, 0]
        code, at = codes[rows], lengths[rows]
        drafted, q_rows, p_codes = [], [], [code]
        for k in range(gamma):
            q_k = q_table[p_codes[-1]]
            tok = torch.multinomial(q_k, 1, generator=gen)[:, 0]
            drafted.append(tok)
            q_rows.append(q_k)
            p_codes.append(p_codes[-1] + (tok + 1) * powers[at + k])
        block = torch.stack(drafted, 1)
        p = torch.stack([p_table[c] for c in p_codes], 1)
        n_acc, nxt = rule.verify(p, torch.stack(q_rows, 1), block, generator=gen)
        emitted = torch.cat([block, torch.zeros_like(block[:, :1])], 1)
        emitted[torch.arange(len(rows)), n_acc] = nxt
        for k in range(gamma + 1):
            keep = k <= n_acc
            r, pos, tok = rows[keep], (at + k)[keep], emitted[keep, k]
            tokens[r, pos] = tok
            codes[r] += (tok + 1) * powers[pos]
        lengths[rows] = at + n_acc + 1
    cell = (tokens[:, :length] * vocab ** torch.arange(length - 1, -1, -1)).sum(-1)
    return np.bincount(cell.numpy(), minlength=vocab**length).reshape((vocab,) * length).astype(float)
