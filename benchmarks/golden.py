"""Reference outputs of the engine, to show that a refactoring changed no behaviour.

Runs a fixed set of generations -- every draft source (draft-model chains, static and dynamic trees,
prompt lookup, an EAGLE-3 head), every γ policy (fixed, auto, draft-stop, auto stop), raw-distribution
rules, observers, batched decoding -- on the fake models of the tests, on tiny random transformers models
and (with ``--embedded``) on the embedded llama.cpp pair, and writes their tokens and statistics (no
times) as JSON. Run it before and after a change and compare the files byte for byte:

    .venv/bin/python benchmarks/golden.py --out before.json [--embedded]
    ... change ...
    .venv/bin/python benchmarks/golden.py --out after.json [--embedded]
    cmp before.json after.json
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.fake_lm import FakeLM  # noqa: E402
from verispec.engine import CostProfile, generate, generate_target_only  # noqa: E402
from verispec.engine.batch import generate_batch, generate_target_only_batch  # noqa: E402
from verispec.engine.ngram import NgramDrafter  # noqa: E402
from verispec.models.batch import RowsOfBackends  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402

T1 = SamplingConfig.parse("temperature=1")
T07 = SamplingConfig.parse("temperature=0.7,top_k=20,top_p=0.8")
GREEDY = SamplingConfig.parse("temperature=0")
#: A profile where drafting pays (cheap draft, flat verification), and one where it does not.
CHEAP = CostProfile(draft_token=0.005, target_block=tuple(0.05 * (1.0 + 0.1 * g) for g in range(9)))
DEAR = CostProfile(draft_token=0.03,
                   target_block=tuple(0.05 * x for x in [1.0, 1.66, 2.11, 2.5, 3.11, 3.6, 4.14, 4.31, 4.78]))
STAT_FIELDS = ("new_tokens", "target_calls", "draft_calls", "accepted_hist", "gamma_hist", "position_accepted",
               "stop_reason", "tree_nodes", "lookup_steps", "lookup_accepted", "gamma", "gamma_policy", "tree", "rule",
               "mode", "cost_model_speedup")


def _stats(stats) -> dict:
    out = {}
    for f in STAT_FIELDS:
        v = getattr(stats, f, None)
        out[f] = round(v, 9) if isinstance(v, float) else v
    return out


def _res(res) -> dict:
    return {"tokens": list(res.tokens), "text": res.text, "stats": _stats(res.stats)}


class _Digest:
    """An observer that hashes everything it sees (``p``, ``q``, drafts, paths)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.n = 0

    def add(self, *tensors) -> None:
        self.n += 1
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.h.update(t.detach().cpu().contiguous().to(torch.float64).numpy().tobytes())
            else:
                self.h.update(json.dumps(t).encode())

    def chain(self, p, q, draft, n) -> None:
        self.add(p, q, draft, n)

    def tree(self, step) -> None:
        pr = step.proposal
        self.add(step.p, pr.q if pr.q is not None else [], pr.tokens, pr.parents, step.path, step.next_token)


def _watch(chain: _Digest | None, tree: _Digest | None) -> dict:
    """Observer keywords of ``generate``: ``observers`` of :class:`VerifiedStep` (or, before they
    replaced them, the chain ``observer`` and the ``tree_observer``)."""
    if "observers" not in inspect.signature(generate).parameters:
        return {"observer": chain.chain if chain else None, "tree_observer": tree.tree if tree else None}

    def watch(step):
        if tree is not None:
            tree.tree(step)
        if chain is not None and step.chain() is not None:
            chain.chain(*step.chain())

    return {"observers": [watch]}


