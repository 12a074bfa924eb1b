"""Gold check of the code grader: every canonical solution passes, a known-wrong one fails.

Grades, through the real ``checkers.check`` path, for every problem of HumanEval, HumanEval+ and
MBPP+: (1) the canonical solution, which must pass; (2) the canonical solution with every output
perturbed (``+1``, ``not``, ``+ "x"``, one more element, ...; see ``WRONG``), which must fail.
Prints counts, the exceptions and the time.

    .venv/bin/python benchmarks/code_gold.py [--datasets humaneval,humaneval_plus,mbpp_plus]
        [--limit N] [--workers 2] [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from verispec.tasks.checkers import check
from verispec.tasks.datasets import load_dataset

#: Appended to the canonical solution: the entry point now returns a perturbed output.
WRONG = '''

def _verispec_perturb(v):
    if v is None:
        return 0
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float, complex)):
        return v + 1
    if isinstance(v, (str, bytes)):
        return v + (b"x" if isinstance(v, bytes) else "x")
    if isinstance(v, list):
        return v + [None]
    if isinstance(v, tuple):
        return v + (None,)
    if isinstance(v, (set, frozenset)):
        return type(v)(list(v) + [("x",)])
    if isinstance(v, dict):
        return dict(v, **{"x": None}) if "x" not in v else dict(v, x=1)
    return None


_verispec_original = ENTRY


def ENTRY(*args, **kwargs):
    return _verispec_perturb(_verispec_original(*args, **kwargs))
'''


def canonical_completion(problem) -> str:
    return problem.answer["canonical_solution"]


def wrong_completion(problem) -> str:
    wrong = WRONG.replace("ENTRY", problem.answer["entry_point"])
    return problem.answer["canonical_solution"].rstrip("\n") + "\n" + wrong


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="humaneval,humaneval_plus,mbpp_plus")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    args = ap.parse_args(argv)
    bad = 0
    for name in args.datasets.split(","):
        problems = load_dataset(name, data_dir=args.data_dir).problems[: args.limit]
        t0 = time.monotonic()

        def one(p):
            ok = check(p, canonical_completion(p), timeout_s=30)
            wrong = check(p, wrong_completion(p), timeout_s=30)
            return p.id, ok, wrong

        with ThreadPoolExecutor(args.workers) as pool:
            rows = list(pool.map(one, problems))
        dt = time.monotonic() - t0
        gold_fail = [(pid, ok.detail) for pid, ok, _ in rows if not ok.correct]
        wrong_pass = [(pid, w.detail) for pid, _, w in rows if w.correct]
        print(f"{name}: {len(rows)} problems; canonical passes {len(rows) - len(gold_fail)}/{len(rows)}; "
              f"perturbed fails {len(rows) - len(wrong_pass)}/{len(rows)}; {dt:.1f} s "
              f"({dt / max(1, 2 * len(rows)):.3f} s per grade, {args.workers} workers)")
        for pid, why in gold_fail:
            print(f"  canonical FAILED {pid}: {why[:300]}")
        for pid, why in wrong_pass:
            print(f"  perturbed PASSED {pid}: {why[:300]}")
        sys.stdout.flush()
        bad += len(gold_fail)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
