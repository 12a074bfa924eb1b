"""Engine speed, printed as ratios measured in one run.

Part 1 (embedded pair, llama.cpp): target-only tokens/s vs chain SD with each rule; block efficiency;
the share of wall time outside model calls; measured c (draft/target cost per token) and v(γ) (cost
of verifying γ+1 tokens relative to one decoding step); the cost-model speedup BE/(γc + v(γ)).

Part 2 (transformers backend, same models for both sides): our lossless SD vs transformers' own
assisted generation (``assistant_model``) with a constant γ and with its default dynamic schedule,
all sampling at temperature 1, reporting our tokens/s over theirs. Default models: small randomly
initialised Qwen2-architecture models with the real 151,936-token vocabulary (``--hf-target`` /
``--hf-draft`` take hub ids, directories, GGUF files dequantised by transformers, or
``embedded-target`` / ``embedded-draft`` for the embedded pair).

Run: ``.venv/bin/python benchmarks/engine.py [--tokens N] [--gamma G] [--skip-llama] [--skip-hf]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from verispec.runtime import tune_openmp

tune_openmp()

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


def part_hf(args) -> None:
    from transformers import GenerationConfig

    from verispec.models.hf import HFBackend

    if args.hf_target:
        from pathlib import Path

        from transformers import AutoModelForCausalLM

        def load(spec: str):
            if spec == "embedded-target" or spec == "embedded-draft":
                from verispec.models import embedded_model_path

                spec = str(embedded_model_path(spec.split("-")[1]))
            if spec.endswith(".gguf"):   # dequantised to float32 by transformers
                path = Path(spec)
                return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
            return AutoModelForCausalLM.from_pretrained(spec).eval()

        target_model, draft_model = load(args.hf_target), load(args.hf_draft)
        label = f"{args.hf_target} / {args.hf_draft}"
    else:
        target_model, draft_model = tiny_qwen(256, 6, 1), tiny_qwen(128, 2, 1)
        label = "random Qwen2 (hidden 256 x 6 layers / 128 x 2), V=151,936"
    class Untokenized(HFBackend):
        """Random models have no tokenizer; the timing needs none (text is not looked at)."""

        def detokenize(self, ids):
            return ""

    target = Untokenized(target_model)
    draft = Untokenized(draft_model)
    prompt = torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(0))
    ids = prompt[0].tolist()
    sampling = SamplingConfig.parse("temperature=1")
    n = args.tokens

    width = min(target.vocab_size, draft.vocab_size)
    ours, constant, dynamic = [], [], []
    for rep in range(args.repeats):
        t = time.perf_counter()
        r = generate(target, draft, ids, rule="lossless", sampling=sampling, gamma=args.gamma, max_new_tokens=n,
                     seed=rep, vocab_width=width)
        ours.append((r.stats.new_tokens, time.perf_counter() - t, r.stats.block_efficiency))
        for schedule, sink in (("constant", constant), ("heuristic", dynamic)):
            # constant: γ drafts every step, as ours; heuristic: transformers' default dynamic schedule
            # (γ grows by 2 after a fully accepted block, shrinks by 1 otherwise) and confidence stop
            extra = ({"num_assistant_tokens": args.gamma, "assistant_confidence_threshold": 0.0}
                     if schedule == "constant" else {})
            gc = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n,
                                  min_new_tokens=n, num_assistant_tokens_schedule=schedule, **extra)
            torch.manual_seed(rep)
            t = time.perf_counter()
            out = target_model.generate(prompt, generation_config=gc, assistant_model=draft_model,
                                        attention_mask=torch.ones_like(prompt))
            sink.append((out.shape[1] - prompt.shape[1], time.perf_counter() - t))
    ours_tps = statistics.median(tok / s for tok, s, _ in ours)
    print(f"\n== transformers backend, {label}, lossless γ={args.gamma}, {n} new tokens, median of {args.repeats}")
    ours_be = statistics.median(be for *_, be in ours)
    print(f"verispec generate (HFBackend)                  {ours_tps:8.2f} tok/s   (BE {ours_be:.2f})")
    for name, runs in (("constant γ", constant), ("default dynamic schedule", dynamic)):
        tps = statistics.median(tok / s for tok, s in runs)
        print(f"transformers assisted, {name:24} {tps:8.2f} tok/s   ours / theirs {ours_tps / tps:5.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--hf-target", default=None)
    ap.add_argument("--hf-draft", default=None)
    args = ap.parse_args()
    if not args.skip_llama:
        part_llama(args)
    if not args.skip_hf:
        part_hf(args)


if __name__ == "__main__":
    main()
