"""Tests for verispec.bench.stats against hand-computed, published and scipy reference values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from scipy import stats as sst

from verispec.bench.stats import (
    bootstrap_ci,
    mcnemar_exact,
    mean_ci,
    newcombe_paired_interval,
    paired_difference,
    paired_t,
    spearman,
    wilson_interval,
    z_value,
)

Z95 = 1.959963984540054  # Phi^{-1}(0.975)


def _wilson_by_hand(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    p = k / n
    centre = (2 * n * p + z * z) / (2 * (n + z * z))
    half = z * np.sqrt(z * z + 4 * n * p * (1 - p)) / (2 * (n + z * z))
    return centre - half, centre + half


# ------------------------------------------------------------------------------------------
# Wilson


def test_z_value():
    assert z_value(0.95) == pytest.approx(Z95, abs=1e-12)
    assert z_value(0.90) == pytest.approx(1.6448536269514722, abs=1e-12)
    with pytest.raises(ValueError):
        z_value(1.0)


@pytest.mark.parametrize(
    "k,n,expected",
    [
        # hand-computed from the score formula (see _wilson_by_hand), to 4 decimals
        (8, 10, (0.4902, 0.9433)),
        (0, 10, (0.0000, 0.2775)),
        (10, 10, (0.7225, 1.0000)),
        # Newcombe (1998a), Stat Med 17:857, Table II, method 3 (score, no continuity correction)
        (81, 263, (0.2553, 0.3662)),
        (15, 148, (0.0624, 0.1605)),
        (0, 20, (0.0000, 0.1611)),
        (1, 29, (0.0061, 0.1718)),
    ],
)
def test_wilson_known_values(k, n, expected):
    lo, hi = wilson_interval(k, n)
    assert (round(lo, 4), round(hi, 4)) == expected
    hlo, hhi = _wilson_by_hand(k, n)
    assert lo == pytest.approx(max(0.0, hlo), abs=1e-12)
    assert hi == pytest.approx(min(1.0, hhi), abs=1e-12)


def test_wilson_closed_forms_and_edges():
    # k = 0: upper limit z^2 / (n + z^2); k = n: lower limit n / (n + z^2)
    for n in (1, 5, 10, 37):
        lo, hi = wilson_interval(0, n)
        assert lo == 0.0 and hi == pytest.approx(Z95**2 / (n + Z95**2), abs=1e-12)
        lo, hi = wilson_interval(n, n)
        assert hi == 1.0 and lo == pytest.approx(n / (n + Z95**2), abs=1e-12)
    # 8/10 at 90 %: narrower than at 95 %
    lo90, hi90 = wilson_interval(8, 10, conf=0.90)
    h = _wilson_by_hand(8, 10, z=1.6448536269514722)
    assert (lo90, hi90) == pytest.approx(h, abs=1e-12)
    assert wilson_interval(8, 10)[0] < lo90 and hi90 < wilson_interval(8, 10)[1]
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    with pytest.raises(ValueError):
        wilson_interval(-1, 10)


def test_wilson_coverage_by_simulation():
    """Over 2000 simulated binomials (random n and p) the 95% Wilson interval covers the true p
    95% of the time, within 3 standard errors of the simulation itself."""
    rng = np.random.default_rng(20240607)
    reps = 2000
    ns = rng.integers(20, 201, size=reps)
    ps = rng.uniform(0.05, 0.95, size=reps)
    ks = rng.binomial(ns, ps)
    covered = []
    for k, n, p in zip(ks, ns, ps):
        lo, hi = wilson_interval(int(k), int(n))
        covered.append(lo <= p <= hi)
    cov = float(np.mean(covered))
    se = math.sqrt(cov * (1 - cov) / reps)
    assert abs(cov - 0.95) <= 3 * se, (cov, se)
    # the exact expected coverage of these (n, p) draws (binomial pmf over all k) is ~95% too,
    # and the simulation agrees with it
    exact = []
    for n, p in zip(ns, ps):
        k = np.arange(n + 1)
        lo, hi = _wilson_by_hand(k, n)  # vectorised over k
        exact.append(float(sst.binom.pmf(k, n, p)[(lo <= p) & (p <= hi)].sum()))
    assert abs(np.mean(exact) - 0.95) < 0.01
    assert abs(cov - np.mean(exact)) <= 3 * se


# ------------------------------------------------------------------------------------------
# McNemar and the paired difference


@pytest.mark.parametrize("n01,n10", [(1, 6), (6, 1), (0, 5), (3, 3), (2, 9), (10, 25), (0, 1), (40, 60)])
def test_mcnemar_matches_binomtest(n01, n10):
    p = mcnemar_exact(n01, n10)
    assert p == pytest.approx(sst.binomtest(n10, n01 + n10, 0.5).pvalue, rel=1e-12, abs=1e-15)


def test_mcnemar_hand_values():
    assert mcnemar_exact(1, 6) == pytest.approx(16 / 128)  # 2 * (1 + 7) / 2^7
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(3, 3) == 1.0  # capped at 1
    assert mcnemar_exact(0, 0) == 1.0  # no discordant pairs
    assert mcnemar_exact(0, 1) == 1.0


def _vectors(a: int, b: int, c: int, d: int):
    """Binary vectors whose paired 2x2 table is [[a, b], [c, d]] (x = first, y = second)."""
    x = [1] * a + [1] * b + [0] * c + [0] * d
    y = [1] * a + [0] * b + [1] * c + [0] * d
    return np.array(x), np.array(y)


# Newcombe (1998b), Stat Med 17:2635, Table II, method 10 (hybrid score, no continuity correction)
NEWCOMBE_1998B = [
    ((36, 12, 2, 0), (0.0569, 0.3404)),
    ((18, 12, 2, 18), (0.0562, 0.3290)),
    ((53, 0, 0, 1), (-0.0729, 0.0729)),
    ((0, 30, 0, 0), (0.8395, 1.0000)),
]


@pytest.mark.parametrize("table,expected", NEWCOMBE_1998B)
def test_paired_difference_newcombe_published(table, expected):
    a, b, c, d = table
    n = a + b + c + d
    lo, hi = newcombe_paired_interval(a, b, c, d)
    assert (round(lo, 4), round(hi, 4)) == expected
    x, y = _vectors(*table)
    res = paired_difference(x, y)
    assert res.diff == pytest.approx((b - c) / n)
    assert (res.ci_lo, res.ci_hi) == (lo, hi)
    assert (res.n, res.n10, res.n01) == (n, b, c)
    assert res.p_value == pytest.approx(sst.binomtest(b, b + c, 0.5).pvalue if b + c else 1.0)
    assert res.test == "mcnemar_exact"


def test_paired_difference_basic_and_wald():
    # a: method, b: baseline over 20 matched keys; 5 keys lost, 1 gained
    base = np.array([1] * 16 + [0] * 4)
    meth = base.copy()
    meth[:5] = 0
    meth[16] = 1
    res = paired_difference(meth.astype(bool), base)
    assert res.diff == pytest.approx(-0.2)
    assert (res.n, res.n01, res.n10) == (20, 5, 1)
    assert res.p_value == pytest.approx(2 * 7 / 64)  # 2 * P[Bin(6, 1/2) <= 1]
    assert res.ci_lo < res.diff < res.ci_hi
    w = paired_difference(meth, base, method="wald")
    half = Z95 * math.sqrt((6 - 4**2 / 20)) / 20
    assert (w.ci_lo, w.ci_hi) == pytest.approx((-0.2 - half, -0.2 + half), abs=1e-12)
    # no discordant pairs: p = 1, Wald collapses, Newcombe does not
    same = paired_difference([1, 0, 1, 1], [1, 0, 1, 1])
    assert same.diff == 0 and same.p_value == 1.0 and same.ci_lo < 0 < same.ci_hi
    wz = paired_difference([1, 0, 1, 1], [1, 0, 1, 1], method="wald")
    assert wz.ci_lo == wz.ci_hi == 0.0
    with pytest.raises(ValueError):
        paired_difference([1, 0], [1])
    with pytest.raises(ValueError):
        paired_difference([1, 2], [1, 0])
    with pytest.raises(ValueError):
        paired_difference([1], [0], method="nope")
    empty = paired_difference([], [])
    assert empty.n == 0 and math.isnan(empty.diff) and empty.p_value == 1.0


@settings(max_examples=150, deadline=None)
@given(hst.lists(hst.tuples(hst.booleans(), hst.booleans()), min_size=1, max_size=80))
def test_paired_difference_properties(pairs):
    x = [p[0] for p in pairs]
    y = [p[1] for p in pairs]
    r = paired_difference(x, y)
    s = paired_difference(y, x)
    assert -1.0 <= r.ci_lo <= r.diff <= r.ci_hi <= 1.0
    # swapping the arms mirrors everything
    assert s.diff == pytest.approx(-r.diff, abs=1e-12)
    assert (s.ci_lo, s.ci_hi) == pytest.approx((-r.ci_hi, -r.ci_lo), abs=1e-12)
    assert s.p_value == pytest.approx(r.p_value) and (s.n01, s.n10) == (r.n10, r.n01)
    assert 0.0 <= r.p_value <= 1.0


# ------------------------------------------------------------------------------------------
# Continuous metrics


def test_mean_ci_hand_and_scipy():
    est, lo, hi = mean_ci([1, 2, 3, 4, 5])
    # mean 3, s = sqrt(2.5), t_{4, .975} = 2.7764451051977987
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)
    assert est == 3.0 and (lo, hi) == pytest.approx((3 - half, 3 + half), abs=1e-12)
    assert (round(lo, 4), round(hi, 4)) == (1.0368, 4.9632)
    rng = np.random.default_rng(0)
    v = rng.normal(2.0, 3.0, size=57)
    ref = sst.t.interval(0.9, len(v) - 1, loc=v.mean(), scale=sst.sem(v))
    assert mean_ci(v, conf=0.9)[1:] == pytest.approx(ref, abs=1e-12)
    assert math.isnan(mean_ci([])[0]) and math.isnan(mean_ci([4.0])[1])
    assert mean_ci([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)


def test_bootstrap_ci():
    rng = np.random.default_rng(1)
    v = rng.normal(10.0, 2.0, size=400)
    b1 = bootstrap_ci(v, n_boot=4000, seed=3)
    b2 = bootstrap_ci(v, n_boot=4000, seed=3)
    assert b1 == b2  # reproducible
    assert b1.estimate == pytest.approx(v.mean())
    assert b1.lo < b1.estimate < b1.hi
    t = mean_ci(v)
    # percentile bootstrap of the mean ~ t-interval for a large normal sample
    assert (b1.hi - b1.lo) == pytest.approx(t.hi - t.lo, rel=0.12)
    assert b1.lo == pytest.approx(t.lo, abs=0.1) and b1.hi == pytest.approx(t.hi, abs=0.1)
    # a statistic without an ``axis`` argument goes through the per-resample path
    med = bootstrap_ci(v, stat=lambda s: float(np.percentile(s, 50)), n_boot=500, seed=0)
    med_vec = bootstrap_ci(v, stat=np.median, n_boot=500, seed=0)
    assert med == pytest.approx(med_vec)
    assert math.isnan(bootstrap_ci([]).estimate)


def test_paired_t_matches_scipy():
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, size=40)
    y = x + rng.normal(0.3, 0.5, size=40)
    r = paired_t(x, y)
    ref = sst.ttest_rel(x, y)
    assert r.t == pytest.approx(ref.statistic, rel=1e-10)
    assert r.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    ci = ref.confidence_interval(0.95)
    assert (r.ci_lo, r.ci_hi) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert r.mean_diff == pytest.approx(np.mean(x - y)) and r.n == 40 and r.df == 39
    # hand example: d = [1, 2, 3] -> mean 2, s = 1, t = 2 * sqrt(3)
    h = paired_t([2, 4, 6], [1, 2, 3])
    assert h.t == pytest.approx(2 * math.sqrt(3)) and h.df == 2
    assert h.p_value == pytest.approx(2 * sst.t.sf(2 * math.sqrt(3), 2))
    # degenerate cases
    z = paired_t([1, 2, 3], [1, 2, 3])
    assert z.t == 0.0 and z.p_value == 1.0
    c = paired_t([2, 3, 4], [1, 2, 3])
    assert c.t == math.inf and c.p_value == 0.0 and c.ci_lo == c.ci_hi == 1.0
    assert math.isnan(paired_t([1], [0]).p_value)
    with pytest.raises(ValueError):
        paired_t([1, 2], [1])


def test_spearman_matches_scipy_and_hand():
    # hand: ranks x = 1..5, y = [1, 2, 3.5, 5, 3.5] (tie -> average rank) -> rho = 8 / sqrt(95)
    r = spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7])
    assert r.rho == pytest.approx(8 / math.sqrt(95), abs=1e-12)
    ref = sst.spearmanr([1, 2, 3, 4, 5], [5, 6, 7, 8, 7])
    assert r.rho == pytest.approx(ref.statistic, abs=1e-12)
    assert r.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    rng = np.random.default_rng(11)
    for _ in range(20):
        n = int(rng.integers(5, 60))
        x = rng.integers(0, 8, size=n)  # plenty of ties
        y = x + rng.integers(-4, 5, size=n)
        got = spearman(x, y)
        ref = sst.spearmanr(x, y)
        assert got.rho == pytest.approx(ref.statistic, abs=1e-12)
        assert got.p_value == pytest.approx(ref.pvalue, rel=1e-8, abs=1e-300)
        assert got.n == n
    assert spearman([1, 2, 3], [3, 2, 1]).rho == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [3, 2, 1]).p_value == 0.0
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]).rho)
