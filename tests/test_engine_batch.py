"""Batched SD: batched backends give each row the single-sequence logits, and each row's output (hence
its law) is that of one-at-a-time decoding with the same seed, whatever the batch size or the other rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.fake_lm import FakeLM
from tests.helpers.laws import exact_prefix_law
from tests.helpers.rule_cases import ALPHA, gof_pvalue
from verispec.engine import generate, generate_target_only
from verispec.engine.batch import generate_batch, generate_target_only_batch
from verispec.models.batch import BatchBackend, HFBatchBackend, RowsOfBackends, row_slices
from verispec.sampling import SamplingConfig

T1 = SamplingConfig.parse("temperature=1")
GREEDY = SamplingConfig.parse("temperature=0")
#: The rules the issue names: lossless, two lossy per-token rules, one sequence-level rule.
RULES = ["lossless", "lenience:ell=0.5", "speccascade:p_base=0.3", "block"]


def fake_rows(batch: int, **kw) -> RowsOfBackends:
    return RowsOfBackends([FakeLM(**kw) for _ in range(batch)])


def same_stats(a, b) -> bool:
    fields = ("target_calls", "draft_calls", "accepted_hist", "gamma_hist", "position_accepted", "new_tokens",
              "stop_reason")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


# --- the transformers batched backend ---------------------------------------------------------------

def test_hf_batch_rows_get_the_single_sequence_logits_through_rollbacks_and_compaction(tiny_hf_pair):
    """Ragged forwards, rollbacks, resets, chunked blocks and compaction: every row's logits equal those of
    the single-sequence backend on that row's tokens (float64), and the cache stays bounded."""
    single = tiny_hf_pair.target
    batch = HFBatchBackend(single, batch_size=3, compact_slack=4, max_block=3)
    assert isinstance(batch, BatchBackend)
    gen = torch.Generator().manual_seed(0)
    seqs: list[list[int]] = [[], [], []]
    for step in range(30):
        toks = [torch.randint(3, 99, (int(torch.randint(0, 6, (1,), generator=gen)),), generator=gen).tolist()
                for _ in range(3)]
        if not any(toks):
            continue
        last = step % 3 == 0
        out = batch.forward_rows(toks, last_only=last)
        assert out.dtype == torch.float64 and out.shape[1] == single.vocab_size
        for r, where in enumerate(row_slices(toks, last_only=last)):
            if where is None:
                continue
            seqs[r] += toks[r]
            single.reset()
            ref = single.forward(seqs[r])
            torch.testing.assert_close(out[where], ref[-1:] if last else ref[-len(toks[r]):], rtol=0, atol=1e-10)
        # tidied before the forward: at most the slack beyond the longest row, plus this forward's columns
        assert batch.cache_columns <= max(map(len, seqs)) + batch.compact_slack + max(map(len, toks))
        for r in range(3):
            if seqs[r] and torch.randint(0, 2, (1,), generator=gen):
                keep = int(torch.randint(0, len(seqs[r]) + 1, (1,), generator=gen))
                batch.rollback_row(r, keep)
                seqs[r] = seqs[r][:keep]
        assert [batch.row_length(r) for r in range(3)] == [len(s) for s in seqs]
    assert batch.compactions > 0
    batch.reset_row(1)
    assert batch.row_length(1) == 0


def test_batched_backends_check_before_changing_state(tiny_hf_pair):
    batch = HFBatchBackend(tiny_hf_pair.target, batch_size=2)
    batch.forward_rows([[5, 6], [7]])
    with pytest.raises(ValueError, match="out of range"):
        batch.forward_rows([[5], [10_000]])
    with pytest.raises(ValueError, match="one token list per row"):
        batch.forward_rows([[5]])
    with pytest.raises(ValueError, match="no tokens"):
        batch.forward_rows([[], []])
    with pytest.raises(ValueError, match="context overflow"):
        batch.forward_rows([[5] * batch.context_length, []])
    with pytest.raises(ValueError, match="cannot roll back"):
        batch.rollback_row(1, 2)
    with pytest.raises(ValueError, match="row must be"):
        batch.rollback_row(2, 0)
    assert [batch.row_length(r) for r in range(2)] == [2, 1]
    with pytest.raises(ValueError, match="batch_size"):
        HFBatchBackend(tiny_hf_pair.target, batch_size=0)


