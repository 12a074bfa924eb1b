"""Truncation-set acceptance in general (``verispec.rules.truncation.Truncation`` and the rules built on it)
and the post-truncation pass of the sampling config that samples their true baselines: the sets against their
definitions and the published code (TensorRT-LLM, BiLD), the law's set formula, edge cases, baseline fields.

Closed form vs mechanism, sampler, chain semantics, acceptance oracle, parameters, constructors and spec round
trip of these rules: tests/test_rule_registry.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import gof_pvalue, naive_truncation_mask, pq_cases, single_position
from verispec import sets
from verispec.rules.truncation import BiLD, Relaxed, SpecCascade, Truncation, Typical
from verispec.sampling import SamplingConfig

#: Every kind of step alone, combinations, and the named instances.
SET_SPECS = [
    "truncation:top_k=3",
    "truncation:top_p=0.7",
    "truncation:min_p=0.3",
    "truncation:eta=0.05",
    "truncation:epsilon=0.05",
    "truncation:prob_gap=0.2",
    "truncation:top_k=4,top_p=0.8",
    "truncation:top_k=5,min_p=0.2,epsilon=0.01",
    "truncation:top_p=0.9,eta=0.1,eta_delta=0.5",
    "truncation:prob_gap=0.5,top_k=6,top_p=0.95,min_p=0.05,eta=0.02,epsilon=0.01",
    "relaxed:top_k=3,delta=0.2",
    "relaxed:top_k=2,delta=1",
    "bild:alpha=2.5",
    "speccascade:p_base=0.3",
    "typical:eps=0.1",
]
#: User sampling configs the baselines are built on (the reference code's T 0.7 / top-k 20 / top-p 0.8,
#: plain T 1, configs whose own min-p / η / ε sit where a rule's step would go, greedy).
USER_CONFIGS = [
    "temperature=0.7,top_k=20,top_p=0.8",
    "",
    "temperature=1.3,min_p=0.02",
    "temperature=0.9,eta=0.01,epsilon=0.001",
    "temperature=0.8,top_p=0.9,epsilon=0.002",
    "greedy",
]
CASES = pq_cases()


def _logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Rows from flat to peaked (per-row scale), so every step removes something on some rows."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.5, 4.0, rows)[:, None]
    return torch.randn(rows, vocab, generator=gen) * scale


# --------------------------------------------------------------------------------------------------
# the true baseline: the user's pipeline followed by the rule's truncation


@pytest.mark.parametrize("user", USER_CONFIGS)
def test_baseline_config_samples_the_rules_reference(user):
    """``with_truncation(**baseline_truncation())`` samples ``rule.reference`` of the processed target."""
    cfg = SamplingConfig.parse(user)
    logits = _logits(12, 60, seed=1)
    p = cfg.process(logits)
    for spec in SET_SPECS:
        rule = R.get(spec)
        base = cfg.with_truncation(**rule.baseline_truncation())
        want = rule.reference(p)
        torch.testing.assert_close(base.process(logits), want, rtol=1e-5, atol=1e-6, msg=f"{user!r} + {spec}")
        torch.testing.assert_close(torch.softmax(base.process_logits(logits), -1), want, rtol=1e-5, atol=1e-6)
        assert SamplingConfig.parse(base.spec()) == base


def test_baseline_on_a_large_vocabulary():
    """Long rows take the block top-k / windowed top-p paths of the pipeline and of the post pass."""
    cfg = SamplingConfig.parse("temperature=0.7,top_k=50,top_p=0.95")
    logits = _logits(3, 20_000, seed=2)
    p = cfg.process(logits)
    for spec in ["truncation:top_k=7", "truncation:top_p=0.5,min_p=0.1", "relaxed:top_k=10,delta=0.05"]:
        rule = R.get(spec)
        base = cfg.with_truncation(**rule.baseline_truncation())
        torch.testing.assert_close(base.process(logits), rule.reference(p))


def test_ordinary_top_k_field_is_not_the_baseline():
    """Power check: ``top_k=5`` in the pipeline proper truncates before top-p, on other rows than the
    rule's set; only the post pass reproduces the rule's baseline."""
    cfg = SamplingConfig.parse("temperature=0.7,top_k=20,top_p=0.8")
    logits = _logits(12, 60, seed=1)
    rule = R.get("truncation:top_k=5")
    want = rule.reference(cfg.process(logits))
    naive = SamplingConfig.parse("temperature=0.7,top_k=5,top_p=0.8").process(logits)
    assert (naive - want).abs().max() > 0.05
    torch.testing.assert_close(cfg.with_truncation(post_top_k=5).process(logits), want)


# --------------------------------------------------------------------------------------------------
# the sets against independent definitions


# Thresholds chosen off the lattice of the integer-weight rows below, so rows have many exact ties but no
# probability within rounding of a threshold.
MASK_SETTINGS = [
    [("top_k", 3)], [("top_k", 20)], [("top_p", 0.613)], [("min_p", 0.37)], [("eta", 0.083)], [("epsilon", 0.071)],
    [("prob_gap", 0.137)], [("top_k", 4), ("top_p", 0.613)], [("prob_gap", 0.237), ("top_k", 3)],
    [("top_k", 6), ("min_p", 0.29), ("epsilon", 0.071)], [("top_p", 0.91), ("eta", 0.23)],
    [("prob_gap", 0.41), ("top_k", 7), ("top_p", 0.87), ("min_p", 0.13), ("eta", 0.017), ("epsilon", 0.03)],
]


@pytest.mark.parametrize("steps", MASK_SETTINGS, ids=lambda s: "+".join(n for n, _ in s))
def test_truncation_mask_matches_naive_definition(steps):
    gen = torch.Generator().manual_seed(3)
    w = torch.randint(0, 6, (400, 12), generator=gen).double()
    w[:, 0] += 1                                            # no empty row
    p = w / w.sum(-1, keepdim=True)
    got = sets.truncation_mask(p, **dict(steps))
    want = np.stack([naive_truncation_mask(row, steps) for row in p.numpy()])
    assert np.array_equal(got.numpy(), want)
    delta_case = sets.truncation_mask(p, eta=0.083, eta_delta=0.7)
    want = np.stack([naive_truncation_mask(r, [("eta", 0.083)], 0.7) for r in p.numpy()])
    assert np.array_equal(delta_case.numpy(), want)


def test_relaxed_is_tensorrt_llms_relaxed_acceptance():
    """The loop of ``mtpRelaxedAcceptanceKernel``: walk the top-K of the softmax, stop at the first value
    below ``top1 − δ``; the draft is accepted iff it is met before (rows without ties)."""
    gen = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(200, 30, generator=gen) * torch.linspace(0.3, 3, 200)[:, None], -1)
    for top_k, delta in [(1, 0.0), (3, 0.2), (10, 0.6), (10, 0.05), (30, 1.0)]:
        rule = Relaxed(top_k, delta)
        got = rule.accept_prob_all(p, torch.ones_like(p)).bool()
        vals, idx = torch.topk(p, top_k, dim=-1)
        want = torch.zeros_like(got)
        for r in range(p.shape[0]):
            threshold = vals[r, 0] - delta
            for j in range(top_k):
                if j > 0 and threshold > vals[r, j]:
                    break
                want[r, idx[r, j]] = True
        assert torch.equal(got, want), (top_k, delta)


def test_bild_is_the_rollback_policy():
    """BiLD's code rolls back iff the cross-entropy of the draft under the large model exceeds α and the
    large model's own prediction differs from the draft."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(200, 30, generator=gen, dtype=torch.float64) * torch.linspace(0.3, 3, 200)[:, None]
    p = torch.softmax(logits, -1)
    loss = -torch.log_softmax(logits, -1)                  # CrossEntropyLoss(logits, x) for every x
    for alpha in (0.5, 2.5, 5.0):
        rollback = (loss > alpha) & (torch.arange(30) != logits.argmax(-1, keepdim=True))
        got = BiLD(alpha).accept_prob_all(p, torch.ones_like(p)).bool()
        assert torch.equal(got, ~rollback), alpha
    assert BiLD(3.0).baseline_truncation() == {"epsilon": math.exp(-3.0)}


