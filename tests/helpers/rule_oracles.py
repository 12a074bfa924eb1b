"""Acceptance rates of every registered per-token rule written from the papers' formulas, in numpy/scipy.

Independent of the rule modules: each oracle reads the rule's name and parameters (``rule.name``,
``rule.params``) and recomputes ``β = Σ_x q(x)·h(x)`` for one row ``p, q: [V]`` (float64) from the
definition in docs/verification-rules.md — divergences from scipy, truncation sets from
:func:`tests.helpers.rule_cases.naive_truncation_mask`, the mentored budget by bisection.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy

from tests.helpers.rule_cases import naive_truncation_mask

#: Order of the steps of the generic truncation rule (the pipeline's).
TRUNCATION_ORDER = ("prob_gap", "top_k", "top_p", "min_p", "eta", "epsilon")


def tv(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


def scipy_divergences(p: np.ndarray, q: np.ndarray) -> dict[str, float]:
    """``D(p, q)`` of every ``div`` option of the divergence-gated rules, from scipy (nats)."""
    m = 0.5 * (p + q)
    return {
        "js": jensenshannon(p, q, base=math.e) ** 2,
        "kl_qp": entropy(q, p),
        "kl_pq": entropy(p, q),
        "tv": tv(p, q),
        "js_rev": 0.5 * entropy(m, p) + 0.5 * entropy(m, q),
    }


def _divergence(p: np.ndarray, q: np.ndarray, kind: str) -> float:
    # every one of these divergences vanishes exactly when the rows are equal (scipy may leave a rounding residue)
    return 0.0 if np.array_equal(p, q) else float(scipy_divergences(p, q)[kind])


def _set_mass(q: np.ndarray, allowed: np.ndarray) -> float:
    return float(q[allowed].sum())


def _cascade_target(p: np.ndarray, q: np.ndarray, rule: str, alpha: float) -> np.ndarray:
    """The deferral target π of the original speculative cascades (Narasimhan et al., table of §3.3)."""
    mp, mq = p.max(), q.max()
    if rule in ("chow", "diff", "opt"):
        use_draft = {"chow": mq >= 1 - alpha, "diff": mq >= mp - alpha,
                     "opt": mq >= mp - alpha * np.clip(q - p, 0, None).sum()}[rule]
        return q if use_draft else p
    tokens = {"token_v1": q >= mp - alpha, "token_v2": p >= mp - alpha, "token_v3": p >= (1 - alpha) * mp}[rule]
    inside = np.where(tokens, q, 0.0)
    return inside + (1 - inside.sum()) * p


def _contrastive_target(p: np.ndarray, q: np.ndarray, mu: float) -> np.ndarray:
    """π_CD ∝ p·q̃^(−μ) on supp p, q̃ = q floored at the row's smallest positive draft probability."""
    q_tilde = np.maximum(q, q[q > 0].min())
    w = np.where(p > 0, p * q_tilde ** (-mu), 0.0)
    return w / w.sum()


def _mentored_budget_acceptance(p: np.ndarray, q: np.ndarray, budget: float) -> float:
    """Σ min(q, p/α) at the smallest α with KL(p‖π_α) <= D, π_α = clip(q, p/β, p/α) on supp p (β normalises):
    an outer bisection on α, an inner root of Σ π = 1 in t = 1/β (scipy's brentq)."""
    on = p > 0

    def law(alpha: float) -> np.ndarray:
        cap = np.where(on, p / alpha if alpha > 0 else np.inf, 0.0)
        y = np.minimum(q, cap)
        if y.sum() >= 1 - 1e-15:                        # nothing rejected: no raise to p/β needed
            return y
        t = brentq(lambda t: np.maximum(y, t * p).sum() - 1, 0.0, 2.0, xtol=1e-16, rtol=1e-15)
        return np.maximum(y, t * p)

    def kl(alpha: float) -> float:
        return float(entropy(p, law(alpha)))

    if kl(0.0) <= budget:
        alpha = 0.0
    else:
        lo, hi = 0.0, 1.0                               # KL(hi) <= D < KL(lo)
        for _ in range(64):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if kl(mid) <= budget else (mid, hi)
        alpha = hi
    cap = np.where(on, p / alpha if alpha > 0 else np.inf, 0.0)
    return float(np.minimum(q, cap).sum())


