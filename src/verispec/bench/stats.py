"""Textbook statistics for the benchmark layer (pure numpy / scipy).

Conventions
-----------
* ``conf`` is the two-sided confidence level (0.95 -> 95 % interval).
* Binary outcome vectors are anything ``np.asarray`` turns into 0/1 (bools, ints).
* Every function returns plain Python floats / ints (never numpy scalars), so results
  serialise to JSON and format predictably.

Choices (documented here once, referenced below)
------------------------------------------------
* Single proportion: **Wilson score interval** without continuity correction
  (Wilson 1927; Newcombe 1998a "method 3").  Good coverage near 0 and 1, never outside [0, 1].
* Paired difference of proportions: **Newcombe's hybrid score interval, method 10**
  (Newcombe 1998b, Stat. Med. 17:2635, "square-and-add" of the two marginal Wilson
  intervals, corrected for the correlation phi between the paired outcomes, with Newcombe's
  phi* correction ``max(AD-BC-N/2, 0)`` when AD > BC).  Chosen over the Wald interval on
  paired differences because Wald collapses to zero width when there are no discordant pairs
  and overshoots [-1, 1] for extreme tables; the Wald interval (Newcombe method 1) is still
  available with ``method="wald"``.
* Paired significance: **exact McNemar test** = two-sided exact binomial test of
  ``n10`` successes in ``n01 + n10`` discordant pairs with p = 1/2 (doubled smaller tail,
  capped at 1; identical to ``scipy.stats.binomtest(...).pvalue`` for p = 1/2).
  ``p = 1`` when there are no discordant pairs.
* Continuous paired metrics: paired t-test / t-interval on the differences.
* Rank correlation: Spearman's rho = Pearson correlation of average ranks (ties get the
  average rank); p-value from the t-distribution with n-2 df (what scipy uses).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np
from scipy import stats as _st

__all__ = [
    "Interval",
    "PairedResult",
    "PairedTResult",
    "SpearmanResult",
    "z_value",
    "wilson_interval",
    "mean_ci",
    "bootstrap_ci",
    "mcnemar_exact",
    "newcombe_paired_interval",
    "paired_difference",
    "paired_t",
    "spearman",
]


class Interval(NamedTuple):
    """A point estimate with a two-sided confidence interval."""

    estimate: float
    lo: float
    hi: float


class PairedResult(NamedTuple):
    """Paired comparison of two binary outcome vectors ``a`` and ``b`` (same keys, same order).

    ``diff = mean(a) - mean(b)``; ``n10`` = #(a=1, b=0), ``n01`` = #(a=0, b=1);
    ``p_value`` is the exact McNemar p; ``test`` names the test used.
    """

    diff: float
    ci_lo: float
    ci_hi: float
    p_value: float
    n: int
    n01: int
    n10: int
    test: str


class PairedTResult(NamedTuple):
    """Paired t-test of ``x - y``: mean difference, its t-interval, t statistic, two-sided p."""

    mean_diff: float
    ci_lo: float
    ci_hi: float
    t: float
    p_value: float
    n: int
    df: int


class SpearmanResult(NamedTuple):
    rho: float
    p_value: float
    n: int


def _check_conf(conf: float) -> None:
    if not (0.0 < conf < 1.0):
        raise ValueError(f"conf must be in (0, 1), got {conf!r}")


def z_value(conf: float = 0.95) -> float:
    """Two-sided standard-normal critical value, e.g. 1.959964 for conf=0.95."""
    _check_conf(conf)
    return float(_st.norm.ppf(0.5 + conf / 2.0))


def wilson_interval(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Wilson score interval (no continuity correction) for ``k`` successes out of ``n``.

    lo, hi = (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n).
    Exactly 0 at k=0 and exactly 1 at k=n.  ``n == 0`` gives ``(nan, nan)`` (no information).
    """
    k = int(k)
    n = int(n)
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return (float("nan"), float("nan"))
    z = z_value(conf)
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2.0 * n)) / denom
    half = z * np.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (float(lo), float(hi))


def mean_ci(values: Sequence[float], conf: float = 0.95) -> Interval:
    """Student-t interval for the mean: mean +/- t_{n-1} * s / sqrt(n) (s with ddof=1).

    Returns ``Interval(mean, lo, hi)``.  n == 0 -> all nan; n == 1 -> (x, nan, nan);
    zero spread -> (mean, mean, mean).
    """
    _check_conf(conf)
    x = np.asarray(values, dtype=float).ravel()
    n = x.size
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    m = float(x.mean())
    if n == 1:
        return Interval(m, float("nan"), float("nan"))
    se = float(x.std(ddof=1)) / np.sqrt(n)
    t = float(_st.t.ppf(0.5 + conf / 2.0, n - 1))
    return Interval(m, float(m - t * se), float(m + t * se))