def test_named_rules_are_instances_with_their_old_sets():
    gen = torch.Generator().manual_seed(6)
    w = torch.randint(0, 5, (300, 9), generator=gen).double()
    w[:, 0] += 1
    p = w / w.sum(-1, keepdim=True)
    for rule in (SpecCascade(0.3), SpecCascade(0.0), SpecCascade(1.0), Typical(0.1), Typical(0.9, 5.0), Relaxed(2, 0.1),
                 BiLD(1.0)):
        assert isinstance(rule, Truncation) and rule.taxonomy == "truncation set"
    assert torch.equal(SpecCascade(0.3).allowed(p), sets.min_p_mask(p, 0.3))
    assert torch.equal(SpecCascade(1.0).allowed(p), sets.min_p_mask(p, 1.0))
    assert SpecCascade(0.0).allowed(p).all()                      # accept everything, as before
    assert torch.equal(Typical(0.1).allowed(p), sets.eta_mask(p, 0.1))
    assert torch.equal(Typical(0.9, 5.0).allowed(p), sets.eta_mask(p, 0.9, 5.0))
    # the generic spelling is the same rule in law and sampler, under another name
    generic, named = R.get("truncation:min_p=0.3"), R.get("speccascade:p_base=0.3")
    assert generic != named and generic.baseline_truncation() == named.baseline_truncation() == {"min_p": 0.3}
    for p1, q1 in CASES.values():
        assert torch.equal(generic.induced(p1, q1), named.induced(p1, q1))
    pp = torch.softmax(torch.randn(50, 4, 9, generator=gen), -1)
    qq = torch.softmax(torch.randn(50, 3, 9, generator=gen), -1)
    d = torch.randint(0, 9, (50, 3), generator=gen)
    out_g = generic.verify(pp, qq, d, generator=torch.Generator().manual_seed(9))
    out_n = named.verify(pp, qq, d, generator=torch.Generator().manual_seed(9))
    assert torch.equal(out_g[0], out_n[0]) and torch.equal(out_g[1], out_n[1])


