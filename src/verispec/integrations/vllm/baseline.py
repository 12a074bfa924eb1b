"""True baselines in vLLM: the target sampled with a rule's truncation, on an engine without speculative decoding.

A lossy rule is judged against its true baseline, ``rule.reference(p)``: the target restricted to the rule's
allowed set (min-p for SpecCascade, the η set for typical acceptance, ...), or ``p`` itself for the
collaborative rules. :class:`VerispecBaseline` is a vLLM logits processor
(``LLM(logits_processors=[BASELINE_PROCESSOR])``) that samples it: for a request with
``extra_args={"verispec_baseline": "<rule spec>", "verispec_top_k": k, "verispec_top_p": p}`` it takes the
tempered logits vLLM hands it, applies vLLM's own top-k / top-p (the same function that processes the target in
the speculative engine, so ``p`` is the one the rule's set is computed on there), and replaces the row by
``log rule.reference(p)``; vLLM then samples its softmax, which is ``rule.reference(p)`` exactly. Top-k and top-p
travel in ``extra_args`` because vLLM would apply its own after this processor (and top-p again on the
truncated row is not the same set); :func:`baseline_params` builds such a request, and the processor refuses a
baseline request whose ``SamplingParams`` set top-k or top-p themselves.

vLLM refuses custom logits processors on engines with speculative decoding; target-only and baseline runs go
to an engine without it (:func:`verispec.integrations.vllm.make_target_llm`).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

from verispec import rules as rule_registry
from verispec.integrations.vllm.settings import REQUEST_BASELINE, REQUEST_TOP_K, REQUEST_TOP_P
from verispec.rules.base import Rule
from vllm import SamplingParams

BASELINE_PROCESSOR = "verispec.integrations.vllm.baseline:VerispecBaseline"


def baseline_request(extra_args: dict | None) -> tuple[Rule, int, float] | None:
    """``(rule, top_k, top_p)`` of a baseline request's ``extra_args`` (None: not a baseline request);
    ``ValueError`` naming the bad value."""
    if not extra_args or REQUEST_BASELINE not in extra_args:
        return None
    rule = rule_registry.get(extra_args[REQUEST_BASELINE])
    top_k = extra_args.get(REQUEST_TOP_K, 0)
    top_p = extra_args.get(REQUEST_TOP_P, 1.0)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"extra_args[{REQUEST_TOP_K!r}] must be an integer >= 0 (0: off), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"extra_args[{REQUEST_TOP_P!r}] must be a number in (0, 1] (1: off), got {top_p!r}")
    return rule, top_k, float(top_p)


class VerispecBaseline(LogitsProcessor):
    """Samples ``rule.reference(p)`` for the requests that ask for a rule's true baseline (module docstring)."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        try:
            found = baseline_request(sampling_params.extra_args)
        except ValueError as exc:
            raise ValueError(f"verispec baseline request: {exc}") from exc
        if found is not None and (sampling_params.top_k not in (0, -1) or sampling_params.top_p < 1.0):
            raise ValueError(f"a verispec baseline request carries top-k / top-p in extra_args[{REQUEST_TOP_K!r}] / "
                             f"[{REQUEST_TOP_P!r}] (vLLM would apply its own after the truncation); leave "
                             "SamplingParams.top_k / top_p off, e.g. build it with "
                             "verispec.integrations.vllm.baseline_params")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[Rule, int, float]] = {}

    def is_argmax_invariant(self) -> bool:
        return True          # every truncation keeps the argmax: greedy requests skip this processor

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update,
                             lambda params, _prompt, _output: baseline_request(params.extra_args))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [batch, V]`` (tempered) -> the same with the baseline rows replaced by ``log reference(p)``."""
        if not self.rows:
            return logits
        groups: dict[Rule, list[int]] = {}
        for index, (rule, _, _) in self.rows.items():
            groups.setdefault(rule, []).append(index)
        for rule, indices in groups.items():
            idx = torch.tensor(indices, device=logits.device)
            top_k = torch.tensor([self.rows[i][1] or logits.shape[-1] for i in indices], device=logits.device)
            top_p = torch.tensor([self.rows[i][2] for i in indices], dtype=torch.float32, device=logits.device)
            rows = apply_top_k_top_p(logits[idx].float(), top_k, top_p)
            reference = rule.reference(torch.softmax(rows, dim=-1))
            logits[idx] = torch.where(reference > 0, reference.clamp_min(1e-38).log(),
                                      torch.full_like(reference, float("-inf"))).to(logits.dtype)
        return logits
