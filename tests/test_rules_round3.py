"""Rules of the third round of the map: Cactus, Modular MAX's logit comparison, and the wrong ``reject_to_p``.

What is specific to each (the registry suite, tests/test_rule_registry.py, runs every example of them through the
common checks: closed form vs mechanism, sampler vs closed form, chains, acceptance oracles, lossless settings,
bad parameters). Here: each rule against a transcription of its source's accept/reject code (written afresh from
the source, compared law to law on random (p, q)), the derivation of Cactus's raised probability, the figures of
the Cactus README, the per-token correction of Cactus, the logit-offset gap of the logit comparison, and the
wrong rule's law against p, per token and over whole SD runs. Statistical tests: fixed seeds, level ``ALPHA``,
power stated in each test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import (
    ALPHA,
    binom_pvalue,
    gof_pvalue,
    pq_cases,
    random_pairs,
    simulate_sd,
    single_position,
)
from verispec.rules.block_law import ToyModel, joint_law
from verispec.rules.cactus import Cactus, raised, raised_target
from verispec.rules.catalogue import entries

CASES = pq_cases()
N_SAMPLES = 40_000
PAIRS = random_pairs(200, 9, seed=31)


def _counts(tokens: torch.Tensor, v: int) -> np.ndarray:
    return np.bincount(tokens.numpy(), minlength=v)


# --------------------------------------------------------------------------------------------------
# Cactus


def _cactus_source_law(p: np.ndarray, q: np.ndarray, delta: float) -> tuple[np.ndarray, float]:
    """The law and acceptance of MANGA-UOFA/Cactus ``cactus/cactus.py`` (commit 3b01b81), transcribed token by
    token in numpy.

    Their names: ``target_probs`` = our p, ``draft_probs`` = our q. ``solve_constraint``: h_n = clamp(p_n +
    sqrt(2δ p_n(1 − p_n)), 0, 1); the other entries p·(1 − h_n)/(1 − p_n) with NaN (0/0) read as 1, clamped to
    [0, 1]. ``_get_accepted``: accept iff u < min(h_n / q_n, 1). ``_get_recovered_probs``: relu(h − q)
    normalised, for the drafted token's h. Summed over the drafted token n ~ q."""
    law, beta = np.zeros_like(p), 0.0
    for n in range(p.size):
        if q[n] == 0:
            continue
        h_n = min(max(p[n] + math.sqrt(2 * delta * p[n] * (1 - p[n])), 0.0), 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            factor = (1 - h_n) / (1 - p[n])
        factor = 1.0 if np.isnan(factor) else factor
        h = np.clip(p * factor, 0.0, 1.0)
        h[n] = h_n
        accept = min(h_n / q[n], 1.0)
        recovered = np.maximum(h - q, 0.0)
        law[n] += q[n] * accept
        beta += q[n] * accept
        if accept < 1:
            law += q[n] * (1 - accept) * recovered / recovered.sum()
    return law, beta


@pytest.mark.parametrize("delta", [0.0, 0.05, 0.21, 1.0, 20.0])
def test_cactus_law_equals_the_transcribed_source_on_random_pairs(delta):
    """verispec's O(V log V) closed form and its acceptance equal the source's mechanism summed token by token,
    on 200 random rows (a quarter sparse) and every regime, to 1e-12."""
    rule = Cactus(delta)
    pairs = [(PAIRS[0][i], PAIRS[1][i]) for i in range(len(PAIRS[0]))] + list(CASES.values())
    for i, (p, q) in enumerate(pairs):
        law, beta = _cactus_source_law(p.numpy(), q.numpy(), delta)
        np.testing.assert_allclose(rule.induced(p, q).numpy(), law, rtol=0, atol=1e-12, err_msg=f"row {i}")
        assert rule.acceptance_rate(p, q).item() == pytest.approx(beta, abs=1e-12), i


def test_cactus_raised_probability_is_the_largest_within_half_chi_square_delta():
    """t(x) = p + sqrt(2δp(1 − p)) makes ½χ²(π_x‖p) exactly δ (where t < 1); any other distribution with the same
    π(x) has a larger χ² (2,000 random ones); KL(π_x‖p) <= log(1 + 2δ)."""
    gen = torch.Generator().manual_seed(3)
    p, _ = CASES["dense"]
    for delta in (0.01, 0.1, 0.5):
        for x in range(p.numel()):
            pi = raised_target(p, torch.tensor(x), delta)
            assert pi.sum().item() == pytest.approx(1.0, abs=1e-12)
            chi2 = ((pi - p) ** 2 / p).sum().item()
            kl = torch.special.xlogy(pi, pi / p).sum().item()
            if pi[x] < 1:
                assert 0.5 * chi2 == pytest.approx(delta, rel=1e-9)
            assert kl <= math.log(1 + 2 * delta) + 1e-12
            others = torch._standard_gamma(torch.ones(2000, p.numel() - 1, dtype=torch.float64), generator=gen)
            others = others / others.sum(-1, keepdim=True) * (1 - pi[x])
            rivals = torch.cat([others[:, :x], pi[x].expand(2000, 1), others[:, x:]], -1)
            assert (((rivals - p) ** 2 / p).sum(-1) >= chi2 - 1e-12).all()


def test_cactus_matches_the_figures_of_its_readme():
    """The README's example: the verifier gives "generate" 0.35 and SpS accepts it at 44%; Cactus raises it to
    .66, accepting 82%, at 0.20 nats of KL. With δ = 0.21 the formula gives those figures (to their rounding)."""
    p_x, sps = 0.35, 0.44
    q_x = p_x / sps
    t = raised(torch.tensor(p_x, dtype=torch.float64), 0.21).item()
    assert t == pytest.approx(0.66, abs=0.005)
    assert min(1.0, t / q_x) == pytest.approx(0.82, abs=0.01)
    kl = t * math.log(t / p_x) + (1 - t) * math.log((1 - t) / (1 - p_x))       # KL(π_x‖p): proportional scaling
    assert kl == pytest.approx(0.20, abs=0.005)


def test_cactus_at_delta_zero_is_lossless_sd_token_by_token():
    cactus, lossless = R.get("cactus:delta=0"), R.get("lossless")
    assert cactus.is_lossless and cactus.induced_form() == R.InducedForm("target")
    for p, q in list(CASES.values()) + [(PAIRS[0][i], PAIRS[1][i]) for i in range(20)]:
        torch.testing.assert_close(cactus.accept_prob_all(p, q), lossless.accept_prob_all(p, q), rtol=0, atol=0)
        v = p.numel()
        torch.testing.assert_close(cactus.correction_at(p.expand(v, v), q.expand(v, v), torch.arange(v)),
                                   lossless.residual(p, q).expand(v, v), rtol=0, atol=1e-15)
        torch.testing.assert_close(cactus.induced(p, q), p, rtol=0, atol=1e-12)


def test_cactus_acceptance_grows_with_the_budget_and_the_law_leaves_p():
    p, q = CASES["tail_overshoot"]
    betas = [Cactus(d).acceptance_rate(p, q).item() for d in (0, 0.01, 0.1, 1, 10, 1000)]
    assert betas == sorted(betas) and betas[0] < betas[-1]
    assert betas[-1] == pytest.approx(1.0)           # t = 1 for every token with p > 0: all of them here
    tvs = [0.5 * (Cactus(d).induced(p, q) - p).abs().sum().item() for d in (0, 0.1, 1)]
    assert tvs[0] < 1e-12 < tvs[1] < tvs[2]


def test_cactus_buys_acceptance_at_the_least_possible_tv():
    """Any rule has TV(P, p) >= β − (1 − d(p, q)); Cactus attains it at every position (P >= p where q > p, P <= p
    where q <= p: docs §2.6), as lenience and mentored decoding do. On 200 random rows and every regime, 5 budgets."""
    batches = [PAIRS, (torch.stack([a for a, _ in CASES.values()]), torch.stack([b for _, b in CASES.values()]))]
    for delta in (0.01, 0.1, 0.5, 2.0, 50.0):
        rule = Cactus(delta)
        for p, q in batches:
            law, beta, d = rule.induced(p, q), rule.acceptance_rate(p, q), 0.5 * (p - q).abs().sum(-1)
            torch.testing.assert_close(0.5 * (law - p).abs().sum(-1), beta - (1 - d), rtol=0, atol=1e-12)
            assert (law[q > p] >= p[q > p] - 1e-15).all() and (law[q <= p] <= p[q <= p] + 1e-15).all()


def test_cactus_sampler_draws_the_correction_of_the_rejected_token():
    """After rejecting x the sampler draws from r_x = norm((π_x − q)_+), the source's per-token residual, not from the
    averaged one. On this pair (δ = 0.06) c(0) = 0.8 < q(2)/p(2) = 0.9 < c(1) ≈ 0.95, so r_0 = δ_3 while r_1 and the
    averaged residual put mass on token 2 (0.10 and 0.04). 40,000 rows: token 0's ~2,000 rejections all emit token 3
    (the averaged residual expects ~80 on token 2: p < 1e-6), token 1's ~1,260 fit r_1 (chi-square at ALPHA)."""
    rule = Cactus(0.06)
    p = torch.tensor([0.25, 0.02, 0.5, 0.23], dtype=torch.float64)
    q = torch.tensor([0.45, 0.1, 0.45, 0.0], dtype=torch.float64)
    torch.testing.assert_close(rule.correction_at(p, q, torch.tensor(0)), torch.eye(4, dtype=torch.float64)[3])
    assert rule.correction_at(p, q, torch.tensor(1))[2] > 0.1 and rule.residual(p, q)[2] > 0.03
    first, accepted, draft = single_position(rule, p, q, N_SAMPLES, seed=41)
    after = {x: first[~accepted & (draft[:, 0] == x)] for x in (0, 1)}
    assert len(after[0]) >= 1500 and len(after[1]) >= 1000
    assert (after[0] == 3).all()
    assert gof_pvalue(_counts(after[0], 4), rule.residual(p, q).numpy()) < 1e-6
    assert gof_pvalue(_counts(after[1], 4), rule.correction_at(p, q, torch.tensor(1)).numpy()) > ALPHA
    assert (first[~accepted] != draft[~accepted, 0]).all()          # r_x(x) = 0


# --------------------------------------------------------------------------------------------------
# Modular MAX's logit comparison


def _max_logit_comparison(z_p: torch.Tensor, z_q_at_draft: torch.Tensor, draft: torch.Tensor, eps: float):
    """modular/modular ``max/nn/sampling/rejection_sampler.py`` ``RejectionSampler.__call__`` (commit ae6ee1f),
    transcribed for one request: reject position i iff the draft's raw logit of its token exceeds the target's
    raw logit of it by more than eps; the first rejected index (G if none: the sentinel) picks the target row whose
    top_k = 1 sample (its argmax) is the next token. ``z_p: [G+1, V]``, ``z_q_at_draft: [G]``, ``draft: [G]``."""
    gamma = draft.numel()
    rejected = z_q_at_draft > z_p[torch.arange(gamma), draft] + eps
    first = int(rejected.nonzero()[0, 0]) if rejected.any() else gamma
    return first, int(z_p[first].argmax())


@pytest.mark.parametrize("eps", [1e-5, 0.5, 2.0])
def test_logit_compare_is_the_max_sampler_on_log_probabilities(eps):
    """With logits equal to log-probabilities, the transcribed MAX sampler and verispec's rule make the same
    decisions and emit the same token (it is deterministic), and the source's law enumerated over x ~ q equals the
    closed form, on 60 random rows and every regime."""
    rule = R.get(f"logit_compare:eps={eps}")
    pairs = [(PAIRS[0][i], PAIRS[1][i]) for i in range(60)] + list(CASES.values())
    for p, q in pairs:
        v = p.numel()
        law = torch.zeros_like(p)
        log_p, log_q = p.log(), q.log()                        # -inf where 0: never above the target's logit
        n, z = rule.verify(p.expand(v, 2, v), q.expand(v, 1, v), torch.arange(v)[:, None])    # every draft x
        for x in range(v):
            if q[x] == 0:
                continue
            first, nxt = _max_logit_comparison(torch.stack([log_p, log_p]), log_q[x:x + 1], torch.tensor([x]), eps)
            law[x if first == 1 else nxt] += q[x]
            assert int(n[x]) == first and (first == 1 or int(z[x]) == nxt)
        torch.testing.assert_close(rule.induced(p, q), law, rtol=0, atol=1e-12)


def test_logit_compare_on_raw_logits_depends_on_the_models_logit_offsets():
    """Why verispec compares log-probabilities: MAX compares raw logits, which (p, q) fix only up to one constant
    per row; shifting the target's logits by +5 (same p) turns every rejection of a token with 1 < q/p <= e^5 into an
    acceptance, so MAX's law is not a function of (p, q)."""
    p, q = CASES["dense"]
    draft = torch.arange(p.numel())
    log_p, log_q = p.log(), q.log()
    flips = 0
    for x in draft.tolist():
        a, _ = _max_logit_comparison(torch.stack([log_p, log_p]), log_q[x:x + 1], torch.tensor([x]), 1e-5)
        b, _ = _max_logit_comparison(torch.stack([log_p + 5, log_p + 5]), log_q[x:x + 1], torch.tensor([x]), 1e-5)
        flips += a != b
    assert torch.allclose(torch.softmax(log_p + 5, -1), p)
    assert flips == int(((q > p) & (q <= p * math.exp(5))).sum()) >= 1


def test_logit_compare_is_deterministic_and_greedy_at_temperature_zero():
    """No coin: two generators give the same decisions; rejections emit argmax p. One-hot p and q (temperature 0):
    the law and acceptance of exact greedy matching."""
    rule = R.get("logit_compare")
    p, q = CASES["dense"]
    gen = torch.Generator().manual_seed(5)
    draft = torch.multinomial(q, 200, replacement=True, generator=gen)[:, None]
    ps, qs = p.expand(200, 2, -1), q.expand(200, 1, -1)
    n1, z1 = rule.verify(ps, qs, draft, generator=torch.Generator().manual_seed(1))
    n2, z2 = rule.verify(ps, qs, draft, generator=torch.Generator().manual_seed(2))
    assert torch.equal(n1, n2) and 0 < int(n1.sum()) < 200
    assert (z1[n1 == 0] == p.argmax()).all() and torch.equal(z1[n1 == 0], z2[n2 == 0])
    greedy, eye = R.get("greedy"), torch.eye(5, dtype=torch.float64)
    for a in range(5):
        for b in range(5):
            torch.testing.assert_close(rule.induced(eye[a], eye[b]), greedy.induced(eye[a], eye[b]), rtol=0, atol=0)
            assert rule.acceptance_rate(eye[a], eye[b]).item() == greedy.acceptance_rate(eye[a], eye[b]).item()


def test_logit_compare_acceptance_grows_with_the_margin():
    for name, (p, q) in CASES.items():
        betas = [R.get(f"logit_compare:eps={e}").acceptance_rate(p, q).item() for e in (0, 1e-5, 0.3, 1, 5, 50)]
        assert betas == sorted(betas), name


# --------------------------------------------------------------------------------------------------
# the wrong rule


def test_reject_to_p_law_is_the_stated_formula_and_not_p():
    """P = q·min(1, p/q) + (1 − β)·p (Spec-RL issue 14's code), on 200 random rows: it differs from p on every row
    where d(p, q) > 0 and p is not a point mass, and P/p = min(1, q/p) + d(p, q) <= 1 + d (equality where the draft
    over-weights a token of supp p)."""
    rule = R.get("reject_to_p")
    assert not rule.is_lossless and rule.taxonomy == "other"
    p, q = PAIRS
    y = q * torch.where(q > 0, (p / q.clamp_min(1e-300)).clamp(max=1.0), torch.zeros_like(q))
    beta = y.sum(-1, keepdim=True)
    torch.testing.assert_close(rule.induced(p, q), y + (1 - beta) * p, rtol=0, atol=1e-12)
    tv = 0.5 * (rule.induced(p, q) - p).abs().sum(-1)
    differ = (0.5 * (p - q).abs().sum(-1) > 1e-9) & (p.amax(-1) < 1)
    assert (tv[differ] > 1e-9).all() and differ.sum() > 150
    d = 0.5 * (p - q).abs().sum(-1, keepdim=True)
    on = p > 0
    ratio = torch.where(on, rule.induced(p, q) / p.clamp_min(1e-300), torch.zeros_like(p))
    want = torch.where(on, torch.where(q >= p, torch.ones_like(p), q / p.clamp_min(1e-300)) + d, torch.zeros_like(p))
    torch.testing.assert_close(ratio, want, rtol=0, atol=1e-9)


def test_reject_to_p_sampler_is_told_apart_from_p():
    """The sampler fits its own law (chi-square at ALPHA) and rejects p (p < 1e-6), and the acceptance is lossless
    SD's. Power: the sparse regime has TV(P, p) = 0.16; 40,000 draws put n·4·TV² ≈ 4,100 far above the 6-df
    non-central chi-square's 99% power point (≈ 51.8). (Disjoint supports and a one-hot p give P = p exactly.)"""
    rule = R.get("reject_to_p")
    for name in ("disjoint", "one_hot_p", "identical"):
        torch.testing.assert_close(rule.induced(*CASES[name]), CASES[name][0], rtol=0, atol=1e-12)
    p, q = CASES["sparse"]
    law = rule.induced(p, q)
    assert 0.5 * (law - p).abs().sum().item() > 0.15
    first, accepted, _ = single_position(rule, p, q, N_SAMPLES, seed=77)
    counts = _counts(first, p.numel())
    assert gof_pvalue(counts, law.numpy()) > ALPHA
    assert gof_pvalue(counts, p.numpy()) < 1e-6
    assert binom_pvalue(int(accepted.sum()), N_SAMPLES, R.get("lossless").acceptance_rate(p, q).item()) > ALPHA


def test_reject_to_p_whole_runs_miss_the_target_joint_law():
    """30,000 whole SD runs (γ = 3, a toy pair, V = 4): the first three tokens follow the rule's exact joint law and
    not the target's (p < 1e-6), which lossless SD does follow on the same pair."""
    target, draft = ToyModel(4, 1, 0.5), ToyModel(4, 101, 0.5)
    rule = R.get("reject_to_p")
    exact = joint_law(rule, target, draft, vocab=4, gamma=3, length=3)
    assert exact.exact and exact.total_variation > 0.02
    counts = simulate_sd(rule, target, draft, vocab=4, gamma=3, length=3, n=30_000, seed=13)
    assert gof_pvalue(counts.ravel(), exact.law.ravel()) > ALPHA
    assert gof_pvalue(counts.ravel(), exact.target.ravel()) < 1e-6
    lossless = joint_law(R.get("lossless"), target, draft, vocab=4, gamma=3, length=3)
    assert lossless.max_abs_deviation <= 1e-12


# --------------------------------------------------------------------------------------------------
# the map


def test_the_map_places_the_new_rules():
    rows = {e.name: e for e in entries()}
    assert rows["cactus"].taxonomy == "collaborative" and rows["cactus"].per_token
    assert rows["logit_compare"].taxonomy == "other" and rows["reject_to_p"].taxonomy == "other"
    assert all(rows[n].baseline == "p" for n in ("cactus", "logit_compare", "reject_to_p"))
    assert rows["reject_to_p"].lossless == "lossy" and "WRONG" in rows["reject_to_p"].summary
