"""γ = auto for prompt lookup (:class:`LookupGamma`): which lookup drafts are worth verifying, and how
many of their tokens, from the cost of verifying free drafts and the acceptance seen per matched-suffix
length; profiles without a draft model; exactness through every kind of step."""

from __future__ import annotations

import json

import pytest

from tests.helpers.fake_lm import FakeLM
from tests.helpers.laws import assert_law, exact_prefix_law, sample_prefixes
from verispec.engine import CostProfile, cached_profile, generate, generate_target_only, measure_profile
from verispec.engine.gamma import LookupGamma, best_gamma, expected_tokens
from verispec.engine.ngram import NgramDrafter
from verispec.sampling import SamplingConfig

T1 = SamplingConfig.parse("temperature=1")
GREEDY = SamplingConfig.parse("temperature=0")
PROMPT = [0, 1, 2, 0, 1, 2, 0, 1]
#: a target whose (g+1)-token forward costs 1 + 0.5·g single steps, and no draft model
FREE = CostProfile(draft_token=None, target_block=tuple(0.01 * (1 + 0.5 * g) for g in range(9)),
                   step_overhead=(0.0, 0.0), plain_overhead=0.0)


def test_free_drafts_are_priced_by_the_verification_alone():
    assert not FREE.has_draft and FREE.verify_cost(0) == 1.0 and FREE.verify_cost(4) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="without a draft model"):
        FREE.step_cost(2)
    with pytest.raises(ValueError, match="without a draft model"):
        _ = FREE.c
    # free drafts pay where a drafted token's expected yield beats its verification: at α = 0.9,
    # E/cost = 1.267, 1.355, 1.376, 1.365 for g = 1..4 (3.439 / 2.5 at g = 3); at α = 0.2 none beats 1
    assert best_gamma(FREE, 0.2, free=True) == 0 and best_gamma(FREE, 0.9, free=True) == 3
    assert CostProfile.from_json(json.loads(json.dumps(FREE.to_json()))) == FREE


def test_lookup_choice_is_the_argmax_against_its_rival_per_match_length():
    pol = LookupGamma(FREE, optimism=0.0, max_match=3)
    plain = 1.0 / FREE.verify_cost(0)
    for _ in range(30):          # 1-token matches: the first token is always rejected
        pol.update(1, 0, 3)
    for _ in range(30):          # 3-token (and longer) matches: every token accepted
        pol.update(3, 3, 3)
    assert pol.alpha(1) < 0.05 and pol.alpha(5) == pol.alpha(3) > 0.95
    assert pol.choose(6, 1, plain) == 0
    a = pol.alpha(4)
    want = max(range(1, 7), key=lambda k: expected_tokens(a, k) / FREE.verify_cost(k))
    assert pol.choose(6, 4, plain) == want == 6 and pol.choose(2, 4, plain) == 2   # capped by what was proposed
    # a rival better than any lookup draft takes the step
    assert pol.choose(6, 4, rival=expected_tokens(a, 6) / FREE.verify_cost(6) + 1e-9) == 0
    # the untried 2-token bucket still has its prior: optimism lets it draft, the posterior mean alone not
    hopeful = LookupGamma(FREE, optimism=1.0, prior_alpha=0.3)
    assert hopeful.choose(4, 2, plain) > 0 and LookupGamma(FREE, optimism=0.0, prior_alpha=0.3).choose(4, 2, plain) == 0
    with pytest.raises(ValueError, match="matched suffix"):
        pol.choose(3, 0, plain)
    with pytest.raises(ValueError, match="prior_alpha"):
        LookupGamma(FREE, prior_alpha=1.0)


def test_a_declined_bucket_is_probed_with_one_token_at_doubling_intervals():
    """Two unlucky failures must not shut a bucket for good: after 8 consecutive declines one token is
    verified anyway, then after 16, 32, ...; a draft chosen on its merits resets the count."""
    pol = LookupGamma(FREE, optimism=0.0, explore_every=8)
    plain = 1.0 / FREE.verify_cost(0)
    pol.update(2, 0, 4)
    pol.update(2, 0, 4)
    probes = [i for i in range(1, 8 + 16 + 32 + 1) if pol.choose(5, 2, plain) > 0]
    assert probes == [8, 8 + 16, 8 + 16 + 32]
    assert pol.choose(5, 2, plain) == 0 and pol.choose(0, 2, plain) == 0   # nothing proposed: no probe, no count
    assert pol.declined[1] == 1
    for _ in range(40):                     # the bucket turns good: it drafts on its merits
        pol.update(2, 4, 4)
    assert pol.choose(5, 2, plain) > 1 and pol.declined[1] == 0
    assert LookupGamma(FREE).choose(5, 1, plain) > 0 and pol.declined[0] == 0   # buckets count apart


