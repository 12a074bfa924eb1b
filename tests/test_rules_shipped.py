"""Rules shipped in serving engines: SGLang's thresholds, vLLM's strict sampler, transformers' static ensemble.

The family's properties: the averaged residual, the power of the law test against a residual reading, a
rejected draft is never re-emitted, strict = sglang at thresholds 1, SGLang's kernel and tree form, and
``hf_ensemble`` against transformers' own ``_speculative_sampling``. Closed form vs mechanism, sampler vs closed
form (chi-square and binomial at ``ALPHA``), chain semantics, the lossless settings against ``p``, parameters
and constructors: tests/test_rule_registry.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import ALPHA, binom_pvalue, gof_pvalue, pq_cases, single_position
from verispec.rules.collaborative import CosWE
from verispec.rules.shipped import SGLangThresholds, Strict, hf_ensemble
from verispec.rules.tree_law import sampled_node_law, tree_node_law

SHIPPED_SPECS = [
    "sglang:single=0.9,acc=0.9",
    "sglang:single=0.3,acc=0.5",
    "sglang:single=1,acc=0.4",
    "sglang:single=0.2,acc=1",
    "sglang",
    "strict",
]
LOSSLESS_SPECS = ["sglang", "sglang:single=1,acc=1", "strict"]
CASES = pq_cases()
N_SAMPLES = 40_000


def _counts(tokens: torch.Tensor, v: int) -> np.ndarray:
    return np.bincount(tokens.numpy(), minlength=v)


# --- closed form, power of the law test --------------------------------------------------------------

@pytest.mark.parametrize("spec", SHIPPED_SPECS)
def test_the_averaged_residual_satisfies_eq_0_1(spec):
    """The law ``q·h + p(W − w)`` (= the token-by-token mechanism, tests/test_rule_registry.py) is also eq. (0.1)
    with the rejection law averaged over the drafted token, the one residual tree verification uses."""
    rule = R.get(spec)
    for name, (p, q) in list(CASES.items()) + list(enumerate(_random_pairs(5, n=10))):
        h = rule.accept_prob_all(p, q)
        beta = (q * h).sum()
        torch.testing.assert_close(rule.induced(p, q), q * h + (1 - beta) * rule.residual(p, q), atol=1e-12, rtol=0,
                                   msg=f"{spec} {name}")


def test_the_law_test_has_power_against_p_and_against_a_residual_correction():
    """The lossy SGLang sampler is told apart from p and from the reading 'correct with norm((p − q)_+)'."""
    rule = R.get("sglang:single=0.3,acc=0.5")
    p, q = CASES["tail_overshoot"]
    first, _, _ = single_position(rule, p, q, N_SAMPLES, seed=5)
    counts = _counts(first, p.numel())
    assert gof_pvalue(counts, rule.induced(p, q).numpy()) > ALPHA
    assert gof_pvalue(counts, p.numpy()) < ALPHA
    y = q * rule.accept_prob_all(p, q)
    residual_reading = y + (1 - y.sum()) * R.get("lossless").residual(p, q)
    assert gof_pvalue(counts, residual_reading.numpy()) < ALPHA


@pytest.mark.parametrize("spec", ["sglang:single=0.3,acc=0.5", "sglang", "strict"])
def test_a_rejected_draft_is_never_re_emitted(spec):
    """SGLang's kernel zeroes the rejected candidate before the final draw, and vLLM's strict sampler emits a
    target draw that differs from the draft: with a deterministic draft c (SGLang's top-1), rejections emit
    from norm(p·1_{≠c})."""
    rule = R.get(spec)
    p, _ = CASES["dense"]
    c = int(p.argmax())
    q = torch.zeros_like(p)
    q[c] = 1.0
    first, accepted, _ = single_position(rule, p, q, N_SAMPLES, seed=9)
    rejected = first[~accepted]
    assert (rejected != c).all()
    rest = p.clone()
    rest[c] = 0
    assert gof_pvalue(_counts(rejected, p.numel()), (rest / rest.sum()).numpy()) > ALPHA
    assert binom_pvalue(int(accepted.sum()), N_SAMPLES, rule.accept_prob_at(p, q, torch.tensor(c)).item()) > ALPHA
    # with sampled drafts too: a rejection never emits the token that was drafted at that position
    p, q = CASES["dense"]
    first, accepted, draft = single_position(rule, p, q, N_SAMPLES, seed=10)
    assert (first[~accepted] != draft[~accepted, 0]).all()


# --- lossless settings ------------------------------------------------------------------------------

def _random_pairs(seed: int, n: int = 50, v: int = 9):
    gen = torch.Generator().manual_seed(seed)
    for i in range(n):
        conc = [0.1, 0.5, 2.0][i % 3]
        p = torch._standard_gamma(torch.full((v,), conc, dtype=torch.float64), generator=gen)
        q = torch._standard_gamma(torch.full((v,), conc, dtype=torch.float64), generator=gen)
        if i % 5 == 0:   # deterministic draft (SGLang's top-k candidates)
            q = torch.zeros(v, dtype=torch.float64).scatter_(0, torch.randint(v, (1,), generator=gen), 1.0)
        yield p / p.sum(), q / q.sum()


@pytest.mark.parametrize("spec", LOSSLESS_SPECS)
def test_lossless_settings_state_the_target_form(spec):
    """(That their law is p for any draft, deterministic drafts included: tests/test_rule_registry.py.)"""
    rule = R.get(spec)
    assert rule.is_lossless and rule.induced_form() == R.InducedForm("target")


def test_strict_is_sglang_at_thresholds_one_token_by_token():
    strict, sglang = R.get("strict"), R.get("sglang:single=1,acc=1")
    for p, q in list(CASES.values()) + list(_random_pairs(4, n=10)):
        torch.testing.assert_close(strict.accept_prob_all(p, q), sglang.accept_prob_all(p, q), atol=0, rtol=0)
        torch.testing.assert_close(strict.residual(p, q), sglang.residual(p, q), atol=1e-12, rtol=0)
        torch.testing.assert_close(strict.acceptance_rate(p, q), sglang.acceptance_rate(p, q), atol=1e-12, rtol=0)


def test_strict_acceptance_is_p_dot_q_and_below_lossless():
    strict, lossless = R.get("strict"), R.get("lossless")
    for name, (p, q) in CASES.items():
        beta = strict.acceptance_rate(p, q).item()
        assert beta == pytest.approx(float(np.dot(p.numpy(), q.numpy())), abs=1e-12), name
        assert beta <= lossless.acceptance_rate(p, q).item() + 1e-12, name
    p, q = CASES["dense"]
    assert strict.acceptance_rate(p, q) < lossless.acceptance_rate(p, q) - 0.1
    p, _ = CASES["dense"]
    assert strict.acceptance_rate(p, p) == pytest.approx(float((p * p).sum()))   # even q = p rejects


def test_disjoint_supports_and_one_hot_target():
    """A draft outside supp(p) is always rejected and the correction is p; a one-hot p is emitted surely."""
    for spec in SHIPPED_SPECS:
        rule = R.get(spec)
        p, q = CASES["disjoint"]
        assert rule.acceptance_rate(p, q).item() == 0.0
        torch.testing.assert_close(rule.induced(p, q), p, atol=1e-12, rtol=0)
        p, q = CASES["one_hot_p"]
        torch.testing.assert_close(rule.induced(p, q), p, atol=1e-12, rtol=0)
        assert rule.acceptance_rate(p, q).item() == pytest.approx(q[2].item(), abs=1e-12)


# --- SGLang's acceptance function and tree form -----------------------------------------------------

def test_sglang_acceptance_is_the_kernel_test():
    """``coin <= p/θa || p >= θs`` with coin ~ U[0, 1): h = 1 on ``p >= θs`` (ties included), else min(1, p/θa)."""
    p = torch.tensor([0.5, 0.45, 0.3, 0.1, 0.0, 0.65], dtype=torch.float64)
    q = torch.full_like(p, 1 / 6)
    rule = SGLangThresholds(single=0.5, acc=0.8)
    assert rule.accept_prob_all(p, q).tolist() == pytest.approx([1.0, 0.5625, 0.375, 0.125, 0.0, 1.0])
    rule = SGLangThresholds(single=0.5, acc=0.4)
    assert rule.accept_prob_all(p, q).tolist() == pytest.approx([1.0, 1.0, 0.75, 0.25, 0.0, 1.0])
    at = rule.accept_prob_at(p.expand(2, 6), q.expand(2, 6), torch.tensor([2, 0]))
    assert at.tolist() == pytest.approx([0.75, 1.0])
    rule = SGLangThresholds(single=0.9, acc=1.0)
    assert rule.accept_prob_all(p, q).tolist() == pytest.approx(p.tolist())   # no single hit: lossless h


def _kernel_transcription(g: torch.Tensor, cand: list[int], single: float, acc: float, n: int, seed: int):
    """The kernel's per-node loop, vectorised over n draws: one coin, prob_acc summed over tried siblings."""
    gen = torch.Generator().manual_seed(seed)
    coin = torch.rand(n, generator=gen, dtype=torch.float64)
    out = torch.full((n,), -1, dtype=torch.long)
    prob_acc = torch.zeros(n, dtype=torch.float64)
    for c in cand:
        prob_acc = prob_acc + g[c]
        hit = (out < 0) & ((coin <= prob_acc / acc) | (g[c] >= single))
        out = torch.where(hit, torch.tensor(c), out)
    rest = g.clone()
    rest[cand] = 0
    fallback = torch.multinomial(rest / rest.sum(), n, replacement=True, generator=gen)
    return torch.where(out >= 0, out, fallback)


def test_sglang_tree_node_law_matches_a_transcription_of_the_kernel():
    p, _ = CASES["dense"]
    cand = torch.argsort(p, descending=True)[1:4].tolist()     # three siblings, not the target's mode
    rule = SGLangThresholds(single=0.9, acc=0.3)
    law, accept = rule.tree_node_law(p, torch.tensor(cand))
    draws = _kernel_transcription(p, cand, rule.single, rule.acc, N_SAMPLES, seed=21)
    assert gof_pvalue(_counts(draws, p.numel()), law.numpy()) > ALPHA
    assert law.sum().item() == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(accept, law[cand], atol=1e-12, rtol=0)
    # the shared coin differs from the chain rule applied to the renormalised target (tree.py's form)
    renorm, g, survive = [], p.clone(), 1.0
    for c in cand:
        a = rule.accept_from_p(g[c]).item()
        renorm.append(survive * a)
        survive *= 1 - a
        g[c] = 0
        g = g / g.sum()
    assert max(abs(x - y) for x, y in zip(accept.tolist(), renorm)) > 0.05


def test_sglang_tree_node_law_reduces_to_the_chain_form_and_to_p():
    rule = SGLangThresholds(single=0.4, acc=0.7)
    for name, (p, _) in CASES.items():
        for c in range(p.numel()):
            q = torch.zeros_like(p)
            q[c] = 1.0
            law, accept = rule.tree_node_law(p, torch.tensor([c]))
            torch.testing.assert_close(law, rule.induced(p, q), atol=1e-12, rtol=0, msg=f"{name} {c}")
            assert accept.item() == pytest.approx(rule.accept_prob_at(p, q, torch.tensor(c)).item())
    lossless = SGLangThresholds()
    for p, _ in CASES.values():
        cand = torch.argsort(p, descending=True)[:3]
        law, accept = lossless.tree_node_law(p, cand)
        torch.testing.assert_close(law, p, atol=1e-12, rtol=0)
        torch.testing.assert_close(accept, p[cand], atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="distinct"):
        rule.tree_node_law(p, torch.tensor([1, 1]))


@pytest.mark.parametrize("spec", ["strict", "sglang"])
def test_lossless_target_only_rules_are_lossless_on_trees(spec):
    """verispec's tree verifier uses ``residual`` (the averaged rejection law) on sampled children and
    zero-and-renormalise on deterministic ones: both keep these rules lossless."""
    rule = R.get(spec)
    p, q = CASES["dense"]
    for scheme in ("iid", "without_replacement"):
        law, _ = sampled_node_law(rule, p, q, 2, scheme=scheme)
        torch.testing.assert_close(law, p, atol=1e-12, rtol=0)
    law, _ = tree_node_law(rule, p, torch.tensor([0, 3, 5]))
    torch.testing.assert_close(law, p, atol=1e-12, rtol=0)


# --- transformers' static ensemble -------------------------------------------------------------------

def test_hf_ensemble_is_cos_we_with_lambda_equal_to_the_weight():
    rule = R.get("hf_ensemble:weight=0.3")
    assert rule == CosWE(lam=0.3) == hf_ensemble(0.3)
    assert rule.spec() == "cos_we:lam=0.3" and R.get(rule.spec()) == rule
    assert R.get("hf_ensemble:0.8") == R.get("cos_we:lam=0.8")


def _transformers_draws(weight: float, p: torch.Tensor, q: torch.Tensor, n: int, seed: int):
    """transformers' own ``_speculative_sampling`` on one drafted token ``c ~ q`` -> (first token, accepted)."""
    from transformers.generation.utils import _speculative_sampling

    cand_logits = q.log()[None, None]                    # [1, 1, V]: softmax gives back q
    new_logits = torch.stack([p, p]).log()[None]         # [1, 2, V]: the drafted position and the bonus
    first, accepted = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                             # tiny ops: thread hand-offs would dominate
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)                      # transformers draws from the global generator
            drafts = torch.multinomial(q, n, replacement=True).tolist()
            for i, c in enumerate(drafts):
                ids = torch.tensor([[0, c]])
                tokens, n_matches = _speculative_sampling(ids, cand_logits, 1, new_logits,
                                                          assistant_ensemble_weight=weight)
                first[i], accepted[i] = tokens[0, 0].item(), int(n_matches) == 1
    finally:
        torch.set_num_threads(threads)
    return first, accepted


