"""The V2 model runner's rejection sampler with verispec's rules (vLLM on GPUs, ``VLLM_USE_V2_MODEL_RUNNER``).

vLLM 0.32's V2 runner (``vllm/v1/worker/gpu/``) verifies with its own class,
``vllm.v1.worker.gpu.spec_decode.rejection_sampler.RejectionSampler``, whose ``_verify`` receives all logits
rows of a chunk of requests: request ``i`` owns rows ``cu[i] .. cu[i+1] - 1``, one per drafted position plus
its bonus position, the draft token of position ``j`` being the input token of row ``j + 1``; the draft's raw
logits sit in ``draft_logits [max_num_reqs, num_speculative_steps, V]`` at the request's state index (None:
point-mass drafts). :class:`VerispecV2RejectionSampler` keeps vLLM's processing of the target
(``sampler.apply_sampling_params``: processors, temperature, min-p, top-k / top-p), divides the draft logits by
the request's temperature as vLLM's kernel does, and runs :func:`~.verify.verify_flat` with the engine's rule.
The bonus token is drawn here from the processed target (vLLM's kernel draws it inside the same call).

Limits (checked or stated): the engine's rule applies to every request (per-request rules need the V1 runner:
``VLLM_USE_V2_MODEL_RUNNER=0``; the front end refuses them on V2); seeded requests draw from torch's global
generator here; block verification and synthetic rates (other ``rejection_sample_method`` values) are not
combined with the plug-in (the proposer check sees ``rejection_sample_method != "standard"`` as point-mass
drafts, and the plug-in replaces the method). Written against vLLM 0.32.0 and exercised by
``scripts/vllm_gpu_check.py`` on a GPU machine; this module is not imported on CPUs.
"""

from __future__ import annotations

import functools
import logging

import torch

from verispec.integrations.vllm.verify import PLACEHOLDER, verify_flat

log = logging.getLogger("verispec.vllm")


def install_v2() -> None:
    """Wrap the V2 runner's construction of its rejection sampler (ImportError where vLLM has no V2 runner)."""
    from vllm.v1.worker.gpu import model_runner as v2_runner
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    from verispec.integrations.vllm.settings import rule_book

    class VerispecV2RejectionSampler(RejectionSampler):
        """vLLM's V2 rejection sampler verifying with the engine's verispec rule."""

        def __init__(self, sampler, spec_config, device, *args, book=None, **kwargs) -> None:
            super().__init__(sampler, spec_config, device, *args, **kwargs)
            self.book = book

        def _verify(self, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
                    expanded_idx_mapping, expanded_local_pos, seq_lens_upper_bound_np, verify_draft_sampled):
            if self.book is None or self.book.default is None:
                return super()._verify(logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping,
                                       idx_mapping_np, expanded_idx_mapping, expanded_local_pos,
                                       seq_lens_upper_bound_np, verify_draft_sampled)
            processed = self.sampler.apply_sampling_params(
                logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, draft_sampled, expanded_local_pos,
                seq_lens_upper_bound_np)
            sampled, num_sampled = verify_v2_rows(
                self.book.default, processed, draft_logits, verify_draft_sampled, cu_num_logits, idx_mapping,
                self.sampler.sampling_states.temperature.gpu, self.num_speculative_steps)
            return processed, sampled, num_sampled

    original = RejectionSampler

    @functools.wraps(original)
    def make(sampler, spec_config, device, *args, **kwargs):
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        book = rule_book(config) if config is not None else None
        if book is None:
            return original(sampler, spec_config, device, *args, **kwargs)
        log.info("verispec: V2 runner verifies with %s (%s drafts)", book.settings.rule, book.drafts)
        return VerispecV2RejectionSampler(sampler, spec_config, device, *args, book=book, **kwargs)

    v2_runner.RejectionSampler = make


def verify_v2_rows(rule, processed: torch.Tensor, draft_logits: torch.Tensor | None, draft_sampled: torch.Tensor,
                   cu_num_logits: torch.Tensor, idx_mapping: torch.Tensor, temperature: torch.Tensor,
                   num_speculative_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The V2 layout to :func:`verify_flat` and back.

    ``processed [num_logits, V]`` target logits after vLLM's processing; ``draft_logits [max_num_reqs, S, V]``
    raw or None; ``draft_sampled [num_logits]`` the input token of each row (-1: invalid draft);
    ``cu_num_logits [num_reqs + 1]``; ``idx_mapping [num_reqs]`` request state indices; ``temperature
    [max_num_reqs]``. ``-> (sampled [num_reqs, S + 1] int64, num_sampled [num_reqs] int32)``.
    """
    device = processed.device
    cu = cu_num_logits.tolist()
    num_reqs = len(cu) - 1
    counts = [cu[i + 1] - cu[i] - 1 for i in range(num_reqs)]
    target_rows = torch.tensor([cu[i] + j for i in range(num_reqs) for j in range(counts[i])], dtype=torch.long,
                               device=device)
    bonus_rows = torch.tensor([cu[i + 1] - 1 for i in range(num_reqs)], dtype=torch.long, device=device)
    temp = temperature[idx_mapping].float()
    greedy = temp == 0
    draft_tokens = draft_sampled[target_rows + 1]
    req_of_row = torch.repeat_interleave(torch.arange(num_reqs, device=device),
                                         torch.tensor(counts, device=device))
    draft_probs = None
    if draft_logits is not None:
        local = target_rows - torch.tensor(cu[:-1], device=device)[req_of_row]
        rows = draft_logits[idx_mapping[req_of_row], local].float()
        t = torch.where(greedy, torch.ones_like(temp), temp)[req_of_row]
        draft_probs = torch.softmax(rows / t[:, None], dim=-1)
    bonus_logits = processed[bonus_rows].float()
    bonus_probs = torch.softmax(bonus_logits, dim=-1)
    bonus = torch.where(greedy, bonus_logits.argmax(-1), torch.multinomial(bonus_probs, 1)[:, 0])
    out = torch.full((num_reqs, num_speculative_steps + 1), PLACEHOLDER, dtype=torch.int32, device=device)
    uniforms = torch.rand(target_rows.numel(), dtype=torch.float64, device=device)
    verify_flat([rule] * num_reqs, processed[target_rows], draft_probs, draft_tokens, counts, bonus, uniforms,
                greedy_rows=greedy, bonus_logits=bonus_logits, out=out, max_spec_len=num_speculative_steps)
    num_sampled = (out != PLACEHOLDER).sum(-1).to(torch.int32)
    return out.long(), num_sampled
