"""Ray workers on this machine: one bench slice in this process vs 1 worker × T threads vs T workers × 1
thread (T = the cores), measured in one run.

The slice (default: HumanEval, first 2 problems, target-only and lossless SD, 2 samples each, 64 new
tokens, the embedded pair) runs once per setting and round into a fresh directory; the rounds go
through the settings in alternate orders (A B C, C B A, ...) so that a machine busy with other work
slows them alike. Printed per setting, summed or averaged over the rounds: wall time of the whole bench
(Ray start and every worker's model load included), samples per minute, the mean generation time of a
sample inside its worker, the steady rate it implies for a long bench, the start-up time, and whether
the outputs equal those of the in-process run (llama.cpp sums in an order that depends on its thread
count, so they need not; the seeds are the same).

    .venv/bin/python benchmarks/ray_workers.py [--dataset humaneval] [--limit 2] [--n-samples 2]
        [--tokens 64] [--threads N] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from verispec.runtime import tune_process

tune_process()

from verispec.bench import runner  # noqa: E402
from verispec.bench.store import ResultStore  # noqa: E402
from verispec.settings import ClusterSettings  # noqa: E402


def outputs(out: Path) -> tuple[dict, list[float]]:
    """Stored outputs by (role, problem, k) and every sample's generation seconds."""
    store = ResultStore(out / runner.STORE_NAME)
    try:
        samples = [(k, s) for k, _ in store.runs() for s in store.samples(k.run_id)]
    finally:
        store.close()
    return ({(k.role, s.problem_id, s.sample_idx): s.output for k, s in samples},
            [float(s.meta["generate_s"]) for _, s in samples])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--n-samples", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="cores to use (default: all)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    t = args.threads
    # (label, --n-threads in-process, cluster, workers)
    settings = [("in-process", t, None, 1),
                (f"1 worker × {t} threads", None, ClusterSettings(workers=1, threads_per_worker=t), 1)]
    if t > 1:
        settings.append((f"{t} workers × 1 thread", None, ClusterSettings(workers=t, threads_per_worker=1), t))

    print(f"{args.dataset}, first {args.limit} problems, target-only + lossless SD, {args.n_samples} samples each, "
          f"{args.tokens} new tokens, embedded pair; {os.cpu_count()} cores; {args.rounds} rounds")
    walls: dict[str, list[float]] = {s[0]: [] for s in settings}
    gens: dict[str, list[float]] = {s[0]: [] for s in settings}
    rows: dict[str, list[dict]] = {s[0]: [] for s in settings}
    with tempfile.TemporaryDirectory(prefix="verispec-ray-bench-") as tmp:
        for rnd in range(args.rounds):
            for label, n_threads, cluster, _ in (settings if rnd % 2 == 0 else settings[::-1]):
                cfg = runner.BenchConfig(datasets=[args.dataset], limit=args.limit, rules=["lossless"],
                                         max_new_tokens=args.tokens, n_samples=args.n_samples, n_threads=n_threads,
                                         out=str(Path(tmp) / f"{rnd}-{label.replace(' ', '_')}"))
                t0 = time.perf_counter()
                out, _ = runner.run_bench(cfg, progress=False, report=False, cluster=cluster, log=lambda m: None)
                walls[label].append(time.perf_counter() - t0)
                got, gen_s = outputs(out)
                rows[label].append(got)
                gens[label] += gen_s
                print(f"  round {rnd + 1}: {label:24} {walls[label][-1]:6.1f} s", flush=True)

    reference = rows[settings[0][0]][0]
    print(f"\n{'setting':24} {'samples':>7} {'wall s':>7} {'samples/min':>11} {'s/sample':>8} {'steady/min':>10} "
          f"{'start s':>7}  outputs = in-process")
    rate, steady = {}, {}
    for label, _, _, workers in settings:
        n = sum(len(r) for r in rows[label])
        wall = sum(walls[label])
        per = statistics.mean(gens[label])   # one sample's generation (and check) inside its worker
        busy = n * per / workers               # the wall time had the workers been busy from start to end
        same = sum(r[k] == reference.get(k) for r in rows[label] for k in r)
        rate[label], steady[label] = 60 * n / wall, 60 * workers / per
        print(f"{label:24} {n:7d} {wall:7.1f} {rate[label]:11.2f} {per:8.2f} {steady[label]:10.2f} "
              f"{(wall - busy) / args.rounds:7.1f}  {same}/{n}")
    print("wall s: all rounds; s/sample: a sample's generation time in its worker; steady/min: workers × 60 / "
          "s/sample, the rate of a long bench; start s: per round, wall − samples × s/sample / workers (Ray "
          "start, model loads, the idle tail)")
    if len(settings) == 3:
        (ref, _, _, _), (one, _, _, _), (many, _, _, _) = settings
        print(f"\n{many} / {one}: {rate[many] / rate[one]:.2f}× the samples per minute in this run, "
              f"{steady[many] / steady[one]:.2f}× steady; {one} / {ref}: {rate[one] / rate[ref]:.2f}×, "
              f"{steady[one] / steady[ref]:.2f}× steady")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