def fake_cases() -> dict:
    out = {}
    t, d = FakeLM(vocab=6, seed=1, eos=5), FakeLM(vocab=6, seed=2, eos=5)
    prompt = [0, 1, 2]
    out["target_only"] = [_res(generate_target_only(t, prompt, sampling=s, max_new_tokens=30, seed=k))
                          for s in (T1, GREEDY) for k in range(3)]
    rules = ["lossless", "lenience:ell=0.5", "speccascade:p_base=0.3", "typical:eps=0.15", "cos_we:lam=0.5",
             "ceiling:kappa=2,base=we,lam=0.5", "strict", "greedy", "block", "hsd", "mentored:D=0.1",
             "mentored:alpha=0.5", "fuzzy:T=0.4,div=js", "kl_judge:tau=0.5", "sglang:single=0.5,acc=0.8",
             "relaxed:top_k=3,delta=0.6", "bild:alpha=3", "cos_cd:mu=0.5", "hsd_mincap"]
    for rule in rules:
        for s_name, s in (("t1", T1), ("t07", T07)):
            key = f"chain/{rule}/{s_name}"
            try:
                out[key] = [_res(generate(t, d, prompt, rule=rule, sampling=s, gamma=g, max_new_tokens=30, seed=k))
                            for g in (1, 4) for k in range(2)]
            except (ValueError, KeyError) as e:
                out[key] = f"error: {type(e).__name__}: {e}"
    obs = _Digest()
    tobs = _Digest()
    out["observers"] = _res(generate(t, d, prompt, rule="lossless", sampling=T1, gamma=3, max_new_tokens=30, seed=7,
                                     **_watch(obs, tobs)))
    out["observers_digest"] = [obs.h.hexdigest(), obs.n, tobs.h.hexdigest(), tobs.n]
    for tree in ("topk:2,2,1", "iid:3,1", "wor:2,2", "dynamic:top_k=3,depth=4,nodes=8", "chain:3"):
        for rule in ("lossless", "lenience:ell=0.5"):
            key = f"tree/{tree}/{rule}"
            try:
                tobs = _Digest()
                out[key] = [_res(generate(t, d, prompt, rule=rule, sampling=T1, tree=tree, max_new_tokens=25, seed=k,
                                          **_watch(None, tobs))) for k in range(2)] + [tobs.h.hexdigest()]
            except (ValueError, KeyError) as e:
                out[key] = f"error: {type(e).__name__}: {e}"
    rep = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    for draft in (d, None):
        for g in (3, "auto"):
            key = f"lookup/draft={draft is not None}/gamma={g}"
            out[key] = [_res(generate(t, draft, rep, rule="lossless", sampling=T1, gamma=g, max_new_tokens=30, seed=k,
                                      lookup=NgramDrafter(max_tokens=4), costs=CHEAP)) for k in range(2)]
    for prof_name, prof in (("cheap", CHEAP), ("dear", DEAR)):
        for stop in (0.0, 0.3, "auto"):
            for g in (4, "auto"):
                key = f"policy/{prof_name}/stop={stop}/gamma={g}"
                try:
                    out[key] = [_res(generate(t, d, prompt, rule="lossless", sampling=T1, gamma=g, draft_stop=stop,
                                              costs=prof, max_new_tokens=40, seed=k)) for k in range(2)]
                except ValueError as e:
                    out[key] = f"error: {e}"
    # raw-distribution rules (they read the untruncated temperature-1 distributions)
    for rule in ("fuzzy:T=0.4,div=js,on=raw", "kl_judge:tau=0.5,on=raw", "fly"):
        key = f"raw/{rule}"
        try:
            out[key] = [_res(generate(t, d, prompt, rule=rule, sampling=T07, gamma=3, max_new_tokens=25, seed=k))
                        for k in range(2)]
        except (ValueError, KeyError) as e:
            out[key] = f"error: {type(e).__name__}: {e}"
    # batches
    rows_t = RowsOfBackends([FakeLM(vocab=6, seed=1, eos=5) for _ in range(3)])
    rows_d = RowsOfBackends([FakeLM(vocab=6, seed=2, eos=5) for _ in range(3)])
    prompts = [[0], [1, 2], [3, 4, 0], [2], [1]]
    for rule in ("lossless", "lenience:ell=0.5", "block"):
        b = generate_batch(rows_t, rows_d, prompts, rule=rule, sampling=T1, gamma=3, max_new_tokens=20, seeds=5)
        out[f"batch/{rule}"] = [_res(r) for r in b]
    b = generate_target_only_batch(rows_t, prompts, sampling=T1, max_new_tokens=20, seeds=5)
    out["batch/target_only"] = [_res(r) for r in b]
    return out


