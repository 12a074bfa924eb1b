#!/usr/bin/env python
"""EAGLE-3 tree speculative decoding on one GPU: acceptance length, tokens per target call and tokens/s per rule.

Local files only (the machine has no network)::

    python scripts/eagle3_gpu.py --target /models/Llama-3.1-8B-Instruct \\
        --head /models/EAGLE3-LLaMA3.1-Instruct-8B \\
        --rules lossless,lenience:ell=0.5,speccascade:p_base=0.3

The target is a transformers model loaded in float16 on cuda through :class:`verispec.models.hf.HFBackend`
(capturing the hidden states the head fuses), the head an EAGLE-3 head in the authors' layout
(:class:`verispec.models.eagle3.Eagle3Head`). Every prompt is decoded once per rule with the same seed by
:func:`verispec.engine.generate` with ``head=`` (the engine's one SD loop): grow an EAGLE-2 dynamic tree with
the head, one target forward over the root and the tree, :func:`verispec.rules.tree.verify_tree` on
deterministic candidates, commit the accepted path.

Tree parameters follow verispec (``--tree dynamic:top_k=10,depth=5,nodes=60``): ``depth`` = deepest level,
``nodes`` = drafted nodes without the root. EAGLE's code with ``total_token=60, depth=5`` builds up to 59
nodes 6 levels deep: pass ``--nodes 59 --depth 6`` to reproduce it exactly.

Reported per rule (decode phase only; the prefill is timed apart, as in verispec's engine):
``tau`` = mean tokens per verification (accepted + 1, EAGLE's average acceptance length), ``tok/call`` =
new tokens per target call after the prefill (equal to tau up to the truncated last round), ``tok/s``, and
the speed-up over target-only decoding of ``--baseline-prompts`` prompts.

Sizing (the paper's setting: Llama-3.1-8B-Instruct + EAGLE-3 head, T = 0.7, 60 nodes, depth 5, top-10, on an
H200; must finish in < 10 minutes): loading 16 GB of fp16 weights from local disk takes ~0.5-1 min. A
round costs one head pass over the new committed tokens plus ``depth - 1`` head passes over 10 tree entries
(~2-3 ms each, launch-bound), one eager target forward over 61 tokens (~25-40 ms, 32 layers), and
sampling/verification of 61 rows of 128k logits on the GPU, where the logits are (~1-3 ms): ~30-50 ms.
EAGLE-3 accepts ~4-6 tokens per round at T = 0.7 on chat prompts (lossy rules more), so 8 prompts x 256
tokens = 2,048 tokens take ~15-30 s per rule; three rules plus two target-only baseline prompts (~8 s
each) fit in ~2-3 minutes, with room for a poor acceptance (2 tokens/round doubles it).
``--max-seconds`` (default 540) stops starting new prompts when the budget is spent and says so, so a
slow machine still reports partial numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from verispec.sampling import SamplingConfig

#: Chat prompts used when no --prompt-file is given (diverse MT-bench-like tasks).
PROMPTS = (
    "Write a short story about a lighthouse keeper who discovers a message in a bottle.",
    "Explain the difference between TCP and UDP, with an example of when to use each.",
    "Write a Python function that returns the longest palindromic substring of a string, and explain it.",
    "What are the main causes of inflation? Answer in a few paragraphs.",
    "Draft a polite email to a colleague asking to reschedule a meeting to next week.",
    "Solve step by step: a train travels 120 km in 1.5 hours, then 80 km in 1 hour. What is its average speed?",
    "Summarize the plot of Romeo and Juliet in five sentences.",
    "Give me a three-day itinerary for a first visit to Kyoto.",
    "Compare the advantages of renewable and nuclear energy for a country's power grid.",
    "Explain how a hash table works and what happens on a collision.",
    "Write a haiku sequence (three haiku) about the change of seasons.",
    "What is the derivative of x^3 * sin(x)? Show the steps.",
)


@dataclass
class Totals:
    """Engine statistics summed over prompts (decode phase: the engine's wall clock starts after the
    prefill)."""

    prompts: int = 0
    new_tokens: int = 0
    target_calls: int = 0
    steps: int = 0
    accepted: int = 0
    wall_s: float = 0.0

    def add(self, st) -> None:
        self.prompts += 1
        self.new_tokens += st.new_tokens
        self.target_calls += st.target_calls
        self.steps += sum(st.accepted_hist)
        self.accepted += sum(n * k for n, k in enumerate(st.accepted_hist))
        self.wall_s += st.wall_s

    @property
    def tau(self) -> float:
        """EAGLE's average acceptance length: accepted drafts + 1 per verification."""
        return (self.accepted + self.steps) / self.steps if self.steps else float("nan")

    @property
    def tokens_per_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")