def bootstrap_ci(
    values: Sequence[float],
    stat: Callable = np.mean,
    conf: float = 0.95,
    n_boot: int = 2000,
    seed: int | None = 0,
) -> Interval:
    """Percentile bootstrap interval for ``stat(values)``.

    Resamples ``values`` with replacement ``n_boot`` times (numpy ``default_rng(seed)``, so the
    result is reproducible for a fixed seed), and returns ``Interval(stat(values), q_lo, q_hi)``
    with ``q_lo, q_hi`` the (1-conf)/2 and (1+conf)/2 quantiles of the bootstrap distribution.
    ``stat`` is called as ``stat(sample_matrix, axis=1)`` when it accepts ``axis`` (vectorised),
    otherwise once per resample.
    """
    _check_conf(conf)
    if n_boot < 1:
        raise ValueError("n_boot must be >= 1")
    x = np.asarray(values, dtype=float).ravel()
    n = x.size
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    est = float(stat(x))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    samples = x[idx]
    try:
        boot = np.asarray(stat(samples, axis=1), dtype=float)
        if boot.shape != (n_boot,):
            raise TypeError
    except TypeError:
        boot = np.array([float(stat(row)) for row in samples])
    alpha = 1.0 - conf
    lo, hi = np.quantile(boot, [alpha / 2.0, 1.0 - alpha / 2.0])
    return Interval(est, float(lo), float(hi))