def test_hf_batch_refuses_sliding_window_caches():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verispec.models.hf import HFBackend

    cfg = Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    batch = HFBatchBackend(HFBackend(Qwen2ForCausalLM(cfg).eval()), batch_size=2)
    with pytest.raises(NotImplementedError, match="sliding-window"):
        batch.forward_rows([[1, 2], [3]])
    assert batch.row_length(0) == batch.row_length(1) == 0


# --- one row = one single-sequence generation ---------------------------------------------------------

@pytest.mark.parametrize("spec", RULES + ["hsd", "greedy"])
def test_each_row_equals_generate_with_its_seed_on_fake_models(spec):
    """More prompts than slots, ragged ends (EOS, length): each prompt's tokens and statistics equal those of
    ``generate`` with its seed, for batch sizes 1 and 3."""
    prompts = [[0, 1], [2], [3, 3, 1], [4, 0, 0, 1], [1], [2, 2], [0]]
    target, draft = dict(vocab=5, seed=1, eos=4, bias={4: -1.0}), dict(vocab=5, seed=2, eos=4, bias={4: -1.0})
    refs = [generate(FakeLM(**target), FakeLM(**draft), p, rule=spec, sampling=T1,
                     gamma=3, max_new_tokens=9, seed=10 + i) for i, p in enumerate(prompts)]
    for batch in (1, 3):
        out = generate_batch(fake_rows(batch, **target), fake_rows(batch, **draft),
                             prompts, rule=spec, sampling=T1, gamma=3, max_new_tokens=9, seeds=10)
        assert len(out) == len(prompts) and out.batch_size == batch
        for res, ref in zip(out, refs):
            assert res.tokens == ref.tokens and res.text == ref.text
            assert same_stats(res.stats, ref.stats)
        calls = sum(r.stats.target_calls for r in refs)    # one row per forward at B = 1, fewer forwards at B = 3
        assert out.target_forwards == calls if batch == 1 else out.target_forwards < calls
    assert {r.stats.stop_reason for r in refs} == {"eos", "length"}


def test_backends_with_more_rows_than_slots():
    """Backends of 4 and 3 rows: the default batch is their smaller size, and a smaller batch_size leaves the
    other rows idle; the outputs do not change."""
    prompts = [[0, 1], [2], [3, 3, 1], [1], [2, 2]]
    refs = [generate(FakeLM(vocab=5, seed=1), FakeLM(vocab=5, seed=2), p, rule="lossless", sampling=T1, gamma=3,
                     max_new_tokens=7, seed=i).tokens for i, p in enumerate(prompts)]
    for batch_size, mean_rows in ((None, 3), (2, 2)):
        out = generate_batch(fake_rows(4, vocab=5, seed=1), fake_rows(3, vocab=5, seed=2), prompts, rule="lossless",
                             sampling=T1, gamma=3, max_new_tokens=7, batch_size=batch_size)
        assert [r.tokens for r in out] == refs
        assert out.batch_size == mean_rows and 1 < out.mean_rows <= mean_rows
        target_only = generate_target_only_batch(fake_rows(4, vocab=5, seed=1), prompts, sampling=T1,
                                                 max_new_tokens=7, batch_size=batch_size)
        assert len(target_only) == len(prompts)


def test_stop_strings_and_eos_inside_blocks_match_generate():
    """Identical models accept whole blocks, so EOS and the stop string land inside them."""
    prompts = [[0], [1, 2], [2], [0, 0], [1], [2, 2]]
    model = dict(vocab=4, seed=10, eos=3, bias={3: -2.0})
    refs = [generate(FakeLM(**model), FakeLM(**model), p, rule="lossless", sampling=T1, gamma=6, max_new_tokens=12,
                     stop=["cab"], seed=i) for i, p in enumerate(prompts)]
    assert {r.stats.stop_reason for r in refs} == {"eos", "stop", "length"}
    out = generate_batch(fake_rows(4, **model), fake_rows(4, **model), prompts, rule="lossless", sampling=T1,
                         gamma=6, max_new_tokens=12, stop=["cab"], seeds=0)
    assert [(r.tokens, r.text, r.stats.stop_reason) for r in out] == [
        (r.tokens, r.text, r.stats.stop_reason) for r in refs]


