"""EAGLE-3 heads (models/eagle3/): the published layout, loading, the head's cache and EAGLE-2 trees.

Heads are randomly initialised on tiny random float64 Llama targets; the target's hidden states come
straight from ``model(..., output_hidden_states=True)``. The tree is checked against a brute-force
reference that recomputes every node's path from scratch (no cache, no tree mask) and ranks all
candidates with plain Python sorting.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model
from verispec.models.eagle3 import Eagle3Drafter, Eagle3Head, default_target_layers, published_keys

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "eagle3_gpu.py"

#: State-dict names of EAGLE-3's ``Model`` (eagle/model/cnets.py, SafeAILab/EAGLE @ cb7e084):
#: ``fc``, ``midlayer`` (LlamaDecoderLayeremb: self_attn, mlp, hidden_norm, input_layernorm,
#: post_attention_layernorm), ``norm``, ``lm_head``, buffers ``d2t``, ``t2d``; ``embed_tokens`` optional.
PUBLISHED = [
    "fc.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
]
VOCAB, HIDDEN, LAYERS, DRAFT_VOCAB = 99, 32, 8, 40


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama", vocab_width=VOCAB, hidden=HIDDEN, layers=LAYERS, seed=3, init_range=0.2)


@pytest.fixture(scope="module")
def head(target):
    return Eagle3Head.random(target.config, draft_vocab_size=DRAFT_VOCAB, seed=1, init_std=0.3, dtype=torch.float64)


@pytest.fixture(scope="module")
def seq():
    return torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(5)).tolist()


def captured(model, tokens, layers) -> torch.Tensor:
    """The target's hidden states ``[len(tokens), 3 * hidden]`` at ``layers`` (output_hidden_states indices)."""
    with torch.no_grad():
        hs = model(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    return torch.cat([hs[i][0] for i in layers], dim=-1)


def embedder(model, head):
    weight = model.get_input_embeddings().weight
    return lambda toks: weight[torch.tensor(toks, dtype=torch.long)].to(head.dtype)


@torch.no_grad()
def scratch_out(head, model, tokens, hidden, root, path=()):
    """Output of the last entry with every entry recomputed from scratch (causal mask, no cache):
    committed entries pair ``fc(hidden_t)`` with token ``t + 1`` (the root last); drafted entries pair
    the previous entry's (from-scratch) output with the path token."""
    emb = embedder(model, head)
    hid = head.fuse(hidden)
    pair = list(tokens[1:]) + [root]
    out, _, _ = head(hid, emb(pair), torch.arange(len(pair)))
    last = out[-1]
    for tok in path:
        hid = torch.cat((hid, last[None]))
        pair.append(tok)
        out, _, _ = head(hid, emb(pair), torch.arange(len(pair)))
        last = out[-1]
    return last


def reference_tree(head, model, tokens, hidden, root, top_k, depth, nodes) -> dict[tuple[int, ...], float]:
    """EAGLE-2 growth by brute force: kept node paths (target ids) -> cumulative draft log-prob."""
    tid = (torch.arange(head.config.draft_vocab_size) + head.d2t).tolist()

    def children(path, base):
        lp = head.draft_logprobs(scratch_out(head, model, tokens, hidden, root, path)[None])[0].tolist()
        best = sorted(range(len(lp)), key=lambda i: (-lp[i], i))[:top_k]
        return [(base + min(lp[i], 0.0), path + (tid[i],)) for i in best]

    cands = children((), 0.0)
    frontier = list(range(len(cands)))
    for level in range(2, depth + 1):
        start = len(cands)
        for c in frontier:
            cands += children(cands[c][1], cands[c][0])
        new = range(start, len(cands))
        frontier = sorted(new, key=lambda i: (-cands[i][0], i))[:top_k] if level < depth else []
    keep = sorted(range(len(cands)), key=lambda i: (-cands[i][0], i))[:nodes]
    return {cands[i][1]: cands[i][0] for i in keep}


def paths_of(tokens, parents):
    out: list[tuple[int, ...]] = []
    for tok, par in zip(tokens, parents):
        out.append((out[par] if par >= 0 else ()) + (tok,))
    return out


def depths_of(parents):
    out: list[int] = []
    for par in parents:
        out.append(0 if par < 0 else out[par] + 1)
    return out


# -- layout and layers ----------------------------------------------------------------------------


def test_state_dict_has_the_published_key_names_and_shapes(head):
    c = head.config
    assert sorted(head.state_dict()) == sorted(PUBLISHED)
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert shapes == published_keys(c)
    assert shapes["fc.weight"] == (HIDDEN, 3 * HIDDEN)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (HIDDEN, 2 * HIDDEN)  # attention reads [emb, hidden]
    assert shapes["lm_head.weight"] == (DRAFT_VOCAB, HIDDEN)
    assert head.d2t.dtype == torch.long and head.t2d.dtype == torch.bool
    with_emb = Eagle3Head(c, embeddings=True)
    assert sorted(with_emb.state_dict()) == sorted(PUBLISHED + ["embed_tokens.weight"])


def test_saved_files_use_the_published_layout(head, tmp_path):
    from safetensors import safe_open

    head.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == sorted(PUBLISHED)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (cfg["vocab_size"], cfg["draft_vocab_size"], cfg["hidden_size"]) == (VOCAB, DRAFT_VOCAB, HIDDEN)
    assert cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(head.target_layers)


def test_published_llama31_config_gives_the_published_shapes():
    """config.json of the Llama-3.1-8B EAGLE-3 head (eagle/traineagle3/config.json, SafeAILab/EAGLE @ cb7e084)."""
    from verispec.models.eagle3 import Eagle3Config

    raw = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": 128001,
           "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
           "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05,
           "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.28.1",
           "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000}
    cfg = Eagle3Config.from_dict(raw)
    assert (cfg.head_dim, cfg.rope_theta, cfg.rms_norm_eps, cfg.target_hidden_size) == (128, 10000.0, 1e-5, 4096)
    shapes = published_keys(cfg)
    assert shapes["fc.weight"] == (4096, 3 * 4096)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (4096, 8192)
    assert shapes["midlayer.self_attn.k_proj.weight"] == (1024, 8192)
    assert shapes["midlayer.mlp.down_proj.weight"] == (4096, 14336)
    assert shapes["lm_head.weight"] == (32000, 4096)
    assert (shapes["d2t"], shapes["t2d"]) == ((32000,), (128256,))
    assert cfg.to_dict()["bos_token_id"] == 128000  # other keys are written back


def test_default_target_layers_follow_eagle():
    # modeling_llama_kv.py keeps the input of decoder layer idx when idx in {2, L // 2, L - 3}.
    for n in range(7, 81):
        eagle = [idx for idx in range(n) if idx == n - 3 or idx == n // 2 or idx == 2]
        assert list(default_target_layers(n)) == eagle
    assert default_target_layers(32) == (2, 16, 29)
    assert default_target_layers(4) == (1, 2, 3)
    assert default_target_layers(6) == (1, 3, 5)
    assert default_target_layers(2) == (1, 1, 2)
    with pytest.raises(ValueError, match="at least one layer"):
        default_target_layers(0)


def test_hidden_state_index_i_is_the_input_of_decoder_layer_i(target, seq):
    """EAGLE captures the input of decoder layer idx; in transformers that is hidden_states[idx]."""
    seen = {}

    def keep_input(i):
        def hook(module, args, kwargs):
            seen[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    hooks = [layer.register_forward_pre_hook(keep_input(i), with_kwargs=True)
             for i, layer in enumerate(target.model.layers)]
    try:
        with torch.no_grad():
            hs = target(torch.tensor([seq[:10]]), output_hidden_states=True).hidden_states
    finally:
        for h in hooks:
            h.remove()
    for i in default_target_layers(LAYERS):
        torch.testing.assert_close(hs[i], seen[i], rtol=0, atol=0)


# -- loading and saving ---------------------------------------------------------------------------


@pytest.mark.parametrize("safe", [True, False])
def test_round_trip_gives_identical_outputs(head, target, seq, tmp_path, safe):
    head.save_pretrained(tmp_path, safe_serialization=safe)
    assert (tmp_path / ("model.safetensors" if safe else "pytorch_model.bin")).is_file()
    loaded = Eagle3Head.from_pretrained(tmp_path, target_config=target.config)
    assert loaded.dtype == torch.float64 and loaded.target_layers == head.target_layers
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    hidden = captured(target, seq, head.target_layers)
    results = []
    for h in (head, loaded):
        d = Eagle3Drafter(h, target.get_input_embeddings(), top_k=4, depth=3, nodes=15)
        d.observe(seq[:12], hidden[:12])
        results.append(d.grow(seq[12]))
    assert results[0][:2] == results[1][:2]
    assert torch.equal(results[0][2], results[1][2])


def test_from_pretrained_dtype_and_layers_without_target(head, tmp_path):
    head.save_pretrained(tmp_path)
    h32 = Eagle3Head.from_pretrained(tmp_path, dtype="float32")
    assert h32.dtype == torch.float32 and h32.d2t.dtype == torch.long
    assert h32.target_layers == head.target_layers  # from eagle_config
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["eagle_config"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    bare = Eagle3Head.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="target_config"):
        _ = bare.target_layers


def test_embed_tokens_in_the_checkpoint_replace_the_targets(head, target, seq, tmp_path):
    from safetensors.torch import load_file, save_file

    head.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    save_file(state, str(tmp_path / "model.safetensors"))
    own = Eagle3Head.from_pretrained(tmp_path, target_config=target.config)
    assert own.embed_tokens is not None
    hidden = captured(target, seq, head.target_layers)
    a = Eagle3Drafter(own, None, top_k=3, depth=3, nodes=10)
    b = Eagle3Drafter(head, target.get_input_embeddings(), top_k=3, depth=3, nodes=10)
    for d in (a, b):
        d.observe(seq[:9], hidden[:9])
    ta, tb = a.grow(seq[9]), b.grow(seq[9])
    assert ta[:2] == tb[:2]
    torch.testing.assert_close(ta[2], tb[2])
    with pytest.raises(ValueError, match="embeddings"):
        Eagle3Drafter(head, None)


def test_full_vocabulary_head_without_d2t(target, seq, tmp_path):
    """EAGLE drops d2t/t2d when the draft vocabulary is the target's: ids are used as they are."""
    from safetensors.torch import load_file, save_file

    full = Eagle3Head.random(target.config, draft_vocab_size=VOCAB, seed=4, init_std=0.3, dtype=torch.float64)
    full.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["d2t"], state["t2d"]
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = Eagle3Head.from_pretrained(tmp_path, target_config=target.config)
    assert torch.equal(loaded.d2t, torch.zeros(VOCAB, dtype=torch.long)) and bool(loaded.t2d.all())
    d = Eagle3Drafter(loaded, target.get_input_embeddings(), top_k=5, depth=1, nodes=5)
    d.observe(seq[:6], captured(target, seq[:6], loaded.target_layers))
    tokens, parents, _ = d.grow(seq[6])
    assert tokens == torch.sort(d.root_logprobs, descending=True, stable=True).indices[:5].tolist()


def test_reduced_vocabulary_maps_draft_ids_to_target_ids(head, target, seq):
    used = (torch.arange(DRAFT_VOCAB) + head.d2t).tolist()
    assert used == sorted(set(used)) and all(0 <= t < VOCAB for t in used)
    assert torch.equal(head.t2d.nonzero().flatten(), torch.tensor(used))
    assert head.target_ids(torch.tensor([0, DRAFT_VOCAB - 1])).tolist() == [used[0], used[-1]]
    d = Eagle3Drafter(head, target.get_input_embeddings(), top_k=6, depth=3, nodes=30)
    d.observe(seq[:10], captured(target, seq[:10], head.target_layers))
    tokens, parents, scores = d.grow(seq[10])
    assert set(tokens) <= set(used)
    top = torch.sort(d.root_logprobs, descending=True, stable=True)
    level1 = [t for t, p in zip(tokens, parents) if p < 0]
    assert level1 == [used[i] for i in top.indices[:6].tolist()]
    torch.testing.assert_close(scores[[i for i, p in enumerate(parents) if p < 0]], top.values[:6])


# -- errors ---------------------------------------------------------------------------------------


def test_bad_directories_raise_clear_errors(head, target, tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        Eagle3Head.from_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        Eagle3Head.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Eagle3Head.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(ValueError, match="num_attention_heads"):
        Eagle3Head.from_pretrained(tmp_path)
    head.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no weights"):
        Eagle3Head.from_pretrained(tmp_path)


def _edit(head, tmp_path, *, drop=(), replace=None, config=None):
    from safetensors.torch import load_file, save_file

    head.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    for k in drop:
        del state[k]
    state.update(replace or {})
    save_file(state, str(tmp_path / "model.safetensors"))
    if config:
        cfg = json.loads((tmp_path / "config.json").read_text())
        cfg.update(config)
        (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_missing_keys_and_shape_mismatches(head, tmp_path):
    with pytest.raises(ValueError, match="lack lm_head.weight"):
        Eagle3Head.from_pretrained(_edit(head, tmp_path / "a", drop=["lm_head.weight"]))
    with pytest.raises(ValueError, match=r"midlayer.mlp.gate_proj.weight \(64, 32\) \(config.json implies \(50, 32\)"):
        Eagle3Head.from_pretrained(_edit(head, tmp_path / "b", config={"intermediate_size": 50}))
    bad = head.d2t.clone()
    bad[-1] = VOCAB  # maps past the target vocabulary
    with pytest.raises(ValueError, match="d2t maps draft ids outside"):
        Eagle3Head.from_pretrained(_edit(head, tmp_path / "c", replace={"d2t": bad}))
    with pytest.warns(UserWarning, match="ignoring weights"):
        Eagle3Head.from_pretrained(_edit(head, tmp_path / "d", replace={"extra.bias": torch.zeros(3)}))


def test_mismatch_with_the_target_is_refused(head, tmp_path):
    head.save_pretrained(tmp_path)
    narrow = tiny_hf_model("llama", vocab_width=VOCAB, hidden=16, layers=LAYERS)
    with pytest.raises(ValueError, match="hidden_size is 16"):
        Eagle3Head.from_pretrained(tmp_path, target_config=narrow.config)
    wide_vocab = tiny_hf_model("llama", vocab_width=128, hidden=HIDDEN, layers=LAYERS)
    with pytest.raises(ValueError, match="vocab_size 99 differs"):
        Eagle3Head.from_pretrained(tmp_path, target_config=wide_vocab.config)
    shallow = tiny_hf_model("llama", vocab_width=VOCAB, hidden=HIDDEN, layers=3)
    with pytest.raises(ValueError, match="not hidden-state indices"):
        Eagle3Head.from_pretrained(tmp_path, target_config=shallow.config)  # eagle_config says (2, 4, 5)


def test_drafter_misuse_raises(head, target, seq):
    with pytest.raises(ValueError, match="top_k"):
        Eagle3Drafter(head, target.get_input_embeddings(), top_k=DRAFT_VOCAB + 1)
    d = Eagle3Drafter(head, target.get_input_embeddings())
    with pytest.raises(RuntimeError, match="observe at least one"):
        d.grow(seq[0])
    with pytest.raises(ValueError, match=r"expected hidden states \[3, 96\]"):
        d.observe(seq[:3], torch.zeros(3, HIDDEN))
    d.observe(seq[:3], captured(target, seq[:3], head.target_layers))
    d.grow(seq[3])
    with pytest.raises(ValueError, match="must be the root"):
        d.observe([seq[3] + 1], torch.zeros(1, 3 * HIDDEN))
    with pytest.raises(ValueError, match=r"n_committed must be an integer in \[0, 4\]"):
        d.commit(5)


# -- the head's cache -----------------------------------------------------------------------------


def test_incremental_cache_equals_recomputation_after_observe_commit_cycles(head, target, seq):
    layers = head.target_layers
    hidden = captured(target, seq, layers)
    d = Eagle3Drafter(head, target.get_input_embeddings(), top_k=4, depth=3, nodes=12)

    def check(tokens, hid, root):
        d.grow(root)
        ref = head.draft_logprobs(scratch_out(head, target, tokens, hid, root)[None])[0]
        torch.testing.assert_close(d.root_logprobs, ref, rtol=0, atol=1e-10)
        assert d.n_cached == len(tokens) and d.n_committed == len(tokens) + 1

    d.observe(seq[:8], hidden[:8])
    check(seq[:8], hidden[:8], seq[8])
    check(seq[:8], hidden[:8], seq[8])                          # grow again: same tree, no new entries
    d.observe(seq[8:12], hidden[8:12])                          # the round accepted 3 nodes
    check(seq[:12], hidden[:12], seq[12])
    check(seq[:12], hidden[:12], seq[13])                       # the root replaced by another one
    d.commit(13)                                                # no-op: committed = 12 observed + root
    d.commit(9)                                                 # the engine undid 4 tokens
    assert d.n_committed == 9 and d.n_cached == 8
    check(seq[:9], hidden[:9], seq[9])
    alt = seq[:6] + [(t * 7 + 1) % (VOCAB - 3) + 3 for t in seq[6:16]]
    alt_hidden = captured(target, alt, layers)
    d.commit(6)
    d.observe(alt[6:10], alt_hidden[6:10])                      # different text after the rollback
    check(alt[:10], alt_hidden[:10], alt[10])
    d.observe(alt[10:15], alt_hidden[10:15])
    check(alt[:15], alt_hidden[:15], alt[15])
    d.reset()
    assert d.n_committed == 0 and d.n_cached == 0
    d.observe(seq[:5], hidden[:5])
    check(seq[:5], hidden[:5], seq[5])


# -- trees ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k,depth,nodes", [(4, 4, 20), (3, 3, 100), (5, 1, 3), (1, 5, 5), (6, 3, 25)])
def test_tree_matches_brute_force_reference(head, target, seq, top_k, depth, nodes):
    hidden = captured(target, seq[:11], head.target_layers)
    d = Eagle3Drafter(head, target.get_input_embeddings(), top_k=top_k, depth=depth, nodes=nodes)
    d.observe(seq[:11], hidden)
    tokens, parents, scores = d.grow(seq[11])
    ref = reference_tree(head, target, seq[:11], hidden, seq[11], top_k, depth, nodes)
    got = dict(zip(paths_of(tokens, parents), scores.tolist()))
    assert len(got) == len(tokens)
    assert set(got) == set(ref)
    for path, score in ref.items():
        assert got[path] == pytest.approx(score, abs=1e-10)


@pytest.mark.parametrize("top_k,depth,nodes", [(4, 4, 20), (3, 3, 100), (5, 1, 3), (1, 5, 5), (10, 5, 60)])
def test_tree_shape(head, target, seq, top_k, depth, nodes):
    hidden = captured(target, seq, head.target_layers)
    d = Eagle3Drafter(head, target.get_input_embeddings(), top_k=top_k, depth=depth, nodes=nodes)
    d.observe(seq[:14], hidden[:14])
    tokens, parents, scores = d.grow(seq[14])
    n = len(tokens)
    assert n == min(nodes, top_k + (depth - 1) * top_k * top_k)
    assert len(parents) == n and scores.shape == (n,) and scores.dtype == torch.float64
    assert all(-1 <= p < i for i, p in enumerate(parents))                       # parents before children
    depths = depths_of(parents)
    assert max(depths) + 1 <= depth and depths == sorted(depths)                 # depth by depth
    for d_ in set(depths):                                                        # grouped under parents
        level_parents = [p for p, dd in zip(parents, depths) if dd == d_]
        assert level_parents == sorted(level_parents)
    used = set((torch.arange(DRAFT_VOCAB) + head.d2t).tolist())
    assert all(t in used for t in tokens)
    for node in [-1] + list(range(n)):
        kids = [i for i, p in enumerate(parents) if p == node]
        assert len(kids) <= top_k
        assert len({tokens[i] for i in kids}) == len(kids)                       # distinct siblings
        assert scores[kids].tolist() == sorted(scores[kids].tolist(), reverse=True)  # rank order
        if node >= 0:
            assert all(scores[i] <= scores[node] for i in kids)
    # the nodes kept are the best by cumulative log-prob: nothing dropped beats a kept leaf... ensured by
    # the reference test; here: growing twice from the same state gives the same tree.
    again = d.grow(seq[14])
    assert again[:2] == (tokens, parents) and torch.equal(again[2], scores)


def test_tree_grown_after_a_round_matches_the_reference(head, target, seq):
    """observe([root] + accepted) then grow(next): the cache carries over between rounds."""
    hidden = captured(target, seq, head.target_layers)
    d = Eagle3Drafter(head, target.get_input_embeddings(), top_k=3, depth=3, nodes=12)
    d.observe(seq[:7], hidden[:7])
    d.grow(seq[7])
    d.observe(seq[7:10], hidden[7:10])
    tokens, parents, scores = d.grow(seq[10])
    ref = reference_tree(head, target, seq[:10], hidden[:10], seq[10], 3, 3, 12)
    got = dict(zip(paths_of(tokens, parents), scores.tolist()))
    assert set(got) == set(ref)
    assert all(got[p] == pytest.approx(s, abs=1e-10) for p, s in ref.items())


def test_float32_head_grows_the_same_tree(head, target, seq):
    h32 = Eagle3Head.random(target.config, draft_vocab_size=DRAFT_VOCAB, seed=1, init_std=0.3, dtype=torch.float32)
    hidden = captured(target, seq, head.target_layers)
    trees = []
    for h in (head, h32):
        d = Eagle3Drafter(h, target.get_input_embeddings(), top_k=3, depth=3, nodes=10)
        d.observe(seq[:9], hidden[:9])
        trees.append(d.grow(seq[9]))
    assert trees[1][2].dtype == torch.float32
    assert trees[0][:2] == trees[1][:2]
    torch.testing.assert_close(trees[0][2].float(), trees[1][2], rtol=0, atol=1e-4)


# -- the GPU script's loop on CPU -----------------------------------------------------------------


def _load_script():
    spec = importlib.util.spec_from_file_location("eagle3_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_gpu_script_parses_its_arguments():
    script = _load_script()
    args = script.parse_args(["--target", "t", "--head", "h"])
    assert (args.prompts, args.max_new_tokens, args.temperature) == (8, 256, 0.7)
    assert (args.nodes, args.depth, args.top_k) == (60, 5, 10)
    assert len(script.load_prompts(3, None)) == 3


def test_engine_tree_sd_with_a_head_greedy_lossless_equals_target_greedy(head, target):
    """The engine with an EAGLE-3 head (what the GPU script runs): greedy lossless tree SD reproduces
    greedy target-only decoding; a lossy rule runs and accepts drafts."""
    from verispec.engine import generate, generate_target_only
    from verispec.models.hf import HFBackend
    from verispec.sampling import SamplingConfig

    tok = tiny_char_tokenizer()
    backend = HFBackend(target, tokenizer=tok, capture_hidden=head.target_layers)
    prompt = tok.encode("hello there, tiny model")
    greedy = SamplingConfig(temperature=0.0)
    base = generate_target_only(backend, prompt, sampling=greedy, max_new_tokens=24)
    drafter = Eagle3Drafter(head, target.get_input_embeddings(), top_k=4, depth=3, nodes=12)
    res = generate(backend, None, prompt, rule="lossless", sampling=greedy, head=drafter, max_new_tokens=24)
    assert res.tokens == base.tokens
    assert res.stats.tree == "eagle3:top_k=4,depth=3,nodes=12" and res.stats.target_calls >= 1
    lossy = generate(backend, None, prompt, rule="lenience:ell=0.5", sampling=SamplingConfig(temperature=0.7),
                     head=drafter, max_new_tokens=16, seed=1)
    assert 1 <= lossy.stats.new_tokens <= 16 and lossy.stats.nodes_per_call > 0
    # prompt lookup first, the head where nothing matches: still the greedy target text
    from verispec.engine.ngram import NgramDrafter

    seen = {"lookup": [0, 0], "head": [0, 0]}

    def count(step):
        seen[step.proposal.source][0] += 1
        seen[step.proposal.source][1] += len(step.path)

    both = generate(backend, None, prompt, rule="lossless", sampling=greedy, head=drafter, max_new_tokens=24,
                    lookup=NgramDrafter(max_tokens=3), observers=[count])
    assert both.tokens == base.tokens
    assert both.stats.lookup_steps == seen["lookup"][0] > 0 and both.stats.lookup_accepted == seen["lookup"][1]
    assert both.stats.lookup_steps < sum(both.stats.accepted_hist)   # the head drafted the other steps
    plain = HFBackend(target, tokenizer=tok)
    with pytest.raises(ValueError, match="capture_hidden"):
        generate(plain, None, prompt, rule="lossless", sampling=greedy, head=drafter, max_new_tokens=4)
    with pytest.raises(ValueError, match="2 tokens"):
        generate(backend, None, prompt[:1], rule="lossless", sampling=greedy, head=drafter, max_new_tokens=4)


def test_drafter_follows_an_hf_backend_round(head, target):
    """One engine round by hand: the rows of ``last_hidden`` after ``forward_tree`` that the drafter
    observes leave it in the state recomputed from scratch on the committed text."""
    from verispec.models.hf import HFBackend

    tok = tiny_char_tokenizer()
    backend = HFBackend(target, tokenizer=tok, capture_hidden=head.target_layers)
    prompt = tok.encode("a tiny prompt")
    d = Eagle3Drafter(head, target.get_input_embeddings(), top_k=3, depth=3, nodes=9)
    backend.forward(prompt[:-1])
    d.observe(prompt[:-1], backend.last_hidden)
    root = prompt[-1]
    tokens, parents, _ = d.grow(root)
    logits = backend.forward_tree([root] + tokens, [-1] + [p + 1 for p in parents])
    hidden = backend.last_hidden
    path = [0]                                  # accept the first node and its first child
    path.append(next(i for i, p in enumerate(parents) if p == 0))
    rows = [0] + [i + 1 for i in path]
    backend.commit_tree_path(rows)
    d.observe([root] + [tokens[i] for i in path], hidden[rows])
    nxt = int(logits[rows[-1]].argmax())
    d.grow(nxt)
    text = prompt + [tokens[i] for i in path]
    ref = head.draft_logprobs(scratch_out(head, target, text, captured(target, text, head.target_layers), nxt)[None])
    torch.testing.assert_close(d.root_logprobs, ref[0], rtol=0, atol=1e-5)  # last_hidden is float32


def test_gpu_script_main_runs_on_cpu_with_local_dirs(tmp_path, capsys):
    model = tiny_hf_model("llama", vocab_width=VOCAB, hidden=HIDDEN, layers=LAYERS, seed=3, init_range=0.2)
    model.to(torch.float32).save_pretrained(tmp_path / "target")
    tiny_char_tokenizer().save_pretrained(tmp_path / "target")
    Eagle3Head.random(model.config, draft_vocab_size=DRAFT_VOCAB, seed=1).save_pretrained(tmp_path / "head")
    script = _load_script()
    rc = script.main(["--target", str(tmp_path / "target"), "--head", str(tmp_path / "head"), "--device", "cpu",
                      "--dtype", "float32", "--prompts", "2", "--max-new-tokens", "6", "--nodes", "8", "--depth", "3",
                      "--top-k", "3", "--baseline-prompts", "1", "--rules", "lossless,lenience:ell=0.5"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "target only: 1 prompts" in out
    rows = [line for line in out.splitlines() if line.startswith(("lossless", "lenience"))]
    assert len(rows) == 2 and all(line.split()[1] == "2" for line in rows)


def test_cli_generate_with_a_draft_head_matches_greedy_target_only(head, target, tmp_path, capsys):
    """``verispec generate --draft-head DIR`` on local files: greedy lossless output equals --baseline's."""
    import json

    from verispec.cli import main

    tok = tiny_char_tokenizer()
    target.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    head.save_pretrained(tmp_path / "head")
    common = ["generate", "--target", str(tmp_path / "target"), "--prompt", "hello there", "--no-chat",
              "--sampling", "temperature=0", "--max-new-tokens", "12", "--json", "--dtype", "float64"]
    assert main(common + ["--baseline"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert main(common + ["--draft-head", str(tmp_path / "head"), "--tree", "dynamic:top_k=3,depth=2,nodes=5"]) == 0
    sd = json.loads(capsys.readouterr().out)
    assert sd["tokens"] == base["tokens"] and sd["tree"] == "eagle3:top_k=3,depth=2,nodes=5"
    assert main(common + ["--draft-head", str(tmp_path / "head"), "--tree", "2,2"]) == 2
    assert "dynamic" in capsys.readouterr().err
