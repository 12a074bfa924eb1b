"""Trees vs chains on this machine: tokens per target call, nodes per call, and speed, in one run.

On the embedded pair (llama.cpp), lossless SD with a chain of γ = depth tokens, static top-k trees and
dynamic (EAGLE-2) trees of the same depth, and target-only sampling, interleaved round by round.
For each: block efficiency (tokens per target call), draft nodes per call, measured tokens/s over
target-only, and the cost model's prediction ``BE · t₁ / (draft time per step + v(n+1) · t₁)`` where
``v(m)`` is the target's forward cost for ``m`` tree tokens relative to one token, measured here
(interpolated from the table printed first) and the draft time per step is measured.

    .venv/bin/python benchmarks/trees.py [--depth 5] [--tokens 96] [--rounds 2]
        [--trees "dynamic:top_k=10,depth=5,nodes=60;dynamic:top_k=4,depth=5,nodes=16;topk:4,2,1,1,1"]
"""

from __future__ import annotations

import argparse
import statistics
import time

from verispec.runtime import tune_process

tune_process()

from verispec.engine import generate, generate_target_only  # noqa: E402
from verispec.engine.tree import TreeShape  # noqa: E402
from verispec.models import load_pair  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402
from verispec.settings import ModelSettings  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? Think step by step.",
]
NODE_COUNTS = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def verify_costs(target, prompt, repeats: int = 5) -> dict[int, float]:
    """Median seconds of one target forward over a tree of ``m`` tokens (a root and ``m − 1`` nodes,
    two children per node), per ``m``."""
    target.reset()
    target.forward(prompt[:-1], all_logits=False)
    n0 = target.n_cached
    out = {}
    for m in NODE_COUNTS:
        parents = [-1] + [(i - 1) // 2 for i in range(1, m)]
        tokens = [prompt[-1]] + [prompt[i % len(prompt)] for i in range(1, m)]
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            target.forward_tree(tokens, parents)
            times.append(time.perf_counter() - t0)
            target.rollback(n0)
        out[m] = statistics.median(times)
    return out


def interpolate(table: dict[int, float], m: float) -> float:
    keys = sorted(table)
    if m <= keys[0]:
        return table[keys[0]]
    for lo, hi in zip(keys, keys[1:]):
        if m <= hi:
            w = (m - lo) / (hi - lo)
            return table[lo] * (1 - w) + table[hi] * w
    return table[keys[-1]] * m / keys[-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--trees", default="dynamic:top_k=10,depth=5,nodes=60;dynamic:top_k=4,depth=5,nodes=16;"
                    "topk:4,2,1,1,1;topk:2,1,1,1,1")
    ap.add_argument("--rule", default="lossless")
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    ap.add_argument("--n-threads", type=int, default=None)
    args = ap.parse_args(argv)
    sampling = SamplingConfig.parse(args.sampling)
    settings = ModelSettings(n_threads=args.n_threads)
    target, draft, width = load_pair(settings)
    prompts = [target.chat_prompt(p) for p in PROMPTS]

    costs = verify_costs(target, prompts[0])
    t1 = costs[1]
    print("target forward over m tree tokens (median of 5):")
    print("  " + "  ".join(f"m={m}: {1e3 * s:.0f} ms ({s / t1:.2f}x)" for m, s in costs.items()), flush=True)

    shapes = [("target-only", None), (f"chain γ={args.depth}", f"iid:{','.join(['1'] * args.depth)}")]
    shapes += [(TreeShape.parse(t).text(), t) for t in args.trees.split(";") if t.strip()]
    rates: dict = {label: [] for label, _ in shapes}
    totals: dict = {label: {"tokens": 0, "calls": 0, "nodes": 0, "steps": 0, "draft_s": 0.0} for label, _ in shapes}
    for rnd in range(args.rounds):
        for label, tree in shapes:
            for i, ids in enumerate(prompts):
                seed = 1000 * rnd + i
                if tree is None:
                    res = generate_target_only(target, ids, sampling=sampling, max_new_tokens=args.tokens, seed=seed)
                else:
                    res = generate(target, draft, ids, rule=args.rule, sampling=sampling, tree=tree,
                                   max_new_tokens=args.tokens, seed=seed, vocab_width=width)
                st = res.stats
                rates[label].append(st.tokens_per_s)
                t = totals[label]
                t["tokens"] += st.new_tokens
                t["calls"] += st.target_calls
                steps = sum(st.accepted_hist) if tree is not None else 0
                t["steps"] += steps
                t["nodes"] += st.tree_nodes
                t["draft_s"] += st.draft_s
            print(f"round {rnd + 1} {label:36} {statistics.median(rates[label][-len(prompts):]):6.2f} tok/s",
                  flush=True)

    base = statistics.median(rates["target-only"])
    chain_be = None
    print(f"\n{args.rule}, {args.sampling}; {args.rounds} rounds x {len(prompts)} prompts x {args.tokens} tokens; "
          f"target-only {base:.2f} tok/s")
    print(f"  {'shape':36} {'BE':>6} {'vs chain':>8} {'nodes/call':>10} {'tok/s':>7} {'measured':>9} {'predicted':>9}")
    for label, tree in shapes:
        t = totals[label]
        med = statistics.median(rates[label])
        if tree is None:
            print(f"  {label:36} {1.0:6.2f} {'':>8} {0:10.1f} {med:7.2f} {1.0:8.2f}x {1.0:8.2f}x")
            continue
        be = t["tokens"] / t["calls"]
        chain_be = chain_be or be
        nodes = t["nodes"] / t["steps"] if t["steps"] else 0.0
        step_s = t["draft_s"] / t["steps"] + interpolate(costs, nodes + 1) if t["steps"] else float("nan")
        predicted = be * t1 / step_s
        print(f"  {label:36} {be:6.2f} {be / chain_be:7.2f}x {nodes:10.1f} {med:7.2f} {med / base:8.2f}x "
              f"{predicted:8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
