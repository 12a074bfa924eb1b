"""The last step of scripts/setup.sh: decode a few tokens with the embedded pair, in a subprocess.

A llama.cpp build that uses an instruction the machine cannot execute does not fail politely: the
process dies of SIGILL ("Illegal instruction", exit status 132).  Here that death happens in a
child, and becomes a message naming the cause and the one command that fixes it.

Usage: ``python scripts/smoke.py`` (with the environment's interpreter; exit status 0 = works).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

PROMPT = "def add(a, b):"
TOKENS = 8
TIMEOUT_S = 900  # first use assembles the embedded models from their PyPI chunks (~1.5 GB)


def _build_record() -> dict:
    marker = Path(sys.prefix) / "share" / "verispec" / "llama-build.json"
    return json.loads(marker.read_text()) if marker.is_file() else {}


def explain_signal(sig: int, build: dict) -> str:
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
    mode = build.get("mode", "unknown")
    flags = " ".join(build.get("features", [])) or "baseline"
    fix = "VERISPEC_LLAMA_BUILD=portable bash scripts/setup.sh"
    if sig == signal.SIGILL:
        return (
            f"smoke test FAILED: llama.cpp died of {name} (illegal instruction) while decoding.\n"
            f"Cause: the llama.cpp build ({mode}: {flags}) uses a CPU instruction this machine advertises but "
            "cannot execute (seen on VMs whose hypervisor does not enable AMX or AVX-512 state), or the "
            "virtual environment was built on another machine.\n"
            f"Fix: {fix}\n"
            "(it rebuilds llama.cpp for the x86-64 / armv8-a baseline, which every such machine runs)"
        )
    return (
        f"smoke test FAILED: the decoding process died of {name}.\n"
        f"llama.cpp build: {mode} ({flags}). If this repeats, rebuild without optional instruction sets:\n"
        f"{fix}"
    )


SMOKE_CMD = [sys.executable, "-m", "verispec", "generate", "--prompt", PROMPT, "--no-chat",
             "--max-new-tokens", str(TOKENS), "--sampling", "temperature=0", "--gamma", "3",
             "--no-cost-model", "--json"]


def main(cmd: list[str] = SMOKE_CMD) -> int:
    """Run ``cmd`` (a ``verispec generate --json`` command line); 0 if it decoded, else 1 with the cause."""
    print(f"[smoke] decoding {TOKENS} tokens with the embedded pair (lossless SD, greedy) in a subprocess",
          flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        print(f"smoke test FAILED: no result after {TIMEOUT_S} s: {' '.join(cmd)}", file=sys.stderr)
        return 1
    if proc.returncode < 0:
        print(explain_signal(-proc.returncode, _build_record()), file=sys.stderr)
        return 1
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        print(f"smoke test FAILED (exit status {proc.returncode}): {' '.join(cmd)}\n{tail}", file=sys.stderr)
        return 1
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"[smoke] ok: {record['text']!r} ({record.get('tokens_per_s', float('nan')):.1f} tokens/s, "
          f"{record.get('target_calls')} target calls)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
