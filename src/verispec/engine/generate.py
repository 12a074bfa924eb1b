"""Decoding loops: target-only (the baseline and ground truth) and chain speculative decoding.

Cache invariant of the chain loop: the target's KV cache holds every committed token except the
last one; the draft's lacks the tokens of ``pending`` (the last committed token, and the one before
it after a fully accepted block or a plain target step). A step

1. drafts ``x_1..x_g`` with the draft model (feeding ``pending`` first, then each draft token),
2. runs one target forward over ``[pending, x_1..x_g]`` -> ``p_1..p_{g+1}``,
3. calls ``rule.verify`` -> ``n`` accepted drafts and the next token ``z``,
4. commits ``x_1..x_n, z``, rolls both caches back, ``pending`` = what the draft has not seen.

``γ = "auto"`` chooses ``g`` before every step from the machine's cost profile and the acceptance so
far (:mod:`verispec.engine.gamma`); ``g = 0`` is then a plain target step.

``g = min(γ, budget − 1)`` so that ``max_new_tokens`` is never exceeded; when one token is left it is
sampled from the target alone. EOS or a stop string inside an accepted block ends the output at the
token that completes it.

Both loops share their prologue (prompt checks, generator, output buffer) and epilogue (totals) in
:class:`_Decoding`; model, sampling and rule time is added to the :class:`Stats` fields by
``with stats.timing(field):`` blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from verispec.engine.costs import CostProfile
from verispec.engine.gamma import AutoGamma
from verispec.engine.stats import CallCosts, Stats
from verispec.models.base import Backend, check_compatible, tokenizer_size
from verispec.rules import Rule
from verispec.rules import get as get_rule
from verispec.rules.base import sample_categorical
from verispec.sampling import SamplingConfig

#: observer(p [G+1, V], q [G, V], draft [G], n_accepted) called after every verification.
Observer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], None]


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stats: Stats


class _Output:
    """Committed tokens with exact EOS / stop-string / budget handling."""

    def __init__(self, backend: Backend, stop: Sequence[str], max_new_tokens: int) -> None:
        self.backend, self.stop, self.max_new = backend, tuple(s for s in stop if s), max_new_tokens
        self.tokens: list[int] = []
        self.text = ""
        self.stop_reason = ""

    @property
    def remaining(self) -> int:
        return self.max_new - len(self.tokens)

    def extend(self, new: Sequence[int]) -> bool:
        """Append ``new``; returns True when the generation is over (EOS, stop string or budget)."""
        for tok in new:
            if tok in self.backend.eos_token_ids:
                self.stop_reason = "eos"
                break
            self.tokens.append(int(tok))
            if self.stop and self._cut_at_stop():
                self.stop_reason = "stop"
                break
            if len(self.tokens) >= self.max_new:
                self.stop_reason = "length"
                break
        if self.stop_reason:
            self.text = self._text_without_stop()
            return True
        return False

    def _cut_at_stop(self) -> bool:
        # Only the tail can contain a stop string that the last token completed.
        window = max(len(s) for s in self.stop) + 32
        tail = self.backend.detokenize(self.tokens[-window:])
        return any(s in tail for s in self.stop)

    def _text_without_stop(self) -> str:
        text = self.backend.detokenize(self.tokens)
        if self.stop_reason == "stop":
            cut = min((text.find(s) for s in self.stop if s in text), default=-1)
            if cut >= 0:
                text = text[:cut]
        return text

    def finish(self) -> str:
        if not self.stop_reason:
            self.text = self.backend.detokenize(self.tokens)
        return self.text


def _check_prompt(backend: Backend, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("the prompt is empty: give at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(ids) >= backend.context_length:
        raise ValueError(
            f"the prompt has {len(ids)} tokens but {backend.name} has a context of {backend.context_length}: "
            "shorten the prompt or raise the context length (--n-ctx)"
        )
    return ids


def _budget(backend: Backend, n_prompt: int, max_new_tokens: int, gamma: int) -> int:
    # A verification forward may hold γ+1 tokens beyond the committed ones.
    room = backend.context_length - n_prompt - gamma - 1
    return max(1, min(max_new_tokens, room))


class _Decoding:
    """What both loops share: the checked prompt, the generator, the statistics and the output, and
    the epilogue that fills the totals. The wall clock starts after the prefill (:meth:`start`)."""

    def __init__(self, target: Backend, prompt_ids: Sequence[int], *, stats: Stats, max_new_tokens: int,
                 stop: Sequence[str], seed: int, gamma: int) -> None:
        self.ids = _check_prompt(target, prompt_ids, max_new_tokens)
        self.gen = torch.Generator().manual_seed(seed)
        self.stats = stats
        self.out = _Output(target, stop, _budget(target, len(self.ids), max_new_tokens, gamma))
        self.t_start = 0.0

    def start(self) -> None:
        self.t_start = time.perf_counter()

    def sample(self, probs: torch.Tensor) -> int:
        """One token from ``probs [1, V]`` with this generation's generator."""
        return int(sample_categorical(probs, self.gen)[0])

    def result(self) -> GenerationResult:
        stats, out = self.stats, self.out
        stats.wall_s = time.perf_counter() - self.t_start
        stats.new_tokens = len(out.tokens) + (out.stop_reason == "eos")
        stats.stop_reason = out.stop_reason
        return GenerationResult(out.finish(), out.tokens, stats)


