#!/usr/bin/env bash
# One-step set-up on a fresh machine: a virtual environment in .venv with verispec and every extra.
# CPU-safe: constraints-cpu.txt pins torch to its CPU build (no multi-GB CUDA download).
# On a GPU machine, set VERISPEC_TORCH_CONSTRAINTS=none to let pip pick a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
constraints=(-c constraints-cpu.txt)
if [ "${VERISPEC_TORCH_CONSTRAINTS:-}" = "none" ]; then constraints=(); fi
# torch first, alone, so that nothing else can pull a different build.
.venv/bin/python -m pip install --disable-pip-version-check -q "${constraints[@]}" torch
.venv/bin/python -m pip install --disable-pip-version-check -q "${constraints[@]}" -e ".[${1:-all}]"
