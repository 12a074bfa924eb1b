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


# -- through verispec serve: the official openai client on the tiny float64 transformers pair ---------------

GREEDY = SamplingConfig.parse("temperature=0")


@pytest.fixture(scope="module")
def served():
    pytest.importorskip("openai")
    from tests.helpers.serve import serve_tiny, tiny_served

    pair = tiny_served(rows=4)
    servers = {level: serve_tiny(pair, spec_decode_metrics=level) for level in ("detailed", "none")}
    yield pair, servers
    for server in servers.values():
        server.stop()


def test_served_responses_carry_vllms_metrics_object(served):
    """Completions and chat, streamed (on the final usage chunk) and not: ``metrics.speculative_decoding`` equals
    the object of the same request's generation run by the engine directly, and agrees with ``usage.speculative``;
    several choices carry none; a tree counts its nodes as drafted tokens."""
    pair, servers = served
    client = servers["detailed"].client()
    lossy = {"verification": {"rule": "lenience:ell=0.5", "gamma": 3}}
    ids = pair.target.tokenize("hello", add_special=True)
    ref = generate(pair.target, pair.draft, ids, rule="lenience:ell=0.5", sampling=GREEDY, gamma=3, max_new_tokens=12)
    out = client.completions.create(model="verispec", prompt="hello", max_tokens=12, temperature=0, extra_body=lossy)
    got = out.model_extra["metrics"]["speculative_decoding"]
    assert got == spec_decode_metrics(ref.stats, 3, "detailed") and got["num_spec_steps"] > 0
    spec = out.usage.model_extra["speculative"]
    assert got["num_accepted_draft_tokens"] == spec["accepted_tokens"]
    assert got["num_draft_tokens"] == spec["draft_tokens"]

    chunks = list(client.completions.create(model="verispec", prompt="hello", max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, extra_body=lossy))
    assert chunks[-1].model_extra["metrics"]["speculative_decoding"] == got
    assert all("metrics" not in (c.model_extra or {}) for c in chunks[:-1])

    chat = client.chat.completions.create(model="verispec", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=10, temperature=0, extra_body=lossy)
    ref_chat = generate(pair.target, pair.draft, pair.target.chat_prompt("hi"), rule="lenience:ell=0.5",
                        sampling=GREEDY, gamma=3, max_new_tokens=10)
    assert chat.model_extra["metrics"]["speculative_decoding"] == spec_decode_metrics(ref_chat.stats, 3, "detailed")

    two = client.completions.create(model="verispec", prompt="hello", max_tokens=8, temperature=0, n=2)
    assert two.model_extra.get("metrics") is None

    tree = client.completions.create(model="verispec", prompt="hello", max_tokens=12, temperature=0,
                                     extra_body={"verification": {"tree": "2,2,1"}})
    t = tree.model_extra["metrics"]["speculative_decoding"]
    assert t["num_spec_tokens"] == 3 and len(t["acceptance_histogram"]) == 4
    assert t["num_draft_tokens"] == tree.usage.model_extra["speculative"]["draft_tokens"] == sum(t["per_step_drafted"])

    plain = servers["none"].client().completions.create(model="verispec", prompt="hello", max_tokens=8,
                                                        temperature=0, extra_body=lossy)
    assert "metrics" not in plain.model_extra


def test_the_flag_sets_the_servers_level(tmp_path):
    """``verispec serve --per-request-spec-decode-metrics`` reaches the policy the app answers with (and
    is off by default, as in vLLM)."""
    from tests.helpers.serve import save_tiny_pair
    from tests.test_serve_cli import parser
    from verispec.serve.cli import build_server

    target, draft = save_tiny_pair(tmp_path)
    common = ["serve", "--target", str(target), "--draft", str(draft), "--dtype", "float64", "--batch-size", "1"]
    for extra, level in (([], "none"), (["--per-request-spec-decode-metrics", "summary"], "summary")):
        app, _ = build_server(parser().parse_args(common + extra))
        assert app.state.verispec.policy.spec_decode_metrics == level
