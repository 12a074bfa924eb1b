"""The embedded pair through vLLM with the verispec plug-in beside verispec's own engine: same prompts, rules.

Run with the vLLM environment: ``.venv-vllm/bin/python benchmarks/vllm_engine.py`` (``--rules
lossless,lenience:ell=0.5,speccascade:p_base=0.3 --gamma 5 --max-new-tokens 64 --prompts 4``). The embedded
Qwen2.5-Coder 1.5B / 0.5B pair is dequantised once to float32 safetensors (verispec.integrations.vllm.models), and
both engines run those same weights: vLLM (CPU build) with a draft model and probabilistic drafts, the plug-in
verifying; verispec's own engine with its transformers backend. Per rule and engine: emitted tokens per target call
(block efficiency, the bonus token included) and tokens/s, one prompt at a time on both sides; vLLM also with all
prompts in one batch. Target-only decoding gives each engine's speed reference. The two engines run one after the
other (each holds both models in memory). Figures are from one run on this machine; compare ratios.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python class for a stack with push, pop, peek and is_empty methods.",
    "Write a Python function that counts the words in a text and returns the 3 most common ones.",
    "Write a Python function that converts a Roman numeral to an integer.",
]


def run_vllm(target: str, draft: str, prompts: list[list[int]], rules: list[str], sampling: str, gamma: int,
             max_new: int) -> dict:
    from verispec.integrations.vllm import make_llm, make_target_llm
    from verispec.integrations.vllm.generate import generate

    kw = dict(dtype="float32", enforce_eager=True, max_model_len=2048, seed=0)
    rows = {}
    llm = make_target_llm(target, **kw)
    for batched in (False, True):
        t0 = time.perf_counter()
        res = (generate(llm, prompts, sampling=sampling, rule=None, max_new_tokens=max_new) if batched else
               [r for p in prompts for r in generate(llm, [p], sampling=sampling, rule=None, max_new_tokens=max_new)])
        rows[("target-only", batched)] = _summary(res, time.perf_counter() - t0)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    llm = make_llm(target, speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": gamma,
                                               "draft_sample_method": "probabilistic"},
                   per_request_spec_decode_metrics="detailed", **kw)
    for rule in rules:
        for batched in (False, True):
            t0 = time.perf_counter()
            res = (generate(llm, prompts, sampling=sampling, rule=rule, gamma=gamma, max_new_tokens=max_new)
                   if batched else [r for p in prompts for r in generate(llm, [p], sampling=sampling, rule=rule,
                                                                         gamma=gamma, max_new_tokens=max_new)])
            rows[(rule, batched)] = _summary(res, time.perf_counter() - t0)
    llm.llm_engine.engine_core.shutdown()
    return rows


def run_verispec(target: str, draft: str, prompts: list[list[int]], rules: list[str], sampling: str, gamma: int,
                 max_new: int) -> dict:
    from verispec.engine import generate, generate_target_only
    from verispec.models import check_compatible
    from verispec.models.hf import HFBackend
    from verispec.sampling import SamplingConfig

    cfg = SamplingConfig.parse(sampling)
    t, d = HFBackend(target, dtype="float32"), HFBackend(draft, dtype="float32")
    width = check_compatible(t, d)
    rows = {}
    t0 = time.perf_counter()
    res = [generate_target_only(t, p, sampling=cfg, max_new_tokens=max_new, seed=i, vocab_width=width)
           for i, p in enumerate(prompts)]
    rows[("target-only", False)] = _summary(res, time.perf_counter() - t0)
    for rule in rules:
        t0 = time.perf_counter()
        res = [generate(t, d, p, rule=rule, sampling=cfg, gamma=gamma, max_new_tokens=max_new, seed=i,
                        vocab_width=width) for i, p in enumerate(prompts)]
        rows[(rule, False)] = _summary(res, time.perf_counter() - t0)
    return rows


def _summary(results, seconds: float) -> dict:
    tokens = sum(r.stats.new_tokens for r in results)
    calls = sum(r.stats.target_calls for r in results)
    row = {"tokens": tokens, "calls": calls, "be": tokens / calls if calls else float("nan"), "tok_s": tokens / seconds}
    print(f"  measured: {row}", flush=True)          # progress: the table comes at the end
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rules", default="lossless,lenience:ell=0.5,speccascade:p_base=0.3")
    ap.add_argument("--sampling", default="temperature=0.7")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--target", default=None, help="model directory (default: the embedded target, dequantised)")
    ap.add_argument("--draft", default=None, help="model directory (default: the embedded draft, dequantised)")
    ap.add_argument("--only", choices=("vllm", "verispec"), default=None)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

    from transformers import AutoTokenizer

    from verispec import rules as R
    from verispec.integrations.vllm.models import vllm_model

    target = args.target or vllm_model(None, "target")
    draft = args.draft or vllm_model(None, "draft")
    rules = R.split_specs(args.rules)
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False)
               for text in PROMPTS[: args.prompts]]
    print(f"embedded pair (float32): {target} / {draft}; sampling {args.sampling}, γ = {args.gamma}, "
          f"{len(prompts)} prompts x {args.max_new_tokens} new tokens")
    tables = {}
    if args.only in (None, "vllm"):
        tables["vLLM + plug-in"] = run_vllm(target, draft, prompts, rules, args.sampling, args.gamma,
                                            args.max_new_tokens)
        gc.collect()
    if args.only in (None, "verispec"):
        tables["verispec (transformers)"] = run_verispec(target, draft, prompts, rules, args.sampling, args.gamma,
                                                        args.max_new_tokens)
    print(f"\n{'engine':24} {'rule':26} {'batch':6} {'tokens':>6} {'calls':>6} {'tok/call':>8} {'tok/s':>7} "
          f"{'vs own target-only':>18}")
    for engine, rows in tables.items():
        for (rule, batched), r in rows.items():
            base = rows.get(("target-only", batched))
            ratio = r["tok_s"] / base["tok_s"] if base else float("nan")
            print(f"{engine:24} {rule:26} {'all' if batched else '1':6} {r['tokens']:6d} {r['calls']:6d} "
                  f"{r['be']:8.2f} {r['tok_s']:7.2f} {ratio:17.2f}x")


if __name__ == "__main__":
    main()
