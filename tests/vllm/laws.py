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
