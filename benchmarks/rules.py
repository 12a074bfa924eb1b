"""Speed of every rule's ``verify`` and of the warper pipeline at the real vocabulary size (CPU).

Prints milliseconds per call (median of repeated runs) for V = 151,936, G in {4, 8, 16}, B in {1, 8},
and the G = 5, B = 1 line that the engine hits on every step: pipeline on target and draft rows plus
``verify``. Run: ``.venv/bin/python benchmarks/rules.py [--repeats N] [--threads T]``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

from verispec.runtime import tune_openmp

tune_openmp()

import torch  # noqa: E402

import verispec.rules as R  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402

VOCAB = 151_936
RULES = [
    "lossless", "greedy", "block", "hsd", "lenience:ell=0.5", "cos_we:lam=0.5", "cos_cd:mu=0.1",
    "ceiling:kappa=2", "ceiling:kappa=2,base=we,lam=0.5", "speccascade:p_base=0.3",
    "cascade:rule=token_v3,alpha=0.7", "typical:eps=0.15",
]
PIPELINE = "temperature=0.7,top_k=20,top_p=0.8"


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def inputs(batch: int, gamma: int, sampling: SamplingConfig, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    # Heavy-tailed logits like a real LM head.
    target_logits = torch.randn(batch, gamma + 1, VOCAB, generator=gen) * 3
    draft_logits = target_logits[:, :gamma] + torch.randn(batch, gamma, VOCAB, generator=gen)
    p = sampling.process(target_logits)
    q = sampling.process(draft_logits)
    draft = torch.multinomial(q.view(-1, VOCAB), 1, generator=gen).view(batch, gamma)
    return target_logits, draft_logits, p, q, draft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, V = {VOCAB}")

    for label, spec in [("dense (T=1)", "temperature=1"), ("truncated", PIPELINE)]:
        sampling = SamplingConfig.parse(spec)
        print(f"\n== verify, ms per call, median of {args.repeats} — inputs {label}: {spec}")
        shapes = [(b, g) for b in (1, 8) for g in (4, 8, 16)]
        print(f"{'rule':34}" + "".join(f"{f'B={b},G={g}':>11}" for b, g in shapes))
        data = {s: inputs(*s, sampling) for s in shapes}
        for rule_spec in RULES:
            rule = R.get(rule_spec)
            cells = []
            for shape in shapes:
                _, _, p, q, draft = data[shape]
                gen = torch.Generator().manual_seed(1)
                cells.append(median_ms(functools.partial(rule.verify, p, q, draft, generator=gen), args.repeats))
            print(f"{rule_spec:34}" + "".join(f"{c:11.2f}" for c in cells))

    print(f"\n== warper pipeline, ms per call on [rows, V] logits, median of {args.repeats}")
    for spec in ["temperature=1", "temperature=0", PIPELINE, PIPELINE + ",min_p=0.1", "temperature=0.7,eta=0.0009"]:
        sampling = SamplingConfig.parse(spec)
        cells = []
        for rows in (1, 6, 48):
            logits = torch.randn(rows, VOCAB) * 3
            cells.append(median_ms(functools.partial(sampling.process, logits), args.repeats))
        print(f"{spec:44} rows=1 {cells[0]:7.2f}   rows=6 {cells[1]:7.2f}   rows=48 {cells[2]:7.2f}")

    print("\n== engine step at G=5, B=1: pipeline on 6 target + 5 draft rows, then verify (ms)")
    for spec in ["temperature=1", PIPELINE]:
        sampling = SamplingConfig.parse(spec)
        t_logits, d_logits, _, _, draft = inputs(1, 5, sampling)
        for rule_spec in RULES:
            rule = R.get(rule_spec)
            gen = torch.Generator().manual_seed(2)

            # Bound now (B023); median_ms calls step only in this iteration, so nothing changes.
            def step(sampling=sampling, t_logits=t_logits, d_logits=d_logits, rule=rule, draft=draft, gen=gen):
                p = sampling.process(t_logits)
                q = sampling.process(d_logits)
                rule.verify(p, q, draft, generator=gen)

            print(f"  {spec:34} {rule_spec:34} {median_ms(step, args.repeats):7.2f}")


if __name__ == "__main__":
    main()
