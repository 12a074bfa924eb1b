"""Installs verispec's verification into vLLM without patching its files (private API, vLLM 0.32.0 only).

:func:`install` wraps three methods, once per process:

* ``GPUModelRunner.__init__`` (the V1 runner; vLLM's CPU runner subclasses it): when the engine's
  settings (:mod:`.settings`) enable the plug-in and the engine decodes speculatively, its
  ``rejection_sampler`` becomes a :class:`~.sampler.VerispecRejectionSampler`. The engine's rule is
  checked against the proposer here, so a refused rule stops the engine while it starts, before any
  generation.
* ``GPUModelRunner._sample``: tells that sampler the rule of each row of the batch (from each request's
  ``SamplingParams.extra_args``).
* ``InputProcessor._validate_params`` (the front end, where requests are admitted): a request's
  ``extra_args["verispec_rule"]`` is checked there, so a refused rule is a ``VLLMValidationError`` from
  ``LLM.generate`` (an HTTP 400 from ``vllm serve``) before anything is scheduled.

The V2 runner (GPUs) is covered by :mod:`.v2`, installed by the same call when vLLM uses it.

Three ways in, all calling :func:`install`: the ``vllm.general_plugins`` entry point ``verispec =
"verispec.integrations.vllm.plugin:register"`` (every vLLM process loads it); ``LLM(...,
worker_extension_cls=WORKER_EXTENSION)`` (:mod:`.worker`); or :func:`verispec.integrations.vllm.make_llm`,
which does the latter and checks the rules before building the engine.
"""

from __future__ import annotations

import functools
import logging

from verispec.integrations.vllm.compat import check_vllm_version
from verispec.integrations.vllm.settings import RuleBook, request_rule, rule_book

log = logging.getLogger("verispec.vllm")

_installed = False


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in every process it starts."""
    install()


def install() -> None:
    """Wrap vLLM's runner and front end (idempotent). The wrappers do nothing for engines whose settings do
    not enable the plug-in."""
    global _installed
    if _installed:
        return
    check_vllm_version()
    _install_v1_runner()
    _install_front_end()
    try:
        from verispec.integrations.vllm.v2 import install_v2
    except ImportError as exc:       # a vLLM build without the V2 runner's sampler (e.g. no Triton)
        log.debug("verispec: V2 model runner not covered (%s)", exc)
    else:
        install_v2()
    _installed = True


def _install_v1_runner() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from verispec.integrations.vllm.sampler import VerispecRejectionSampler

    init, sample = GPUModelRunner.__init__, GPUModelRunner._sample

    @functools.wraps(init)
    def __init__(self, vllm_config, device, *args, **kwargs):
        init(self, vllm_config, device, *args, **kwargs)
        book = rule_book(vllm_config)
        if book is not None and hasattr(self, "rejection_sampler"):
            self.rejection_sampler = VerispecRejectionSampler(self.sampler, self.speculative_config, self.device,
                                                              book)
            log.info("verispec: speculative decoding verified with %s (%s drafts)",
                     book.settings.rule, book.drafts)

    @functools.wraps(sample)
    def _sample(self, logits, spec_decode_metadata):
        sampler = getattr(self, "rejection_sampler", None)
        if spec_decode_metadata is not None and isinstance(sampler, VerispecRejectionSampler):
            sampler.set_rows([_request_rule(sampler.book, self.requests.get(rid)) for rid in self.input_batch.req_ids])
        return sample(self, logits, spec_decode_metadata)

    GPUModelRunner.__init__ = __init__
    GPUModelRunner._sample = _sample


def _request_rule(book: RuleBook, state):
    """A request's rule; a spec the front end did not check (the plug-in was not installed there) that turns
    out invalid is logged and the request keeps vLLM's own sampler rather than stopping the engine."""
    params = getattr(state, "sampling_params", None)
    try:
        return book.for_request(getattr(params, "extra_args", None))
    except ValueError as exc:
        log.error("verispec: request %s verified by vLLM's own sampler: %s", getattr(state, "req_id", "?"), exc)
        return None


def _install_front_end() -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    from verispec.integrations.vllm.settings import REQUEST_RULE

    class RuleRefused(VLLMValidationError, ValueError):
        """A request's verispec rule cannot run on this engine."""

    validate = InputProcessor._validate_params

    @functools.wraps(validate)
    def _validate_params(self, params, *args, **kwargs):
        result = validate(self, params, *args, **kwargs)
        if isinstance(params, SamplingParams):
            try:
                spec = request_rule(params.extra_args)
                if spec is not None:
                    book = getattr(self, "_verispec_book", None)
                    if book is None:
                        book = self._verispec_book = rule_book(self.vllm_config)
                    if book is None:
                        raise ValueError(f"extra_args[{REQUEST_RULE!r}] asks for a verispec rule, but this engine "
                                         "does not verify with the verispec plug-in (it needs a speculative_config "
                                         "and additional_config={'verispec': {...}}; see docs/vllm.md)")
                    if getattr(self.vllm_config, "use_v2_model_runner", False):
                        raise ValueError("per-request verispec rules need vLLM's V1 model runner (set "
                                         "VLLM_USE_V2_MODEL_RUNNER=0); on the V2 runner every request uses the "
                                         f"engine's rule, {book.settings.rule!r}")
                    book.for_request(params.extra_args)
            except ValueError as exc:
                raise RuleRefused(str(exc), parameter=f"extra_args.{REQUEST_RULE}") from exc
        return result

    InputProcessor._validate_params = _validate_params
