"""Building vLLM engines and requests for verispec: the entry points a user (or the bench) calls.

``make_llm(model, speculative_config=..., rule="lenience:ell=0.5", **vllm_kwargs)`` checks the rule against
the proposer first (``ValueError`` before any engine starts), installs the plug-in in this process (the
front end checks per-request rules at admission) and in vLLM's workers (``worker_extension_cls``), and
returns an ordinary ``vllm.LLM``. Every other keyword goes to vLLM unchanged (``tensor_parallel_size``,
``pipeline_parallel_size``, ``distributed_executor_backend="ray"``, ``dtype``, ...), so the same call scales
from this CPU to a GPU cluster. ``make_target_llm(model, **vllm_kwargs)`` is the same model without
speculative decoding, for target-only runs and true baselines (:mod:`.baseline`).

``request_params(sampling, rule=...)`` / ``baseline_params(sampling, rule)`` turn a verispec
:class:`~verispec.sampling.SamplingConfig` into ``vllm.SamplingParams``.
"""

from __future__ import annotations

from typing import Any

from verispec.integrations.vllm.settings import (
    CONFIG_KEY,
    REQUEST_BASELINE,
    REQUEST_RULE,
    REQUEST_TOP_K,
    REQUEST_TOP_P,
    PluginSettings,
    RuleBook,
)
from verispec.integrations.vllm.support import Proposer
from verispec.sampling import SamplingConfig

#: SamplingConfig fields vLLM's speculative engine cannot apply (min-p is ignored there, the others do not
#: exist in vLLM): they belong to a rule's true baseline, on the target-only engine.
_NOT_IN_SPECULATIVE_VLLM = ("min_p", "eta", "epsilon", "post_prob_gap", "post_top_k", "post_top_p", "post_min_p",
                            "post_eta", "post_epsilon")


def make_llm(model: str, *, speculative_config: dict, rule: str = "lossless", request_rules: bool = True,
             **vllm_kwargs: Any):
    """A ``vllm.LLM`` that decodes speculatively and verifies with verispec's ``rule`` (see the module doc)."""
    from verispec.integrations.vllm.plugin import install
    from verispec.integrations.vllm.worker import WORKER_EXTENSION
    from vllm import LLM

    settings = PluginSettings(rule=rule, request_rules=request_rules)
    RuleBook(settings, Proposer.from_config(speculative_config).drafts)     # refuses before the engine starts
    install()
    additional = dict(vllm_kwargs.pop("additional_config", None) or {})
    additional.update(settings.to_additional_config())
    if vllm_kwargs.get("worker_extension_cls") not in (None, WORKER_EXTENSION):
        raise ValueError("make_llm sets worker_extension_cls itself (the verispec worker extension); "
                         "pass no other")
    vllm_kwargs["worker_extension_cls"] = WORKER_EXTENSION
    return LLM(model=model, speculative_config=dict(speculative_config), additional_config=additional,
               **vllm_kwargs)


#: options that only an engine with speculative decoding takes (vLLM refuses them without): the same options
#: can then configure both engines of a comparison
_SPECULATIVE_ONLY = ("per_request_spec_decode_metrics",)


def make_target_llm(model: str, **vllm_kwargs: Any):
    """The same model without speculative decoding, able to sample true baselines (``logits_processors``).
    Options that only speculative decoding takes (per-request draft metrics) are dropped."""
    from verispec.integrations.vllm.baseline import BASELINE_PROCESSOR
    from vllm import LLM

    if "speculative_config" in vllm_kwargs:
        raise ValueError("make_target_llm builds the engine without speculative decoding; use make_llm for SD")
    for name in _SPECULATIVE_ONLY:
        vllm_kwargs.pop(name, None)
    processors = list(vllm_kwargs.pop("logits_processors", None) or [])
    if BASELINE_PROCESSOR not in processors:
        processors.append(BASELINE_PROCESSOR)
    return LLM(model=model, logits_processors=processors, **vllm_kwargs)


def vllm_sampling_fields(sampling: SamplingConfig) -> dict[str, Any]:
    """``temperature``, ``top_k``, ``top_p`` of ``sampling`` as ``vllm.SamplingParams`` keywords; ``ValueError``
    for fields that vLLM's speculative engine cannot apply (a rule's baseline truncation: use
    :func:`baseline_params` on the target-only engine)."""
    extra = [f for f in _NOT_IN_SPECULATIVE_VLLM if getattr(sampling, f) != getattr(SamplingConfig(), f)]
    if extra:
        raise ValueError(f"sampling {sampling} sets {', '.join(extra)}, which vLLM's speculative engine does not "
                         "apply (vLLM ignores min-p there; the others are not vLLM fields). Sample a rule's true "
                         "baseline with baseline_params(sampling, rule) on make_target_llm's engine")
    return {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}


def request_params(sampling: SamplingConfig | str = "", *, rule: str | None = None, **kwargs: Any):
    """``vllm.SamplingParams`` for a speculative request: verispec's sampling fields, and ``rule`` (None: the
    engine's) in ``extra_args``; ``kwargs`` (``max_tokens``, ``seed``, ``stop``, ...) go to vLLM."""
    from vllm import SamplingParams

    sampling = SamplingConfig.parse(sampling) if isinstance(sampling, str) else sampling
    extra = dict(kwargs.pop("extra_args", None) or {})
    if rule is not None:
        extra[REQUEST_RULE] = rule
    return SamplingParams(**vllm_sampling_fields(sampling), extra_args=extra or None, **kwargs)


def baseline_params(sampling: SamplingConfig | str, rule: str, **kwargs: Any):
    """``vllm.SamplingParams`` that sample ``rule``'s true baseline under ``sampling`` on the target-only engine
    (:mod:`.baseline`): vLLM applies the temperature, the processor top-k / top-p and the truncation."""
    from verispec import rules as rule_registry
    from vllm import SamplingParams

    sampling = SamplingConfig.parse(sampling) if isinstance(sampling, str) else sampling
    spec = rule_registry.get(rule).spec()
    fields = vllm_sampling_fields(sampling)
    extra = dict(kwargs.pop("extra_args", None) or {})
    extra.update({REQUEST_BASELINE: spec, REQUEST_TOP_K: fields["top_k"], REQUEST_TOP_P: fields["top_p"]})
    return SamplingParams(temperature=fields["temperature"], extra_args=extra, **kwargs)


__all__ = ["make_llm", "make_target_llm", "request_params", "baseline_params", "vllm_sampling_fields",
           "CONFIG_KEY"]
