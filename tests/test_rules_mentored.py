"""Mentored decoding: the mechanism's algebra (clip(q, p/β, p/α)), β against an independent solver, the power of
the sampler test, the budget holds and binds, the solution is optimal, the relation to lenience / the ceiling,
the lossless settings are lossless SD, edge cases, spec text.

The checks every registered rule gets (closed form vs mechanism on the regimes and random rows, sampler, chain
semantics, acceptance against an independent bisection, parameters, constructors, spec round trip) run on the
mentored settings in tests/test_rule_registry.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import ALPHA, binom_pvalue, gof_pvalue, pq_cases, random_pairs, single_position
from verispec.rules.base import TAXONOMY, total_variation
from verispec.rules.collaborative import CeilingOnTarget, Lenience, lossless_residual
from verispec.rules.divergence import kl_divergence
from verispec.rules.mentored import LOG_ALPHA_TOLERANCE, Mentored, normalising_beta

CASES = pq_cases()


def _np(t):
    return t.numpy().astype(float)


# --- the mechanism -----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["mentored:D=0.05", "mentored:D=0.5", "mentored:alpha=0.3", "mentored:alpha=0"])
def test_mechanism_algebra(spec):
    """y = q·h = min(q, p/α); rejected mass 1 − A = Σ (p/β − q)_+ (the consistency condition M.2), the
    residual lives where q < p/β; π = y + (p/β − q)_+ = clip(q, p/β, p/α); α <= 1 <= β; π = 0 off supp p."""
    rule = R.get(spec)
    p, q = random_pairs(300, 12, seed=2)
    alpha, beta = rule.solve(p, q)
    assert ((0 <= alpha) & (alpha <= 1) & (beta >= 1)).all()
    a, b = alpha.unsqueeze(-1), beta.unsqueeze(-1)
    cap = torch.where(p > 0, p / a, torch.zeros_like(p))
    y = q * rule.accept_prob_all(p, q)
    assert torch.allclose(y, torch.minimum(q, cap), atol=1e-15)
    acceptance = y.sum(-1)
    fill = (p / b - q).clamp_min(0)
    assert torch.allclose(fill.sum(-1), 1 - acceptance, atol=1e-12)                  # (M.2)
    assert torch.all((fill == 0) | (y == q))                                          # residual only where y = q
    law = rule.induced(p, q)
    assert torch.allclose(law, y + fill, atol=1e-12)
    assert torch.allclose(law, torch.clamp(q, min=p / b, max=cap), atol=1e-15)      # the clip, literally
    assert torch.all(law[p == 0] == 0) and torch.all(rule.accept_prob_all(p, q)[p == 0] == 0)
    assert torch.all(law <= cap + 1e-15) and torch.all(law >= p / b - 1e-15)


def _clip_mass(t: float, p: np.ndarray, q: np.ndarray, cap: np.ndarray) -> float:
    """``Σ clip(q, t·p, cap)`` (``t = 1/β``)."""
    return float(np.maximum(np.minimum(q, cap), t * p).sum())


def test_normalising_beta_against_an_independent_solver():
    """The sort-and-prefix-sum β equals a plain bisection of Σ clip(q, p/β, p/α) = 1 (numpy, 200 halvings)."""
    p, q = random_pairs(200, 10, seed=3)
    gen = torch.Generator().manual_seed(4)
    alpha = torch.rand(200, generator=gen, dtype=torch.float64)
    alpha[::7] = 0.0
    alpha[1::7] = 1.0
    beta = normalising_beta(p, q, alpha)
    assert torch.all(beta >= 1)
    nothing_rejected = 0
    for i in range(200):
        pi, qi, ai = _np(p[i]), _np(q[i]), alpha[i].item()
        cap = np.where(pi > 0, pi / ai if ai > 0 else np.inf, 0.0)
        t = 1 / beta[i].item()
        assert _clip_mass(t, pi, qi, cap) == pytest.approx(1.0, abs=1e-12), i
        if _clip_mass(0.0, pi, qi, cap) >= 1 - 1e-13:     # nothing rejected: p/β must raise no token
            nothing_rejected += 1
            assert np.all(t * pi <= np.minimum(qi, cap) + 1e-12), i
            continue
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if _clip_mass(mid, pi, qi, cap) < 1 else (lo, mid)
        assert t == pytest.approx(hi, abs=1e-12), i
    assert 0 < nothing_rejected < 100


# --- the sampler -------------------------------------------------------------------------------------

N_SAMPLES = 40_000


def test_sampler_test_has_power():
    """On the peaked case (D = 0.3) the emitted law is clearly neither p nor lenience's law at the same α
    (which has the same acceptance): the residual (p/β − q)_+ is what the registry's sampler test (40,000 rows,
    the same statistics) checks."""
    p, q = CASES["peaked"]
    rule = R.get("mentored:D=0.3")
    alpha, _ = rule.solve(p, q)
    first, accepted, _ = single_position(rule, p, q, N_SAMPLES, seed=21)
    counts = np.bincount(first.numpy(), minlength=p.numel())
    assert gof_pvalue(counts, _np(rule.induced(p, q))) > ALPHA
    assert gof_pvalue(counts, _np(p)) < 1e-12
    assert gof_pvalue(counts, _np(Lenience(alpha.item()).induced(p, q))) < 1e-12
    assert binom_pvalue(int(accepted.sum()), N_SAMPLES, 1 - total_variation(p, q).item()) < 1e-12


@pytest.mark.slow
def test_engine_first_token_follows_induced_and_greedy_is_exact_matching():
    """Through the engine: the first emitted token of 1,000 seeds follows the closed form (not p); at temperature 0
    the output equals greedy target-only decoding for every γ. The 1,000 runs go through the batched engine
    (32 rows at a time), whose row i is ``generate(..., seed=i)`` token for token (tests/test_engine_batch.py):
    the same counts as 1,000 ``generate`` calls."""
    from tests.helpers.fake_lm import FakeLM
    from verispec.engine import generate, generate_target_only
    from verispec.engine.batch import generate_batch
    from verispec.models.batch import RowsOfBackends
    from verispec.sampling import SamplingConfig

    t1, greedy = SamplingConfig.parse("temperature=1"), SamplingConfig.parse("temperature=0")
    target, draft, prompt = FakeLM(vocab=5, seed=3, scale=2.0), FakeLM(vocab=5, seed=4, scale=2.0), [2, 0]
    rule = R.get("mentored:D=0.2")
    p = t1.process(target.next_logits(prompt)[None]).double()
    q = t1.process(draft.next_logits(prompt)[None]).double()
    rows = [RowsOfBackends([FakeLM(vocab=5, seed=seed, scale=2.0) for _ in range(32)]) for seed in (3, 4)]
    out = generate_batch(*rows, [prompt] * 1000, rule=rule, sampling=t1, gamma=3, max_new_tokens=2, seeds=0)
    counts = np.bincount([res.tokens[0] for res in out.results], minlength=5)
    assert generate(target, draft, prompt, rule=rule, sampling=t1, gamma=3, max_new_tokens=2,
                    seed=7).tokens == out.results[7].tokens
    assert gof_pvalue(counts, _np(rule.induced(p, q)[0])) > ALPHA
    assert gof_pvalue(counts, _np(p[0])) < 1e-12
    target, draft = FakeLM(vocab=5, seed=6), FakeLM(vocab=5, seed=7)
    ref = generate_target_only(target, [0, 1, 2], sampling=greedy, max_new_tokens=25)
    for gamma in (1, 3, 6):
        out = generate(target, draft, [0, 1, 2], rule=rule, sampling=greedy, gamma=gamma, max_new_tokens=25, seed=3)
        assert out.tokens == ref.tokens


# --- the budget --------------------------------------------------------------------------------------

@pytest.mark.parametrize("v", [7, 50])
def test_budget_holds_and_binds(v):
    """KL(p‖π) <= D on every row; where α > 0 the budget binds (KL = D to bisection accuracy) and any
    smaller α breaks it; where α = 0 the α = 0 endpoint itself is within budget."""
    p, q = random_pairs(400, v, seed=10 + v)
    for D in (0.01, 0.1, 0.5):
        rule = Mentored(D=D)
        alpha, _ = rule.solve(p, q)
        kl = kl_divergence(p, rule.induced(p, q))
        assert torch.all(kl <= D + 1e-12), (D, (kl - D).max())
        binds = alpha > 0
        assert binds.sum() > 50 and (~binds).sum() > 0, (D, binds.sum())
        assert torch.all(D - kl[binds] <= 1e-9), (D, (D - kl[binds]).max())
        assert torch.all(alpha < 1)
        endpoint = Mentored(alpha=0.0)
        assert torch.all(kl_divergence(p[~binds], endpoint.induced(p[~binds], q[~binds])) <= D + 1e-12)
        # tight in α: a relative 1e-6 below the returned α (>> the bisection's bracket) the budget is exceeded
        smaller = Mentored(alpha=0.5)
        for i in torch.nonzero(binds)[:, 0][:60].tolist():
            a_i = alpha[i].item() * (1 - 1e-6)
            law = smaller._clip(p[i], q[i], torch.tensor(a_i), normalising_beta(p[i], q[i], torch.tensor(a_i)))
            assert kl_divergence(p[i], law).item() > D, (D, i, alpha[i].item())
    assert LOG_ALPHA_TOLERANCE < 1e-9


def test_kl_and_acceptance_decrease_with_alpha():
    """Along α ∈ [0, 1] (fixed-α mode): KL(p‖π_α) and the acceptance never increase; KL(π_1) = 0."""
    p, q = random_pairs(200, 20, seed=5)
    prev_kl = prev_acc = None
    for a in np.linspace(0.0, 1.0, 101):
        rule = Mentored(alpha=float(a))
        kl = kl_divergence(p, rule.induced(p, q))
        acc = rule.acceptance_rate(p, q)
        if prev_kl is not None:
            finite = torch.isfinite(prev_kl)
            assert torch.all(kl[finite] <= prev_kl[finite] + 1e-12), a
            assert torch.all(acc <= prev_acc + 1e-12), a
        prev_kl, prev_acc = kl, acc
    assert torch.all(prev_kl.abs() <= 1e-15)
    assert torch.allclose(prev_acc, 1 - total_variation(p, q), atol=1e-15)


def test_acceptance_increases_with_budget():
    p, q = random_pairs(300, 30, seed=6)
    budgets = [0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 100.0]
    accs = [Mentored(D=D).acceptance_rate(p, q) for D in budgets]
    for lo, hi in zip(accs, accs[1:]):
        assert torch.all(hi >= lo - 1e-12)
        assert hi.mean() > lo.mean() + 1e-4
    assert torch.allclose(accs[0], 1 - total_variation(p, q), atol=1e-15)
    on_supp = (q * (p > 0)).sum(-1)          # a budget past every row's endpoint: accept all drafts on supp p
    finite = torch.isfinite(kl_divergence(p, Mentored(alpha=0.0).induced(p, q)))
    assert torch.allclose(accs[-1][finite], on_supp[finite], atol=1e-12)


# --- optimality --------------------------------------------------------------------------------------

def test_no_random_feasible_law_accepts_more():
    """Every law π' on supp p with KL(p‖π') <= D has acceptance Σ min(q, π') <= the mentored acceptance."""
    gen = torch.Generator().manual_seed(9)
    D = 0.2
    rule = Mentored(D=D)
    pairs = [CASES[n] for n in ("dense", "tail_overshoot", "one_hot_q", "sparse")]
    pairs += list(zip(*random_pairs(6, 5, seed=12)))
    for p, q in pairs:
        best = rule.acceptance_rate(p, q).item()
        law = rule.induced(p, q)
        on = p > 0
        # perturbations of the optimum (log-normal, several scales) and broad Dirichlet draws
        scales = torch.tensor([0.01, 0.1, 1.0], dtype=torch.float64).repeat_interleave(6000)[:, None]
        noise = torch.randn(len(scales), p.numel(), generator=gen, dtype=torch.float64) * scales
        cand = torch.where(on, law.clamp_min(1e-12) * noise.exp(), torch.zeros_like(noise))
        g = torch._standard_gamma(torch.full((6000, p.numel()), 0.5, dtype=torch.float64), generator=gen)
        cand = torch.cat([cand, torch.where(on, g, torch.zeros_like(g))])
        cand = cand / cand.sum(-1, keepdim=True)
        feasible = kl_divergence(p.expand_as(cand), cand) <= D
        assert feasible.sum() > 100
        acc = torch.minimum(q, cand[feasible]).sum(-1)
        assert acc.max().item() <= best + 1e-9, (acc.max().item(), best)


def test_budget_beats_any_lenience_within_the_same_budget():
    """Lenience ℓ with KL(p‖P_ℓ) <= D never accepts more than mentored decoding with budget D."""
    p, q = random_pairs(200, 30, seed=7)
    for D in (0.05, 0.3):
        best = Mentored(D=D).acceptance_rate(p, q)
        for ell in np.linspace(0.05, 1.0, 20):
            rule = R.get(f"lenience:ell={ell:.4f}")
            ok = kl_divergence(p, rule.induced(p, q)) <= D
            assert torch.all(rule.acceptance_rate(p, q)[ok] <= best[ok] + 1e-9), (D, ell)


# --- relation to lenience and the overshoot ceiling ---------------------------------------------------

@pytest.mark.parametrize("a", [0.2, 0.5, 0.8])
def test_fixed_alpha_is_lenience_with_the_normalising_residual(a):
    """mentored:alpha=ℓ vs lenience:ell=ℓ = ceiling:kappa=1/ℓ: the same h, yield, acceptance, ceiling
    p/ℓ and law on {q >= p}; lenience is the mechanism (M.1) with β forced to 1; mentored's law has the
    smaller KL(p‖·) at equal acceptance."""
    m, lenience, ceiling = Mentored(alpha=a), Lenience(a), CeilingOnTarget(1 / a)
    p, q = random_pairs(300, 15, seed=11)
    assert torch.allclose(m.accept_prob_all(p, q), lenience.accept_prob_all(p, q), atol=1e-15)
    for other in (lenience, ceiling):
        assert torch.allclose(m.acceptance_rate(p, q), other.acceptance_rate(p, q), atol=1e-12)
    P_m, P_l = m.induced(p, q), lenience.induced(p, q)
    over = q >= p
    assert torch.allclose(P_m[over], P_l[over], atol=1e-15)
    assert torch.all(P_m <= p / a + 1e-15) and torch.all(P_l <= p / a + 1e-15)
    # lenience = mentored's (h, r) with β = 1 instead of the normalising β
    y, acc = m.yield_and_acceptance(p, q)
    one = torch.ones(p.shape[0], dtype=torch.float64)
    assert torch.allclose(y + (1 - acc).unsqueeze(-1) * m._residual(p, q, one), P_l, atol=1e-12)
    assert torch.allclose(m._residual(p, q, one), lossless_residual(p, q))
    kl_m, kl_l = kl_divergence(p, P_m), kl_divergence(p, P_l)
    assert torch.all(kl_m <= kl_l + 1e-12)
    assert (kl_m < kl_l - 1e-6).float().mean() > 0.5            # and the laws differ on most rows
    assert (P_m - P_l).abs().amax(-1).max() > 1e-2


def test_tv_distortion_is_the_acceptance_gain():
    """TV(π, p) = A − (1 − d(p, q)), the least TV any rule with acceptance A can have: mentored decoding
    (both modes) and lenience put all their excess over p on the capped tokens."""
    p, q = random_pairs(300, 20, seed=15)
    lossless_acceptance = 1 - total_variation(p, q)
    for rule in (Mentored(D=0.05), Mentored(D=0.5), Mentored(alpha=0.3), Mentored(alpha=0.0), Lenience(0.3)):
        law, acc = rule.induced(p, q), rule.acceptance_rate(p, q)
        assert torch.allclose(total_variation(law, p), acc - lossless_acceptance, atol=1e-12), rule
        assert torch.all(total_variation(law, q) <= 1 - acc + 1e-12), rule      # the bound's other half


def test_lenience_and_mentored_coincide_when_q_over_p_is_constant_below_p():
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.15, 0.25, 0.4], dtype=torch.float64)       # q/p = 1/2 on {q < p}
    m, lenience = Mentored(alpha=0.5), Lenience(0.5)
    assert torch.allclose(m.induced(p, q), lenience.induced(p, q), atol=1e-15)
    q2 = torch.tensor([0.3, 0.05, 0.25, 0.4], dtype=torch.float64)      # not constant: they differ
    assert (m.induced(p, q2) - lenience.induced(p, q2)).abs().max() > 1e-2


