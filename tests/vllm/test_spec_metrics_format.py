"""``verispec serve``'s ``metrics.speculative_decoding`` against vLLM's own code: vLLM 0.32's accumulator
(``RequestSpecDecodeMetrics``: observe each verify step, then ``to_dict``) fed the steps verispec recorded gives
the same object, and vLLM's response model (``SpeculativeDecodingMetrics``) accepts ours unchanged."""

from __future__ import annotations

import random

import pytest

from verispec.engine.stats import Stats
from verispec.serve.spec_metrics import spec_decode_metrics


@pytest.mark.parametrize("level", ["summary", "detailed"])
def test_equals_vllms_accumulator_and_validates_as_its_response_model(level):
    from vllm.entrypoints.generate.base.protocol import SpeculativeDecodingMetrics
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    rng = random.Random(7)
    for case in range(200):
        k = rng.randint(1, 8)
        stats = Stats(mode="sd", rule="lossless", gamma=k)
        theirs = RequestSpecDecodeMetrics.new(k)
        for _ in range(rng.randint(0, 30)):
            drafted = rng.randint(1, k)
            accepted = rng.randint(0, drafted)
            stats.record_step(accepted, drafted)
            theirs.observe(num_draft_tokens=drafted, num_accepted=accepted, detailed=level == "detailed")
        ours = spec_decode_metrics(stats, k, level)
        assert ours == theirs.to_dict(), case
        assert SpeculativeDecodingMetrics(**ours).model_dump(exclude_none=True) == ours
