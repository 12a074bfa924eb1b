"""True baselines in vLLM: the target alone, sampled with a rule's truncation (verispec.integrations.vllm.baseline).

``N`` identical one-token requests; the token must follow ``rule.reference(p1)``, ``p1`` being the target's
processed distribution after the prompt (computed in transformers). Chi-square at level ALPHA; the power check:
the truncated samples reject the untruncated ``p1``, in every one of 500 simulated batches (tests/test_vllm_power.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import ALPHA, gof_pvalue
from tests.vllm.laws import next_probs
from verispec import sets

PROMPT = [40, 41, 42, 43, 44, 45]
N = 3000
BASELINES = [("speccascade:p_base=0.3", "temperature=1"), ("typical:eps=0.2", "temperature=1"),
             ("speccascade:p_base=0.2", "temperature=0.8,top_k=20")]


def baseline_p1(target, sampling: str) -> torch.Tensor:
    """The target's processed distribution after PROMPT under ``sampling`` ("temperature=T[,top_k=K]") ``[V]``."""
    temperature = float(sampling.split(",")[0].split("=")[1])
    top_k = int(sampling.split("top_k=")[1]) if "top_k" in sampling else 0
    p = next_probs(target, [PROMPT], temperature)[0]
    return sets.restrict(p, sets.top_k_mask(p, top_k)) if top_k else p


@pytest.fixture(scope="module")
def baseline_batch(target_engine):
    """Every baseline's requests and plain target-only requests, interleaved in one batch."""
    from verispec.integrations.vllm import baseline_params, request_params

    params = [baseline_params(sampling, rule, max_tokens=1) for rule, sampling in BASELINES]
    params.append(request_params("temperature=1", max_tokens=1))
    outs = target_engine.generate([{"prompt_token_ids": PROMPT}] * (N * len(params)), params * N, use_tqdm=False)
    counts = np.zeros((len(params), 99))
    for i, out in enumerate(outs):
        counts[i % len(params), out.outputs[0].token_ids[0]] += 1
    return counts


@pytest.mark.parametrize("k", range(len(BASELINES)))
def test_baseline_requests_sample_the_rules_reference(baseline_batch, tiny_models, k):
    spec, sampling = BASELINES[k]
    p1 = baseline_p1(tiny_models.target, sampling)
    reference = R.get(spec).reference(p1)
    assert gof_pvalue(baseline_batch[k], reference.numpy()) > ALPHA
    assert gof_pvalue(baseline_batch[k], p1.numpy()) < 1e-6        # power: the truncation is visible


def test_target_only_requests_sample_the_target(baseline_batch, tiny_models):
    assert gof_pvalue(baseline_batch[-1], baseline_p1(tiny_models.target, "temperature=1").numpy()) > ALPHA


def test_a_baseline_request_with_vllms_own_top_p_is_refused_at_admission(target_engine):
    from vllm import SamplingParams

    bad = SamplingParams(temperature=1.0, top_p=0.8, max_tokens=1, extra_args={"verispec_baseline": "typical:eps=0.2"})
    with pytest.raises(Exception, match="extra_args"):
        target_engine.generate([{"prompt_token_ids": PROMPT}], bad, use_tqdm=False)
    unknown = SamplingParams(temperature=1.0, max_tokens=1, extra_args={"verispec_baseline": "no_such_rule"})
    with pytest.raises(Exception, match="unknown rule"):
        target_engine.generate([{"prompt_token_ids": PROMPT}], unknown, use_tqdm=False)
