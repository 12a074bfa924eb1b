"""Batched SD throughput: tokens/s and target forwards at B = 1, 4, 16, ratios measured in one run.

The same prompts (more than the largest batch is not needed: 16 by default) are decoded with
continuous batching at each batch size, by lossless chain SD and by target-only sampling, each prompt
with its own seed (so every batch size produces the same tokens, up to batched model numerics).
Reported per batch size: new tokens, seconds, tokens/s and its ratio to B = 1, batched target
forwards, emitted tokens per target forward, mean rows per forward.

Parts: ``hf`` — small random Qwen2-architecture transformers models with the real 151,936-token
vocabulary on the CPU (or ``--device``); ``llama`` — the embedded Qwen2.5-Coder 1.5B / 0.5B pair with
llama.cpp on the CPU; ``cuda`` — the embedded pair dequantised by transformers on a CUDA device (when
one is visible).

Run: ``.venv/bin/python benchmarks/batch.py [--parts hf,llama,cuda] [--tokens 24] [--prompts 16]``.
``throughput`` and ``gpu_rows`` are the functions other scripts call (``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from verispec.runtime import tune_process

tune_process()

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine import tiny_qwen  # noqa: E402  (the same random models as the engine benchmark)

from verispec.engine.batch import generate_batch, generate_target_only_batch  # noqa: E402
from verispec.models.batch import BatchBackend, HFBatchBackend  # noqa: E402
from verispec.models.hf import HFBackend  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "Explain step by step: a train travels 60 km in 45 minutes. What is its speed in km/h?",
    "Write a function that merges two sorted lists into one sorted list, and test it.",
    "A shop sells pens at 3 for $2. How much do 18 pens cost? Show your reasoning.",
    "Write a SQL query that returns the ten most recent orders with their customer names.",
    "What is the difference between a list and a tuple in Python? Answer briefly.",
    "Implement binary search in Python and state its time complexity.",
    "Summarise in two sentences why the sky is blue.",
]
SAMPLING = "temperature=0.7,top_k=20,top_p=0.8"

#: make_rows(b) -> a batched backend with at least b rows (built for b, or one shared by all b).
RowsFactory = Callable[[int], BatchBackend]


class Untokenized(HFBackend):
    """Random models have no tokenizer; the timing needs none (text is not looked at)."""

    def detokenize(self, ids):
        return ""


def hf_rows(single: HFBackend) -> RowsFactory:
    """Batched transformers rows of exactly ``b`` (idle rows would be computed as padding)."""
    return lambda b: HFBatchBackend(single, batch_size=b)


def llama_rows(path, *, rows: int, n_ctx: int, n_threads: int | None = None) -> RowsFactory:
    """One llama.cpp context of ``rows`` sequences for every ``b <= rows`` (idle rows cost nothing)."""
    from verispec.models.batch import LlamaBatchBackend

    shared: list = []

    def make(b: int):
        if not shared:
            shared.append(LlamaBatchBackend(path, batch_size=rows, n_ctx=n_ctx, n_threads=n_threads))
        return shared[0]

    return make


def throughput(target: RowsFactory, draft: RowsFactory, prompts: Sequence[Sequence[int]], batch_sizes: Sequence[int],
               *, rule: str = "lossless", sampling: str | SamplingConfig = SAMPLING, gamma: int = 5,
               max_new_tokens: int = 32, seeds: int = 0, target_only: bool = True, vocab_width: int | None = None,
               deadline: float | None = None, warmup: bool = True) -> list[dict]:
    """One row (a dict) per mode and batch size: ``mode`` ("sd" or "target"), ``B``, ``tokens``, ``wall_s``
    (prefills included), ``tok_s``, ``vs_B1`` (tok/s over the same mode's first batch size), ``prefill_s``,
    ``decode_tok_s`` (tokens over the seconds outside prefills), ``target_forwards``,
    ``draft_forwards``, ``tokens_per_forward``, ``mean_rows``. ``target`` / ``draft``: factories of
    batched backends (:func:`hf_rows`, :func:`llama_rows`). Stops early (fewer rows) past ``deadline``
    (a ``time.perf_counter()`` value)."""
    sampling = SamplingConfig.parse(sampling) if isinstance(sampling, str) else sampling
    rows: list[dict] = []
    first: dict[str, float] = {}
    for b in batch_sizes:
        tb, db = target(b), draft(b)
        for mode in ("sd", "target") if target_only else ("sd",):
            if deadline is not None and time.perf_counter() > deadline:
                return rows
            common = dict(sampling=sampling, seeds=seeds, batch_size=b, vocab_width=vocab_width)
            if warmup:                     # first calls pay one-off costs (allocations, kernel selection)
                _run_once(mode, tb, db, prompts[:b], 2, rule, gamma, common)
            out = _run_once(mode, tb, db, prompts, max_new_tokens, rule, gamma, common)
            tps = out.tokens_per_s
            decode_s = max(out.wall_s - out.prefill_s, 1e-9)
            first.setdefault(mode, tps)
            rows.append(dict(mode=mode, B=b, tokens=out.new_tokens, wall_s=out.wall_s, tok_s=tps,
                             prefill_s=out.prefill_s, decode_tok_s=out.new_tokens / decode_s,
                             vs_B1=tps / first[mode] if first[mode] else float("nan"),
                             target_forwards=out.target_forwards, draft_forwards=out.draft_forwards,
                             tokens_per_forward=out.tokens_per_forward, mean_rows=out.mean_rows))
    return rows


def _run_once(mode: str, target: BatchBackend, draft: BatchBackend, prompts, max_new_tokens: int, rule: str,
              gamma: int, common: dict):
    if mode == "sd":
        return generate_batch(target, draft, prompts, rule=rule, gamma=gamma, max_new_tokens=max_new_tokens, **common)
    return generate_target_only_batch(target, prompts, max_new_tokens=max_new_tokens, **common)


def format_rows(rows: list[dict]) -> list[str]:
    head = (f"{'mode':7} {'B':>3} {'tokens':>7} {'seconds':>8} {'tok/s':>8} {'vs B=1':>7} {'prefill s':>9} "
            f"{'decode tok/s':>12} {'target fwd':>10} {'tok/fwd':>8} {'rows/fwd':>8} {'draft fwd':>9}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['mode']:7} {r['B']:3d} {r['tokens']:7d} {r['wall_s']:8.2f} {r['tok_s']:8.2f} "
                     f"{r['vs_B1']:7.2f} {r['prefill_s']:9.2f} {r['decode_tok_s']:12.2f} "
                     f"{r['target_forwards']:10d} {r['tokens_per_forward']:8.2f} "
                     f"{r['mean_rows']:8.2f} {r['draft_forwards']:9d}")
    return lines


def chat_prompts(backend, n: int) -> list[list[int]]:
    return [backend.chat_prompt(PROMPTS[i % len(PROMPTS)]) for i in range(n)]


def gpu_rows(target_path: str, draft_path: str, *, device: str = "cuda", dtype: str = "bfloat16",
             sampling: str = SAMPLING, gamma: int = 5, tokens: int = 128, batch_sizes: Sequence[int] = (1, 4, 16),
             deadline: float | None = None, rule: str = "lossless") -> Iterator[str]:
    """Lines of the batched throughput table on ``device`` for a transformers pair loaded from local
    paths (directories or ``.gguf`` files), ``max(batch_sizes)`` prompts."""
    from verispec.models import check_compatible

    t0 = time.perf_counter()
    target = HFBackend(target_path, device=device, dtype=dtype)
    draft = HFBackend(draft_path, device=device, dtype=dtype)
    width = check_compatible(target, draft)
    prompts = chat_prompts(target, max(batch_sizes))
    yield (f"{target.name} / {draft.name} on {device} ({dtype}), loaded in {time.perf_counter() - t0:.0f} s; "
           f"{rule}, γ={gamma}, {sampling}, {len(prompts)} prompts x {tokens} new tokens")
    rows = throughput(hf_rows(target), hf_rows(draft), prompts, batch_sizes, rule=rule, sampling=sampling, gamma=gamma,
                      max_new_tokens=tokens, vocab_width=width, deadline=deadline)
    yield from format_rows(rows)
    done = {r["B"] for r in rows}
    if set(batch_sizes) - done:
        yield f"(time budget spent: skipped B = {sorted(set(batch_sizes) - done)})"


def part_hf(args) -> None:
    target = Untokenized(tiny_qwen(256, 6, 1), device=args.device)
    draft = Untokenized(tiny_qwen(128, 2, 2), device=args.device)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1000, (24,), generator=gen).tolist() for _ in range(args.prompts)]
    print(f"== transformers, random Qwen2 (hidden 256 x 6 layers / 128 x 2), V=151,936, {args.device}; lossless "
          f"γ={args.gamma}, temperature=1, {len(prompts)} prompts x {args.tokens} new tokens")
    rows = throughput(hf_rows(target), hf_rows(draft), prompts, args.batch_sizes, sampling="temperature=1",
                      gamma=args.gamma, max_new_tokens=args.tokens, vocab_width=151_936)
    print("\n".join(format_rows(rows)))


def part_llama(args) -> None:
    from verispec.models import check_compatible, embedded_model_path

    big = max(args.batch_sizes)
    n_ctx = 512
    make_t = llama_rows(embedded_model_path("target"), rows=big, n_ctx=n_ctx, n_threads=args.threads)
    make_d = llama_rows(embedded_model_path("draft"), rows=big, n_ctx=n_ctx, n_threads=args.threads)
    target, draft = make_t(big), make_d(big)
    width = check_compatible(target, draft)
    prompts = chat_prompts(target, args.prompts)
    print(f"\n== llama.cpp, embedded pair (1.5B / 0.5B Q4_K_M), CPU, {target.n_threads} threads; lossless "
          f"γ={args.gamma}, {args.sampling}, {len(prompts)} prompts x {args.tokens} new tokens")
    rows = throughput(make_t, make_d, prompts, args.batch_sizes, sampling=args.sampling, gamma=args.gamma,
                      max_new_tokens=args.tokens, vocab_width=width)
    print("\n".join(format_rows(rows)))


def part_cuda(args) -> None:
    if not torch.cuda.is_available():
        print("\n== cuda: no CUDA device visible, skipped")
        return
    from verispec.models import embedded_model_path

    print(f"\n== cuda: {torch.cuda.get_device_name(0)}")
    for line in gpu_rows(str(embedded_model_path("target")), str(embedded_model_path("draft")), device="cuda",
                         sampling=args.sampling, gamma=args.gamma, tokens=args.tokens, batch_sizes=args.batch_sizes):
        print(line)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="hf,llama,cuda")
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--sampling", default=SAMPLING)
    ap.add_argument("--device", default="cpu", help="device of the hf part")
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads (default: all cores; on a busy machine 1 is often faster and steadier)")
    args = ap.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    parts = args.parts.split(",")
    if "hf" in parts:
        part_hf(args)
    if "llama" in parts:
        part_llama(args)
    if "cuda" in parts:
        part_cuda(args)


if __name__ == "__main__":
    main()