# --- lossless settings and edge cases -----------------------------------------------------------------

@pytest.mark.parametrize("spec", ["mentored:D=0", "mentored:alpha=1"])
def test_lossless_settings_are_lossless_sd(spec):
    """D = 0 and α = 1 emit p bit for bit, state the form "target", and are lossless SD: the same h, residual and
    acceptance 1 − d(p, q)."""
    rule = R.get(spec)
    lossless = R.get("lossless")
    assert rule.is_lossless and rule.induced_form().kind == "target"
    pairs = list(CASES.items()) + [("random", random_pairs(50, 9, seed=13))]
    for name, (p, q) in pairs:
        assert torch.equal(rule.induced(p, q), p), (spec, name)
        assert torch.allclose(rule.acceptance_rate(p, q), 1 - total_variation(p, q), atol=1e-15), (spec, name)
        assert torch.allclose(rule.accept_prob_all(p, q), lossless.accept_prob_all(p, q), atol=1e-15)
        assert torch.allclose(rule.residual(p, q), lossless_residual(p, q), atol=1e-15)


def test_lossy_settings_are_not_flagged_lossless():
    for spec in ["mentored", "mentored:D=1e-6", "mentored:alpha=0.999", "mentored:alpha=0"]:
        rule = R.get(spec)
        assert not rule.is_lossless and rule.induced_form().kind == "other", spec


