"""Where the time of one SD step goes on this machine (llama.cpp path), measured in one run.

Generates with lossless chain SD on the embedded pair under ``cProfile`` and prints, per step: the
draft forwards, the target forward, the sampling pipeline (draft and target rows), the rule, and the
rest (Python bookkeeping, detokenisation), the page faults (see :mod:`verispec.runtime`), then the
functions outside model calls that cost most.

    .venv/bin/python benchmarks/step_profile.py [--gamma 3] [--tokens 96] [--tree SPEC]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource

from verispec.runtime import tune_process

tune_process()

from verispec.engine import generate  # noqa: E402
from verispec.models import load_pair  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402
from verispec.settings import ModelSettings  # noqa: E402

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
#: Profile entries that are model compute or waiting for it.
MODEL_CALLS = ("forward", "forward_tree", "llama_decode", "commit_tree_path", "rollback")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--tree", default=None)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    settings = ModelSettings()
    target, draft, width = load_pair(settings)
    ids = target.chat_prompt(PROMPT)
    sampling = SamplingConfig.parse(args.sampling)
    kw = dict(rule="lossless", sampling=sampling, gamma=args.gamma, tree=args.tree, vocab_width=width)
    generate(target, draft, ids, max_new_tokens=16, **kw)          # warm-up
    prof = cProfile.Profile()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    prof.enable()
    res = generate(target, draft, ids, max_new_tokens=args.tokens, seed=1, **kw)
    prof.disable()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    st = res.stats
    steps = max(1, sum(st.gamma_hist))
    print(f"{st.new_tokens} tokens, {steps} steps, BE {st.block_efficiency:.2f}, {st.tokens_per_s:.2f} tok/s "
          f"({args.tree or f'chain γ={args.gamma}'}, {args.sampling}), {faults / steps:.0f} page faults per step")
    parts = [("draft forwards", st.draft_s), ("target forward", st.verify_s),
             ("sampling pipelines + rule", st.rule_s),
             ("rest (bookkeeping)", st.wall_s - st.draft_s - st.verify_s - st.rule_s)]
    for name, secs in parts:
        print(f"  {name:28} {1e3 * secs / steps:7.2f} ms/step  {secs / st.wall_s:6.1%}")
    print(f"\nfunctions outside model calls, by own time (ms per step), top {args.top}:")
    stats = pstats.Stats(prof)
    rows = []
    for (filename, line, func), (_, _, tottime, cumtime, _) in stats.stats.items():
        if any(m in func for m in MODEL_CALLS):
            continue
        rows.append((tottime, cumtime, f"{filename.rsplit('/', 1)[-1]}:{line}({func})"))
    for tottime, cumtime, where in sorted(rows, reverse=True)[: args.top]:
        print(f"  {1e3 * tottime / steps:7.3f} own  {1e3 * cumtime / steps:7.3f} cumulative  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
