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
* Several samples per problem (clustered outcomes): samples of one problem are correlated, so
  the intervals above are too narrow.  The **clustered** versions keep the same estimator and
  interval shape but use the *effective sample size* ``n / deff`` (Kish; Korn & Graubard 1998,
  Survey Methodology 24:193, for Wilson-type intervals on survey data), where the design effect
  ``deff = V_cluster / V_iid`` compares the cluster-robust (sandwich) variance of the mean,
  ``Σ_g (Σ_{j∈g} e_j)² / n²``, with the independent-samples one, ``Σ_j e_j² / n²``
  (``e_j`` = outcome − mean; for a paired difference, ``d_j`` − mean difference).  Consequences,
  checked in the tests: with one sample per problem ``deff = 1`` and the interval *is* the
  unclustered one; when the samples of a problem are identical ``deff`` = samples per problem
  and the interval is the one computed from the problems alone.  ``deff`` is floored at 1 (few
  problems make a smaller estimate noise, not information), and when ``V_iid = 0`` (all
  outcomes equal; no discordant pairs) or there is a single problem it takes its worst case
  ``n / n_problems``.
  Paired significance with clusters: the **clustered McNemar test** of Durkalski et al. (2003,
  Stat. Med. 22:2417), ``X² = (Σ_g (n10_g − n01_g))² / Σ_g (n10_g − n01_g)²`` on 1 df, which is
  the asymptotic McNemar statistic with one pair per problem.
* Speed-up of one run over another on the same prompts (:func:`speedup_interval`): the ratio of the two
  pooled rates ``(Σ tokens_a / Σ seconds_a) / (Σ tokens_b / Σ seconds_b)`` over the paired samples, with a
  **percentile bootstrap** interval that resamples problems (all samples of a problem together; Efron &
  Tibshirani 1993, ch. 13), from a fixed seed so that a report is reproducible.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats as _st

__all__ = [
    "PairedResult",
    "ClusteredProportion",
    "z_value",
    "wilson_interval",
    "mcnemar_exact",
    "newcombe_paired_interval",
    "paired_difference",
    "clustered_proportion",
    "clustered_paired_difference",
    "clustered_mcnemar",
    "ClusteredPairedResult",
    "design_effect",
    "SpeedUp",
    "speedup_interval",
]


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
    return _wilson(k, n, z_value(conf))


def _wilson(k: float, n: float, z: float) -> tuple[float, float]:
    """Wilson limits for ``k`` of ``n``; real-valued so that effective sample sizes can be used."""
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2.0 * n)) / denom
    half = z * np.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (float(lo), float(hi))


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
    if a + b + c + d == 0:
        return (float("nan"), float("nan"))
    return _newcombe(a, b, c, d, z_value(conf))


def _newcombe(a: float, b: float, c: float, d: float, z: float) -> tuple[float, float]:
    """Method-10 limits on a (possibly rescaled, real-valued) paired table; see the caller."""
    n = a + b + c + d
    p1 = (a + b) / n
    p2 = (a + c) / n
    diff = p1 - p2
    l1, u1 = _wilson(a + b, n, z)
    l2, u2 = _wilson(a + c, n, z)
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


# ------------------------------------------------------------------------------------------
# Clustered outcomes: several samples per problem (see "Choices" in the module docstring)


class ClusteredProportion(NamedTuple):
    """Accuracy over clustered samples: estimate, interval, and how much clustering cost.

    ``n_effective = n / design_effect``; the interval is Wilson's at that sample size."""

    estimate: float
    lo: float
    hi: float
    n: int
    n_clusters: int
    design_effect: float
    n_effective: float


class ClusteredPairedResult(NamedTuple):
    """Paired difference over clustered pairs: Newcombe's interval at the effective sample size and
    the clustered McNemar p (``test = "mcnemar_clustered"``)."""

    diff: float
    ci_lo: float
    ci_hi: float
    p_value: float
    n: int
    n_clusters: int
    n01: int
    n10: int
    design_effect: float
    test: str


def _cluster_codes(clusters, n: int) -> tuple[np.ndarray, int]:
    labels = list(clusters)
    if len(labels) != n:
        raise ValueError(f"clusters must give one label per outcome ({len(labels)} labels for {n} outcomes)")
    codes: dict = {}
    idx = np.array([codes.setdefault(c, len(codes)) for c in labels], dtype=np.int64)
    return idx, len(codes)


def design_effect(values, clusters) -> float:
    """``V_cluster / V_iid`` of the mean of ``values`` grouped by ``clusters`` (see the module docstring).

    Floored at 1; ``n / n_clusters`` (its worst case) when every value is the same or there is a
    single cluster."""
    x = np.asarray(values, dtype=float).ravel()
    n = x.size
    idx, g = _cluster_codes(clusters, n)
    if n == 0:
        return float("nan")
    e = x - x.mean()
    v_iid = float(np.sum(e * e))
    if v_iid <= 1e-12 * n or g == 1:  # one problem: its residuals sum to 0, the sandwich says nothing
        return n / g
    v_cluster = float(np.sum(np.bincount(idx, weights=e, minlength=g) ** 2))
    return max(1.0, v_cluster / v_iid)


