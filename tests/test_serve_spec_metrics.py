"""vLLM's per-request ``metrics.speculative_decoding`` object from verispec's statistics: every field against an
oracle transcribed from vLLM 0.32's ``RequestSpecDecodeMetrics`` (observe per verified step, then to_dict),
fed the same steps, on real generations (chains, γ auto, trees, prompt lookup) of the fake models."""

from __future__ import annotations

import pytest

from tests.helpers.fake_lm import FakeLM
from verispec.engine.costs import CostProfile
from verispec.engine.generate import generate
from verispec.engine.ngram import NgramDrafter
from verispec.engine.stats import Stats
from verispec.sampling import SamplingConfig
from verispec.serve.spec_metrics import response_metrics, spec_decode_metrics


def vllm_oracle(k: int, steps: list[tuple[int, int]], detailed: bool) -> dict:
    """vLLM 0.32's accumulator, in our words: a dense histogram of k + 1 buckets over the accepted count of each
    verify step, the proposed tokens summed; mean acceptance length counts the bonus token."""
    histogram, drafted, per_acc, per_draft = [0] * (k + 1), 0, [], []
    for accepted, proposed in steps:
        histogram[accepted] += 1
        drafted += proposed
        if detailed:
            per_acc.append(accepted)
            per_draft.append(proposed)
    n_steps = sum(histogram)
    n_acc = sum(j * c for j, c in enumerate(histogram))
    out = {"mean_acceptance_length": 1.0 + n_acc / n_steps if n_steps else 1.0,
           "draft_acceptance_rate": n_acc / drafted if drafted else 0.0,
           "acceptance_histogram": histogram, "num_spec_steps": n_steps, "num_accepted_draft_tokens": n_acc,
           "num_draft_tokens": drafted, "num_spec_tokens": k}
    if per_acc:
        out.update(per_step_accepted=per_acc, per_step_drafted=per_draft)
    return out


SAMPLING = SamplingConfig.parse("temperature=1")


def _run(**kw):
    target, draft = FakeLM(vocab=6, seed=1), FakeLM(vocab=6, seed=2)
    return generate(target, kw.pop("draft", draft), [0, 1, 2, 1, 0, 1, 2], rule="lossless", sampling=SAMPLING,
                    max_new_tokens=40, seed=3, **kw).stats


@pytest.mark.parametrize("case, k", [
    ("chain", 4), ("auto", 16), ("tree", 3), ("lookup", 4),
])
def test_the_object_equals_vllms_accumulator_fed_the_same_steps(case, k):
    cheap_draft = CostProfile(draft_token=0.05, target_block=tuple(1 + 0.02 * g for g in range(17)))
    kw = {"chain": {"gamma": 4}, "auto": {"gamma": "auto", "costs": cheap_draft, "draft_stop": 0.0},
          "tree": {"tree": "2,2,1"}, "lookup": {"gamma": 4, "draft": None, "lookup": NgramDrafter()}}[case]
    stats = _run(**kw)
    steps = list(zip(stats.step_accepted, stats.step_drafted))
    assert steps and len(steps) == sum(stats.accepted_hist)
    if case == "tree":
        assert sum(stats.step_drafted) == stats.tree_nodes and max(stats.step_drafted) > 3   # nodes, not depth
    for level in ("summary", "detailed"):
        assert spec_decode_metrics(stats, k, level) == vllm_oracle(k, steps, level == "detailed")
    assert spec_decode_metrics(stats, k, "none") is None


def test_no_speculative_step_and_several_choices():
    plain = Stats(mode="target_only", rule="", gamma=0, new_tokens=5, target_calls=5)
    assert spec_decode_metrics(plain, 0, "summary") == vllm_oracle(0, [], False)
    assert response_metrics([plain], 0, "detailed") == {"speculative_decoding": vllm_oracle(0, [], True)}
    assert response_metrics([plain, plain], 0, "summary") is None              # n > 1: not one sequence's
    assert response_metrics([plain], 0, "none") is None
    with pytest.raises(ValueError, match="none, summary, detailed"):
        spec_decode_metrics(plain, 0, "full")
