"""The decoding engine: exactness in law, greedy equality, stopping, errors, statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.fake_lm import FakeLM
from tests.helpers.laws import T1, assert_law, exact_prefix_law, sample_prefixes
from tests.helpers.rule_cases import ALPHA, gof_pvalue
from verispec.engine import generate, generate_target_only
from verispec.sampling import SamplingConfig


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["lossless", "block", "hsd"])
def test_lossless_rules_match_target_only_law(spec):
    """Through real cache handling (prefill, block forwards, rollbacks), lossless SD samples the target's law."""
    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    prompt = [0, 1]
    law = exact_prefix_law(target, prompt, 3, T1)
    counts = sample_prefixes(
        lambda s: generate(target, draft, prompt, rule=spec, sampling=T1, gamma=2, max_new_tokens=3, seed=s), 6000, 3
    )
    assert_law(counts, law)


@pytest.mark.slow
def test_target_only_matches_its_law_and_the_law_test_has_power():
    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    prompt = [0, 1]
    sampling = SamplingConfig.parse("temperature=0.8,top_k=3")
    law = exact_prefix_law(target, prompt, 3, sampling)
    target_only = lambda s: generate_target_only(target, prompt, sampling=sampling, max_new_tokens=3, seed=s)
    assert_law(sample_prefixes(target_only, 4000, 3), law)
    lossy = sample_prefixes(
        lambda s: generate(target, draft, prompt, rule="cos_we:lam=0.2", sampling=sampling, gamma=3, max_new_tokens=3,
                           seed=s), 4000, 3
    )
    keys = sorted(set(law) | set(lossy))
    assert gof_pvalue(np.array([lossy.get(k, 0) for k in keys]), np.array([law.get(k, 0.0) for k in keys])) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["lenience:ell=0.4", "speccascade:p_base=0.3", "cos_cd:mu=0.5", "typical:eps=0.2"])
def test_lossy_rule_first_token_follows_induced(spec):
    target, draft = FakeLM(vocab=5, seed=3, scale=2.0), FakeLM(vocab=5, seed=4, scale=2.0)
    prompt = [2, 0]
    rule = R.get(spec)
    p = T1.process(target.next_logits(prompt)[None])
    q = T1.process(draft.next_logits(prompt)[None])
    induced = rule.induced(p.double(), q.double())[0].numpy()
    counts = np.zeros(5)
    for s in range(5000):
        res = generate(target, draft, prompt, rule=spec, sampling=T1, gamma=3, max_new_tokens=2, seed=s)
        counts[res.tokens[0]] += 1
    assert gof_pvalue(counts, induced) > ALPHA


@pytest.mark.slow
def test_truncation_true_baseline_is_target_sampled_with_the_truncation():
    target = FakeLM(vocab=6, seed=5, scale=2.0)
    prompt = [1]
    base = SamplingConfig.parse("temperature=0.9")
    for spec in ["speccascade:p_base=0.3", "typical:eps=0.2"]:
        rule = R.get(spec)
        sampling = base.with_truncation(**rule.baseline_truncation())
        p = base.process(target.next_logits(prompt)[None]).double()
        reference = rule.reference(p)[0].numpy()
        counts = np.zeros(6)
        for s in range(4000):
            counts[generate_target_only(target, prompt, sampling=sampling, max_new_tokens=1, seed=s).tokens[0]] += 1
        assert gof_pvalue(counts, reference) > ALPHA
        assert counts[reference == 0].sum() == 0


