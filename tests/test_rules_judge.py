"""The pluggable trained-judge rule (``verispec.rules.judge``): an indicator judge is SpecCascade, features reach
the predicate (law and sampler with features), chain positions get their own features, greedy rows, the judge
registry and the predicate contract.

Closed form vs mechanism, sampler, chain semantics, acceptance oracle, parameters and spec round trip for the
two toy judges (tests/helpers/rule_cases.py) are in tests/test_rule_registry.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import (
    ALPHA,
    JUDGE_H,
    binom_pvalue,
    gof_pvalue,
    half_max,
    pq_cases,
    single_position,
    soft_judge,
    test_judges,
)
from verispec.rules.judge import JudgeRule, judges, register_judge, registered_judge

CASES = pq_cases()
N_SAMPLES = 40_000
H = JUDGE_H


@pytest.fixture(autouse=True)
def _registered():
    with test_judges():
        yield


def test_indicator_judge_is_speccascade_exactly():
    """The toy judge ``p(x) >= 0.5·max p`` has speccascade:p_base=0.5's law, acceptance and sampler."""
    judge, cascade = R.get("judge:name=half_max"), R.get("speccascade:p_base=0.5")
    for name, (p, q) in CASES.items():
        assert torch.equal(judge.induced(p, q), cascade.induced(p, q)), name
        assert torch.equal(judge.acceptance_rate(p, q), cascade.acceptance_rate(p, q)), name
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 5, 11, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(64, 4, 11, generator=gen) * 2, -1)
    d = torch.randint(0, 11, (64, 4), generator=gen)
    out_j = judge.verify(p, q, d, generator=torch.Generator().manual_seed(3))
    out_c = cascade.verify(p, q, d, generator=torch.Generator().manual_seed(3))
    assert torch.equal(out_j[0], out_c[0]) and torch.equal(out_j[1], out_c[1])


def test_closed_form_with_features_matches_the_predicate():
    """With features, ``induced`` = eq. (0.1) with h from the predicate on every token (given those features) and
    r = p, and the acceptance is Σ q·h (without features: tests/test_rule_registry.py)."""
    feats = torch.tensor([0.3, -0.2, 1.0, 0.1], dtype=torch.float64)
    for spec in ("judge:name=half_max", "judge:name=soft"):
        rule = R.get(spec)
        for name, (p, q) in CASES.items():
            h = rule.accept_prob_all(p, q, feats)
            want = q * h + (1 - (q * h).sum()) * p
            torch.testing.assert_close(rule.induced(p, q, features=feats), want, rtol=0, atol=1e-12)
            assert abs(rule.induced(p, q, features=feats).sum().item() - 1) < 1e-12
            assert abs(rule.acceptance_rate(p, q, features=feats).item() - (q * h).sum().item()) < 1e-12, name


def test_sampler_with_features_matches_induced_law_and_acceptance():
    """verify with per-row features [n, 1, H] vs the closed form given those features: chi-square and binomial at
    ALPHA on 40,000 rows per regime (the power of tests/test_rule_registry.py::test_sampler_matches_closed_form;
    without features the registry runs it)."""
    rule = R.get("judge:name=soft")
    feats = torch.tensor([0.3, -0.2, 1.0, 0.1], dtype=torch.float64)
    for i, (name, (p, q)) in enumerate(CASES.items()):
        rows = feats.expand(N_SAMPLES, 1, -1)
        first, accepted, _ = single_position(rule, p, q, N_SAMPLES, seed=3000 + i, features=rows)
        counts = np.bincount(first.numpy(), minlength=p.numel())
        pval = gof_pvalue(counts, rule.induced(p, q, features=feats).numpy())
        assert pval > ALPHA, f"{name}: emitted law differs from induced (p={pval:.2e})"
        beta = rule.acceptance_rate(p, q, features=feats).item()
        assert binom_pvalue(int(accepted.sum()), N_SAMPLES, beta) > ALPHA, name


def test_features_reach_the_predicate_and_the_law_test_has_power():
    """Other features give another law, which the chi-square test tells apart."""
    rule = R.get("judge:name=soft")
    p, q = CASES["tail_overshoot"]
    on, off = torch.full((H,), 2.0, dtype=torch.float64), torch.full((H,), -2.0, dtype=torch.float64)
    assert rule.acceptance_rate(p, q, features=on) > rule.acceptance_rate(p, q, features=off) + 0.05
    first, _, _ = single_position(rule, p, q, N_SAMPLES, seed=5, features=on.expand(N_SAMPLES, 1, -1))
    counts = np.bincount(first.numpy(), minlength=p.numel())
    assert gof_pvalue(counts, rule.induced(p, q, features=on).numpy()) > ALPHA
    assert gof_pvalue(counts, rule.induced(p, q, features=off).numpy()) < 1e-6