def clustered_proportion(outcomes, clusters, conf: float = 0.95) -> ClusteredProportion:
    """Accuracy of binary ``outcomes`` whose samples are grouped by ``clusters`` (one label each,
    e.g. the problem id): Wilson's interval at the effective sample size ``n / deff``."""
    _check_conf(conf)
    x = _binary(outcomes, "outcomes")
    n = int(x.size)
    _, g = _cluster_codes(clusters, n)
    if n == 0:
        nan = float("nan")
        return ClusteredProportion(nan, nan, nan, 0, 0, nan, 0.0)
    deff = design_effect(x, clusters)
    n_eff = n / deff
    k = int(x.sum())
    lo, hi = _wilson(k / deff, n_eff, z_value(conf))
    return ClusteredProportion(k / n, lo, hi, n, g, float(deff), float(n_eff))


def clustered_mcnemar(a, b, clusters) -> float:
    """Clustered McNemar p-value (Durkalski et al. 2003) for paired binary ``a`` vs ``b``.

    ``X² = (Σ_g (n10_g − n01_g))² / Σ_g (n10_g − n01_g)²``, χ² with 1 df; p = 1 without
    discordance.  With one pair per cluster this is the asymptotic McNemar test."""
    x, y = _binary(a, "a"), _binary(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same length ({x.size} vs {y.size})")
    idx, g = _cluster_codes(clusters, int(x.size))
    per_cluster = np.bincount(idx, weights=(x - y).astype(float), minlength=g)
    den = float(np.sum(per_cluster**2))
    if den == 0.0:
        return 1.0
    stat = float(per_cluster.sum()) ** 2 / den
    return float(_st.chi2.sf(stat, 1))


def clustered_paired_difference(a, b, clusters, conf: float = 0.95) -> ClusteredPairedResult:
    """Paired comparison of binary ``a`` vs ``b`` whose pairs are grouped by ``clusters``.

    ``diff = mean(a) − mean(b)``; interval: Newcombe method 10 on the paired table scaled by
    ``1 / deff`` with ``deff`` the design effect of the differences ``a − b``; p: clustered McNemar."""
    _check_conf(conf)
    x, y = _binary(a, "a"), _binary(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same length ({x.size} vs {y.size})")
    n = int(x.size)
    _, g = _cluster_codes(clusters, n)
    test = "mcnemar_clustered"
    if n == 0:
        nan = float("nan")
        return ClusteredPairedResult(nan, nan, nan, 1.0, 0, 0, 0, 0, nan, test)
    n11 = int(np.sum((x == 1) & (y == 1)))
    n10 = int(np.sum((x == 1) & (y == 0)))
    n01 = int(np.sum((x == 0) & (y == 1)))
    n00 = n - n11 - n10 - n01
    deff = design_effect(x - y, clusters)
    lo, hi = _newcombe(n11 / deff, n10 / deff, n01 / deff, n00 / deff, z_value(conf))
    p = clustered_mcnemar(x, y, clusters)
    return ClusteredPairedResult(float((n10 - n01) / n), lo, hi, p, n, g, n01, n10, float(deff), test)


class SpeedUp(NamedTuple):
    """``estimate`` = pooled rate of run a over pooled rate of run b; ``lo``/``hi`` its bootstrap interval
    (None with fewer than two problems); ``n``: paired samples, ``n_problems``: problems resampled."""

    estimate: float
    lo: float | None
    hi: float | None
    n: int
    n_problems: int


#: bootstrap resamples of :func:`speedup_interval` (its Monte-Carlo error on a 95 % bound is ~0.005 of the width)
SPEEDUP_RESAMPLES = 4000


def speedup_interval(tokens_a, seconds_a, tokens_b, seconds_b, problems, conf: float = 0.95,
                     resamples: int = SPEEDUP_RESAMPLES, seed: int = 0) -> SpeedUp | None:
    """The speed-up of run a over run b on paired samples (one entry per pair: the tokens and seconds of each
    run, and the pair's problem), with a percentile-bootstrap interval over problems. None when there is no
    pair, or when either run's pooled seconds or tokens are zero (no rate to compare)."""
    _check_conf(conf)
    data = np.asarray([tokens_a, seconds_a, tokens_b, seconds_b], dtype=float).T       # [n, 4]
    if data.size == 0:
        return None
    if not np.isfinite(data).all() or (data < 0).any():
        raise ValueError("tokens and seconds must be finite and >= 0")
    codes, n_problems = _cluster_codes(problems, len(data))
    sums = np.zeros((n_problems, 4))
    np.add.at(sums, codes, data)                                                        # per problem

    def ratio(t: np.ndarray) -> np.ndarray:          # t: [..., 4] pooled sums
        with np.errstate(divide="ignore", invalid="ignore"):
            return (t[..., 0] / t[..., 1]) / (t[..., 2] / t[..., 3])

    total = sums.sum(0)
    if (total <= 0).any():
        return None
    estimate = float(ratio(total))
    if n_problems < 2:
        return SpeedUp(estimate, None, None, len(data), n_problems)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n_problems, np.full(n_problems, 1.0 / n_problems), size=resamples)   # [R, G]
    boot = ratio(counts @ sums)
    boot = boot[np.isfinite(boot)]
    alpha = 1 - conf
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return SpeedUp(estimate, float(lo), float(hi), len(data), n_problems)
