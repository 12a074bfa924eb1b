"""The worker extension that installs the plug-in in vLLM's worker processes.

``LLM(..., worker_extension_cls=WORKER_EXTENSION)`` makes vLLM import this module in each worker before it
builds the model runner (importing it installs the plug-in, :func:`.plugin.install`) and mixes
:class:`VerispecWorkerExtension` into the platform's worker class, which adds one RPC:
``llm.collective_rpc("verispec_counts")`` -> per worker ``{rule spec: {"drafted", "accepted", "steps"}}``.
"""

from __future__ import annotations

from verispec.integrations.vllm.plugin import install

WORKER_EXTENSION = "verispec.integrations.vllm.worker.VerispecWorkerExtension"

install()


class VerispecWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``)."""

    def verispec_counts(self) -> dict[str, dict[str, int]]:
        """Drafted and accepted tokens and verification steps per rule since the engine started."""
        from verispec.integrations.vllm.sampler import VerispecRejectionSampler

        sampler = getattr(getattr(self, "model_runner", None), "rejection_sampler", None)
        out: dict[str, dict[str, int]] = {}
        if isinstance(sampler, VerispecRejectionSampler):
            for (spec, what), n in sampler.counts.items():
                out.setdefault(spec, {})[what] = int(n)
        return out