def acceptance_oracle(rule, p: np.ndarray, q: np.ndarray, raw: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """``β = Σ q·h`` of the per-token ``rule`` on one row ``p, q: [V]``; ``raw``: the pair an ``on=raw`` gate
    reads. Raises ``KeyError`` for a rule without an oracle (a new rule must add one)."""
    name, kw = rule.name, rule.params
    if name == "lossless":
        return 1 - tv(p, q)
    if name == "greedy":
        return float(q[int(np.argmax(p))])
    if name == "strict":
        return float(p @ q)
    if name == "lenience":
        return float(np.minimum(q, p / kw["ell"]).sum())
    if name == "cos_we":
        return 1 - kw["lam"] * tv(p, q)
    if name == "cos_cd":
        return 1 - tv(_contrastive_target(p, q, kw["mu"]), q)
    if name == "ceiling":
        if kw["base"] == "p":
            return float(np.minimum(q, kw["kappa"] * p).sum())
        base = kw["lam"] * p + (1 - kw["lam"]) * q if kw["base"] == "we" else _contrastive_target(p, q, kw["mu"])
        capped = np.minimum(base, kw["kappa"] * p)
        return 1 - tv(capped / capped.sum(), q)
    if name == "cascade":
        return 1 - tv(_cascade_target(p, q, kw["rule"], kw["alpha"]), q)
    if name == "speccascade":
        return _set_mass(q, p >= kw["p_base"] * p.max())
    if name == "typical":
        eps = kw["eps"]
        delta = kw.get("delta", math.sqrt(eps))
        nz = p[p > 0]
        allowed = p >= min(eps, delta * math.exp((nz * np.log(nz)).sum()))
        allowed[int(np.argmax(p))] = True
        return _set_mass(q, allowed)
    if name == "truncation":
        steps = [(k, kw[k]) for k in TRUNCATION_ORDER if k in kw]
        return _set_mass(q, naive_truncation_mask(p, steps, kw.get("eta_delta")))
    if name == "relaxed":
        kth = np.sort(p)[::-1][kw["top_k"] - 1]
        return _set_mass(q, (p >= kth) & (p >= p.max() - kw["delta"]) & (p > 0))
    if name == "bild":
        allowed = p >= math.exp(-kw["alpha"])
        allowed[int(np.argmax(p))] = True
        return _set_mass(q, allowed & (p > 0))
    if name == "sglang":
        h = np.where(p >= kw["single"], 1.0, np.minimum(1.0, p / kw["acc"]))
        return float((q * h).sum())
    if name == "judge":
        if kw["name"] == "half_max":
            return _set_mass(q, p >= 0.5 * p.max())
        if kw["name"] == "soft":                        # tests.helpers.rule_cases.soft_judge without features
            standard = np.minimum(1.0, np.divide(p, q, out=np.zeros_like(p), where=q > 0))
            return float((q * np.maximum(0.5 * (p / p.max()) ** 0.25, standard)).sum())
        raise KeyError(f"no oracle for judge {kw['name']!r}")
    if name in ("fuzzy", "kl_judge"):
        pd, qd = raw if kw["on"] == "raw" else (p, q)
        if name == "fuzzy":
            return 1.0 if _divergence(pd, qd, kw["div"]) <= kw["T"] else 0.0
        confident = pd.max() > kw["confident"]
        if not confident and _divergence(pd, qd, kw["div"]) < kw["tau"]:
            return 1.0
        return 1 - tv(p, q) if (confident or kw["reject"] == "sd") else 0.0
    if name == "mentored":
        if "alpha" in kw:
            alpha = kw["alpha"]
            return float(np.where(p > 0, np.minimum(q, p / alpha if alpha > 0 else np.inf), 0.0).sum())
        return 1 - tv(p, q) if kw["D"] == 0 else _mentored_budget_acceptance(p, q, kw["D"])
    if name == "cactus":                                # Σ q·min(1, t/q), t = the raised target probability
        t = np.minimum(1.0, p + np.sqrt(2 * kw["delta"] * p * (1 - p)))
        return float(np.minimum(q, t).sum())
    if name == "logit_compare":                         # accept iff log q(x) <= log p(x) + eps
        with np.errstate(divide="ignore"):
            keep = (p > 0) & (q > 0) & (np.log(q) <= np.log(p) + kw["eps"])
        return _set_mass(q, keep)
    if name == "reject_to_p":
        return 1 - tv(p, q)
    raise KeyError(f"no acceptance oracle for rule {name!r}: add one to tests/helpers/rule_oracles.py")
