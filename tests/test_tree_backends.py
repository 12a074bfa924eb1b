"""Draft-tree decoding on both backends: ``forward_tree`` / ``commit_tree_path`` / ``n_tree``.

Every tree row must equal the logits of decoding that node's path alone after the same prefix, and a
commit must leave the cache of decoding the accepted path. Tolerances:

- HF (float64): sdpa ``1e-9`` (measured ~1e-15); eager ``1e-5``, since its softmax runs in float32
  (measured ~1e-6).
- llama.cpp: with ``n_ubatch=1`` (one-token kernels) a tree row equals, bitwise, plain decoding of its
  path replayed into the same KV cells (the other nodes' cells taken by tokens it cannot see). Against
  plain decoding with a different cell layout it is only close: the attention's summation order changes
  and the next matmul's 8-bit activation quantisation amplifies that. With the default ubatch the
  quantised kernels also depend on the batch size (as ``forward`` blocks do, see test_models). Measured
  on the embedded draft: max |logit diff| 0.40 (one-token) / 0.48 (batched) on logits up to 28, max
  |prob diff| 0.016 / 0.031, argmax equal at all 16 nodes, top-5 equal at 14-16 of 16. The tests allow
  1.5 / 0.05 and require equal argmax wherever the reference's top-2 margin exceeds 1.0; two siblings'
  rows differ by ~17, so a node seeing a sibling would fail them.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model

# 16 nodes, two roots, branching 2, depth up to 6. The single chain from the cache end is 0-1-3-6-12-13-15
# (llama.cpp keeps it in sequence 0), the rest are branch nodes.
PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, -1, 10, 6, 12, 8, 13]
SPLITS = {"one call": [16], "grown": [5, 6, 5], "node by node": [1] * 16}
FULL_DEPTH = [0, 1, 3, 6, 12, 13, 15]
PATHS = [[], [0], [0, 2, 5, 9], FULL_DEPTH, [10, 11], [0, 1, 4, 8, 14]]
LLAMA_PATHS = [[], [10, 11], FULL_DEPTH, [0, 1, 4, 8, 14]]  # no root, a branch root, the chain, a branch


def path_of(parents: list[int], k: int) -> list[int]:
    out = []
    while k >= 0:
        out.append(k)
        k = parents[k]
    return out[::-1]


def grow(be, toks: list[int], parents: list[int], sizes: list[int]) -> torch.Tensor:
    rows, at = [], 0
    for size in sizes:
        rows.append(be.forward_tree(toks[at : at + size], parents[at : at + size]))
        at += size
        assert be.n_tree == at
    return torch.cat(rows)


def path_refs(be, prefix: list[int], toks: list[int], parents: list[int], *, one_by_one: bool = False):
    """Row k: logits after decoding node k's path alone after ``prefix`` (cache left at ``prefix``)."""
    be.reset()
    be.forward(prefix, all_logits=False)
    rows = []
    for k in range(len(parents)):
        ids = [toks[j] for j in path_of(parents, k)]
        last = [be.forward([t]) for t in ids][-1] if one_by_one else be.forward(ids)[-1:]
        rows.append(last[0])
        be.rollback(len(prefix))
    return torch.stack(rows)


# --------------------------------------------------------------------------------------------------
# HF backend: tiny random float64 models, both architectures, both attention implementations
# --------------------------------------------------------------------------------------------------
HF_CASES = [("qwen2", "sdpa"), ("qwen2", "eager"), ("llama", "sdpa"), ("llama", "eager")]


def make_hf(arch: str, attn: str, **kw):
    from verispec.models.hf import HFBackend

    model = tiny_hf_model(arch, vocab_width=128 if arch == "qwen2" else 99, hidden=32, seed=1, init_range=0.2)
    model.set_attn_implementation(attn)
    assert model.config._attn_implementation == attn
    return HFBackend(model, tokenizer=tiny_char_tokenizer(), **kw), (1e-9 if attn == "sdpa" else 1e-5)


