"""Decoding speed of several llama-cpp-python builds on this machine, measured in one run.

Each build is a wheel (e.g. the ``native`` one pip builds by default, and the ``probe`` one that
scripts/build_llama.py builds); each is unpacked into its own folder and used through
``PYTHONPATH`` by a child ``verispec generate`` on the embedded pair, target-only and lossless SD,
the builds interleaved round by round so that a busy machine slows them alike.

    python benchmarks/llama_builds.py native=/path/native.whl probe=~/.cache/verispec/wheels/KEY/*.whl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def decode(site: str, mode: str, tokens: int, threads: int) -> float:
    cmd = [sys.executable, "-m", "verispec", "generate", "--prompt", PROMPT, "--max-new-tokens", str(tokens),
           "--sampling", "temperature=0", "--n-threads", str(threads), "--no-cost-model", "--json"]
    cmd += ["--baseline"] if mode == "target-only" else ["--rule", "lossless", "--gamma", "3"]
    env = dict(os.environ, PYTHONPATH=site + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{site}: {mode} failed ({out.returncode}): {out.stderr[-800:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="LABEL=WHEEL")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="llama-builds-")
    sites = {}
    for item in args.builds:
        label, _, wheel = item.partition("=")
        if not Path(wheel).is_file():
            raise SystemExit(f"{wheel}: no such wheel")
        sites[label] = os.path.join(tmp, label)
        zipfile.ZipFile(wheel).extractall(sites[label])
        for so in Path(sites[label]).rglob("*.so*"):  # zip extraction drops the exec bits
            so.chmod(0o755)
    speeds: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for mode in ("target-only", "lossless"):
            for label, site in sites.items():
                tps = decode(site, mode, args.tokens, args.threads)
                speeds.setdefault((label, mode), []).append(tps)
                print(f"round {r + 1} {mode:11s} {label:10s} {tps:6.2f} tok/s", flush=True)
    first = next(iter(sites))
    print(f"\nmedian tokens/s over {args.rounds} rounds, {args.tokens} tokens, {args.threads} threads "
          f"(ratio to {first}):")
    for mode in ("target-only", "lossless"):
        ref = statistics.median(speeds[(first, mode)])
        for label in sites:
            med = statistics.median(speeds[(label, mode)])
            print(f"  {mode:11s} {label:10s} {med:6.2f}  x{med / ref:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