def load_prompts(n: int, path: str | None) -> list[str]:
    """``n`` user messages: lines of a text file, or ``prompt``/``question``/``turns[0]`` of a JSONL file,
    else the built-in :data:`PROMPTS` (cycled)."""
    if path is None:
        pool = list(PROMPTS)
    else:
        pool = []
        for line in Path(path).read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            if path.endswith(".jsonl"):
                row = json.loads(line)
                text = row.get("prompt") or row.get("question") or (row.get("turns") or [None])[0]
                if text:
                    pool.append(str(text))
            else:
                pool.append(line)
        if not pool:
            raise ValueError(f"no prompts in {path}")
    return [pool[i % len(pool)] for i in range(n)]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="local directory of the transformers target")
    ap.add_argument("--head", required=True, help="local directory of the EAGLE-3 head (config.json + weights)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per rule (default 8)")
    ap.add_argument("--prompt-file", default=None, help="text (one prompt a line) or JSONL file; default built-in")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling of the target (1 = off)")
    ap.add_argument("--nodes", type=int, default=60, help="drafted nodes per tree, root excluded")
    ap.add_argument("--depth", type=int, default=5, help="deepest tree level")
    ap.add_argument("--top-k", type=int, default=10, help="children per expanded node / nodes expanded per level")
    ap.add_argument("--rules", default="lossless,lenience:ell=0.5,speccascade:p_base=0.3",
                    help="comma-separated rule specs (verispec.rules)")
    ap.add_argument("--baseline-prompts", type=int, default=2, help="prompts decoded by the target alone (0 = none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--max-seconds", type=float, default=540.0, help="stop starting new prompts after this")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = parse_args(argv)
    t_start = time.perf_counter()

    from transformers import AutoConfig

    from verispec.engine import generate, generate_target_only
    from verispec.models.eagle3 import Eagle3Drafter, Eagle3Head
    from verispec.models.hf import HFBackend
    from verispec.rules import get as get_rule
    from verispec.rules import split_specs

    rules = [get_rule(s) for s in split_specs(args.rules)]
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p)
    dtype = getattr(torch, args.dtype)
    target_config = AutoConfig.from_pretrained(args.target)
    head = Eagle3Head.from_pretrained(args.head, target_config=target_config, device=args.device, dtype=dtype)
    try:
        target = HFBackend(args.target, device=args.device, dtype=dtype, capture_hidden=head.target_layers)
    except TypeError as e:
        raise SystemExit(f"HFBackend has no capture_hidden yet ({e}); this script needs it") from None
    drafter = Eagle3Drafter(head, target.model.get_input_embeddings(), top_k=args.top_k, depth=args.depth,
                            nodes=args.nodes)
    prompts = [target.chat_prompt(m) for m in load_prompts(args.prompts, args.prompt_file)]
    gpu = torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else args.device
    print(f"# {gpu}; target {args.target}; head {args.head} (layers {head.target_layers}, draft vocab "
          f"{head.config.draft_vocab_size}); load {time.perf_counter() - t_start:.0f} s", flush=True)
    print(f"# sampling {sampling.spec()}; tree dynamic:top_k={args.top_k},depth={args.depth},nodes={args.nodes}; "
          f"{len(prompts)} prompts x {args.max_new_tokens} tokens", flush=True)

    def out_of_time() -> bool:
        return time.perf_counter() - t_start > args.max_seconds

    def sd(rule, ids, max_new, seed):
        return generate(target, None, ids, rule=rule, sampling=sampling, head=drafter, max_new_tokens=max_new,
                        seed=seed).stats

    # Warm-up (CUDA kernels, allocator) on a short decoding, not timed.
    sd(rules[0], prompts[0], 16, 0)

    base = Totals()
    for i, ids in enumerate(prompts[: args.baseline_prompts]):
        if out_of_time():
            break
        base.add(generate_target_only(target, ids, sampling=sampling, max_new_tokens=args.max_new_tokens,
                                      seed=args.seed + i).stats)
    if base.prompts:
        print(f"target only: {base.prompts} prompts, {base.new_tokens} tokens, {base.tokens_per_s:.1f} tok/s",
              flush=True)

    header = f"{'rule':<28} {'prompts':>7} {'tokens':>7} {'tau':>6} {'tok/call':>8} {'tok/s':>8} {'speedup':>8}"
    print(header, flush=True)
    for rule in rules:
        total = Totals()
        for i, ids in enumerate(prompts):
            if out_of_time():
                break
            total.add(sd(rule, ids, args.max_new_tokens, args.seed + i))
        speed = total.tokens_per_s / base.tokens_per_s if base.prompts and total.prompts else float("nan")
        print(f"{rule.spec():<28} {total.prompts:>7} {total.new_tokens:>7} {total.tau:>6.2f} "
              f"{total.tokens_per_call:>8.2f} {total.tokens_per_s:>8.1f} {speed:>8.2f}", flush=True)
    if out_of_time():
        print(f"# stopped early: --max-seconds {args.max_seconds:.0f} reached (rows with fewer prompts are partial)")
    print(f"# total {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
