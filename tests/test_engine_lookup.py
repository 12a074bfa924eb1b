"""Prompt-lookup (n-gram) drafting in the engine: alone and beside a draft model, exact in law for
lossless rules, point-mass semantics for lossy ones, caches and statistics."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.fake_lm import FakeLM
from tests.helpers.laws import assert_law, exact_prefix_law, sample_prefixes
from tests.helpers.rule_cases import gof_pvalue
from verispec.engine import generate, generate_target_only
from verispec.engine.ngram import NgramDrafter
from verispec.sampling import SamplingConfig

T1 = SamplingConfig.parse("temperature=1")
GREEDY = SamplingConfig.parse("temperature=0")
#: A prompt that repeats itself, so the lookup finds matches from the first step on.
PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]


@pytest.mark.parametrize("with_draft", [False, True])
def test_greedy_lookup_sd_equals_greedy_target_only(with_draft):
    target = FakeLM(vocab=8, seed=1, scale=3.0)
    draft = FakeLM(vocab=8, seed=2) if with_draft else None
    ref = generate_target_only(target, PROMPT, sampling=GREEDY, max_new_tokens=40)
    res = generate(target, draft, PROMPT, rule="lossless", sampling=GREEDY, gamma=4, max_new_tokens=40,
                   lookup=NgramDrafter(min_ngram=2, max_tokens=4))
    assert res.tokens == ref.tokens
    assert res.stats.lookup_steps > 0 and res.stats.lookup_accepted > 0
    if with_draft:  # the draft model drafted where nothing matched, and its cache kept up
        assert res.stats.lookup_steps < sum(res.stats.accepted_hist)


@pytest.mark.slow
@pytest.mark.parametrize("with_draft", [False, True])
def test_lossless_lookup_sd_samples_the_target_law(with_draft):
    """Exact law of the first 3 tokens (chi-square, α = ALPHA) through lookup steps, draft-model steps,
    plain target steps and the caches; lenience 0.5 on the same drafts is rejected (power)."""
    target = FakeLM(vocab=3, seed=1)
    draft = FakeLM(vocab=3, seed=2) if with_draft else None
    law = exact_prefix_law(target, PROMPT, 3, T1)
    run = lambda rule: (lambda s: generate(target, draft, PROMPT, rule=rule, sampling=T1, gamma=2,
                                           max_new_tokens=3, seed=s, lookup=NgramDrafter(max_tokens=2)))
    assert_law(sample_prefixes(run("lossless"), 4000, 3), law)
    lossy = sample_prefixes(run("lenience:ell=0.5"), 4000, 3)
    keys = sorted(set(law) | set(lossy))
    assert gof_pvalue(np.array([lossy.get(k, 0) for k in keys]), np.array([law.get(k, 0.0) for k in keys])) < 1e-6


def test_lookup_errors_are_clear():
    target, draft = FakeLM(vocab=3, seed=1), FakeLM(vocab=3, seed=2)
    kw = dict(rule="lossless", sampling=T1, max_new_tokens=4)
    with pytest.raises(ValueError, match="no draft source"):
        generate(target, None, PROMPT, gamma=2, **kw)
    with pytest.raises(ValueError, match="tree"):
        generate(target, draft, PROMPT, tree="2,2", lookup=NgramDrafter(), **kw)
    with pytest.raises(ValueError, match="cost profile"):
        generate(target, None, PROMPT, gamma="auto", lookup=NgramDrafter(), **kw)
    with pytest.raises(ValueError, match="point mass"):
        generate(target, draft, PROMPT, gamma=2, lookup=NgramDrafter(), **{**kw, "rule": "cos_we:lam=0.5"})


def test_block_verification_takes_lookup_drafts_as_point_masses():
    target = FakeLM(vocab=3, seed=1, scale=3.0)
    ref = generate_target_only(target, PROMPT, sampling=GREEDY, max_new_tokens=30)
    res = generate(target, None, PROMPT, rule="block", sampling=GREEDY, gamma=3, max_new_tokens=30,
                   lookup=NgramDrafter(max_tokens=3))
    assert res.tokens == ref.tokens and res.stats.lookup_steps > 0
