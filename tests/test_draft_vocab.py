"""A draft with a reduced output vocabulary (verispec.models.draft_vocab): the subset, the backends, exactness."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.helpers.fake_lm import FakeLM
from tests.helpers.laws import T1, assert_law, exact_prefix_law, sample_prefixes
from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model
from verispec.engine import generate, generate_target_only
from verispec.models.draft_vocab import (
    DEFAULT_SIZE,
    RestrictedVocab,
    corpus_texts,
    draft_vocabulary,
    parse_size,
    rank_tokens,
    with_draft_vocab,
)
from verispec.sampling import SamplingConfig

GREEDY = SamplingConfig.parse("temperature=0")


@pytest.fixture(scope="module")
def tiny_pair():
    from verispec.models.hf import HFBackend

    tok = tiny_char_tokenizer()
    target = HFBackend(tiny_hf_model(seed=3, init_range=0.3), tokenizer=tok)
    draft = HFBackend(tiny_hf_model(seed=4, init_range=0.3), tokenizer=tok)
    return target, draft


# ------------------------------------------------------------------------------------------ the subset
def test_rank_tokens_keeps_the_most_frequent_and_the_ones_always_kept():
    counts = Counter({7: 50, 3: 50, 9: 10, 1: 5, 40: 99})
    # 40 is out of range; 2 is always kept; then by count, 3 before 7 (a tie: the smaller id first)
    assert rank_tokens(counts, 20, 3, keep=[2]) == [2, 3, 7]
    ids = rank_tokens(counts, 20, 8, keep=[2])
    assert ids == [0, 1, 2, 3, 4, 5, 7, 9]          # then the unseen ones by id
    top = rank_tokens(Counter({i: 100 - i for i in range(30, 60)}), 100, 16, keep=[99])
    assert top == sorted([99] + list(range(30, 45)))
    with pytest.raises(ValueError, match="cannot hold"):
        rank_tokens(counts, 100, 16, keep=range(20))
    with pytest.raises(ValueError, match="at least one"):
        rank_tokens(counts, 100, 0)


def test_draft_vocabulary_counts_the_corpus_and_is_cached(tiny_pair, tmp_path, monkeypatch):
    _, draft = tiny_pair
    corpus = tmp_path / "c.txt"
    corpus.write_text("zzzz yyyy zzzz xxx" * 50)
    rows = tmp_path / "c.jsonl"
    rows.write_text(json.dumps({"q": "qqqq", "a": ["wwww"], "n": 3}) + "\n")
    ids = draft_vocabulary(draft, 20, [corpus, rows], cache_dir=tmp_path / "cache")
    piece = {draft.token_piece(i): i for i in range(draft.vocab_size)}
    assert len(ids) == 20 and {piece[c] for c in "zyx qw"} <= set(ids)
    assert set(draft.eos_token_ids) <= set(ids)
    monkeypatch.setattr(type(draft), "tokenize", lambda *a, **k: pytest.fail("tokenized again"))
    assert draft_vocabulary(draft, 20, [corpus, rows], cache_dir=tmp_path / "cache") == ids
    assert draft_vocabulary(draft, 500, [corpus]) == list(range(draft.vocab_size))   # nothing to reduce
    with pytest.raises(FileNotFoundError, match="not found"):
        draft_vocabulary(draft, 20, [tmp_path / "missing.txt"], cache_dir=tmp_path)
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        corpus_texts([tmp_path / "bin.txt"])


def test_the_default_corpus_is_local():
    texts, described = corpus_texts(None, max_chars=20_000)
    assert described.startswith("stdlib:") and 0 < sum(map(len, texts)) <= 20_000


@pytest.mark.parametrize("text, size", [("32768", 32768), ("32k", 32768), ("auto", DEFAULT_SIZE), ("full", None),
                                        ("0", None), (None, None)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["many", "8", "-5"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="draft-vocab"):
        parse_size(text)


# ------------------------------------------------------------------------------------------ backends
def test_reduced_hf_head_computes_the_subsets_logits_only(tiny_pair):
    """The reduced draft's logits equal the full model's on the subset and are -inf elsewhere, for every
    call the engine makes; its output layer holds the subset's rows only, and the model object the user
    built is unchanged (the full backend still computes every row)."""
    _, draft = tiny_pair
    ids = list(range(0, 99, 3)) + [2]
    small = with_draft_vocab(draft, ids)
    inner = small.model
    assert inner.weight.shape[0] == len(set(ids)) and "+vocab" in small.name and small.vocab_size == draft.vocab_size
    keep = sorted(set(ids))
    out = torch.ones(draft.vocab_size, dtype=torch.bool)
    out[keep] = False
    calls = (lambda b: b.forward([5, 6, 7, 8]), lambda b: b.forward([9], all_logits=False),
             lambda b: b.forward_tree([1, 2, 3], [-1, 0, 0]), lambda b: (b.commit_tree_path([0, 2]), b.forward([4]))[1])
    for call in calls:
        full, part = call(draft), call(small)
        torch.testing.assert_close(part[:, keep], full[:, keep])
        assert torch.isinf(part[:, out]).all() and (part[:, out] < 0).all()
    assert draft.model.get_output_embeddings().weight.shape[0] == draft.vocab_size
    draft.reset()
    small.reset()


def test_restricted_vocab_masks_any_backend():
    lm = FakeLM(vocab=24, seed=3)
    ids = list(range(4, 20))
    masked = RestrictedVocab(FakeLM(vocab=24, seed=3), ids)
    full, part = lm.forward([1, 2, 3]), masked.forward([1, 2, 3])
    assert torch.equal(part[:, ids], full[:, ids]) and torch.isinf(part[:, :4]).all()
    assert masked.vocab_size == 24 and masked.n_cached == 3 and "+vocab16" in masked.name
    with pytest.raises(ValueError, match="at least one"):
        RestrictedVocab(lm, [])
    with pytest.raises(ValueError, match="0..23"):
        RestrictedVocab(lm, range(10, 30))


def test_greedy_sd_with_a_reduced_draft_equals_the_target(tiny_pair):
    target, draft = tiny_pair
    small = with_draft_vocab(draft, list(range(3, 60)) + [2])
    ref = generate_target_only(target, [5, 9, 14], sampling=GREEDY, max_new_tokens=24)
    for gamma in (3, 6):
        out = generate(target, small, [5, 9, 14], rule="lossless", sampling=GREEDY, gamma=gamma, max_new_tokens=24)
        assert out.tokens == ref.tokens


@pytest.mark.slow
def test_lossless_sd_with_a_reduced_draft_samples_the_target_law():
    """q is zero outside the subset -- where the target puts mass too -- and lossless SD still samples p
    exactly (first 4 tokens' joint law, 6000 samples)."""
    target = FakeLM(vocab=6, seed=1, scale=1.0, bias={0: 1.0})   # token 0: the target's favourite
    small = RestrictedVocab(FakeLM(vocab=6, seed=2, scale=1.0), [2, 3, 4, 5])      # 0 and 1 never drafted
    prompt = [0, 1]
    law = exact_prefix_law(target, prompt, 3, T1)

    def run(seed):
        return generate(target, small, prompt, rule="lossless", sampling=T1, gamma=3, max_new_tokens=3, seed=seed)

    assert_law(sample_prefixes(run, 6000, 3), law)


def test_cli_draft_vocab_flags(tiny_pair, tmp_path, monkeypatch):
    import argparse

    from verispec.cli import _reduced_draft

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))    # the ranked list is cached there
    _, draft = tiny_pair
    corpus = tmp_path / "c.txt"
    corpus.write_text("abcabc" * 20)
    small = _reduced_draft(argparse.Namespace(draft_vocab=20, draft_vocab_corpus=[str(corpus)]), draft)
    assert small.model.weight.shape[0] == 20
    assert _reduced_draft(argparse.Namespace(draft_vocab=None, draft_vocab_corpus=None), draft) is draft
    with pytest.raises(ValueError, match="needs a draft model"):
        _reduced_draft(argparse.Namespace(draft_vocab=20, draft_vocab_corpus=None), None)
    with pytest.raises(ValueError, match="give --draft-vocab N"):
        _reduced_draft(argparse.Namespace(draft_vocab=None, draft_vocab_corpus=[str(corpus)]), draft)


