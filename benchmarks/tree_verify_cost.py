"""Cost of one target forward over a draft tree of n nodes (llama.cpp, embedded target GGUF).

Part 1: plain one-token decoding with the tree-capable context (``n_seq_max = 256``, unified KV cache)
against the plain one-sequence context (``max_tree_nodes=0``), interleaved, to show the context change
costs nothing.  Part 2: median wall time of ``forward_tree`` over a top-k shaped tree of n nodes
(depth <= 5), and of a chain of n nodes through ``forward_tree`` and through ``forward``, each as a
ratio to a one-token forward.  Settings are interleaved round by round so a busy machine slows them
alike.

    .venv/bin/python benchmarks/tree_verify_cost.py [--rounds 7] [--n-threads 2] [--sizes 1,2,4,...]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time

from verispec.runtime import tune_process

tune_process()

from verispec.models.embedded import embedded_model_path  # noqa: E402
from verispec.models.llama import LlamaBackend  # noqa: E402

PROMPT = "Write a Python function that checks whether a string is a palindrome, with a docstring."
SIZES = "1,2,4,6,8,12,16,24,32,48,64"
MAX_DEPTH = 5  # tree levels
CHILD_P = 0.55  # synthetic acceptance of the rank-0 child; rank r gets CHILD_P * (1 - CHILD_P) ** r


def topk_tree(n: int, max_depth: int = MAX_DEPTH) -> list[int]:
    """Parents of the n most probable nodes of an infinite top-k draft tree (best-first), depth < max_depth.

    A node's r-th child continues its path with probability ``CHILD_P * (1 - CHILD_P) ** r``, so the tree
    is bushy near the root and thin below it, as the trees of EAGLE / Sequoia are."""
    parents: list[int] = []
    depth: list[int] = []
    heap = [(-CHILD_P, -1, 0, 0)]  # (-path prob, parent id, child rank, depth)
    while heap and len(parents) < n:
        neg_p, par, rank, d = heapq.heappop(heap)
        k = len(parents)
        parents.append(par)
        depth.append(d)
        p = -neg_p
        # its next sibling, and its own first child
        heapq.heappush(heap, (-p * (1 - CHILD_P), par, rank + 1, d))
        if d + 1 < max_depth:
            heapq.heappush(heap, (-p * CHILD_P, k, 0, d + 1))
    return parents


def shape(parents: list[int]) -> str:
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return "/".join(str(depth.count(d)) for d in range(max(depth) + 1))


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n-threads", type=int, default=2)
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--decode-tokens", type=int, default=24, help="tokens per round in part 1")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    path = embedded_model_path("target")

    # -- part 1: plain decoding, old vs tree-capable context ----------------------------------------
    old = LlamaBackend(path, n_ctx=4096, n_threads=args.n_threads, max_tree_nodes=0)
    new = LlamaBackend(path, n_ctx=4096, n_threads=args.n_threads)
    lc = new._lc
    print(f"== {path.name}, {args.n_threads} threads")
    for label, be in (("plain context", old), ("tree context", new)):
        c = be._ctx.ctx
        print(f"{label:14} n_seq_max {lc.llama_n_seq_max(c):3d}  n_ctx {lc.llama_n_ctx(c)}  "
              f"n_ctx_seq {lc.llama_n_ctx_seq(c)}  context_length {be.context_length}")
    prompt = new.chat_prompt(PROMPT)
    rates: dict[str, list[float]] = {"plain context": [], "tree context": []}
    for _ in range(max(3, args.rounds // 2)):
        for label, be in (("plain context", old), ("tree context", new)):
            be.reset()
            tok = int(be.forward(prompt, all_logits=False)[0].argmax())
            t = time.perf_counter()
            for _ in range(args.decode_tokens):
                tok = int(be.forward([tok])[0].argmax())
            rates[label].append(args.decode_tokens / (time.perf_counter() - t))
    for label, r in rates.items():
        print(f"{label:14} one-token decoding: median {statistics.median(r):6.2f} tok/s "
              f"(rounds: {', '.join(f'{x:.2f}' for x in r)})")
    old.close()

    # -- part 2: one forward over a tree of n nodes ----------------------------------------------------
    be = new
    be.reset()
    be.forward(prompt, all_logits=False)
    n0 = be.n_cached
    rng = random.Random(0)
    toks = [rng.randrange(200, 30000) for _ in range(max(sizes))]

    def tree_call(parents):
        def run():
            be.forward_tree(toks[: len(parents)], parents)
        return run

    def chain_forward(n):
        def run():
            be.forward(toks[:n])
        return run

    settings: dict[str, object] = {"forward 1": chain_forward(1)}
    trees = {n: topk_tree(n) for n in sizes}
    for n in sizes:
        settings[f"tree {n}"] = tree_call(trees[n])
        if n <= 8:
            settings[f"chain tree {n}"] = tree_call([-1] + list(range(n - 1)))
            settings[f"forward {n}"] = chain_forward(n)
    times: dict[str, list[float]] = {k: [] for k in settings}
    for _ in range(args.rounds):
        for key, run in settings.items():
            times[key].append(timed(run))
            be.rollback(n0)  # also drops the open tree
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    base = ms["forward 1"]
    print(f"\nmedian of {args.rounds} interleaved rounds after a {n0}-token prompt; "
          f"ratio = time / one-token forward ({base:.1f} ms)")
    print(f"{'n':>4} {'tree shape (nodes/depth)':>26} {'tree ms':>8} {'ratio':>6} {'chain ms':>9} {'ratio':>6} "
          f"{'forward ms':>10} {'ratio':>6}")
    for n in sizes:
        row = f"{n:4d} {shape(trees[n]):>26} {ms[f'tree {n}']:8.1f} {ms[f'tree {n}'] / base:6.2f}"
        if n <= 8:
            row += (f" {ms[f'chain tree {n}']:9.1f} {ms[f'chain tree {n}'] / base:6.2f}"
                    f" {ms[f'forward {n}']:10.1f} {ms[f'forward {n}'] / base:6.2f}")
        print(row)
    be.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
