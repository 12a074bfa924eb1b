"""Batched decoding of a list of prompts: up to ``batch_size`` prompts advance together, each row at its
own pace, on :class:`~verispec.engine.session.BatchSession` (the one batched loop; its docstring has the
step, the cache invariant, the randomness and the statistics).

Continuous batching: the prompts wait in the session's queue; each free row (slot) of the batched
backends (:mod:`verispec.models.batch`) takes the next one, is prefilled, decodes until its output ends
(EOS, stop string, length), and is emptied for the next prompt.

Randomness: prompt ``i`` owns one ``torch.Generator`` seeded with ``seeds[i]``, so a row's tokens do
not depend on which rows share the batch or on the batch size, and equal those of
``generate(..., seed=seeds[i])`` up to the floating-point differences of batched versus single-sequence
model calls (none on the fake models of the tests; float64 round-off on transformers, which leaves
greedy and sampled outputs equal in practice; llama.cpp's quantised kernels differ between batch sizes).

Statistics: each prompt's :class:`Stats` counts the forwards its row took part in and the time of the
batched sections it took part in; :class:`BatchResult` has the totals of the whole call (batched
forwards, seconds, tokens/s).

Chains only: draft trees, prompt lookup and EAGLE heads are refused (``NotImplementedError``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from verispec.engine.decoding import GenerationResult, Observer
from verispec.engine.session import (
    BatchResult,
    BatchSession,
    RowHandle,
    RowRequest,
    check_batch_backend,
    check_gamma,
    check_session_rule,
)
from verispec.models.batch import BatchBackend
from verispec.rules import Rule
from verispec.sampling import SamplingConfig

__all__ = ["BatchResult", "generate_batch", "generate_target_only_batch"]


def _seeds(seeds: int | Sequence[int], n: int) -> list[int]:
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        return [seeds + i for i in range(n)]
    out = [int(s) for s in seeds]
    if len(out) != n:
        raise ValueError(f"seeds: give one seed per prompt ({n}), got {len(out)}")
    return out


def _stops(stop, n: int) -> list[Sequence[str]]:
    """Stop strings per prompt: the same list for all (``["\\n\\n"]``) or one list per prompt."""
    if isinstance(stop, str):
        raise TypeError("stop takes a list of stop strings (or one list per prompt), not a string")
    stop = list(stop)
    if stop and all(not isinstance(x, str) for x in stop):
        if len(stop) != n:
            raise ValueError(f"one stop list per prompt: got {len(stop)} lists for {n} prompts")
        return [list(x) for x in stop]
    return [stop] * n


def _run(session: BatchSession, requests: list[RowRequest],
         on_done: Callable[[int, GenerationResult], None] | None) -> BatchResult:
    """Admit every request (all are checked before any decoding), step the session until all have ended,
    and return their results in request order with the session's totals."""
    results: list[GenerationResult | None] = [None] * len(requests)

    def done(handle: RowHandle) -> None:
        results[handle.request.tag] = handle.result
        if on_done is not None:
            on_done(handle.request.tag, handle.result)

    for i, request in enumerate(requests):
        request.tag, request.on_done = i, done
    t0 = time.perf_counter()
    for request in requests:
        session.admit(request)
    session.run()
    totals = session.totals
    totals.wall_s = time.perf_counter() - t0
    totals.results = results
    return totals


def generate_batch(
    target: BatchBackend,
    draft: BatchBackend,
    prompts: Sequence[Sequence[int]],
    *,
    rule: Rule | str,
    sampling: SamplingConfig,
    gamma: int = 5,
    max_new_tokens: int,
    stop: Sequence[str] | Sequence[Sequence[str]] = (),
    seeds: int | Sequence[int] = 0,
    batch_size: int | None = None,
    vocab_width: int | None = None,
    tree=None,
    lookup=None,
    on_done: Callable[[int, GenerationResult], None] | None = None,
    observers: Sequence[Observer | None] | None = None,
) -> BatchResult:
    """Speculative decoding of every prompt with ``rule``, ``batch_size`` rows at a time (default: the
    backends' rows); see the module docstring. ``seeds``: one per prompt, or an int ``s`` giving
    prompt ``i`` the seed ``s + i``. Prompt ``i``'s result equals ``generate(target_i, draft_i,
    prompts[i], seed=seeds[i], ...)`` on the same models up to batched-versus-single model numerics.
    ``tree`` and ``lookup`` are not supported (chains only). ``stop``: stop strings for every prompt, or
    one list per prompt. ``on_done(i, result)`` is called as soon as prompt ``i`` ends (e.g. to store it
    while the others decode). ``observers``: one per prompt (or None), each called after every verified
    step of its prompt with the :class:`VerifiedStep` on the host, as ``generate``'s observers are."""
    if tree is not None or lookup is not None:
        raise NotImplementedError("batched decoding drafts chains: draft trees and prompt lookup run one sequence "
                                  "at a time (verispec.engine.generate)")
    check_gamma(gamma)
    if draft is None:
        raise ValueError("batched SD needs a draft model (prompt lookup is not supported in batches)")
    check_batch_backend(target, "target")
    check_batch_backend(draft, "draft")
    rule = check_session_rule(rule)
    session = BatchSession(target, draft, batch_size=batch_size, vocab_width=vocab_width)
    seeds = _seeds(seeds, len(prompts))
    if observers is not None and len(observers) != len(prompts):
        raise ValueError(f"one observer (or None) per prompt: got {len(observers)} for {len(prompts)} prompts")
    watch = observers if observers is not None else [None] * len(prompts)
    requests = [RowRequest(ids, max_new_tokens, sampling, rule=rule, gamma=gamma, stop=st, seed=s, observer=w)
                for ids, s, st, w in zip(prompts, seeds, _stops(stop, len(prompts)), watch)]
    return _run(session, requests, on_done)


def generate_target_only_batch(
    target: BatchBackend,
    prompts: Sequence[Sequence[int]],
    *,
    sampling: SamplingConfig,
    max_new_tokens: int,
    stop: Sequence[str] | Sequence[Sequence[str]] = (),
    seeds: int | Sequence[int] = 0,
    batch_size: int | None = None,
    vocab_width: int | None = None,
    on_done: Callable[[int, GenerationResult], None] | None = None,
) -> BatchResult:
    """Plain sampling from the target, ``batch_size`` rows at a time: one batched forward of one token
    per active row per step (the prompt's last token is the first step's). Prompt ``i``'s result equals
    ``generate_target_only(target_i, prompts[i], seed=seeds[i], ...)`` up to batched-versus-single model
    numerics."""
    session = BatchSession(target, None, batch_size=batch_size, target_width=vocab_width)
    seeds = _seeds(seeds, len(prompts))
    requests = [RowRequest(ids, max_new_tokens, sampling, rule=None, stop=st, seed=s)
                for ids, s, st in zip(prompts, seeds, _stops(stop, len(prompts)))]
    return _run(session, requests, on_done)