@pytest.fixture(params=HF_CASES, ids=[f"{a}-{i}" for a, i in HF_CASES])
def hf(request):
    return make_hf(*request.param)


def hf_tokens(be) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(7)
    return be.tokenize("def add(a, b):\n"), torch.randint(3, 99, (len(PARENTS),), generator=g).tolist()


@pytest.mark.parametrize("sizes", list(SPLITS.values()), ids=list(SPLITS))
def test_hf_tree_rows_equal_each_path_decoded_alone(hf, sizes):
    be, atol = hf
    prefix, toks = hf_tokens(be)
    refs = path_refs(be, prefix, toks, PARENTS)
    tree = grow(be, toks, PARENTS, sizes)
    assert tree.shape == (len(PARENTS), be.vocab_size) and tree.dtype == torch.float64
    assert be.n_cached == len(prefix)
    torch.testing.assert_close(tree, refs, rtol=0, atol=atol)
    # Power: siblings' rows differ by far more than the tolerance, so a leak between branches would show.
    assert (refs[1] - refs[2]).abs().max() > 1e-2


@pytest.mark.parametrize("path", PATHS, ids=[str(p) for p in PATHS])
def test_hf_commit_keeps_exactly_the_accepted_path(hf, path):
    be, atol = hf
    prefix, toks = hf_tokens(be)
    nxt = be.tokenize("xy")
    kept = [toks[i] for i in path]
    be.reset()
    fresh = be.forward(prefix + kept + nxt)[-len(nxt) :]
    be.reset()
    be.forward(prefix)
    grow(be, toks, PARENTS, SPLITS["grown"])
    be.commit_tree_path(path)
    assert be.n_cached == len(prefix) + len(path) and be.n_tree == 0
    torch.testing.assert_close(be.forward(nxt), fresh, rtol=0, atol=atol)
    # Rolling back into the committed path and continuing matches a fresh run too.
    cut = len(prefix) + len(path) // 2
    be.rollback(cut)
    seq = prefix + kept
    again = be.forward(seq[cut:] + nxt)[-len(nxt) :]
    torch.testing.assert_close(again, fresh, rtol=0, atol=atol)


def test_hf_chain_is_plain_forward(tiny_hf_pair, monkeypatch):
    be = tiny_hf_pair.target
    prefix, toks = hf_tokens(be)
    chain = toks[:6]
    be.forward(prefix)
    block = be.forward(chain)
    be.rollback(len(prefix) + 3)
    cont = be.forward(chain[3:])
    be.rollback(len(prefix))
    calls = []
    inner = be.model.forward
    monkeypatch.setattr(be.model, "forward", lambda *a, **kw: calls.append(kw) or inner(*a, **kw))
    rows = be.forward_tree(chain, [-1, 0, 1, 2, 3, 4])
    assert torch.equal(rows, block)  # the same model call, no mask: bitwise the same
    be.commit_tree_path([0, 1, 2])  # a prefix of the chain: a crop
    assert be.n_cached == len(prefix) + 3 and be.n_tree == 0
    assert torch.equal(be.forward(chain[3:]), cont)  # the same cache as forward + rollback
    be.rollback(len(prefix))
    rows = torch.cat([be.forward_tree(chain[:2], [-1, 0]), be.forward_tree(chain[2:], [1, 2, 3, 4])])
    torch.testing.assert_close(rows, block, rtol=0, atol=1e-12)
    assert all("attention_mask" not in kw for kw in calls)
    be.commit_tree_path(range(6))
    assert be.n_cached == len(prefix) + 6 and be.forward(chain[:1]).shape == (1, be.vocab_size)


