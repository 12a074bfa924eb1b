#!/usr/bin/env bash
# Every test, from a fresh clone too: the set-up (scripts/setup.sh; scripts/setup_vllm.sh for the vLLM
# plug-in, skipped with VERISPEC_VLLM=0), the main suite in .venv, then the vLLM plug-in's suite in
# .venv-vllm (tests/vllm; the main suite skips that directory, where vLLM is not installed).
# Extra arguments go to the main pytest run (e.g. -m "not slow"; -n 0 runs it in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
vllm=${VERISPEC_VLLM:-1}
if [ "$vllm" != "0" ]; then
    bash scripts/setup_vllm.sh
fi
# the main suite on up to 4 CPUs (pytest-xdist; a file's tests stay on one worker, sharing its fixtures)
workers=$(.venv/bin/python -c "import os; print(min(len(os.sched_getaffinity(0)), 4))")
.venv/bin/python -m pytest -q -n "$workers" --dist loadfile "$@"
if [ "$vllm" != "0" ]; then
    .venv-vllm/bin/python -m pytest -q tests/vllm
fi