def test_edge_cases():
    budget, endpoint = R.get("mentored:D=0.1"), R.get("mentored:alpha=0")
    huge = R.get("mentored:D=100")
    # q has mass where p = 0: never emitted, never accepted, whatever the budget
    for name in ("sparse", "one_hot_p", "disjoint"):
        p, q = CASES[name]
        for rule in (budget, endpoint, huge):
            assert torch.all(rule.induced(p, q)[p == 0] == 0), (name, rule)
            assert torch.all(rule.accept_prob_all(p, q)[p == 0] == 0), (name, rule)
    # one-hot p: the law is p; only the target's token is accepted (acceptance 1 − TV, as lossless)
    p, q = CASES["one_hot_p"]
    for rule in (budget, endpoint, huge):
        assert torch.allclose(rule.induced(p, q), p, atol=1e-15)
        assert rule.acceptance_rate(p, q).item() == pytest.approx(q[2].item(), abs=1e-15)
    # one-hot q: accepted with probability min(1, p(x)/α); the budget binds
    p, q = CASES["one_hot_q"]
    alpha, _ = budget.solve(p, q)
    assert 0 < alpha.item() < 1
    assert budget.acceptance_rate(p, q).item() == pytest.approx(min(1.0, p[3].item() / alpha.item()), abs=1e-12)
    assert endpoint.acceptance_rate(p, q).item() == 1.0
    # q == p: acceptance 1 and law p for every α
    p, q = CASES["identical"]
    for rule in (budget, endpoint, huge, R.get("mentored:alpha=0.3")):
        assert rule.acceptance_rate(p, q).item() == pytest.approx(1.0, abs=1e-15)
        assert torch.allclose(rule.induced(p, q), p, atol=1e-15)
    # disjoint supports: nothing accepted, law p, KL 0
    p, q = CASES["disjoint"]
    for rule in (budget, endpoint, huge):
        assert rule.acceptance_rate(p, q).item() == 0.0
        assert torch.allclose(rule.induced(p, q), p, atol=1e-15)
    # greedy (one-hot p and q): exact matching
    a, b = torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
    a[1], b[3] = 1.0, 1.0
    for rule in (budget, endpoint, huge):
        assert rule.acceptance_rate(a, a.clone()).item() == 1.0
        assert rule.acceptance_rate(a, b).item() == 0.0 and torch.equal(rule.induced(a, b), a)