def test_target_only_batch_equals_generate_target_only():
    prompts = [[0, 1], [2], [3, 3, 1], [4], [1, 1]]
    for batch in (1, 2, 5):
        out = generate_target_only_batch(fake_rows(batch, vocab=5, seed=1, eos=4), prompts, sampling=T1,
                                         max_new_tokens=8, seeds=[7, 3, 9, 1, 0])
        for res, p, s in zip(out, prompts, [7, 3, 9, 1, 0]):
            ref = generate_target_only(FakeLM(vocab=5, seed=1, eos=4), p, sampling=T1, max_new_tokens=8, seed=s)
            assert res.tokens == ref.tokens and same_stats(res.stats, ref.stats)


@pytest.fixture
def hf_prompts(tiny_hf_pair):
    return [tiny_hf_pair.target.chat_prompt(t) for t in ["hello world", "ab", "Q", "a longer prompt"]]


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig.parse("temperature=0.9,top_k=8")], ids=["greedy", "t0.9"])
def test_tiny_hf_batches_equal_one_at_a_time(tiny_hf_pair, hf_prompts, sampling):
    """Float64 tiny transformers models: B = 1 and B = 3 batches (4 prompts: a slot is refilled) give every
    prompt the tokens of ``generate`` with its seed, for each rule; greedy and sampled."""
    target, draft = tiny_hf_pair.target, tiny_hf_pair.draft
    batched = {b: (HFBatchBackend(target, batch_size=b, compact_slack=8), HFBatchBackend(draft, batch_size=b))
               for b in (1, 3)}
    for spec in RULES:
        refs = [generate(target, draft, p, rule=spec, sampling=sampling, gamma=3, max_new_tokens=10, seed=5 + i).tokens
                for i, p in enumerate(hf_prompts)]
        for b, (tb, db) in batched.items():
            out = generate_batch(tb, db, hf_prompts, rule=spec, sampling=sampling, gamma=3, max_new_tokens=10, seeds=5)
            assert [r.tokens for r in out] == refs, (spec, b)


def test_tiny_hf_target_only_batch_equals_one_at_a_time(tiny_hf_pair, hf_prompts):
    target = tiny_hf_pair.target
    refs = [generate_target_only(target, p, sampling=T1, max_new_tokens=10, seed=i).tokens
            for i, p in enumerate(hf_prompts)]
    out = generate_target_only_batch(HFBatchBackend(target, batch_size=3), hf_prompts, sampling=T1,
                                     max_new_tokens=10, seeds=0)
    assert [r.tokens for r in out] == refs


def test_a_row_does_not_depend_on_the_other_rows(tiny_hf_pair, hf_prompts):
    """Prompt 0 with seed 42 gives the same sampled tokens whatever shares the batch with it."""
    target, draft = tiny_hf_pair.target, tiny_hf_pair.draft
    tb, db = HFBatchBackend(target, batch_size=3), HFBatchBackend(draft, batch_size=3)
    outputs = []
    for others in (hf_prompts[1:3], [hf_prompts[3], hf_prompts[1]], [hf_prompts[0], hf_prompts[0]]):
        out = generate_batch(tb, db, [hf_prompts[0]] + others, rule="lenience:ell=0.5", sampling=T1, gamma=3,
                             max_new_tokens=16, seeds=[42, 1, 2])
        outputs.append(out[0].tokens)
    assert outputs[0] == outputs[1] == outputs[2]
    # on fake models too, with the row in a different slot each time (slots are refilled in order)
    prompts = [[0, 1], [2], [3], [1, 1, 1]]
    first = generate_batch(fake_rows(2, vocab=5, seed=1), fake_rows(2, vocab=5, seed=2), prompts, rule="block",
                           sampling=T1, gamma=4, max_new_tokens=12, seeds=[3, 4, 5, 6])
    moved = generate_batch(fake_rows(2, vocab=5, seed=1), fake_rows(2, vocab=5, seed=2), prompts[::-1], rule="block",
                           sampling=T1, gamma=4, max_new_tokens=12, seeds=[6, 5, 4, 3])
    assert [r.tokens for r in first] == [r.tokens for r in moved][::-1]


# --- laws --------------------------------------------------------------------------------------------