def generate_target_only(
    target: Backend,
    prompt_ids: Sequence[int],
    *,
    sampling: SamplingConfig,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    seed: int = 0,
    vocab_width: int | None = None,
) -> GenerationResult:
    """Plain autoregressive sampling from the target with ``sampling`` (one forward per token).

    ``vocab_width`` slices the logits (default: the tokenizer's size, dropping padded rows)."""
    run = _Decoding(target, prompt_ids, stats=Stats(mode="target_only", rule="", gamma=0),
                    max_new_tokens=max_new_tokens, stop=stop, seed=seed, gamma=0)
    stats = run.stats
    # Logits rows past the tokenizer are padding: never sample them.
    width = vocab_width or min(target.vocab_size, tokenizer_size(target))
    target.reset()
    with stats.timing("prefill_s"):
        logits = target.forward(run.ids, all_logits=False)
    stats.target_calls += 1  # the prefill forward produced the first token's distribution
    run.start()
    while True:
        with stats.timing("rule_s"):
            tok = run.sample(sampling.process(logits[-1:, :width]))
        if run.out.extend([tok]):
            break
        with stats.timing("verify_s"):
            logits = target.forward([tok], all_logits=False)
        stats.target_calls += 1
    return run.result()


def generate(
    target: Backend,
    draft: Backend,
    prompt_ids: Sequence[int],
    *,
    rule: Rule | str,
    sampling: SamplingConfig,
    gamma: int | str | AutoGamma,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    seed: int = 0,
    observer: Observer | None = None,
    vocab_width: int | None = None,
    costs: CallCosts | CostProfile | None = None,
) -> GenerationResult:
    """Chain speculative decoding of ``prompt_ids`` with ``rule``; see the module docstring.

    ``gamma``: draft tokens per step, or ``"auto"``: chosen before every step by the cost model from
    ``costs`` (a :class:`CostProfile`) and the acceptance seen so far (:class:`AutoGamma`; a step may
    then also be a plain target step, ``g = 0``), or an :class:`AutoGamma` of one's own (fresh per
    generation: it learns from the steps). ``vocab_width`` (from :func:`check_compatible`,
    computed when omitted) slices both models' logits to the shared vocabulary. ``costs`` (a
    :class:`CallCosts` from :func:`measure_costs` or a :class:`CostProfile`) fills
    ``stats.cost_model_speedup``: with a profile, the modelled time of target-only sampling over the
    modelled time of the steps actually taken (:mod:`verispec.engine.costs`).
    """
    policy = gamma if isinstance(gamma, AutoGamma) else None
    if gamma == "auto":
        if not isinstance(costs, CostProfile):
            raise ValueError("gamma='auto' needs the machine's cost profile: pass costs=CostProfile "
                             "(verispec.engine.cached_profile or measure_profile)")
        policy = AutoGamma(costs)
    if policy is not None:
        gamma = policy.g_max
    elif isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per step) must be an integer >= 1 or 'auto', got {gamma!r}")
    elif isinstance(costs, CostProfile) and gamma > costs.g_max:
        raise ValueError(f"the cost profile covers γ = 1..{costs.g_max}, got gamma={gamma}")
    rule = get_rule(rule)
    run = _Decoding(target, prompt_ids, stats=Stats(mode="sd", rule=rule.spec(), gamma=gamma,
                                                    gamma_policy="auto" if policy else "fixed"),
                    max_new_tokens=max_new_tokens, stop=stop, seed=seed, gamma=gamma)
    stats, out, ids = run.stats, run.out, run.ids
    _check_prompt(draft, ids, max_new_tokens)
    width = vocab_width or check_compatible(target, draft)

    target.reset()
    draft.reset()
    with stats.timing("prefill_s"):
        if len(ids) > 1:
            target.forward(ids[:-1], all_logits=False)
            draft.forward(ids[:-1], all_logits=False)
    committed = len(ids)          # tokens in the sequence; the caches hold committed − 1
    pending = [ids[-1]]           # tokens the draft cache still has to see (pending first)

    run.start()
    while True:
        g = min(policy.next() if policy else gamma, out.remaining - 1)
        stats.record_gamma(g)
        if g < 1:
            # A plain target step (one token left, or the policy found drafting not worth it):
            # the next token comes from the target alone (bonus semantics); the draft has not
            # seen it yet, so it joins ``pending``.
            with stats.timing("verify_s"):
                logits = target.forward(pending[-1:], all_logits=False)
            stats.target_calls += 1
            with stats.timing("rule_s"):
                tok = run.sample(sampling.process(logits[:, :width]))
            if out.extend([tok]):
                break
            committed += 1
            pending.append(tok)
            continue

        # 1. draft x_1..x_g
        draft_tokens, q = _draft_block(draft, pending, g, sampling, width, run)
        # 2. one target forward over [pending, x_1..x_g] -> p_1..p_{g+1}
        with stats.timing("verify_s"):
            target_logits = target.forward([pending[-1]] + draft_tokens.tolist(), all_logits=True)
        stats.target_calls += 1
        # 3. verify -> n accepted drafts and the next token z
        with stats.timing("rule_s"):
            p = sampling.process(target_logits[:, :width])
            n_acc, nxt = rule.verify(p[None], q[None], draft_tokens[None], generator=run.gen)
            n = int(n_acc[0])
        stats.record_step(n, g)
        if policy is not None:
            policy.update(n, g)
        if observer is not None:
            observer(p, q, draft_tokens, n)

        # 4. commit x_1..x_n, z and roll both caches back to committed − 1 tokens
        emitted = draft_tokens[:n].tolist() + [int(nxt[0])]
        if out.extend(emitted):
            break
        # Target cache holds committed − 1 + g + 1 tokens; keep up to x_n.
        target.rollback(committed + n)
        # Draft cache saw pending and x_1..x_{g−1}.
        draft.rollback(committed + min(n, g - 1))
        committed += n + 1
        # The draft has not seen z, nor x_g when the whole block was accepted.
        pending = emitted[-2:] if n == g else emitted[-1:]
    result = run.result()
    if isinstance(costs, CostProfile):
        reached = sum(stats.position_reached)
        alpha = sum(stats.position_accepted) / reached if reached else None
        modelled = sum(k * costs.step_cost(g, alpha) for g, k in enumerate(stats.gamma_hist))
        stats.cost_model_speedup = costs.speedup(stats.new_tokens, modelled) if modelled else None
    elif costs is not None:
        stats.cost_model_speedup = costs.speedup(stats.block_efficiency)
    return result


def _draft_block(draft: Backend, pending: list[int], g: int, sampling: SamplingConfig, width: int,
                 run: _Decoding) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``g`` draft tokens, feeding ``pending`` first. -> ``(tokens [g] int64, q [g, V])``."""
    stats = run.stats
    draft_tokens = torch.empty(g, dtype=torch.long)
    q_rows = []
    feed = pending
    for i in range(g):
        with stats.timing("draft_s"):
            logits = draft.forward(feed, all_logits=False)
        with stats.timing("rule_s"):
            q_i = sampling.process(logits[:, :width])
            tok = sample_categorical(q_i, run.gen)
        draft_tokens[i] = tok[0]
        q_rows.append(q_i[0])
        feed = [int(tok[0])]
    stats.draft_calls += g
    return draft_tokens, torch.stack(q_rows)