@pytest.mark.parametrize("weight", [0.3, 0.8])
def test_hf_ensemble_agrees_with_transformers(weight):
    rule = R.get(f"hf_ensemble:weight={weight}")
    n = 15_000
    for i, name in enumerate(["dense", "tail_overshoot", "sparse"]):
        p, q = CASES[name]
        first, accepted = _transformers_draws(weight, p, q, n, seed=100 + i)
        counts = np.bincount(first, minlength=p.numel())
        assert gof_pvalue(counts, rule.induced(p, q).numpy()) > ALPHA, (weight, name)
        assert binom_pvalue(int(accepted.sum()), n, rule.acceptance_rate(p, q).item()) > ALPHA, (weight, name)
        on_reject = np.bincount(first[~accepted], minlength=p.numel())
        assert gof_pvalue(on_reject, rule.residual(p, q).numpy()) > ALPHA, (weight, name)
        # power: the flipped weight convention (w on the draft) and the target itself are rejected
        assert gof_pvalue(counts, CosWE(lam=1 - weight).induced(p, q).numpy()) < ALPHA, (weight, name)
        assert gof_pvalue(counts, p.numpy()) < ALPHA, (weight, name)


# --- identity and registry ---------------------------------------------------------------------------

def test_identity_and_registry():
    for spec in SHIPPED_SPECS:
        rule = R.get(spec)
        assert R.get(rule.spec()) == rule
        assert rule.describe() and rule.per_token and rule.pointwise_acceptance
        p, q = CASES["dense"]
        torch.testing.assert_close(rule.reference(p, q), p)
        assert rule.baseline_truncation() == {}
    sg = R.get("sglang:single=0.9,acc=0.8")
    assert (sg.name, sg.family, sg.taxonomy, sg.is_lossless) == ("sglang", "sglang", "truncation set", False)
    assert sg.induced_form().kind == "other" and sg.spec() == "sglang:single=0.9,acc=0.8"
    assert R.get("sglang:0.9,0.8") == sg and R.get("sglang") == SGLangThresholds(1.0, 1.0)
    assert not R.get("sglang:single=1,acc=0.99").is_lossless and not R.get("sglang:single=0.99").is_lossless
    st = R.get("strict")
    assert (st.spec(), st.family, st.taxonomy, st.is_lossless) == ("strict", "strict", "lossless", True)
    assert st == Strict()
    assert R.split_specs("sglang:single=0.9,acc=0.9,strict,hf_ensemble:weight=0.5") == [
        "sglang:single=0.9,acc=0.9", "strict", "hf_ensemble:weight=0.5"]
    text = R.help_text()
    assert "sglang:single=1.0,acc=1.0" in text and "hf_ensemble:weight" in text and "strict" in text

