"""Exact laws of short continuations and the goodness-of-fit check the engine's law tests share."""

from __future__ import annotations

import numpy as np

from tests.helpers.fake_lm import FakeLM
from tests.helpers.rule_cases import ALPHA, gof_pvalue
from verispec.sampling import SamplingConfig

T1 = SamplingConfig.parse("temperature=1")


def exact_prefix_law(model: FakeLM, prompt: list[int], length: int, sampling: SamplingConfig):
    """{continuation: probability} of the first ``length`` tokens under target-only sampling."""
    law = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, prob in law.items():
            p = sampling.process(model.next_logits(prompt + list(seq))[None])[0].double()
            for tok in range(model.vocab_size):
                if p[tok] > 0:
                    nxt[seq + (tok,)] = prob * p[tok].item()
        law = nxt
    return law


def sample_prefixes(run, n: int, length: int) -> dict:
    """{continuation: count} of the first ``length`` tokens of ``run(seed)`` for seeds ``0..n-1``."""
    counts: dict = {}
    for seed in range(n):
        toks = tuple(run(seed).tokens[:length])
        counts[toks] = counts.get(toks, 0) + 1
    return counts


def assert_law(counts: dict, law: dict) -> None:
    """Pearson goodness of fit of ``counts`` to ``law`` at the suite's level ``ALPHA``."""
    keys = sorted(set(law) | set(counts))
    observed = np.array([counts.get(k, 0) for k in keys])
    expected = np.array([law.get(k, 0.0) for k in keys])
    p = gof_pvalue(observed, expected)
    assert p > ALPHA, f"law mismatch (p = {p:.2e})"