def hf_cases() -> dict:
    from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model
    from verispec.models.eagle3 import Eagle3Drafter, Eagle3Head
    from verispec.models.hf import HFBackend

    out = {}
    tok = tiny_char_tokenizer()
    target = HFBackend(tiny_hf_model("qwen2", vocab_width=128, hidden=32, seed=1, init_range=0.2), tokenizer=tok)
    draft = HFBackend(tiny_hf_model("llama", vocab_width=len(tok), hidden=16, seed=2, init_range=0.2), tokenizer=tok)
    prompt = tok.encode("def add(a, b):")
    out["target_only"] = [_res(generate_target_only(target, prompt, sampling=T1, max_new_tokens=20, seed=k))
                          for k in range(2)]
    for rule in ("lossless", "lenience:ell=0.5", "speccascade:p_base=0.3"):
        out[f"chain/{rule}"] = [_res(generate(target, draft, prompt, rule=rule, sampling=T07, gamma=4,
                                              max_new_tokens=20, seed=k)) for k in range(2)]
    out["tree/dynamic"] = [_res(generate(target, draft, prompt, rule="lossless", sampling=T1,
                                         tree="dynamic:top_k=3,depth=3,nodes=8", max_new_tokens=20, seed=k))
                           for k in range(2)]
    out["auto"] = [_res(generate(target, draft, prompt, rule="lossless", sampling=T1, gamma="auto", draft_stop="auto",
                                 costs=CHEAP, max_new_tokens=20, seed=k)) for k in range(2)]
    m = tiny_hf_model("llama", vocab_width=99, hidden=32, layers=8, seed=3, init_range=0.2)
    head = Eagle3Head.random(m.config, draft_vocab_size=40, seed=1, init_std=0.3, dtype=torch.float64)
    backend = HFBackend(m, tokenizer=tok, capture_hidden=head.target_layers)
    drafter = Eagle3Drafter(head, m.get_input_embeddings(), top_k=4, depth=3, nodes=12)
    p2 = tok.encode("hello there, tiny model")
    out["eagle3"] = [_res(generate(backend, None, p2, rule=r, sampling=s, head=drafter, max_new_tokens=20, seed=1))
                     for r, s in (("lossless", GREEDY), ("lenience:ell=0.5", T07))]
    out["eagle3+lookup"] = _res(generate(backend, None, p2, rule="lossless", sampling=GREEDY, head=drafter,
                                         lookup=NgramDrafter(max_tokens=3), max_new_tokens=20))
    return out


def embedded_cases() -> dict:
    from verispec.models import load_backend

    out = {}
    target = load_backend(None, role="target", n_ctx=1024)
    draft = load_backend(None, role="draft", n_ctx=1024)
    ids = target.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    out["target_only"] = [_res(generate_target_only(target, ids, sampling=s, max_new_tokens=24, seed=1))
                          for s in (GREEDY, T07)]
    for rule in ("lossless", "lenience:ell=0.5", "speccascade:p_base=0.3"):
        out[f"chain/{rule}"] = _res(generate(target, draft, ids, rule=rule, sampling=T07, gamma=3, max_new_tokens=24,
                                             seed=1))
    out["tree"] = _res(generate(target, draft, ids, rule="lossless", sampling=GREEDY,
                                tree="dynamic:top_k=3,depth=3,nodes=6", max_new_tokens=24))
    out["lookup"] = _res(generate(target, None, ids + ids, rule="lossless", sampling=GREEDY, gamma=3,
                                  lookup=NgramDrafter(max_tokens=3), max_new_tokens=24))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--embedded", action="store_true", help="also the embedded llama.cpp pair (slower)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    data = {"fake": fake_cases(), "hf": hf_cases()}
    if args.embedded:
        data["embedded"] = embedded_cases()
    Path(args.out).write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False))
    n = sum(len(v) for v in data.values())
    print(f"{n} cases written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