def _batched_counts(spec: str, prompt: list[int], n: int, length: int, target: dict, draft: dict) -> dict:
    """First ``length`` tokens of ``prompt`` over ``n`` seeds, each run in a batch of 8 rows beside rows of
    another prompt (only ``prompt``'s rows are counted). One token more is asked for: with one token left
    the engine samples the target alone (as ``generate`` does), which would hide a lossy rule's law."""
    other = [3, 3]
    prompts = [other if i % 4 == 3 else prompt for i in range(n + n // 3)]
    out = generate_batch(fake_rows(8, **target), fake_rows(8, **draft), prompts, rule=spec, sampling=T1, gamma=2,
                         max_new_tokens=length + 1, seeds=1000)
    counts: dict = {}
    for res in (r for i, r in enumerate(out.results) if i % 4 != 3):
        key = tuple(res.tokens[:length])
        counts[key] = counts.get(key, 0) + 1
    return counts


def _gof(counts: dict, law: dict) -> float:
    keys = sorted(set(law) | set(counts))
    return gof_pvalue(np.array([counts.get(k, 0) for k in keys]), np.array([law.get(k, 0.0) for k in keys]))


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["lossless", "block"])
def test_batched_lossless_rows_follow_the_target_law(spec):
    """Chi-square (ALPHA = 1e-4): the first 3 tokens of batched rows follow the target's exact law."""
    target, draft = dict(vocab=4, seed=1), dict(vocab=4, seed=2)
    prompt = [0, 1]
    law = exact_prefix_law(FakeLM(**target), prompt, 3, T1)
    counts = _batched_counts(spec, prompt, 3000, 3, target, draft)
    assert _gof(counts, law) > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["lenience:ell=0.5", "speccascade:p_base=0.3"])
def test_batched_lossy_rows_follow_the_induced_law_and_the_test_has_power(spec):
    """The first token of batched rows follows the rule's induced law, which the test tells from p."""
    target, draft = dict(vocab=5, seed=11, scale=2.0), dict(vocab=5, seed=111, scale=2.0)
    prompt = [2, 0]
    p = T1.process(FakeLM(**target).next_logits(prompt)[None]).double()
    q = T1.process(FakeLM(**draft).next_logits(prompt)[None]).double()
    induced = R.get(spec).induced(p, q)[0].numpy()
    counts = _batched_counts(spec, prompt, 3000, 1, target, draft)
    first = np.array([counts.get((t,), 0) for t in range(5)])
    assert gof_pvalue(first, induced) > ALPHA
    assert gof_pvalue(first, p[0].numpy()) < ALPHA  # the law is visibly not p: the test discriminates


# --- errors ------------------------------------------------------------------------------------------

def test_refusals():
    target, draft = fake_rows(2, vocab=4, seed=1), fake_rows(2, vocab=4, seed=2)
    kw = dict(rule="lossless", sampling=T1, max_new_tokens=4)
    with pytest.raises(NotImplementedError, match="chains"):
        generate_batch(target, draft, [[0]], tree="4,2", **kw)
    with pytest.raises(NotImplementedError, match="chains"):
        generate_batch(target, draft, [[0]], lookup=object(), **kw)
    with pytest.raises(ValueError, match="gamma"):
        generate_batch(target, draft, [[0]], gamma="auto", **kw)
    with pytest.raises(ValueError, match="batch_size 3 exceeds"):
        generate_batch(target, draft, [[0]], batch_size=3, **kw)
    with pytest.raises(ValueError, match="one seed per prompt"):
        generate_batch(target, draft, [[0], [1]], seeds=[1], **kw)
    with pytest.raises(TypeError, match="batched backend"):
        generate_batch(FakeLM(vocab=4), draft, [[0]], **kw)
    with pytest.raises(ValueError, match="empty"):
        generate_batch(target, draft, [[0], []], **kw)
    assert generate_batch(target, draft, [], **kw).results == []


# --- llama.cpp (the embedded pair, if present) -----------------------------------------------------

