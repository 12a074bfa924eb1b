"""What batch size does to greedy outputs on llama.cpp, and what ``--batch-invariant`` costs.

The same prompts are decoded greedily (target-only and lossless chain SD, γ = 3) by the embedded
Qwen2.5-Coder 1.5B / 0.5B pair on llama.cpp in four ways, ratios measured in one run:

* ``one at a time``: :func:`verispec.engine.generate` on single-sequence backends (``bench`` without
  ``--batch-size``);
* ``batch 1``: continuous batching with one row (``--batch-size 1``);
* ``batch B``: ``B`` rows per model call (``--batch-size B``);
* ``batch B invariant``: ``B`` rows, each computed alone (``--batch-size B --batch-invariant``).

Printed per way: seconds, new tokens/s and its ratio to ``batch B`` (the cost of invariance), and how
many outputs equal those of ``batch 1`` and of ``one at a time`` token for token (bitwise logits give
equal greedy outputs; batched rows round differently, so near-ties can split).

Run: ``.venv/bin/python benchmarks/batch_invariance.py [--batch 4] [--prompts 8] [--tokens 32] [--threads N]``.
"""

from __future__ import annotations

import argparse
import time

from verispec.runtime import tune_process

tune_process()

from verispec.engine import generate, generate_target_only  # noqa: E402
from verispec.engine.batch import generate_batch, generate_target_only_batch  # noqa: E402
from verispec.models import check_compatible  # noqa: E402
from verispec.models.batch import LlamaBatchBackend  # noqa: E402
from verispec.models.embedded import embedded_model_path  # noqa: E402
from verispec.models.llama import LlamaBackend  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences what a hash table is.",
    "Write a Python function is_prime(n).",
    "List three uses of a binary search tree.",
    "Write a shell command that counts the lines of every .py file in a folder.",
    "What does the Python keyword 'yield' do?",
    "Write a SQL query that returns the ten most recent orders.",
    "Write a Python function that reverses the words of a sentence.",
    "What is the difference between a list and a tuple in Python?",
    "Write a Python class for a stack with push, pop and peek.",
    "Explain what a race condition is.",
    "Write a regular expression that matches an e-mail address.",
]
GREEDY = SamplingConfig.parse("temperature=0")


def run_single(target, draft, prompts, tokens, width):
    out = {"target_only": [], "lossless": []}
    for ids in prompts:
        out["target_only"].append(generate_target_only(target, ids, sampling=GREEDY, max_new_tokens=tokens,
                                                       vocab_width=width).tokens)
        out["lossless"].append(generate(target, draft, ids, rule="lossless", sampling=GREEDY, gamma=3,
                                        max_new_tokens=tokens, vocab_width=width).tokens)
    return out


def run_batched(target, draft, prompts, tokens, width, batch):
    common = dict(sampling=GREEDY, max_new_tokens=tokens, seeds=0, batch_size=batch, vocab_width=width)
    return {"target_only": [r.tokens for r in generate_target_only_batch(target, prompts, **common)],
            "lossless": [r.tokens for r in generate_batch(target, draft, prompts, rule="lossless", gamma=3, **common)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    ap.add_argument("--n-ctx", type=int, default=512)
    args = ap.parse_args()
    paths = embedded_model_path("target"), embedded_model_path("draft")
    texts = (PROMPTS * (args.prompts // len(PROMPTS) + 1))[: args.prompts]
    kw = dict(n_ctx=args.n_ctx, n_threads=args.threads)

    results, seconds = {}, {}
    single = LlamaBackend(paths[0], **kw), LlamaBackend(paths[1], **kw)
    width = check_compatible(*single)
    prompts = [single[0].chat_prompt(t) for t in texts]
    t0 = time.perf_counter()
    results["one at a time"] = run_single(*single, prompts, args.tokens, width)
    seconds["one at a time"] = time.perf_counter() - t0
    for be in single:
        be.close()
    for name, batch, invariant in (("batch 1", 1, False), (f"batch {args.batch}", args.batch, False),
                                   (f"batch {args.batch} invariant", args.batch, True)):
        pair = [LlamaBatchBackend(p, batch_size=batch, invariant=invariant, **kw) for p in paths]
        t0 = time.perf_counter()
        results[name] = run_batched(*pair, prompts, args.tokens, width, batch)
        seconds[name] = time.perf_counter() - t0
        for be in pair:
            be.close()

    n_tokens = {k: sum(len(t) for v in r.values() for t in v) for k, r in results.items()}
    base = f"batch {args.batch}"
    speed = {k: n_tokens[k] / seconds[k] for k in results}
    print(f"{args.prompts} prompts x {args.tokens} tokens, greedy target-only + lossless SD (γ=3), embedded pair, "
          f"llama.cpp, {single[0].n_threads} threads")
    print(f"{'decoding':24} {'seconds':>8} {'tok/s':>7} {'vs ' + base:>12}   equal to batch 1 / to one at a time "
          "(target-only; lossless)")
    for k in results:
        eq = []
        for ref in ("batch 1", "one at a time"):
            eq.append("; ".join(f"{sum(a == b for a, b in zip(results[k][m], results[ref][m]))}/{len(prompts)}"
                                for m in ("target_only", "lossless")))
        print(f"{k:24} {seconds[k]:8.1f} {speed[k]:7.2f} {speed[k] / speed[base]:11.2f}x   {eq[0]:>9} / {eq[1]}")


if __name__ == "__main__":
    main()
