"""Collecting real verified positions: run lossless SD and record every drafted position.

Lossless generation samples exactly from the target, so the recorded prefixes are the target's own
trajectories; at each of them every rule's induced law can be compared with its baseline exactly
(:mod:`verispec.diagnose.measures`).

:func:`collect_corpus` generates the problems one after another with one model pair;
:func:`collect_corpus_on_workers` spreads them over the Ray workers of a pool it is given (one problem
per unit; :class:`verispec.cluster.WorkerPool`) and records the same corpus.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import Any

from verispec.diagnose.record import PositionRecorder
from verispec.engine import generate, generate_batch


def collect_corpus(
    target,
    draft,
    problems: Iterable[Any],
    *,
    sampling,
    gamma: int,
    max_new_tokens: int,
    seed: int,
    recorder: PositionRecorder,
    progress: bool = True,
) -> PositionRecorder:
    """Generate each problem with ``rule="lossless"`` and record its drafted positions into ``recorder``.

    ``problems``: objects with ``.dataset``, ``.id``, ``.prompt`` (e.g. :class:`verispec.tasks.datasets.Problem`);
    the prompt ids are ``target.chat_prompt(problem.prompt)``. After every verification an engine
    observer reads the chain (:meth:`~verispec.engine.VerifiedStep.chain`: ``p [G+1, V]``, ``q [G, V]``,
    the draft tokens ``[G]`` and the accepted count ``n``); rows ``0..G−1`` of ``p`` and ``q`` are recorded
    with meta ``dataset``, ``problem_id``, ``step`` (verification step index within the problem),
    ``position`` (0..G−1), ``accepted`` (``position < n``) and ``draft_token``. ``seed`` is passed unchanged
    to every generation; the problem's ``stop`` strings (if it has any) are passed as ``stop``.
    Returns ``recorder``; the generation results are attached as ``recorder.generations`` (a list of
    ``(dataset, id, GenerationResult)``).
    """
    problems = list(problems)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(problems), desc="collecting positions", unit="problem")
    results = getattr(recorder, "generations", None)
    if results is None:
        results = []
        recorder.generations = results  # type: ignore[attr-defined]
    try:
        for problem in problems:
            result = record_problem(target, draft, problem, sampling=sampling, gamma=gamma,
                                    max_new_tokens=max_new_tokens, seed=seed, recorder=recorder)
            results.append((str(problem.dataset), str(problem.id), result))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(positions=len(recorder))
    finally:
        if bar is not None:
            bar.close()
    return recorder


def record_problem(target, draft, problem, *, sampling, gamma: int, max_new_tokens: int, seed: int,
                   recorder: PositionRecorder):
    """Generate one problem with ``rule="lossless"``, recording its drafted positions into ``recorder``
    (the unit of :func:`collect_corpus`, whose docstring gives the record); returns the generation."""

    return generate(
        target, draft, target.chat_prompt(problem.prompt),
        rule="lossless", sampling=sampling, gamma=gamma,
        max_new_tokens=max_new_tokens, stop=_stop(problem),
        seed=seed, observers=[_observer(recorder, problem)],
    )


def _stop(problem) -> tuple[str, ...]:
    return tuple(getattr(problem, "stop", ()) or ())


def _observer(recorder: PositionRecorder, problem):
    """The engine observer recording one problem's drafted positions into ``recorder``."""
    step = [0]
    dataset, pid = str(problem.dataset), str(problem.id)

    def observer(verified):
        chain = verified.chain()
        if chain is None:
            return
        p, q, draft_tokens, n_accepted = chain
        g = int(q.shape[0])
        recorder.add(
            p[:g], q,
            dataset=dataset, problem_id=pid, step=step[0],
            position=list(range(g)),
            accepted=[int(j < int(n_accepted)) for j in range(g)],
            draft_token=[int(t) for t in draft_tokens[:g]],
        )
        step[0] += 1

    return observer