def test_shapes_dtypes_and_batch_consistency():
    rule = R.get("mentored:D=0.2")
    p, q = random_pairs(24, 11, seed=14)
    p3, q3 = p.view(4, 6, 11), q.view(4, 6, 11)
    alpha, beta = rule.solve(p3, q3)
    assert alpha.shape == beta.shape == (4, 6)
    a_rows = torch.stack([rule.solve(p[i], q[i])[0] for i in range(24)])
    assert torch.allclose(alpha.reshape(-1), a_rows, atol=0, rtol=0)
    assert torch.allclose(rule.induced(p3, q3).reshape(24, 11), rule.induced(p, q), atol=1e-15)
    law32 = rule.induced(p.float(), q.float())
    assert law32.dtype == torch.float32 and torch.allclose(law32.double(), rule.induced(p, q), atol=1e-5)
    assert rule.acceptance_rate(p.float(), q.float()).dtype == torch.float32
    gen = torch.Generator().manual_seed(0)
    pv = p.float()[:20].view(4, 5, 11)
    draft = torch.multinomial(q.float()[:16], 1, generator=gen).view(4, 4)
    n_acc, nxt = rule.verify(pv, q.float()[:16].view(4, 4, 11), draft, generator=gen)
    assert n_acc.shape == nxt.shape == (4,) and n_acc.dtype == torch.int64
    assert bool(((0 <= n_acc) & (n_acc <= 4)).all()) and bool(((0 <= nxt) & (nxt < 11)).all())