def test_hf_errors_leave_the_state_unchanged(tiny_hf_pair, monkeypatch):
    be = tiny_hf_pair.draft
    prefix, toks = hf_tokens(be)
    refs = path_refs(be, prefix, toks, PARENTS)
    first = be.forward_tree(toks[:5], PARENTS[:5])
    bad_calls = [
        ([5], [5]),  # its own id
        ([5], [9]),  # a later node
        ([5], [-2]),
        ([5, 6], [-1]),  # length mismatch
        ([], []),
        ([be.vocab_size], [0]),
    ]
    for tok, par in bad_calls:
        with pytest.raises(ValueError):
            be.forward_tree(tok, par)
        assert be.n_tree == 5 and be.n_cached == len(prefix)
    with pytest.raises(ValueError, match="tree is open"):
        be.forward([5])
    for path in ([1], [0, 2, 1], [0, 7], [2]):  # not a root, not a chain of parents, out of range
        with pytest.raises(ValueError, match="path"):
            be.commit_tree_path(path)
    # Overflow: a node whose path would pass the context end; wide but shallow trees still fit.
    saved = be.context_length
    be.context_length = len(prefix) + 3
    try:
        with pytest.raises(ValueError, match="context overflow"):
            be.forward_tree([7], [3])  # depth 3: positions up to len(prefix) + 3
        be.forward_tree([7, 8], [2, 2])  # depth 2
        be.commit_tree_path([])
    finally:
        be.context_length = saved
    first = be.forward_tree(toks[:5], PARENTS[:5])
    # A model error mid-call (after some layers extended the cache) leaves the state as it was.
    layer = be.model.model.layers[1]
    monkeypatch.setattr(layer, "forward", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        be.forward_tree(toks[5:], PARENTS[5:])
    monkeypatch.undo()
    assert be.n_tree == 5 and be.n_cached == len(prefix)
    rest = be.forward_tree(toks[5:], PARENTS[5:])
    torch.testing.assert_close(torch.cat([first, rest]), refs, rtol=0, atol=1e-9)
    be.rollback(len(prefix) - 2)
    assert be.n_tree == 0 and be.n_cached == len(prefix) - 2
    tail = be.forward(prefix[-2:])
    be.reset()
    torch.testing.assert_close(tail, be.forward(prefix)[-2:], rtol=0, atol=1e-9)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_hf_capture_hidden_matches_output_hidden_states(arch):
    be, _ = make_hf(arch, "sdpa", capture_hidden=[0, 1, -1])
    prefix, toks = hf_tokens(be)
    hidden = be.model.config.hidden_size
    n_layers = be.model.config.num_hidden_layers

    def full_states(ids):
        out = be.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        return torch.cat([out.hidden_states[i][0] for i in (0, 1, n_layers)], -1).float()

    be.forward(prefix)
    assert be.last_hidden.shape == (len(prefix), 3 * hidden) and be.last_hidden.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(be.last_hidden, full_states(prefix), rtol=0, atol=1e-6)
        be.forward_tree(toks, PARENTS)
        assert be.last_hidden.shape == (len(PARENTS), 3 * hidden)
        for k in range(len(PARENTS)):
            want = full_states(prefix + [toks[j] for j in path_of(PARENTS, k)])[-1]
            torch.testing.assert_close(be.last_hidden[k], want, rtol=0, atol=1e-6)
    be.commit_tree_path([0])
    be.forward([5], all_logits=False)
    assert be.last_hidden.shape == (1, 3 * hidden)

    plain, _ = make_hf(arch, "sdpa")
    plain.forward(prefix)
    assert plain.last_hidden is None
    with pytest.raises(ValueError, match="capture_hidden"):
        make_hf(arch, "sdpa", capture_hidden=[n_layers + 1])


# --------------------------------------------------------------------------------------------------
# llama.cpp backend: the embedded draft GGUF
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gguf(embedded_pair_paths):
    pytest.importorskip("llama_cpp")
    from verispec.models.llama import LlamaBackend

    # ``exact``: one token per ubatch, so every row comes from the one-token kernels.
    batched = LlamaBackend(embedded_pair_paths.draft, n_ctx=512, n_threads=1)
    exact = LlamaBackend(embedded_pair_paths.draft, n_ctx=512, n_threads=1, n_ubatch=1)
    yield batched, exact
    batched.close()
    exact.close()


@pytest.fixture(scope="module")
def gguf_case(gguf):
    return gguf_tree(gguf[1])


def gguf_tree(be) -> tuple[list[int], list[int], list[int]]:
    """A prefix and a draft tree over real continuations: each node's children are its parent's top tokens."""
    prefix = be.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    be.reset()
    last = be.forward(prefix, all_logits=False)[0]
    toks: list[int] = []
    for k, p in enumerate(PARENTS):
        if p == -1:
            logits = last
        else:
            be.rollback(len(prefix))
            logits = be.forward([toks[j] for j in path_of(PARENTS, p)])[-1]
        rank = sum(1 for j in range(k) if PARENTS[j] == p)  # first child: top-1, second: top-2
        toks.append(int(logits.topk(rank + 1).indices[rank]))
    be.reset()
    return prefix, toks, PARENTS


JUNK_SEQ = 255  # a llama.cpp sequence no tree of these tests uses (max_tree_nodes = 255)


def depth_of(parents: list[int], k: int) -> int:
    return len(path_of(parents, k)) - 1


def same_layout_rows(be, prefix, toks, parents, sizes, keep: list[int]) -> dict[int, torch.Tensor]:
    """Decode the nodes ``keep`` (a root-down path) one token at a time with plain ``forward`` into
    sequence 0, in the order and KV cells the tree gets (calls of ``sizes`` nodes, each by depth), every
    other node taking its cell as a token of an unrelated sequence that sequence 0 cannot see.
    Returns ``{node: logits row}``. Afterwards the cache holds ``prefix + path`` in sequence 0 and the
    unrelated tokens in ``JUNK_SEQ`` (remove them with ``llama_memory_seq_rm``)."""
    lc, b = be._lc, be._batch.batch
    be.reset()
    be.forward(prefix, all_logits=False)
    rows, at, junk_pos = {}, 0, 0
    for size in sizes:
        for k in sorted(range(at, at + size), key=lambda k: (depth_of(parents, k), k)):
            if k in keep:
                rows[k] = be.forward([toks[k]])[0]
                continue
            b.token[0], b.pos[0], b.n_seq_id[0], b.logits[0], b.n_tokens = toks[k], junk_pos, 1, False, 1
            b.seq_id[0][0] = JUNK_SEQ
            assert lc.llama_decode(be._ctx.ctx, b) == 0
            junk_pos += 1
        at += size
    return rows


@pytest.mark.embedded
@pytest.mark.parametrize("sizes", [SPLITS["one call"], SPLITS["grown"]], ids=["one call", "grown"])
def test_llama_tree_rows_equal_each_path_decoded_alone(gguf, gguf_case, sizes):
    batched, exact = gguf
    prefix, toks, parents = gguf_case
    # One token per ubatch: bitwise what plain decoding of each path gives with the same KV-cell layout.
    # (Even one-token kernels are not bitwise invariant to where the path's cells sit among invisible
    # ones: the attention's summation order changes, and the 8-bit activation quantisation of the next
    # matmul amplifies that to ~0.3 logits at some nodes, so cell-for-cell replays are the exact reference.)
    refs = torch.zeros(len(parents), exact.vocab_size)
    for leaf in sorted(set(range(len(parents))) - set(parents)):
        for k, row in same_layout_rows(exact, prefix, toks, parents, sizes, path_of(parents, leaf)).items():
            refs[k] = row
    exact.reset()
    exact.forward(prefix, all_logits=False)
    rows = grow(exact, toks, parents, sizes)
    assert rows.shape == (len(parents), exact.vocab_size) and rows.dtype == torch.float32
    assert torch.equal(rows, refs)
    exact.commit_tree_path([])

    # Batched kernels: close to the paths decoded alone as blocks.
    refs = path_refs(batched, prefix, toks, parents)
    batched.reset()
    batched.forward(prefix, all_logits=False)
    rows = grow(batched, toks, parents, sizes)
    batched.commit_tree_path([])
    assert (rows - refs).abs().max() < 1.5
    assert (torch.softmax(rows.double(), -1) - torch.softmax(refs.double(), -1)).abs().max() < 0.05
    top2 = refs.topk(2).values
    clear = (top2[:, 0] - top2[:, 1]) > 1.0
    assert clear.sum() >= len(parents) // 2
    assert torch.equal(rows.argmax(-1)[clear], refs.argmax(-1)[clear])
    # Power: two siblings' rows (a leak between branches) differ by much more than the tolerance.
    assert (refs[1] - refs[2]).abs().max() > 3.0


@pytest.mark.embedded
@pytest.mark.parametrize("path", LLAMA_PATHS, ids=[str(p) for p in LLAMA_PATHS])
def test_llama_commit_keeps_exactly_the_accepted_path(gguf, gguf_case, path):
    batched, be = gguf
    prefix, toks, parents = gguf_case
    nxt = be.tokenize(" return")
    sizes = SPLITS["grown"]
    same_layout_rows(be, prefix, toks, parents, sizes, path)
    be._lc.llama_memory_seq_rm(be._mem, JUNK_SEQ, -1, -1)
    want = be.forward(nxt)

    be.reset()
    be.forward(prefix, all_logits=False)
    grow(be, toks, parents, sizes)
    be.commit_tree_path(path)
    n = len(prefix) + len(path)
    assert be.n_cached == n and be.n_tree == 0
    lc, mem = be._lc, be._mem
    assert (lc.llama_memory_seq_pos_min(mem, 0), lc.llama_memory_seq_pos_max(mem, 0)) == (0, n - 1)
    assert all(lc.llama_memory_seq_pos_max(mem, s) == -1 for s in range(1, be.max_tree_nodes + 1))
    assert torch.equal(be.forward(nxt), want)  # the cache of the accepted path, cell for cell
    # Rolling back into the committed path and continuing matches plain decoding (up to cell layout).
    cut = len(prefix) + len(path) // 2
    be.rollback(cut)
    again = torch.cat([be.forward([t]) for t in (prefix + [toks[i] for i in path])[cut:] + nxt])[-len(nxt) :]
    be.reset()
    fresh = torch.cat([be.forward([t]) for t in prefix + [toks[i] for i in path] + nxt])[-len(nxt) :]
    assert (again - fresh).abs().max() < 1.5 and torch.equal(again.argmax(-1), fresh.argmax(-1))

    # Batched kernels: the next block after the commit is close to a fresh decode of prefix + path.
    batched.reset()
    fresh = batched.forward(prefix + [toks[i] for i in path] + nxt)[-len(nxt) :]
    batched.reset()
    batched.forward(prefix, all_logits=False)
    grow(batched, toks, parents, sizes)
    batched.commit_tree_path(path)
    cont = batched.forward(nxt)
    assert (cont - fresh).abs().max() < 1.5 and torch.equal(cont.argmax(-1), fresh.argmax(-1))


@pytest.mark.embedded
def test_llama_chain_is_plain_forward(gguf, gguf_case):
    be, _ = gguf
    prefix, toks, _ = gguf_case
    chain = toks[:6]
    be.reset()
    be.forward(prefix, all_logits=False)
    block = be.forward(chain)
    be.rollback(len(prefix) + 3)
    cont = be.forward(chain[3:])
    be.rollback(len(prefix))
    rows = be.forward_tree(chain, [-1, 0, 1, 2, 3, 4])
    assert torch.equal(rows, block)  # the same llama_decode batch
    assert be._n_branch == 0
    be.commit_tree_path([0, 1, 2])
    assert be.n_cached == len(prefix) + 3
    assert torch.equal(be.forward(chain[3:]), cont)  # the same cache as forward + rollback
    # Grown across calls too, then committed whole.
    be.rollback(len(prefix))
    rows = torch.cat([be.forward_tree(chain[:2], [-1, 0]), be.forward_tree(chain[2:], [1, 2, 3, 4])])
    assert torch.equal(rows.argmax(-1), block.argmax(-1)) and (rows - block).abs().max() < 1.5
    be.commit_tree_path(range(6))
    assert be.n_cached == len(prefix) + 6


@pytest.mark.embedded
def test_llama_context_is_unified_and_errors_leave_the_state_unchanged(gguf, gguf_case):
    _, be = gguf
    lc, ctx = be._lc, be._ctx.ctx
    assert lc.llama_n_seq_max(ctx) == be.max_tree_nodes + 1 == 256
    assert lc.llama_n_ctx_seq(ctx) == lc.llama_n_ctx(ctx) >= be.context_length + be.max_tree_nodes
    prefix, toks, parents = gguf_case
    refs = torch.zeros(len(parents), be.vocab_size)
    for leaf in sorted(set(range(len(parents))) - set(parents)):
        for k, row in same_layout_rows(be, prefix, toks, parents, [5, 11], path_of(parents, leaf)).items():
            refs[k] = row
    be.reset()
    be.forward(prefix, all_logits=False)
    first = be.forward_tree(toks[:5], parents[:5])
    for tok, par in (([5], [5]), ([5], [9]), ([5], [-2]), ([5, 6], [-1]), ([], []), ([be.vocab_size], [0])):
        with pytest.raises(ValueError):
            be.forward_tree(tok, par)
    with pytest.raises(ValueError, match="tree is open"):
        be.forward([5])
    for path in ([1], [0, 2, 1], [0, 7]):
        with pytest.raises(ValueError, match="path"):
            be.commit_tree_path(path)
    saved = be.context_length, be.max_tree_nodes
    try:
        be.context_length = len(prefix) + 3
        with pytest.raises(ValueError, match="context overflow"):
            be.forward_tree([7], [3])
        be.context_length, be.max_tree_nodes = saved[0], 3  # nodes 2 and 4 already are branch nodes
        with pytest.raises(ValueError, match="max_tree_nodes"):
            be.forward_tree([7, 8], [2, 2])
    finally:
        be.context_length, be.max_tree_nodes = saved
    assert be.n_tree == 5 and be.n_cached == len(prefix)

    # llama_decode failing on the second block of a call: the cache is restored.
    class FailSecondDecode:
        def __init__(self, real):
            self.real, self.calls = real, 0

        def __getattr__(self, name):
            return getattr(self.real, name)

        def llama_decode(self, c, b):
            self.calls += 1
            return 1 if self.calls == 2 else self.real.llama_decode(c, b)

    saved_lc, saved_batch = be._lc, be.n_batch
    be._lc, be.n_batch = FailSecondDecode(saved_lc), 4
    try:
        with pytest.raises(RuntimeError, match="llama_decode returned 1"):
            be.forward_tree(toks[5:], parents[5:])
    finally:
        be._lc, be.n_batch = saved_lc, saved_batch
    assert be.n_tree == 5 and be.n_cached == len(prefix)
    rest = be.forward_tree(toks[5:], parents[5:])
    assert torch.equal(torch.cat([first, rest]), refs)
    be.rollback(len(prefix) - 1)
    assert be.n_tree == 0 and be.n_cached == len(prefix) - 1
    tail = be.forward(prefix[-1:])
    be.reset()
    torch.testing.assert_close(tail, torch.cat([be.forward([t]) for t in prefix])[-1:], rtol=0, atol=1e-4)