# --------------------------------------------------------------------------------------------------
# the law


@pytest.mark.parametrize("spec", SET_SPECS)
def test_law_is_the_set_formula_with_the_naive_sets(spec):
    """``induced`` = ``q·1_A + (1 − q(A))·p`` with A from the definitions (naive loops), and A lies in supp p.
    (Against the mechanism, the sampler and the acceptance oracle: tests/test_rule_registry.py.)"""
    rule = R.get(spec)
    order = ("prob_gap", "top_k", "top_p", "min_p", "eta", "epsilon")
    steps = [(k, rule.truncation[k]) for k in order if k in rule.truncation]
    for name, (p, q) in CASES.items():
        allowed = torch.from_numpy(naive_truncation_mask(p.numpy(), steps, rule.truncation.get("eta_delta")))
        assert torch.equal(rule.allowed(p), allowed), (spec, name)
        inside = torch.where(allowed, q, torch.zeros_like(q))
        torch.testing.assert_close(rule.induced(p, q), inside + (1 - inside.sum()) * p, rtol=0, atol=1e-12)
        assert (allowed <= (p > 0)).all(), (spec, name)


def test_the_law_test_has_power():
    """A wrong law (the same rule with a looser set) is rejected by the chi-square test the registry's sampler
    test runs (40,000 rows)."""
    p, q = CASES["tail_overshoot"]
    first, _, _ = single_position(R.get("relaxed:top_k=3,delta=0.2"), p, q, 40_000, seed=7)
    counts = np.bincount(first.numpy(), minlength=p.numel())
    assert gof_pvalue(counts, R.get("relaxed:top_k=3,delta=0.5").induced(p, q).numpy()) < 1e-6


def test_edge_cases():
    p, q = CASES["one_hot_p"]
    for spec in SET_SPECS:                    # one-hot p (greedy): A = {argmax}, exact match
        rule = R.get(spec)
        assert rule.allowed(p).tolist() == (p > 0).tolist()
        torch.testing.assert_close(rule.reference(p), p)
    p, q = CASES["disjoint"]                  # the draft proposes only tokens the target excludes
    for spec in SET_SPECS:
        rule = R.get(spec)
        assert rule.acceptance_rate(p, q).item() == 0.0
        torch.testing.assert_close(rule.induced(p, q), p)
    # top-k beyond the support keeps the support only: a drafted token with p = 0 is rejected
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    assert R.get("truncation:top_k=3").allowed(p).tolist() == [True, True, False, False]
    assert R.get("truncation:prob_gap=0.9").allowed(p).tolist() == [True, True, False, False]


# --------------------------------------------------------------------------------------------------
# specs, parameters, forms


def test_baseline_fields_and_forms():
    assert R.get("truncation:min_p=0.3,epsilon=0.01").baseline_truncation() == {"min_p": 0.3, "epsilon": 0.01}
    assert R.get("truncation:eta=0.1,eta_delta=0.5").baseline_truncation() == {"eta": 0.1, "eta_delta": 0.5}
    assert R.get("truncation:top_k=5,min_p=0.3").baseline_truncation() == {"post_top_k": 5, "post_min_p": 0.3}
    assert R.get("relaxed:top_k=3,delta=0.2").baseline_truncation() == {"post_prob_gap": 0.2, "post_top_k": 3}
    assert R.get("relaxed:top_k=3,delta=1").baseline_truncation() == {"post_top_k": 3}
    assert R.get("truncation:min_p=0.3").induced_form() == R.InducedForm("min_p_set", p_base=0.3)
    assert R.get("truncation:eta=0.2").induced_form() == R.get("typical:eps=0.2").induced_form()
    for spec in ("truncation:top_k=3", "truncation:min_p=0.3,epsilon=0.01", "relaxed:top_k=3,delta=0.2",
                 "bild:alpha=2"):
        assert R.get(spec).induced_form().kind == "other"
        assert not R.get(spec).pointwise_acceptance and not R.get(spec).is_lossless