def collect_corpus_batched(target, draft, problems: Iterable[Any], *, sampling, gamma: int, max_new_tokens: int,
                           seed: int, recorder: PositionRecorder, batch_size: int,
                           progress: bool = True) -> PositionRecorder:
    """:func:`collect_corpus` on batched backends (:mod:`verispec.models.batch`), ``batch_size`` problems
    decoded together (continuous batching). Each problem records into a recorder of its own, merged in
    problem order, so the corpus has the layout of :func:`collect_corpus` (its values may differ by the
    round-off of batched model calls)."""

    problems = list(problems)
    own = [PositionRecorder(tol=recorder.tol, max_keep=recorder.max_keep) for _ in problems]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(problems), desc="collecting positions", unit="problem")
    try:
        out = generate_batch(target, draft, [target.chat_prompt(p.prompt) for p in problems], rule="lossless",
                             sampling=sampling, gamma=gamma, max_new_tokens=max_new_tokens,
                             stop=[list(_stop(p)) for p in problems], seeds=[seed] * len(problems),
                             batch_size=batch_size, observers=[_observer(r, p) for r, p in zip(own, problems)],
                             on_done=(lambda i, res: bar.update(1)) if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    results = getattr(recorder, "generations", None)
    if results is None:
        results = []
        recorder.generations = results  # type: ignore[attr-defined]
    for problem, positions, result in zip(problems, own, out):
        recorder.extend(positions)
        results.append((str(problem.dataset), str(problem.id), result))
    return recorder


class _ProblemUnits:
    """The worker side of :func:`collect_corpus_on_workers`: one model pair; a unit ``(i, problem)``
    returns ``(i, positions of that problem in a recorder of its own, generation)``."""

    def __init__(self, settings, load_models: Callable | None, options: dict, tol: float, max_keep: int) -> None:
        from verispec.models import load_pair

        self.target, self.draft, _ = (load_models or load_pair)(settings, need_draft=True)
        self.options, self.tol, self.max_keep = options, tol, max_keep

    def __call__(self, unit):
        i, problem = unit
        recorder = PositionRecorder(tol=self.tol, max_keep=self.max_keep)
        result = record_problem(self.target, self.draft, problem, recorder=recorder, **self.options)
        return i, recorder, result


def collect_corpus_on_workers(
    settings,
    problems: Iterable[Any],
    *,
    pool,
    sampling,
    gamma: int,
    max_new_tokens: int,
    seed: int,
    recorder: PositionRecorder,
    load_models: Callable | None = None,
    progress: bool = True,
) -> PositionRecorder:
    """:func:`collect_corpus` with one unit per problem on the workers of ``pool`` (a
    :class:`verispec.cluster.WorkerPool`, not started: the layer above builds it, this one
    knows nothing of Ray), each holding the pair that ``settings`` names (loaded by ``load_models``,
    default ``load_pair``, with ``n_threads`` = the worker's threads). The problems' positions are added
    to ``recorder`` in problem order whatever order they arrive in, so the corpus is the one
    :func:`collect_corpus` records. A dead worker's problem is generated again on another; a killed
    driver loses the corpus (it is saved whole, at the end). ``pool`` is closed on return."""
    problems = list(problems)
    options = dict(sampling=sampling, gamma=gamma, max_new_tokens=max_new_tokens, seed=seed)
    results = getattr(recorder, "generations", None)
    if results is None:
        results = []
        recorder.generations = results  # type: ignore[attr-defined]
    arrived: dict[int, tuple] = {}
    next_index = [0]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(problems), desc="collecting positions", unit="problem")

    def add(unit, value) -> None:
        i, positions, result = value
        arrived[i] = (positions, result)
        while next_index[0] in arrived:
            positions, result = arrived.pop(next_index[0])
            problem = problems[next_index[0]]
            recorder.extend(positions)
            results.append((str(problem.dataset), str(problem.id), result))
            next_index[0] += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(positions=len(recorder))

    def factory(threads: int):
        local = dataclasses.replace(settings, n_threads=threads)
        return functools.partial(_ProblemUnits, local, load_models, options, recorder.tol, recorder.max_keep)

    try:
        pool.start(factory)
        pool.run(list(enumerate(problems)), add)
    finally:
        pool.close()
        if bar is not None:
            bar.close()
    return recorder