@pytest.fixture(scope="module")
def llama_backends(embedded_pair_paths):
    """Single and 2-row batched backends of the embedded pair; ``n_ubatch=1``: every token is computed as in
    one-token decoding on both sides, so batched rows are bitwise the single-sequence numerics."""
    pytest.importorskip("llama_cpp")
    from verispec.models.batch import LlamaBatchBackend
    from verispec.models.llama import LlamaBackend

    kw = dict(n_ctx=192, n_threads=1, n_ubatch=1)
    made = dict(target=LlamaBackend(embedded_pair_paths.target, max_tree_nodes=0, **kw),
                draft=LlamaBackend(embedded_pair_paths.draft, max_tree_nodes=0, **kw),
                target_rows=LlamaBatchBackend(embedded_pair_paths.target, batch_size=2, **kw),
                draft_rows=LlamaBatchBackend(embedded_pair_paths.draft, batch_size=2, **kw))
    yield made
    for be in made.values():
        be.close()


@pytest.mark.embedded
def test_llama_batch_rows_get_the_single_sequence_logits(llama_backends):
    single, rows = llama_backends["draft"], llama_backends["draft_rows"]
    rows.reset()
    toks = [single.tokenize("def add(a, b):"), single.tokenize("Hello there")]
    out = rows.forward_rows(toks)
    for r, where in enumerate(row_slices(toks)):
        single.reset()
        assert torch.equal(out[where], single.forward(toks[r]))
    rows.rollback_row(0, 2)
    more = [single.tokenize(" world"), []]
    last = rows.forward_rows(more, last_only=True)
    single.reset()
    assert torch.equal(last, single.forward(toks[0][:2] + more[0], all_logits=False))
    assert [rows.row_length(r) for r in range(2)] == [2 + len(more[0]), len(toks[1])]


@pytest.mark.embedded
def test_llama_greedy_batch_equals_one_at_a_time(llama_backends):
    b = llama_backends
    prompts = [b["target"].tokenize(t) for t in ("def add(a, b):", "The capital of France is", "import numpy")]
    refs = [generate(b["target"], b["draft"], p, rule="lossless", sampling=GREEDY, gamma=3, max_new_tokens=5).tokens
            for p in prompts]
    out = generate_batch(b["target_rows"], b["draft_rows"], prompts, rule="lossless", sampling=GREEDY, gamma=3,
                         max_new_tokens=5)
    assert [r.tokens for r in out] == refs


def test_batched_observers_stops_and_on_done_match_one_at_a_time():
    """Each prompt's observer sees what generate's observer sees (same p, q, drafts, accepted counts),
    per-prompt stop strings apply to their own prompt, and on_done reports each prompt as it ends."""
    sampling = SamplingConfig.parse("temperature=1")
    prompts = [[1, 2], [3], [2, 2, 1], [0, 1]]
    stops = [["ab"], [], ["c"], ["ba", "cc"]]
    seen: dict[int, list] = {i: [] for i in range(4)}
    single: dict[int, list] = {i: [] for i in range(4)}
    done: list[int] = []

    def watcher(store, i):
        def watch(step):
            p, q, x, n = step.chain()
            store[i].append((p.clone(), q.clone(), x.tolist(), n))

        return watch

    def pair(rows):
        return (RowsOfBackends([FakeLM(vocab=5, seed=1) for _ in range(rows)]),
                RowsOfBackends([FakeLM(vocab=5, seed=2) for _ in range(rows)]))

    target, draft = pair(2)
    out = generate_batch(target, draft, prompts, rule="lossless", sampling=sampling, gamma=3, max_new_tokens=12,
                         stop=stops, seeds=[5, 6, 7, 8], observers=[watcher(seen, i) for i in range(4)],
                         on_done=lambda i, res: done.append(i))
    assert sorted(done) == [0, 1, 2, 3]
    for i, ids in enumerate(prompts):
        ref = generate(FakeLM(vocab=5, seed=1), FakeLM(vocab=5, seed=2), ids, rule="lossless", sampling=sampling,
                       gamma=3, max_new_tokens=12, stop=stops[i], seed=5 + i, observers=[watcher(single, i)])
        assert out[i].tokens == ref.tokens and out[i].text == ref.text
        assert len(seen[i]) == len(single[i]) > 0
        for (p, q, x, n), (p1, q1, x1, n1) in zip(seen[i], single[i]):
            assert x == x1 and n == n1
            torch.testing.assert_close(p, p1)
            torch.testing.assert_close(q, q1)
    with pytest.raises(ValueError, match="one stop list per prompt"):
        generate_batch(*pair(2), prompts, rule="lossless", sampling=sampling, max_new_tokens=3, stop=[["a"]])
