"""Tests of the models layer: HF and llama.cpp backends, vocabulary check, embedded GGUF assembly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers.embedded_parts import fake_embedded_parts
from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model
from verispec.models import Backend, check_compatible, load_backend
from verispec.models import embedded as emb

TEXT = "def add(a, b):\n    return a + b"


# --------------------------------------------------------------------------------------------------
# HF backend on tiny random models (float64, no download)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["target", "draft"])
def test_hf_block_forward_equals_token_by_token(tiny_hf_pair, which):
    be = getattr(tiny_hf_pair, which)
    ids = be.tokenize(TEXT)
    block = be.forward(ids)
    assert block.shape == (len(ids), be.vocab_size)
    assert block.dtype == torch.float64
    assert be.n_cached == len(ids)
    be.reset()
    assert be.n_cached == 0
    rows = torch.cat([be.forward([t]) for t in ids])
    torch.testing.assert_close(block, rows, rtol=0, atol=1e-12)
    # Not trivially equal rows: the model depends on its context.
    assert (block[1:] - block[:-1]).abs().max() > 1e-3


def test_hf_rollback_then_reforward_is_exact(tiny_hf_pair):
    be = tiny_hf_pair.target
    ids = be.tokenize(TEXT)
    prefix, block = ids[:10], ids[10:16]
    be.forward(prefix)
    first = be.forward(block)
    be.rollback(10)
    assert be.n_cached == 10
    again = be.forward(block)
    assert torch.equal(first, again)

    # Rolling back into the middle of the block and continuing with different tokens gives the same
    # logits as a fresh run over the new sequence.
    be.rollback(12)
    other = be.tokenize("xyz")
    cont = be.forward(other)
    be.reset()
    fresh = be.forward(prefix + block[:2] + other)
    torch.testing.assert_close(cont, fresh[-3:], rtol=0, atol=1e-12)
    assert (cont - first[2:5]).abs().max() > 1e-6  # the new tokens really changed something


def test_hf_all_logits_false_is_last_row(tiny_hf_pair):
    be = tiny_hf_pair.draft
    ids = be.tokenize(TEXT)
    full = be.forward(ids)
    be.reset()
    last = be.forward(ids, all_logits=False)
    assert last.shape == (1, be.vocab_size)
    torch.testing.assert_close(last[0], full[-1], rtol=0, atol=1e-12)
    assert be.n_cached == len(ids)


def test_hf_input_validation(tiny_hf_pair):
    be = tiny_hf_pair.target
    be.forward([3, 4, 5])
    with pytest.raises(ValueError, match="roll back to 4"):
        be.rollback(4)
    with pytest.raises(ValueError):
        be.rollback(-1)
    with pytest.raises(ValueError, match="at least one token"):
        be.forward([])
    with pytest.raises(ValueError, match="out of range"):
        be.forward([be.vocab_size])
    assert be.n_cached == 3
    be.rollback(0)
    assert be.n_cached == 0
    be.forward([3])  # usable after a rollback to 0


def test_hf_text_and_metadata(tiny_hf_pair):
    be = tiny_hf_pair.target
    assert isinstance(be, Backend)
    assert be.vocab_size == 128 and be.tokenizer_size == 99
    assert be.detokenize(be.tokenize(TEXT)) == TEXT
    tok = tiny_hf_pair.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in be.eos_token_ids
    assert tok.convert_tokens_to_ids("<|endoftext|>") in be.eos_token_ids
    assert be.token_piece(im_end) == "<|im_end|>"
    prompt = be.chat_prompt("hi", system="be brief")
    text = "".join(be.token_piece(i) for i in prompt)
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_hf_without_tokenizer_raises_clearly():
    from verispec.models.hf import HFBackend

    be = HFBackend(tiny_hf_model("llama", vocab_width=99, hidden=16))
    assert be.forward([1, 2, 3]).shape == (3, 99)  # logits work without a tokenizer
    with pytest.raises(RuntimeError, match="without a tokenizer"):
        be.tokenize("abc")


# --------------------------------------------------------------------------------------------------
# Vocabulary compatibility
# --------------------------------------------------------------------------------------------------
def test_check_compatible_accepts_padded_logits(tiny_hf_pair):
    # target lm_head is padded to 128 rows, draft has exactly the 99 tokenizer ids
    assert check_compatible(tiny_hf_pair.target, tiny_hf_pair.draft) == 99
    assert check_compatible(tiny_hf_pair.draft, tiny_hf_pair.target) == 99


def test_check_compatible_refuses_different_tokenizers(tiny_hf_pair):
    from verispec.models.hf import HFBackend

    other = HFBackend(tiny_hf_model("llama", vocab_width=99, hidden=16), tokenizer=tiny_char_tokenizer(seed=7))
    other.name = "hf:shuffled"
    with pytest.raises(ValueError, match=r"(?s)hf:shuffled.*do not share a vocabulary: token \d+ is"):
        check_compatible(tiny_hf_pair.target, other)


def test_check_compatible_refuses_extra_real_tokens(tiny_hf_pair):
    from verispec.models.hf import HFBackend

    tok = tiny_char_tokenizer()
    tok.add_tokens(["def", "return"])
    bigger = HFBackend(tiny_hf_model("llama", vocab_width=128, hidden=16), tokenizer=tok)
    with pytest.raises(ValueError, match="tokenizer sizes differ.*'def'"):
        check_compatible(tiny_hf_pair.target, bigger)


def test_check_compatible_tolerates_padding_tokens(tiny_hf_pair):
    from verispec.models.hf import HFBackend

    tok = tiny_char_tokenizer()
    tok.add_tokens([f"[PAD{i}]" for i in range(99, 110)])
    padded = HFBackend(tiny_hf_model("llama", vocab_width=110, hidden=16), tokenizer=tok)
    assert check_compatible(padded, tiny_hf_pair.draft) == 99


# --------------------------------------------------------------------------------------------------
# load_backend
# --------------------------------------------------------------------------------------------------
def test_load_backend_missing_gguf(tmp_path):
    missing = tmp_path / "nope" / "model.gguf"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_backend(str(missing), role="target")


def test_load_backend_missing_directory_and_bad_role(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_backend(str(tmp_path / "no_such_model_dir"), role="draft")
    with pytest.raises(ValueError, match="role"):
        load_backend(None, role="verifier")


def test_load_backend_from_local_directory(tmp_path):
    from verispec.models.hf import HFBackend

    model, tok = tiny_hf_model("qwen2", vocab_width=128, seed=3), tiny_char_tokenizer()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    be = load_backend(str(tmp_path / "m"), role="target", dtype="float64")
    assert isinstance(be, HFBackend) and be.vocab_size == 128 and be.dtype == torch.float64
    # (transformers 5 re-derives a Qwen2Tokenizer from config.model_type, so the reloaded tokenizer
    # need not split text exactly like the original char-level one; compare the model on fixed ids)
    assert be.tokenizer is not None and len(be.tokenizer) == 99
    ids = tok.encode(TEXT)
    ref = HFBackend(model, tokenizer=tok)
    torch.testing.assert_close(be.forward(ids), ref.forward(ids), rtol=0, atol=1e-12)


def test_llama_default_threads(monkeypatch):
    pytest.importorskip("llama_cpp")
    from verispec.models.llama import default_threads

    monkeypatch.setenv("VERISPEC_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("VERISPEC_THREADS", "many")
    with pytest.raises(ValueError, match="VERISPEC_THREADS"):
        default_threads()
    monkeypatch.delenv("VERISPEC_THREADS")
    assert default_threads() >= 1


def test_llama_backend_missing_file(tmp_path):
    pytest.importorskip("llama_cpp")
    from verispec.models.llama import LlamaBackend

    with pytest.raises(FileNotFoundError, match="x.gguf"):
        LlamaBackend(tmp_path / "x.gguf")


# --------------------------------------------------------------------------------------------------
# Embedded GGUF assembly
# --------------------------------------------------------------------------------------------------
def test_assembly_concatenates_verifies_and_stamps(tmp_path, monkeypatch):
    blobs = [os.urandom(1000), os.urandom(3), os.urandom(20000)]
    digest = fake_embedded_parts(tmp_path, monkeypatch, blobs)
    cache = tmp_path / "cache"
    path = emb.embedded_model_path("draft", cache_dir=cache, progress=False, expected_sha256=digest)
    assert path.parent == cache and path.read_bytes() == b"".join(blobs)
    assert Path(str(path) + ".sha256").read_text().split()[0] == digest
    # the model, its stamp, and the empty lock file assemblies of this model take turns through
    assert sorted(p.name for p in cache.iterdir()) == [f".{path.name}.lock", path.name, path.name + ".sha256"]

    # Reuse: size matches and stamp agrees -> no hashing at all.
    def no_hash(_):
        raise AssertionError("re-hashed a stamped file")

    monkeypatch.setattr(emb, "_sha256_file", no_hash)
    assert emb.embedded_model_path("draft", cache_dir=cache, progress=False, expected_sha256=digest) == path


def test_assembly_rebuilds_corrupt_file_of_right_size(tmp_path, monkeypatch):
    blobs = [b"a" * 100, b"b" * 50]
    digest = fake_embedded_parts(tmp_path, monkeypatch, blobs)
    cache = tmp_path / "cache"
    cache.mkdir()
    dest = cache / emb.EMBEDDED_MODELS["target"].filename
    dest.write_bytes(b"x" * 150)  # right size, wrong content, no stamp
    path = emb.embedded_model_path("target", cache_dir=cache, progress=False, expected_sha256=digest)
    assert path.read_bytes() == b"a" * 100 + b"b" * 50


def test_assembly_wrong_digest_raises_and_cleans_up(tmp_path, monkeypatch):
    blobs = [b"hello ", b"world"]
    actual = fake_embedded_parts(tmp_path, monkeypatch, blobs)
    cache = tmp_path / "cache"
    wrong = "0" * 64
    with pytest.raises(ValueError, match=f"(?s)expected {wrong}.*got {actual}"):
        emb.embedded_model_path("draft", cache_dir=cache, progress=True, expected_sha256=wrong)
    # temp file removed, nothing renamed into place (the empty lock file stays for the next assembly)
    assert [p.name for p in cache.iterdir()] == [f".{emb.EMBEDDED_MODELS['draft'].filename}.lock"]


def test_assembly_missing_packages_says_how_to_install(monkeypatch):
    fake = emb.EmbeddedModel("draft", "nothing", "verispec-no-such-pkg", 2, "0" * 64, "x.gguf")
    monkeypatch.setitem(emb.EMBEDDED_MODELS, "draft", fake)
    assert not emb.embedded_available("draft")
    with pytest.raises(ImportError, match=r"pip install 'verispec\[embedded\]'"):
        emb.embedded_model_path("draft", progress=False)


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "v"))
    assert emb.default_cache_dir() == tmp_path / "v"
    monkeypatch.delenv("VERISPEC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert emb.default_cache_dir() == tmp_path / "x" / "verispec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert emb.default_cache_dir() == Path.home() / ".cache" / "verispec"


@pytest.mark.embedded
def test_real_draft_assembly_matches_sha256(tmp_path, embedded_pair_paths):
    spec = emb.EMBEDDED_MODELS["draft"]
    path = emb.embedded_model_path("draft", cache_dir=tmp_path, progress=False)
    assert path.stat().st_size == embedded_pair_paths.draft.stat().st_size
    assert Path(str(path) + ".sha256").read_text().split()[0] == spec.sha256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"


# --------------------------------------------------------------------------------------------------
# llama.cpp backend on the embedded Qwen2.5-Coder pair
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_pair(embedded_pair_paths):
    pytest.importorskip("llama_cpp")
    from verispec.models.llama import LlamaBackend

    # One thread: on a busy shared 2-core machine, llama.cpp's spinning thread barrier makes 2 threads
    # many times slower than 1 (and the tests check numerics, not speed).
    target = LlamaBackend(embedded_pair_paths.target, n_ctx=512, n_threads=1)
    draft = LlamaBackend(embedded_pair_paths.draft, n_ctx=512, n_threads=1)
    yield target, draft
    target.close()
    draft.close()


@pytest.fixture
def target(llama_pair):
    be = llama_pair[0]
    be.reset()
    return be


@pytest.fixture
def draft(llama_pair):
    be = llama_pair[1]
    be.reset()
    return be


def _probs(logits):
    return torch.softmax(logits.double(), -1)


@pytest.mark.embedded
@pytest.mark.parametrize("which", [0, 1])
def test_llama_block_forward_close_to_sequential(llama_pair, which):
    be = llama_pair[which]
    be.reset()
    prompt = be.tokenize("# Python: add two numbers\n")
    block = be.tokenize("def add(a, b):\n")[:6]
    pre = be.forward(prompt, all_logits=False)
    assert pre.shape == (1, be.vocab_size) and pre.dtype == torch.float32
    blk = be.forward(block)
    assert blk.shape == (len(block), be.vocab_size)
    be.rollback(len(prompt))
    seq = torch.cat([be.forward([t]) for t in block])
    assert be.n_cached == len(prompt) + len(block)
    # Quantised kernels differ slightly between batch sizes: close, not bitwise equal.
    # (measured on the embedded pair: max |logit diff| ~0.4, max |prob diff| ~0.01)
    assert (blk - seq).abs().max() < 1.5
    assert (_probs(blk) - _probs(seq)).abs().max() < 0.05
    assert torch.equal(blk.argmax(-1), seq.argmax(-1))


@pytest.mark.embedded
def test_llama_rollback_then_reforward_reproduces(draft):
    # The mechanics are the same for both models; the draft is cheaper.
    prompt = draft.tokenize("User: Say hello.\nAssistant:")
    draft.forward(prompt, all_logits=False)
    block = draft.tokenize("Hello! How can I help")
    first = draft.forward(block)
    draft.rollback(len(prompt))
    again = draft.forward(block)
    torch.testing.assert_close(first, again, rtol=0, atol=1e-4)

    # Rolling back into the block and continuing differently matches a fresh run of the new sequence.
    draft.rollback(len(prompt) + 2)
    other = draft.tokenize(" there, friend")
    cont = draft.forward(other)
    draft.reset()
    fresh = draft.forward(prompt + block[:2] + other)
    assert torch.equal(cont.argmax(-1), fresh[-len(other) :].argmax(-1))
    assert (_probs(cont) - _probs(fresh[-len(other) :])).abs().max() < 0.05


@pytest.mark.embedded
def test_llama_all_logits_false_is_last_row(draft):
    ids = draft.tokenize("print(2 + 2)")
    full = draft.forward(ids)
    draft.reset()
    last = draft.forward(ids, all_logits=False)
    torch.testing.assert_close(last[0], full[-1], rtol=0, atol=1e-3)


@pytest.mark.embedded
def test_llama_inputs_longer_than_n_batch_are_split(draft):
    ids = draft.tokenize(TEXT)
    whole = draft.forward(ids)
    draft.reset()
    saved = draft.n_batch
    draft.n_batch = 4  # decode in chunks of 4 (the llama_batch buffer itself is larger)
    try:
        chunked = draft.forward(ids)
        assert chunked.shape == whole.shape and draft.n_cached == len(ids)
        draft.reset()
        last = draft.forward(ids, all_logits=False)
    finally:
        draft.n_batch = saved
    assert torch.equal(chunked.argmax(-1), whole.argmax(-1))
    assert (_probs(chunked) - _probs(whole)).abs().max() < 0.05
    torch.testing.assert_close(last[0], chunked[-1], rtol=0, atol=1e-3)
    with pytest.raises(ValueError, match="context overflow"):
        draft.forward([220] * (draft.context_length - draft.n_cached + 1))
    assert draft.n_cached == len(ids)


@pytest.mark.embedded
def test_llama_pair_vocab_chat_and_eos(llama_pair):
    target, draft = llama_pair
    assert isinstance(target, Backend)
    assert check_compatible(target, draft) == target.vocab_size == draft.vocab_size
    im_start, im_end, eot = 151644, 151645, 151643
    for be in (target, draft):
        assert be.token_piece(im_end) == "<|im_end|>" and be.token_piece(eot) == "<|endoftext|>"
        assert {im_end, eot} <= be.eos_token_ids
        assert 128247 not in be.eos_token_ids  # Qwen's ordinary "</s>" text token is not an end of turn
        prompt = be.chat_prompt("hi", system="You are terse.")
        text = "".join(be.token_piece(i) for i in prompt)
        assert text == (
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        )
        assert prompt.count(im_start) == 3 and prompt.count(im_end) == 2
        assert be.detokenize(be.tokenize(TEXT)) == TEXT
        assert be.detokenize([im_end]) == ""  # control tokens are not rendered as text


@pytest.mark.embedded
def test_llama_target_answers_sensibly(target):
    prompt = target.chat_prompt("What is 2+3? Reply with just the number.")
    logits = target.forward(prompt, all_logits=False)
    assert target.token_piece(int(logits[0].argmax())) == "5"


@pytest.mark.embedded
def test_load_backend_embedded_default(embedded_pair_paths):
    pytest.importorskip("llama_cpp")
    be = load_backend(None, role="draft", n_ctx=256, n_threads=1)
    try:
        assert be.name.endswith(emb.EMBEDDED_MODELS["draft"].filename)
        assert be.context_length == 256
    finally:
        be.close()