# --------------------------------------------------------------------------------------------------
# the post-truncation pass of the sampling config


def test_post_fields_parse_and_stay_out_of_existing_specs():
    c = SamplingConfig.parse("temperature=0.7,post_top_k=5")
    assert c == SamplingConfig(temperature=0.7, post_top_k=5) and c.spec() == "temperature=0.7,post_top_k=5"
    full = SamplingConfig.parse("post_prob_gap=0.3,post_top_k=5,post_top_p=0.9,post_min_p=0.1,post_eta=0.01,"
                                "post_eta_delta=0.2,post_epsilon=0.001")
    assert SamplingConfig.parse(full.spec()) == full
    assert full.post_truncation == {"prob_gap": 0.3, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "eta": 0.01,
                                    "eta_delta": 0.2, "epsilon": 0.001}
    for text in ("temperature=0.7,top_k=20,top_p=0.8", "min_p=0.1", "eta=0.01,eta_delta=0.5", ""):
        assert SamplingConfig.parse(text).spec() == text and SamplingConfig.parse(text).post_truncation == {}
    for text, match in [("post_top_k=-1", "post_top_k must be an integer >= 0"),
                        ("post_top_p=0", "post_top_p must be"), ("post_prob_gap=2", "post_prob_gap must be"),
                        ("post_epsilon=1", "post_epsilon must be")]:
        with pytest.raises(ValueError, match=match):
            SamplingConfig.parse(text)


def test_with_truncation_places_each_request_where_it_is_exact():
    t07 = SamplingConfig.parse("temperature=0.7,top_k=20,top_p=0.8")
    assert t07.with_truncation(min_p=0.3) == SamplingConfig.parse("temperature=0.7,top_k=20,top_p=0.8,min_p=0.3")
    assert t07.with_truncation(epsilon=0.01, min_p=0.3).spec() == \
        "temperature=0.7,top_k=20,top_p=0.8,min_p=0.3,epsilon=0.01"
    own_min_p = SamplingConfig.parse("temperature=0.7,min_p=0.1")
    assert own_min_p.with_truncation(min_p=0.3).spec() == "temperature=0.7,min_p=0.1,post_min_p=0.3"
    assert own_min_p.with_truncation(eta=0.1).spec() == "temperature=0.7,min_p=0.1,eta=0.1"   # η runs after min-p
    own_eta = SamplingConfig.parse("eta=0.01,eta_delta=0.5")
    assert own_eta.with_truncation(min_p=0.3).spec() == "eta=0.01,eta_delta=0.5,post_min_p=0.3"
    assert own_eta.with_truncation(eta=0.2).spec() == "eta=0.01,eta_delta=0.5,post_eta=0.2"
    stale_delta = SamplingConfig(eta_delta=0.5)       # δ of a switched-off η must not leak into the request
    assert stale_delta.with_truncation(eta=0.2) == SamplingConfig(eta=0.2)
    assert t07.with_truncation(post_top_k=5, post_min_p=0.3).spec() == \
        "temperature=0.7,top_k=20,top_p=0.8,post_top_k=5,post_min_p=0.3"
    assert own_min_p.with_truncation(min_p=0.0) == own_min_p and t07.with_truncation() == t07
    with pytest.raises(ValueError, match="cannot take a second post-truncation"):
        SamplingConfig(post_top_k=5).with_truncation(min_p=0.3)
    with pytest.raises(ValueError, match="request eta too"):
        t07.with_truncation(eta_delta=0.3)
    with pytest.raises(ValueError, match="requested twice"):
        t07.with_truncation(min_p=0.3, post_min_p=0.2)
    with pytest.raises(TypeError, match="unknown field"):
        t07.with_truncation(top_k=5)
    with pytest.raises(ValueError, match="min_p"):
        t07.with_truncation(min_p=2.0)


def test_post_pass_on_greedy_and_empty_inputs():
    logits = _logits(4, 30, seed=9)
    greedy = SamplingConfig.parse("greedy,post_top_p=0.3,post_eta=0.2")
    assert torch.equal(greedy.process(logits), SamplingConfig.parse("greedy").process(logits))
    cfg = SamplingConfig.parse("post_top_k=3")
    assert cfg.process(torch.zeros(0, 30)).shape == (0, 30)
    out = cfg.process(logits)
    assert ((out > 0).sum(-1) == 3).all() and torch.allclose(out.sum(-1), torch.ones(4))