def test_each_position_gets_its_own_features():
    """features [B, G, H]: position 2 is judged with its own row (chain semantics)."""
    seen = []

    def spy(p, q, tokens, features):
        seen.append(features.clone())
        return torch.ones_like(tokens, dtype=torch.bool)

    rule = JudgeRule(spy, name="spy")
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(3, 3, 6, generator=gen), -1)
    q = torch.softmax(torch.randn(3, 2, 6, generator=gen), -1)
    d = torch.randint(0, 6, (3, 2), generator=gen)
    feats = torch.arange(3 * 2 * H, dtype=torch.float32).view(3, 2, H)
    n_acc, _ = rule.verify(p, q, d, generator=gen, features=feats)
    assert torch.equal(seen[0], feats) and (n_acc == 2).all()


def test_greedy_rows_reject_to_the_argmax():
    """With one-hot p (temperature 0) a rejection emits argmax p, as both sources do."""
    rule = R.get("judge:name=soft")
    p, q = CASES["one_hot_p"]
    first, accepted, _ = single_position(rule, p, q, 2000, seed=2)
    assert (first[~accepted] == 2).all() and (first[accepted] == 2).all()


# --------------------------------------------------------------------------------------------------
# registry and the predicate contract


def test_registry_and_spec_round_trip():
    rule = R.get("judge:name=soft")
    assert isinstance(rule, JudgeRule) and rule.spec() == "judge:name=soft" and R.get(rule.spec()) == rule
    assert registered_judge("soft") == rule and rule.predicate is soft_judge
    assert {"half_max", "soft"} <= set(judges())
    assert rule.taxonomy == "other" and rule.family == "judge" and not rule.is_lossless and rule.describe()
    assert rule.baseline_truncation() == {} and rule.induced_form().kind == "other"
    p, _ = CASES["dense"]
    assert torch.equal(rule.reference(p), p)
    register_judge("soft", soft_judge)                       # the same function again: no-op
    with pytest.raises(ValueError, match="already registered"):
        register_judge("soft", half_max)
    with pytest.raises(ValueError, match="name must be"):
        register_judge("bad name", soft_judge)
    with pytest.raises(TypeError, match="callable"):
        register_judge("x", 3)
    with pytest.raises(ValueError, match="name must be"):
        JudgeRule(soft_judge, name="a,b")


@pytest.mark.parametrize("bad, error, match", [
    (lambda p, q, t, f: p.gather(-1, t)[..., 0], ValueError, "returned shape"),
    (lambda p, q, t, f: p.gather(-1, t)[..., None], ValueError, "returned shape"),
    (lambda p, q, t, f: 2 * p.gather(-1, t) + 0.5, ValueError, r"must lie in \[0, 1\]"),
    (lambda p, q, t, f: p.gather(-1, t) - 1.5, ValueError, r"must lie in \[0, 1\]"),
    (lambda p, q, t, f: p.gather(-1, t) * float("nan"), ValueError, r"must lie in \[0, 1\]"),
    (lambda p, q, t, f: torch.ones_like(t), ValueError, "bools or floats"),
    (lambda p, q, t, f: 0.5, TypeError, "must return a tensor"),
])
def test_bad_predicates_raise_clear_errors(bad, error, match):
    rule = JudgeRule(bad, name="bad")
    p, q = CASES["dense"]
    with pytest.raises(error, match=match):
        rule.induced(p, q)
    with pytest.raises(error, match=match):
        rule.verify(p.expand(2, 2, -1), q.expand(2, 1, -1), torch.zeros(2, 1, dtype=torch.long))


def test_bad_features_raise_clear_errors():
    rule = R.get("judge:name=soft")
    p, q = CASES["dense"]
    ps, qs, d = p.expand(3, 3, -1), q.expand(3, 2, -1), torch.zeros(3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"features must have shape \[3, 2, H\]"):
        rule.verify(ps, qs, d, features=torch.zeros(3, 3, H))
    with pytest.raises(ValueError, match=r"features must have shape \[3, 2, H\]"):
        rule.verify(ps, qs, d, features=torch.zeros(3, 2))
    with pytest.raises(TypeError, match="features must be a tensor"):
        rule.verify(ps, qs, d, features=[1.0])
    with pytest.raises(ValueError, match=r"features must have shape \[H\]"):
        rule.induced(p, q, features=torch.zeros(2, H))
