"""Exact laws of the first two tokens of a request, from the tiny models in transformers (the oracle).

A request with prompt ``P`` at temperature ``T`` emits ``t1 ~ p1 = p(·|P)`` from vLLM's ordinary sampler (the
prefill), then drafts from ``(P, t1)``; the first verified position emits ``t2`` with the rule's per-token law
at ``p2 = p(·|P, t1)``, ``q2 = q(·|P, t1)``. So the pair ``(t1, t2)`` has the joint law
``p1(t1) · law(t2 | t1)``; every identical request in a batch is one sample of it.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.helpers.rule_cases import gof_pvalue


def _tiny_qwen2(seed: int, layers: int, head_std: float):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=99, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                      initializer_range=0.02, eos_token_id=2, bos_token_id=0, pad_token_id=0,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():      # logits of std ~1.5: distributions neither flat nor one-hot
        model.lm_head.weight.normal_(0.0, head_std)
    return model


def tiny_target_and_draft():
    """The vLLM tests' two tiny random Qwen2 models over the 99-token character vocabulary: target (2 layers),
    draft (1 layer). Deterministic, so tests without vLLM can rebuild the laws the vLLM tests check."""
    return _tiny_qwen2(11, 2, head_std=0.2), _tiny_qwen2(12, 1, head_std=0.2)


@torch.no_grad()
def next_probs(model, contexts: list[list[int]], temperature: float) -> torch.Tensor:
    """``softmax(logits / T)`` after each context ``[k, V]`` (float64)."""
    ids = torch.tensor(contexts)
    logits = model(input_ids=ids).logits[:, -1].double()
    return torch.softmax(logits / temperature, dim=-1)


class TwoTokenOracle:
    """``p1 [V]``, and ``p2, q2 [V, V]`` (row ``t1``: the target / draft after ``P + [t1]``)."""

    def __init__(self, target, draft, prompt: list[int], temperature: float = 1.0) -> None:
        self.p1 = next_probs(target, [prompt], temperature)[0]
        vocab = self.p1.numel()
        contexts = [prompt + [t] for t in range(vocab)]
        self.p2 = next_probs(target, contexts, temperature)
        self.q2 = next_probs(draft, contexts, temperature)

    def joint(self, law_given_t1: torch.Tensor) -> np.ndarray:
        """Flat ``[V * V]`` joint law of ``(t1, t2)`` from ``law_given_t1 [V, V]``."""
        return (self.p1[:, None] * law_given_t1).reshape(-1).numpy()


def pair_counts(outputs, vocab: int) -> np.ndarray:
    """Counts of ``(t1, t2)`` over vLLM ``RequestOutput``s, flat ``[V * V]``."""
    counts = np.zeros(vocab * vocab)
    for out in outputs:
        t1, t2 = out.outputs[0].token_ids[:2]
        counts[t1 * vocab + t2] += 1
    return counts


def joint_pvalue(outputs, oracle: TwoTokenOracle, law_given_t1: torch.Tensor) -> float:
    return gof_pvalue(pair_counts(outputs, oracle.p1.numel()), oracle.joint(law_given_t1))