@pytest.mark.parametrize("spec", ["lossless", "block", "hsd", "lenience:ell=0.3", "speccascade:p_base=0.5", "greedy"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_sd_equals_greedy_target_only(spec, gamma):
    target, draft = FakeLM(vocab=5, seed=6), FakeLM(vocab=5, seed=7)
    greedy = SamplingConfig.parse("temperature=0")
    ref = generate_target_only(target, [0, 1, 2], sampling=greedy, max_new_tokens=25)
    out = generate(target, draft, [0, 1, 2], rule=spec, sampling=greedy, gamma=gamma, max_new_tokens=25, seed=3)
    assert out.tokens == ref.tokens


def test_eos_inside_an_accepted_block_ends_the_output_there():
    # Both models strongly prefer token 3 (EOS) after two tokens: EOS lands inside accepted blocks.
    eos = 3
    target = FakeLM(vocab=4, seed=8, eos=eos)
    draft = FakeLM(vocab=4, seed=8, eos=eos)  # identical: everything is accepted
    for seed in range(30):
        out = generate(target, draft, [0], rule="lossless", sampling=T1, gamma=6, max_new_tokens=40, seed=seed)
        ref = generate_target_only(target, [0], sampling=T1, max_new_tokens=40, seed=seed)
        assert eos not in out.tokens
        if out.stats.stop_reason == "eos":
            # identical models accept every draft: the sequence is the draft's own sample path
            assert len(out.tokens) < 40
        assert len(out.tokens) <= 40 and len(ref.tokens) <= 40
    # Exact position: with a forced EOS at a known step the output ends just before it.
    class EosAfter(FakeLM):
        def next_logits(self, prefix):
            logits = super().next_logits(prefix)
            if len(prefix) == 1 + 4:  # prompt + 4 generated tokens -> the 5th token is EOS
                logits = torch.full_like(logits, -30.0)
                logits[eos] = 30.0
            else:
                logits[eos] = -30.0
            return logits

    t, d = EosAfter(vocab=4, seed=9, eos=eos), EosAfter(vocab=4, seed=9, eos=eos)
    out = generate(t, d, [0], rule="lossless", sampling=T1, gamma=6, max_new_tokens=40, seed=0)
    assert len(out.tokens) == 4 and out.stats.stop_reason == "eos"
    assert out.stats.new_tokens == 5  # the EOS token was generated (counts toward block efficiency)


def test_stop_string_inside_a_block_cuts_at_the_right_token():
    target, draft = FakeLM(vocab=3, seed=10), FakeLM(vocab=3, seed=10)
    greedy = SamplingConfig.parse("temperature=0")
    full = generate_target_only(target, [0], sampling=greedy, max_new_tokens=30).text
    stop = full[5:7]
    cut = full.find(stop)
    out = generate(target, draft, [0], rule="lossless", sampling=greedy, gamma=8, max_new_tokens=30, stop=[stop])
    assert out.text == full[:cut]
    assert out.stats.stop_reason == "stop"
    assert len(out.tokens) == cut + len(stop)  # one character per token: ends at the completing token
    base = generate_target_only(target, [0], sampling=greedy, max_new_tokens=30, stop=[stop])
    assert base.text == out.text and base.tokens == out.tokens


@pytest.mark.parametrize("max_new", [1, 2, 5, 7, 13])
def test_max_new_tokens_is_never_exceeded(max_new):
    target, draft = FakeLM(vocab=4, seed=11), FakeLM(vocab=4, seed=11)
    for seed in range(5):
        out = generate(target, draft, [0], rule="lossless", sampling=T1, gamma=5, max_new_tokens=max_new, seed=seed)
        assert len(out.tokens) == max_new and out.stats.stop_reason == "length"
        assert out.stats.new_tokens == max_new


def test_statistics_are_consistent():
    target, draft = FakeLM(vocab=4, seed=12), FakeLM(vocab=4, seed=13)
    out = generate(target, draft, [0, 1], rule="lenience:ell=0.5", sampling=T1, gamma=4, max_new_tokens=60, seed=1)
    st = out.stats
    steps = sum(st.accepted_hist)
    accepted = sum(n * c for n, c in enumerate(st.accepted_hist))
    assert st.target_calls == steps + (1 if st.new_tokens > accepted + steps else 0)
    assert sum(n * c for n, c in enumerate(st.accepted_hist)) + steps <= st.new_tokens + 4
    assert st.block_efficiency == pytest.approx(st.new_tokens / st.target_calls)
    assert st.position_reached[0] == steps
    assert all(a <= r for a, r in zip(st.position_accepted, st.position_reached))
    assert 1 <= st.block_efficiency <= 5
    assert st.wall_s >= st.draft_s + st.verify_s - 1e-9


def test_reproducible_with_a_seed():
    target, draft = FakeLM(vocab=5, seed=14), FakeLM(vocab=5, seed=15)
    a = generate(target, draft, [0], rule="typical:eps=0.2", sampling=T1, gamma=3, max_new_tokens=30, seed=42)
    b = generate(target, draft, [0], rule="typical:eps=0.2", sampling=T1, gamma=3, max_new_tokens=30, seed=42)
    c = generate(target, draft, [0], rule="typical:eps=0.2", sampling=T1, gamma=3, max_new_tokens=30, seed=43)
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_bad_inputs():
    target, draft = FakeLM(vocab=4, seed=1, context_length=20), FakeLM(vocab=4, seed=2, context_length=20)
    with pytest.raises(ValueError, match="gamma"):
        generate(target, draft, [0], rule="lossless", sampling=T1, gamma=0, max_new_tokens=5)
    with pytest.raises(ValueError, match="unknown rule"):
        generate(target, draft, [0], rule="nope", sampling=T1, gamma=2, max_new_tokens=5)
    with pytest.raises(ValueError, match="context"):
        generate(target, draft, [0] * 25, rule="lossless", sampling=T1, gamma=2, max_new_tokens=5)
    with pytest.raises(ValueError, match="empty"):
        generate_target_only(target, [], sampling=T1, max_new_tokens=5)
    other = FakeLM(vocab=4, seed=2, alphabet="zyxw")
    with pytest.raises(ValueError, match="do not share a vocabulary"):
        generate(target, other, [0], rule="lossless", sampling=T1, gamma=2, max_new_tokens=5)
    # Near the end of the context the budget shrinks instead of overflowing.
    out = generate(target, draft, [0] * 10, rule="lossless", sampling=T1, gamma=3, max_new_tokens=50)
    assert len(out.tokens) <= 20 - 10


# --- transformers backend (tiny random float64 models) ----------------------------------------------

def test_greedy_sd_equals_target_only_on_tiny_hf_models(tiny_hf_pair):
    target, draft = tiny_hf_pair.target, tiny_hf_pair.draft
    greedy = SamplingConfig.parse("temperature=0")
    prompt = target.chat_prompt("hello world")
    ref = generate_target_only(target, prompt, sampling=greedy, max_new_tokens=24)
    for spec, gamma in [("lossless", 4), ("block", 3), ("lenience:ell=0.5", 5), ("hsd", 2)]:
        out = generate(target, draft, prompt, rule=spec, sampling=greedy, gamma=gamma, max_new_tokens=24)
        assert out.tokens == ref.tokens, spec
    assert ref.stats.new_tokens >= 1


@pytest.mark.slow
def test_lossless_law_on_tiny_hf_models(tiny_hf_pair):
    """First two tokens under top-k 3 sampling: lossless SD vs the exact target law (HF cache cropping)."""
    target, draft = tiny_hf_pair.target, tiny_hf_pair.draft
    sampling = SamplingConfig.parse("temperature=1,top_k=3")
    prompt = target.chat_prompt("ab")
    width = 99
    law = {(): 1.0}
    for _ in range(2):
        nxt = {}
        for seq, prob in law.items():
            target.reset()
            p = sampling.process(target.forward(prompt + list(seq), all_logits=False)[:, :width].float())[0].double()
            for tok in torch.nonzero(p).flatten().tolist():
                nxt[seq + (tok,)] = prob * p[tok].item()
        law = nxt
    counts = sample_prefixes(
        lambda s: generate(target, draft, prompt, rule="lossless", sampling=sampling, gamma=3, max_new_tokens=2,
                           seed=s),
        1500, 2
    )
    assert_law(counts, law)


@pytest.mark.slow
def test_lossy_rule_law_on_tiny_hf_models(tiny_hf_pair):
    """First token of CoS-WE SD through the transformers backend follows the rule's induced law."""
    target, draft = tiny_hf_pair.target, tiny_hf_pair.draft
    sampling = SamplingConfig.parse("temperature=1,top_k=4")
    prompt = target.chat_prompt("xy")
    width = 99
    target.reset()
    draft.reset()
    p = sampling.process(target.forward(prompt, all_logits=False)[:, :width].float()).double()
    q = sampling.process(draft.forward(prompt, all_logits=False)[:, :width].float()).double()
    rule = R.get("cos_we:lam=0.3")
    induced = rule.induced(p, q)[0].numpy()
    counts = np.zeros(width)
    for s in range(1200):
        res = generate(target, draft, prompt, rule=rule, sampling=sampling, gamma=2, max_new_tokens=2, seed=s)
        counts[res.tokens[0]] += 1
    assert gof_pvalue(counts, induced) > ALPHA
    assert np.abs(induced - p[0].numpy()).sum() > 0.05  # the rule is visibly lossy here, so the test discriminates


def test_stats_timing_adds_the_block_seconds_to_its_field():
    import time

    from verispec.engine import Stats

    st = Stats(mode="sd", rule="lossless", gamma=3)
    for _ in range(2):
        with st.timing("verify_s"):
            time.sleep(0.02)
    assert 0.04 <= st.verify_s < 1.0 and st.draft_s == st.rule_s == st.prefill_s == 0.0
    with pytest.raises(ValueError, match="no timing field 'verify'"):
        st.timing("verify")
    with pytest.raises(ValueError, match="no timing field"):
        st.timing("new_tokens")


@pytest.mark.slow
def test_rule_reading_raw_distributions_gets_them_from_the_engine():
    """fuzzy with on=raw gates on the untruncated T = 1 pair while emitting from the processed one: the
    engine's first token follows induced(p, q, raw=(p_raw, q_raw)), which differs from the law gated on
    the processed pair (so the test tells the two apart)."""
    target, draft = FakeLM(vocab=6, seed=3), FakeLM(vocab=6, seed=4)
    sampling = SamplingConfig.parse("temperature=0.5,top_k=3")
    prompt = [1, 2]
    raw_rule, processed_rule = R.get("fuzzy:T=0.8,div=tv,on=raw"), R.get("fuzzy:T=0.8,div=tv")
    t_logits, d_logits = target.next_logits(prompt)[None], draft.next_logits(prompt)[None]
    p, q = sampling.process(t_logits).double(), sampling.process(d_logits).double()
    raw = (torch.softmax(t_logits.double(), -1), torch.softmax(d_logits.double(), -1))
    law = raw_rule.induced(p, q, raw=raw)[0].numpy()
    assert np.abs(law - processed_rule.induced(p, q)[0].numpy()).sum() > 0.2
    counts = np.zeros(6)
    for s in range(3000):
        out = generate(target, draft, prompt, rule=raw_rule, sampling=sampling, gamma=2, max_new_tokens=2, seed=s)
        counts[out.tokens[0]] += 1
    assert gof_pvalue(counts, law) > ALPHA
    with pytest.raises(ValueError, match="raw distribution"):
        generate(target, draft, prompt, rule=raw_rule, sampling=sampling, tree="2,1", max_new_tokens=2)
