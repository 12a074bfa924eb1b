"""One-token and few-token forwards of the embedded pair (transformers, float32) three ways, in one process:
the standard layout, the weight-major layout without padding (:func:`~verispec.models.cpu_linear.default_plan`),
and the backend's measured plan per row count (:func:`~verispec.models.cpu_linear.plan_rows`).

    .venv/bin/python benchmarks/row_plan.py [--rounds 8]

Each round times every way once, in turn; printed: the fastest of the rounds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from verispec.runtime import tune_process

tune_process()

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from assisted import load_model  # noqa: E402

from verispec.models.cpu_linear import default_plan, describe_plan  # noqa: E402
from verispec.models.hf import HFBackend  # noqa: E402

SIZES = (1, 2, 9)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args(argv)
    target, tokenizer = load_model("embedded-target", torch.float32)
    draft, _ = load_model("embedded-draft", torch.float32)
    ids = tokenizer("def fib(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")["input_ids"]
    for name, model in (("target", target), ("draft", draft)):
        backend = HFBackend(model, tokenizer=tokenizer, linear_layout="weight-major")
        planned = backend.row_plan
        print(f"{name} plan: {describe_plan(planned)}")
        backend.reset()
        backend.forward(ids, all_logits=False)
        base = len(ids)
        ways = {"standard": ("standard", None), "default": ("weight-major", default_plan()),
                "planned": ("weight-major", planned)}
        best = {(way, n): float("inf") for way in ways for n in SIZES}
        for _ in range(args.rounds):
            for way, (layout, plan) in ways.items():
                backend.linear_layout, backend.row_plan = layout, plan
                for n in SIZES:
                    t = time.perf_counter()
                    backend.forward([ids[-1]] * n, all_logits=n > 1)
                    best[way, n] = min(best[way, n], time.perf_counter() - t)
                    backend.rollback(base)
        for way in ways:
            print(f"  {name} {way:9s}: " + ", ".join(f"{n} token{'s' * (n > 1)} {1e3 * best[way, n]:.1f} ms"
                                                    for n in SIZES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
