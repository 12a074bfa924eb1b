"""Engine speed, printed as ratios measured in one run.

Part 1 (embedded pair, llama.cpp): target-only tokens/s vs chain SD with each rule; block efficiency;
the share of wall time outside model calls; measured c (draft/target cost per token) and v(γ) (cost
of verifying γ+1 tokens relative to one decoding step); the cost-model speedup BE/(γc + v(γ)).

verispec against transformers' own assisted generation (same models on both sides) is
``benchmarks/assisted.py``; ``tiny_qwen`` (small random Qwen2 models with the real vocabulary) is
shared with ``benchmarks/batch.py``.

Run: ``.venv/bin/python benchmarks/engine.py [--tokens N] [--gamma G]``.
"""

from __future__ import annotations

import argparse

from verispec.runtime import tune_process

tune_process()

import torch  # noqa: E402

from verispec.engine import generate, generate_target_only, measure_costs  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "Explain step by step: a train travels 60 km in 45 minutes. What is its speed in km/h?",
]
RULES = ["lossless", "block", "lenience:ell=0.5", "cos_we:lam=0.5", "ceiling:kappa=2,base=we,lam=0.5",
         "speccascade:p_base=0.3", "typical:eps=0.15"]


def part_llama(args) -> None:
    from verispec.models import check_compatible, load_backend

    target, draft = load_backend(None, role="target"), load_backend(None, role="draft")
    width = check_compatible(target, draft)
    sampling = SamplingConfig.parse(args.sampling)
    ids = [target.chat_prompt(p) for p in PROMPTS]
    costs = measure_costs(target, draft, ids[0], args.gamma, repeats=7)
    print(f"== embedded pair (llama.cpp, {target.n_threads} threads), {args.sampling}, γ={args.gamma}, "
          f"{args.tokens} new tokens x {len(PROMPTS)} prompts")
    print(f"measured: draft token {1000 * costs.draft_token:.1f} ms, target token {1000 * costs.target_token:.1f} ms, "
          f"target block of {args.gamma + 1} {1000 * costs.target_block:.1f} ms "
          f"-> c = {costs.c:.3f}, v(γ) = {costs.v:.3f}")

    def totals(results):
        tok = sum(r.stats.new_tokens for r in results)
        wall = sum(r.stats.wall_s for r in results)
        calls = sum(r.stats.target_calls for r in results)
        outside = sum(r.stats.other_s for r in results)
        return tok, wall, calls, outside

    base = [generate_target_only(target, i, sampling=sampling, max_new_tokens=args.tokens, seed=s, vocab_width=width)
            for s, i in enumerate(ids)]
    tok, wall, calls, outside = totals(base)
    base_tps = tok / wall
    print(f"{'mode':36} {'tok/s':>7} {'vs target':>9} {'BE':>6} {'outside models':>15} {'cost-model speedup':>19}")
    print(f"{'target-only':36} {base_tps:7.2f} {1:9.2f} {tok / calls:6.2f} {outside / wall:14.1%} {'1.00':>19}")
    for spec in RULES:
        res = [generate(target, draft, i, rule=spec, sampling=sampling, gamma=args.gamma, max_new_tokens=args.tokens,
                        seed=s, vocab_width=width, costs=costs) for s, i in enumerate(ids)]
        tok, wall, calls, outside = totals(res)
        be = tok / calls
        print(f"{spec:36} {tok / wall:7.2f} {tok / wall / base_tps:9.2f} {be:6.2f} {outside / wall:14.1%} "
              f"{costs.speedup(be):19.2f}")


def tiny_qwen(hidden: int, layers: int, seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=151_936, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    part_llama(ap.parse_args())


if __name__ == "__main__":
    main()
