#!/usr/bin/env python
"""One GPU check, ready to run on a CUDA machine with no network, in under 10 minutes, from local files.

Default pair: the embedded Qwen2.5-Coder 1.5B / 0.5B GGUF files (the PyPI chunk packages installed by
``scripts/setup.sh``), dequantised by transformers and run in bfloat16 on the GPU; ``--target`` /
``--draft`` take any local directory or ``.gguf`` file (``--device-map auto`` splits a large target
over the GPUs present). Prints, each measured in this one run:

1. target-only vs lossless SD tokens/s (and one lossy rule), block efficiency, and the cost-model
   speed-up ``BE / (γc + v(γ))`` from costs measured on this GPU, beside the measured one;
2. the engine's per-step rule cost on the device (pipeline on both models' rows, ``verify`` with a
   generator on the device, counts to the host) at V = 151,936, G = 5, B = 1 / 8 / 64 — the issue's
   aim is <= 0.5 ms at B = 1;
3. batched SD throughput at B = 1 / 4 / 16 (tokens/s and target calls), B = 16 over B = 1.

Run: ``python benchmarks/gpu_check.py [--target DIR|FILE.gguf] [--draft ...] [--tokens 128]
[--max-seconds 540]``. Each part checks the time left and says what it skipped.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # `benchmarks.*` helpers

from verispec.engine import generate, generate_target_only, measure_costs  # noqa: E402
from verispec.models import check_compatible  # noqa: E402
from verispec.models.hf import HFBackend  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "Explain step by step: a train travels 60 km in 45 minutes. What is its speed in km/h?",
    "Write a function that merges two sorted lists into one sorted list, and test it.",
    "A shop sells pens at 3 for $2. How much do 18 pens cost? Show your reasoning.",
]
SAMPLING = "temperature=0.7,top_k=20,top_p=0.8"
STEP_RULES = ["lossless", "block", "lenience:ell=0.5", "speccascade:p_base=0.3", "typical:eps=0.15"]


def model_path(spec: str) -> str:
    if spec in ("embedded-target", "embedded-draft"):
        from verispec.models import embedded_model_path

        return str(embedded_model_path(spec.split("-")[1]))
    return spec


def load(spec: str, args, device_map=None) -> HFBackend:
    return HFBackend(model_path(spec), device=args.device, dtype=args.dtype, device_map=device_map)


def part_decode(target, draft, args, deadline: float) -> None:
    width = check_compatible(target, draft)
    sampling = SamplingConfig.parse(args.sampling)
    ids = [target.chat_prompt(p) for p in PROMPTS[: args.prompts]]
    costs = measure_costs(target, draft, ids[0], args.gamma, repeats=5)
    print(f"\n== 1. decoding on {args.device} ({args.dtype}), {args.sampling}, γ = {args.gamma}, "
          f"{args.tokens} tokens x {len(ids)} prompts")
    print(f"measured costs: draft token {1000 * costs.draft_token:.1f} ms, target token "
          f"{1000 * costs.target_token:.1f} ms, block of {args.gamma + 1} {1000 * costs.target_block:.1f} ms "
          f"-> c = {costs.c:.3f}, v(γ) = {costs.v:.3f}")
    rows = []
    base_tps = None
    for label in ["target-only", "lossless", "lenience:ell=0.5"]:
        if time.perf_counter() > deadline:
            print(f"  (time budget spent: skipped {label} and after)")
            break
        tok = wall = calls = 0.0
        for k, prompt in enumerate(ids):
            if label == "target-only":
                res = generate_target_only(target, prompt, sampling=sampling, max_new_tokens=args.tokens, seed=k,
                                           vocab_width=width)
            else:
                res = generate(target, draft, prompt, rule=label, sampling=sampling, gamma=args.gamma,
                               max_new_tokens=args.tokens, seed=k, vocab_width=width, costs=costs)
            tok += res.stats.new_tokens
            wall += res.stats.wall_s
            calls += res.stats.target_calls
        tps = tok / wall if wall else float("nan")
        if label == "target-only":
            base_tps = tps
            rows.append((label, tps, 1.0, tok / calls, None))
        else:
            be = tok / calls
            rows.append((label, tps, tps / base_tps, be, costs.speedup(be)))
    print(f"  {'run':22} {'tok/s':>8} {'speed-up':>9} {'tok/call':>9} {'cost model':>11}")
    for label, tps, sp, be, model in rows:
        m = f"{model:11.2f}" if model is not None else f"{'':11}"
        print(f"  {label:22} {tps:8.1f} {sp:9.2f} {be:9.2f} {m}")


def part_rules(args, deadline: float) -> None:
    from benchmarks.rules import step_ms

    print(f"\n== 2. engine step on {args.device}: pipeline + verify + counts to host, V = 151,936, G = 5 (ms, "
          f"median of {args.repeats})")
    sampling = SamplingConfig.parse(args.sampling)
    batches = (1, 8, 64)
    print(f"  {'rule':28}" + "".join(f"{f'B={b}':>9}" for b in batches))
    for rule in STEP_RULES:
        if time.perf_counter() > deadline:
            print("  (time budget spent: skipped the remaining rules)")
            return
        cells = [step_ms(rule, sampling, b, 5, args.device, args.repeats) for b in batches]
        print(f"  {rule:28}" + "".join(f"{c:9.3f}" for c in cells))


def part_batch(args, deadline: float) -> None:
    print(f"\n== 3. batched SD throughput on {args.device}")
    try:
        from benchmarks.batch import gpu_rows
    except ImportError as e:   # pragma: no cover - reported, not fatal
        print(f"  skipped: batched decoding is not available here ({e})")
        return
    for line in gpu_rows(model_path(args.target), model_path(args.draft), device=args.device, dtype=args.dtype,
                         sampling=args.sampling, gamma=args.gamma, tokens=args.tokens, batch_sizes=(1, 4, 16),
                         deadline=deadline):
        print("  " + line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="embedded-target")
    ap.add_argument("--draft", default="embedded-draft")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device-map", default=None, help="e.g. auto: split the target over every GPU")
    ap.add_argument("--sampling", default=SAMPLING)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--max-seconds", type=float, default=540)
    ap.add_argument("--parts", default="decode,rules,batch")
    args = ap.parse_args()
    t0 = time.perf_counter()
    deadline = t0 + args.max_seconds
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("no CUDA device is visible: pass --device cpu to try the script on a CPU")
        print(f"GPU: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, torch {torch.__version__}")
    parts = args.parts.split(",")
    if "decode" in parts:
        target = load(args.target, args, device_map=args.device_map)
        draft = load(args.draft, args)
        print(f"loaded {target.name} and {draft.name} in {time.perf_counter() - t0:.0f} s")
        part_decode(target, draft, args, deadline)
        del target, draft
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if "rules" in parts:
        part_rules(args, deadline)
    if "batch" in parts:
        part_batch(args, deadline)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