def _mixed_profile() -> CostProfile:
    """A draft model worth drafting with (c = 0.1) and a target whose blocks cost 1 + 0.4·g steps."""
    return CostProfile(draft_token=0.001, target_block=tuple(0.01 * (1 + 0.4 * g) for g in range(9)),
                       draft_pair=0.0015, step_overhead=(0.0, 0.0), plain_overhead=0.0)


@pytest.mark.parametrize("with_draft", [False, True])
def test_auto_lookup_greedy_equals_target_only_and_prices_each_step(with_draft):
    """Lookup steps, declined lookups (draft-model or plain steps) and their caches: greedy SD emits
    target-only's tokens, and the modelled speedup is the hand sum of each step's cost."""
    target = FakeLM(vocab=8, seed=3, scale=3.0)
    draft = FakeLM(vocab=8, seed=2) if with_draft else None
    prof = _mixed_profile() if with_draft else FREE
    ref = generate_target_only(target, PROMPT, sampling=GREEDY, max_new_tokens=60)
    res = generate(target, draft, PROMPT, rule="lossless", sampling=GREEDY, gamma="auto", max_new_tokens=60,
                   costs=prof, lookup=NgramDrafter(min_ngram=1, max_ngram=3, max_tokens=8))
    st = res.stats
    assert res.tokens == ref.tokens and st.gamma_policy == "auto"
    # every kind of step happened: accepted lookup drafts, plain steps and (with a draft) draft-model chains
    assert st.lookup_accepted > 0 and st.gamma_hist[0] > 0
    assert (st.target_calls - st.lookup_steps - st.gamma_hist[0] > 0) == with_draft
    if not with_draft:
        cost = sum(n * prof.verify_cost(g) for g, n in enumerate(st.gamma_hist))
        assert st.cost_model_speedup == pytest.approx(st.new_tokens * prof.verify_cost(0) / cost)
    else:
        assert st.cost_model_speedup is not None and st.draft_calls > 0


def test_auto_lookup_declines_drafts_that_keep_failing():
    """A target that never repeats the prompt: lookup's 1-token matches are rejected, so after a few
    tries auto stops verifying them (plain steps), while fixed γ keeps paying for them."""
    target = FakeLM(vocab=8, seed=3, scale=0.5)   # near-uniform: a copied token is accepted 1 time in ~8
    kw = dict(rule="lossless", sampling=T1, max_new_tokens=80, seed=0)
    auto = generate(target, None, PROMPT, gamma="auto", costs=FREE, lookup=NgramDrafter(max_tokens=8), **kw).stats
    fixed = generate(target, None, PROMPT, gamma=3, costs=FREE, lookup=NgramDrafter(max_tokens=3), **kw).stats
    assert fixed.lookup_steps > 40 and auto.lookup_steps < 20
    assert auto.cost_model_speedup > fixed.cost_model_speedup


@pytest.mark.slow
def test_auto_lookup_with_a_draft_model_samples_the_target_law():
    """Exact law of the first 3 tokens under T = 1 through auto-chosen lookup, draft-model and plain steps."""
    target, draft = FakeLM(vocab=3, seed=1), FakeLM(vocab=3, seed=2)
    law = exact_prefix_law(target, PROMPT, 3, T1)
    prof = _mixed_profile()
    counts = sample_prefixes(lambda s: generate(target, draft, PROMPT, rule="lossless", sampling=T1, gamma="auto",
                                                max_new_tokens=3, seed=s, costs=prof,
                                                lookup=NgramDrafter(max_tokens=8)), 3000, 3)
    assert_law(counts, law)


def test_profiles_without_a_draft_model(tmp_path, quiet_machine):
    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    prof = measure_profile(target, None, [0, 1], g_max=3, repeats=3)
    assert not prof.has_draft and prof.g_max == 3 and prof.verify_cost(2) > 1.0 and target.n_cached == 2
    cached, measured = cached_profile(target, None, [0, 1], cache_dir=tmp_path, g_max=3)
    assert measured and "draft=none" in cached.identity
    assert cached_profile(target, None, [0, 1], cache_dir=tmp_path, g_max=3) == (cached, False)
    with pytest.raises(ValueError, match="without a draft model"):
        generate(target, draft, [0, 1], rule="lossless", sampling=T1, gamma=2, max_new_tokens=3, costs=prof)
