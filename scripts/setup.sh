#!/usr/bin/env bash
# One-step set-up on a fresh machine: a virtual environment in .venv with verispec and every extra,
# then a smoke test that decodes a few tokens with the embedded model pair.
#
# CPU-safe: constraints-cpu.txt pins torch to its CPU build (no multi-GB CUDA download); on a GPU
# machine set VERISPEC_TORCH_CONSTRAINTS=none to let pip pick a CUDA build.
# llama.cpp is built for the instruction sets this machine really executes (scripts/build_llama.py):
# VERISPEC_LLAMA_BUILD=probe (default) | portable (x86-64 / armv8-a baseline, runs anywhere) | native.
# VERISPEC_SKIP_SMOKE=1 skips the smoke test.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --disable-pip-version-check -q)
constraints=(-c constraints-cpu.txt)
if [ "${VERISPEC_TORCH_CONSTRAINTS:-}" = "none" ]; then constraints=(); fi
# torch first, alone, so that nothing else can pull a different build.
"${pip[@]}" "${constraints[@]}" torch
# llama.cpp next, built for this machine, so that the next step finds it installed.
.venv/bin/python scripts/build_llama.py
"${pip[@]}" "${constraints[@]}" -e ".[${1:-all}]"
if [ "${VERISPEC_SKIP_SMOKE:-0}" != "1" ]; then
    .venv/bin/python scripts/smoke.py
fi
