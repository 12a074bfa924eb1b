"""The worker extension that installs the plug-in in vLLM's worker processes.

``LLM(..., worker_extension_cls=WORKER_EXTENSION)`` makes vLLM import this module in each worker before it
builds the model runner (importing it installs the plug-in, :func:`.plugin.install`) and mixes
:class:`VerispecWorkerExtension` into the platform's worker class, which adds one RPC:
``llm.collective_rpc("verispec_counts")`` -> per worker ``{rule spec: {"drafted", "accepted", "steps"}}``
(engines built through the entry point get the same RPC from :func:`.plugin.install`).
"""

from __future__ import annotations

from verispec.integrations.vllm.plugin import install, runner_counts

WORKER_EXTENSION = "verispec.integrations.vllm.worker.VerispecWorkerExtension"

install()


class VerispecWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``)."""

    def verispec_counts(self) -> dict[str, dict[str, int]]:
        """Drafted and accepted tokens and verification steps per rule since the engine started."""
        return runner_counts(getattr(self, "model_runner", None))