def mcnemar_exact(n01: int, n10: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts.

    Under H0 each discordant pair is (1,0) or (0,1) with probability 1/2, so
    p = min(1, 2 * P[Bin(n01+n10, 1/2) <= min(n01, n10)]).  p = 1 with no discordant pairs.
    """
    n01 = int(n01)
    n10 = int(n10)
    if n01 < 0 or n10 < 0:
        raise ValueError("discordant counts must be >= 0")
    m = n01 + n10
    if m == 0:
        return 1.0
    return float(min(1.0, 2.0 * _st.binom.cdf(min(n01, n10), m, 0.5)))


def newcombe_paired_interval(
    a: int, b: int, c: int, d: int, conf: float = 0.95
) -> tuple[float, float]:
    """Newcombe (1998b) method 10 interval for p1 - p2 from a paired 2x2 table.

    Cells: ``a`` = both successes, ``b`` = first success only, ``c`` = second success only,
    ``d`` = both failures; p1 = (a+b)/n, p2 = (a+c)/n.  With Wilson limits (l1,u1), (l2,u2):
        lo = D - sqrt((p1-l1)^2 - 2 phi (p1-l1)(u2-p2) + (u2-p2)^2)
        hi = D + sqrt((u1-p1)^2 - 2 phi (u1-p1)(p2-l2) + (p2-l2)^2)
    where phi = (ad-bc)/sqrt((a+b)(c+d)(a+c)(b+d)) with Newcombe's correction
    (numerator max(ad-bc-n/2, 0) when ad > bc) and phi = 0 when a margin is empty.
    Reproduces Newcombe's published examples (see the tests).
    """
    a, b, c, d = (int(v) for v in (a, b, c, d))
    if min(a, b, c, d) < 0:
        raise ValueError("cell counts must be >= 0")
    n = a + b + c + d
    if n == 0:
        return (float("nan"), float("nan"))
    p1 = (a + b) / n
    p2 = (a + c) / n
    diff = p1 - p2
    l1, u1 = wilson_interval(a + b, n, conf)
    l2, u2 = wilson_interval(a + c, n, conf)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    if margins == 0:
        phi = 0.0
    else:
        num = a * d - b * c
        if num > 0:
            num = max(num - n / 2.0, 0.0)
        phi = num / np.sqrt(float(margins))
    dl = np.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    du = np.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return (float(max(-1.0, diff - dl)), float(min(1.0, diff + du)))


def _binary(v, name: str) -> np.ndarray:
    x = np.asarray(v).ravel()
    if x.dtype == bool:
        return x.astype(np.int64)
    xf = x.astype(float)
    if not np.all((xf == 0) | (xf == 1)):
        raise ValueError(f"{name} must be binary (0/1 or bool)")
    return xf.astype(np.int64)


def paired_difference(a, b, conf: float = 0.95, method: str = "newcombe") -> PairedResult:
    """Paired comparison of binary outcomes ``a`` vs ``b`` observed on the same keys, in order.

    ``diff = mean(a) - mean(b)`` with a ``conf`` interval (``method="newcombe"``: Newcombe
    1998b method 10, default; ``method="wald"``: diff +/- z * sqrt(((n10+n01) - (n10-n01)^2/n))/n,
    Newcombe method 1) and the exact McNemar p-value.  ``n`` = number of pairs.
    Empty input gives nan diff/CI, p = 1.
    """
    _check_conf(conf)
    x = _binary(a, "a")
    y = _binary(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same length ({x.size} vs {y.size})")
    n = int(x.size)
    n11 = int(np.sum((x == 1) & (y == 1)))
    n10 = int(np.sum((x == 1) & (y == 0)))
    n01 = int(np.sum((x == 0) & (y == 1)))
    n00 = n - n11 - n10 - n01
    p = mcnemar_exact(n01, n10)
    test = "mcnemar_exact"
    if n == 0:
        nan = float("nan")
        return PairedResult(nan, nan, nan, 1.0, 0, 0, 0, test)
    diff = (n10 - n01) / n
    if method == "newcombe":
        lo, hi = newcombe_paired_interval(n11, n10, n01, n00, conf)
    elif method == "wald":
        z = z_value(conf)
        var = ((n10 + n01) - (n10 - n01) ** 2 / n) / (n * n)
        half = z * np.sqrt(max(var, 0.0))
        lo, hi = float(diff - half), float(diff + half)
    else:
        raise ValueError(f"unknown method {method!r} (use 'newcombe' or 'wald')")
    return PairedResult(float(diff), lo, hi, p, n, n01, n10, test)


def paired_t(x, y, conf: float = 0.95) -> PairedTResult:
    """Paired t-test on ``d = x - y`` (two-sided) with a t-interval for the mean difference.

    Agrees with ``scipy.stats.ttest_rel(x, y)``.  Degenerate cases: n < 2 -> t, p, CI nan;
    all differences identical -> CI collapses to the mean, t = 0 / p = 1 if that mean is 0,
    else t = +/-inf, p = 0.
    """
    _check_conf(conf)
    xa = np.asarray(x, dtype=float).ravel()
    ya = np.asarray(y, dtype=float).ravel()
    if xa.shape != ya.shape:
        raise ValueError(f"x and y must have the same length ({xa.size} vs {ya.size})")
    d = xa - ya
    n = int(d.size)
    nan = float("nan")
    if n == 0:
        return PairedTResult(nan, nan, nan, nan, nan, 0, 0)
    m = float(d.mean())
    if n == 1:
        return PairedTResult(m, nan, nan, nan, nan, 1, 0)
    df = n - 1
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        if m == 0.0:
            return PairedTResult(m, m, m, 0.0, 1.0, n, df)
        return PairedTResult(m, m, m, float(np.copysign(np.inf, m)), 0.0, n, df)
    se = sd / np.sqrt(n)
    t = m / se
    p = float(2.0 * _st.t.sf(abs(t), df))
    q = float(_st.t.ppf(0.5 + conf / 2.0, df))
    return PairedTResult(m, float(m - q * se), float(m + q * se), float(t), p, n, df)


def spearman(x, y) -> SpearmanResult:
    """Spearman rank correlation (ties -> average ranks) with a two-sided p-value.

    rho = Pearson correlation of ``scipy.stats.rankdata(..., method="average")`` ranks;
    p from t = rho sqrt((n-2)/(1-rho^2)) on n-2 df (as ``scipy.stats.spearmanr``).
    Constant input or n < 3 -> rho and/or p nan; |rho| = 1 -> p = 0.
    """
    xa = np.asarray(x, dtype=float).ravel()
    ya = np.asarray(y, dtype=float).ravel()
    if xa.shape != ya.shape:
        raise ValueError(f"x and y must have the same length ({xa.size} vs {ya.size})")
    n = int(xa.size)
    nan = float("nan")
    if n < 2:
        return SpearmanResult(nan, nan, n)
    rx = _st.rankdata(xa, method="average")
    ry = _st.rankdata(ya, method="average")
    rx = rx - rx.mean()
    ry = ry - ry.mean()
    den = np.sqrt(np.sum(rx * rx) * np.sum(ry * ry))
    if den == 0.0:
        return SpearmanResult(nan, nan, n)
    rho = float(np.clip(np.sum(rx * ry) / den, -1.0, 1.0))
    if n < 3:
        return SpearmanResult(rho, nan, n)
    df = n - 2
    if abs(rho) >= 1.0:
        return SpearmanResult(rho, 0.0, n)
    t = rho * np.sqrt(df / (1.0 - rho * rho))
    p = float(2.0 * _st.t.sf(abs(t), df))
    return SpearmanResult(rho, p, n)