# --- spec text and identity --------------------------------------------------------------------------

def test_spec_text_and_identity():
    assert R.get("mentored").spec() == "mentored:D=0.1" and R.get("mentored") == Mentored()
    assert R.get("mentored:0.25").spec() == "mentored:D=0.25"
    assert R.get("mentored:D=0.2,alpha=none") == Mentored(D=0.2)
    assert R.get("mentored:alpha=0.5").spec() == "mentored:alpha=0.5"
    assert R.split_specs("mentored:D=0.1,mentored:alpha=0.5,lossless") == [
        "mentored:D=0.1", "mentored:alpha=0.5", "lossless"]
    assert "mentored:D=0.1,alpha=none" in R.help_text()
    for spec in ("mentored:D=0.1", "mentored:alpha=0.5"):
        rule = R.get(spec)
        assert rule.taxonomy == "collaborative" and rule.taxonomy in TAXONOMY and rule.family == "mentored"
        assert rule.per_token and not rule.pointwise_acceptance
        p, q = CASES["dense"]
        assert torch.equal(rule.reference(p, q), p)          # true baseline: the plain target
    assert "D=0.1" in R.get("mentored:D=0.1").describe()
    assert "α=0.5" in R.get("mentored:alpha=0.5").describe()
    assert math.isinf(R.get("mentored:alpha=0").solve(*CASES["one_hot_q"])[1].item())   # nothing rejected
