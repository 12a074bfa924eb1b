"""Tests for verispec.bench.stats against hand-computed, published and scipy reference values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from scipy import stats as sst

from verispec.bench.stats import (
    clustered_mcnemar,
    clustered_paired_difference,
    clustered_proportion,
    design_effect,
    mcnemar_exact,
    newcombe_paired_interval,
    paired_difference,
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
    half = Z95 * math.sqrt(6 - 4**2 / 20) / 20
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
# Clustered outcomes (several samples per problem)


def test_clustered_with_one_sample_per_problem_is_the_unclustered_interval():
    rng = np.random.default_rng(2)
    for _ in range(30):
        n = int(rng.integers(2, 80))
        y = rng.random(n) < rng.uniform(0.1, 0.9)
        got = clustered_proportion(y, [f"p{i}" for i in range(n)])
        assert got.design_effect == 1.0 and got.n_effective == n and got.n_clusters == n
        assert (got.lo, got.hi) == pytest.approx(wilson_interval(int(y.sum()), n), abs=1e-12)
        b = rng.random(n) < 0.5
        pr = clustered_paired_difference(y, b, range(n))
        ref = paired_difference(y, b)
        if (y != b).any() and len(set((y.astype(int) - b.astype(int)).tolist())) > 1:
            assert pr.design_effect == pytest.approx(1.0)
            assert (pr.ci_lo, pr.ci_hi) == pytest.approx((ref.ci_lo, ref.ci_hi), abs=1e-12)
        assert pr.diff == ref.diff and (pr.n01, pr.n10) == (ref.n01, ref.n10)
        # the clustered McNemar is then the asymptotic McNemar chi-square test
        m = ref.n01 + ref.n10
        chi = sst.chi2.sf((ref.n10 - ref.n01) ** 2 / m, 1) if m else 1.0
        assert pr.p_value == pytest.approx(chi, rel=1e-12)


def test_clustered_with_identical_samples_is_the_interval_of_the_problems():
    problem_correct = [1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1]            # 8 of 12 problems
    problem_base = [1, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1]
    for m in (2, 5, 16):
        y = np.repeat(problem_correct, m)
        b = np.repeat(problem_base, m)
        cl = np.repeat(np.arange(12), m)
        got = clustered_proportion(y, cl)
        assert got.design_effect == pytest.approx(m) and got.n_effective == pytest.approx(12)
        assert (got.lo, got.hi) == pytest.approx(wilson_interval(8, 12), abs=1e-12)
        naive = wilson_interval(int(y.sum()), y.size)
        assert naive[1] - naive[0] < got.hi - got.lo  # the unclustered interval is too narrow
        pr = clustered_paired_difference(y, b, cl)
        ref = paired_difference(problem_correct, problem_base)
        assert pr.design_effect == pytest.approx(m)
        assert (pr.ci_lo, pr.ci_hi) == pytest.approx((ref.ci_lo, ref.ci_hi), abs=1e-12)
        assert pr.diff == pytest.approx(ref.diff) and pr.n_clusters == 12 and pr.n == 12 * m
        # Durkalski's statistic depends on the per-problem sums only through their ratio: m cancels
        assert pr.p_value == pytest.approx(clustered_mcnemar(problem_correct, problem_base, range(12)))


def test_design_effect_hand_values_and_degenerate_cases():
    # clusters {0,1}: e = (1-0.5, 1-0.5) and (0-0.5, 0-0.5) -> V_c = 1^2 + 1^2 = 2, V_iid = 4 * 0.25 = 1
    assert design_effect([1, 1, 0, 0], ["a", "a", "b", "b"]) == pytest.approx(2.0)
    # perfectly anti-correlated within clusters -> V_c = 0; floored at 1
    assert design_effect([1, 0, 1, 0], ["a", "a", "b", "b"]) == 1.0
    # all outcomes equal: the worst case n / n_clusters (a run that solves everything is as
    # informative as its problems, not its samples)
    assert design_effect([1] * 6, [0, 0, 0, 1, 1, 1]) == 3.0
    all_right = clustered_proportion([1] * 6, [0, 0, 0, 1, 1, 1])
    assert (all_right.lo, all_right.hi) == pytest.approx(wilson_interval(2, 2))
    # unequal cluster sizes: hand computation, p = 3/5
    y, cl = [1, 1, 1, 0, 0], ["a", "a", "b", "b", "c"]
    e = np.array(y) - 0.6
    v_c = (e[0] + e[1]) ** 2 + (e[2] + e[3]) ** 2 + e[4] ** 2
    assert design_effect(y, cl) == pytest.approx(max(1.0, v_c / np.sum(e * e)))
    # a single problem: as informative as one sample, whatever its samples say
    one = clustered_proportion([1, 0, 1, 1], ["p"] * 4)
    assert one.design_effect == 4.0 and one.n_effective == 1.0
    assert (one.lo, one.hi) == pytest.approx(_wilson_by_hand(0.75, 1), abs=1e-12)  # Wilson at n = 1
    with pytest.raises(ValueError, match="one label per outcome"):
        clustered_proportion([1, 0], ["a"])
    with pytest.raises(ValueError, match="binary"):
        clustered_proportion([1, 2], ["a", "b"])
    with pytest.raises(ValueError, match="same length"):
        clustered_paired_difference([1, 0], [1], ["a", "b"])
    assert math.isnan(clustered_proportion([], []).estimate)
    assert clustered_paired_difference([], [], []).p_value == 1.0
    assert clustered_mcnemar([1, 1], [1, 1], ["a", "b"]) == 1.0


def test_clustered_interval_keeps_its_coverage_where_the_unclustered_one_does_not():
    """Problems differ in difficulty (beta-distributed solve rates, ICC ~ 0.33), 8 samples each.

    The estimand is the mean solve rate over problems.  Wilson on samples treats 240 correlated
    samples as independent and under-covers badly; the clustered interval should be near 95%.
    1000 replications: a binomial standard error of ~0.7 percentage points around 95%, so the
    thresholds below (>= 0.92 and <= 0.85) are far from chance failures."""
    rng = np.random.default_rng(7)
    n_prob, m, a, b = 30, 8, 1.2, 0.8        # mean 0.6, ICC = 1 / (a + b + 1) = 1/3
    truth = a / (a + b)
    hits_cl = hits_iid = 0
    reps = 1000
    cl = np.repeat(np.arange(n_prob), m)
    for _ in range(reps):
        rates = rng.beta(a, b, size=n_prob)
        y = (rng.random((n_prob, m)) < rates[:, None]).ravel()
        c = clustered_proportion(y, cl)
        lo, hi = wilson_interval(int(y.sum()), y.size)
        hits_cl += c.lo <= truth <= c.hi
        hits_iid += lo <= truth <= hi
    assert hits_cl / reps >= 0.92
    assert hits_iid / reps <= 0.85


def test_clustered_mcnemar_hand_value():
    # per-problem n10_g - n01_g: p 2, q 1, r -1, s 3 -> X^2 = 5^2 / (4 + 1 + 1 + 9)
    a = [1, 1, 1, 0, 0, 1, 1, 1]
    b = [0, 0, 0, 0, 1, 0, 0, 0]
    cl = ["p", "p", "q", "q", "r", "s", "s", "s"]
    per = {}
    for x, y, g in zip(a, b, cl):
        per[g] = per.get(g, 0) + x - y
    assert per == {"p": 2, "q": 1, "r": -1, "s": 3}
    stat = 5**2 / (4 + 1 + 1 + 9)
    assert clustered_mcnemar(a, b, cl) == pytest.approx(sst.chi2.sf(stat, 1), rel=1e-12)
