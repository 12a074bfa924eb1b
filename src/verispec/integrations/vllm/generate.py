"""Prompts in, texts and verispec statistics out: one batched ``generate`` on a vLLM engine.

:func:`generate` runs a list of token-id prompts with one rule (or as target-only / a rule's true baseline) and
returns, per prompt, a :class:`Generated` with the text and a :class:`verispec.engine.stats.Stats` (the fields
the bench store reads): new tokens, target calls, drafted and accepted tokens per step, stop reason.

Where the numbers come from: speculative engines report each request's verification steps
(``per_request_spec_decode_metrics="detailed"``, set by :func:`verispec.integrations.vllm.make_llm` callers
such as the bench: drafted and accepted tokens per step); target calls are those steps, plus the steps that had
no draft (``new_tokens − 1 − Σ(accepted + 1)``), plus the prefill's forward that emitted the first token — as
verispec's engine counts them (target-only: one call per token). A request cut by ``max_tokens`` or a stop
string may have had tokens of its last step discarded by vLLM, which then counts one step fewer there. Times:
vLLM decodes the batch together; each request's ``wall_s`` is the batch's wall time divided by the batch size
(its share of the throughput).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from verispec.engine.stats import Stats
from verispec.sampling import SamplingConfig

TARGET_ONLY = None


@dataclass
class Generated:
    """One request's result, shaped like the engine's ``GenerationResult`` where the bench reads it."""

    text: str
    token_ids: list[int]
    stats: Stats


def truncation_rule(sampling: SamplingConfig) -> tuple[SamplingConfig, str | None]:
    """Split a sampling config into vLLM's part and the truncation that makes a true baseline:
    ``("temperature=0.7,top_k=20", "truncation:min_p=0.3")`` for ``temperature=0.7,top_k=20,min_p=0.3``
    (the truncation as a rule whose ``reference`` is that truncation of ``p``); None when there is none."""
    ordinary = {k: getattr(sampling, k) for k in ("min_p", "eta", "epsilon") if getattr(sampling, k)}
    if ordinary.get("eta") and sampling.eta_delta is not None:
        ordinary["eta_delta"] = sampling.eta_delta
    post = dict(sampling.post_truncation)
    if ordinary and post:
        raise ValueError(f"sampling {sampling} truncates twice (ordinary fields and the post pass); vLLM baselines "
                         "take one truncation")
    settings = ordinary or post
    if not settings:
        return sampling, None
    base = SamplingConfig(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    return base, "truncation:" + ",".join(f"{k}={v}" for k, v in settings.items())


def generate(llm, prompts: Sequence[Sequence[int]], *, sampling: SamplingConfig | str, rule: str | None,
             max_new_tokens: int, gamma: int = 0, seeds: Sequence[int] | None = None,
             stops: Sequence[Sequence[str]] | None = None) -> list[Generated]:
    """Generate ``prompts`` (token ids) on ``llm``: speculative with ``rule`` (a spec) on an engine from
    ``make_llm``, or target-only (``rule=None``; a truncation in ``sampling`` samples that true baseline) on an
    engine from ``make_target_llm``. ``gamma``: the engine's draft length (recorded in the stats)."""
    from verispec.integrations.vllm.llm import baseline_params, request_params

    sampling = SamplingConfig.parse(sampling) if isinstance(sampling, str) else sampling
    params = []
    for i in range(len(prompts)):
        kw = dict(max_tokens=max_new_tokens, seed=None if seeds is None else int(seeds[i]) % (2**63),
                  stop=list(stops[i]) if stops is not None and stops[i] else None)
        if rule is None:
            base, truncation = truncation_rule(sampling)
            params.append(baseline_params(base, truncation, **kw) if truncation else request_params(base, **kw))
        else:
            params.append(request_params(sampling, rule=rule, **kw))
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    share = (time.perf_counter() - t0) / max(1, len(prompts))
    return [_result(out, rule, gamma, share) for out in outs]


def _result(out, rule: str | None, gamma: int, wall_s: float) -> Generated:
    completion = out.outputs[0]
    tokens = list(completion.token_ids)
    stats = Stats(mode="target_only" if rule is None else "sd", rule=rule or "", gamma=gamma if rule else 0)
    stats.new_tokens = len(tokens)
    stats.wall_s = wall_s
    stats.verify_s = wall_s
    stats.stop_reason = {"length": "length"}.get(completion.finish_reason or "",
                                                 "stop" if isinstance(completion.stop_reason, str) else "eos")
    metrics = getattr(completion, "spec_decode_metrics", None)
    emitted = 0
    if rule is not None and metrics is not None:
        stats.gamma_policy = "fixed"
        for accepted, drafted in zip(metrics.per_step_accepted, metrics.per_step_drafted):
            stats.record_step(accepted, drafted)
            stats.record_gamma(drafted)
            stats.draft_calls += drafted
            emitted += accepted + 1
        stats.target_calls = len(metrics.per_step_accepted)
    plain = max(0, stats.new_tokens - 1 - emitted)
    stats.target_calls += plain + (1 if tokens else 0)     # + the prefill's forward, which emitted the first token
    if rule is not None and plain:
        stats.record_gamma(0)
        stats.gamma_hist[0] += plain - 1
    return Generated(completion.text, tokens, stats)