@pytest.mark.embedded
def test_llama_draft_with_a_cut_gguf_gives_the_full_drafts_logits_on_the_subset(embedded_pair_paths, tmp_path):
    """The embedded draft with a 2,048-token vocabulary: a GGUF whose vocabulary, token embedding and
    output layer hold the subset, fed input embeddings, gives bitwise the full draft's logits on the subset
    (-inf elsewhere) for blocks, trees and tokens outside the subset; greedy SD with it equals the target."""
    from verispec.models.gguf_vocab import ReducedVocabLlama
    from verispec.models.llama import LlamaBackend

    full = LlamaBackend(embedded_pair_paths.draft, n_ctx=256, max_tree_nodes=4)
    target = LlamaBackend(embedded_pair_paths.target, n_ctx=256, max_tree_nodes=4)
    corpus = tmp_path / "corpus.py"    # this file: a small corpus (the default, the standard library, is slow)
    corpus.write_text(Path(__file__).read_text(encoding="utf-8"), encoding="utf-8")
    ids = draft_vocabulary(full, 2048, [corpus], cache_dir=tmp_path)
    small = ReducedVocabLlama(full, ids, cache_dir=tmp_path)
    try:
        assert small.vocab_size == full.vocab_size and small.n_logits == 2048 and "+vocab2048" in small.name
        outside = [i for i in range(5000, 6000) if i not in set(ids)][:3]
        prompt = full.chat_prompt("Say hi.")
        for call in (lambda b: b.forward(prompt), lambda b: b.forward_tree([100, 200, 300], [-1, 0, 0]),
                     lambda b: (b.commit_tree_path([0, 2]), b.forward(outside, all_logits=False))[1]):
            want, got = call(full), call(small)
            assert torch.equal(got[:, ids], want[:, ids])
            assert int(torch.isinf(got).sum()) == got.shape[0] * (full.vocab_size - 2048)
        ref = generate_target_only(target, prompt, sampling=GREEDY, max_new_tokens=12)
        out = generate(target, small, prompt, rule="lossless", sampling=GREEDY, gamma=3, max_new_tokens=12)
        assert out.tokens == ref.tokens
        with pytest.raises(NotImplementedError, match="siblings"):
            small.sibling()
    finally:
        small.close()
        target.close()
        full.close()
