"""Collecting real verified positions: run lossless SD and record every drafted position.

Lossless generation samples exactly from the target, so the recorded prefixes are the target's own
trajectories; at each of them every rule's induced law can be compared with its baseline exactly
(:mod:`verispec.diagnose.measures`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from verispec.diagnose.record import PositionRecorder


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

    ``problems``: objects with ``.dataset``, ``.id``, ``.prompt`` (e.g. :class:`verispec.bench.datasets.Problem`);
    the prompt ids are ``target.chat_prompt(problem.prompt)``. After every verification the engine's
    observer receives ``p [G+1, V]``, ``q [G, V]``, the draft tokens ``[G]`` and the accepted count
    ``n``; rows ``0..G−1`` of ``p`` and ``q`` are recorded with meta ``dataset``, ``problem_id``,
    ``step`` (verification step index within the problem), ``position`` (0..G−1), ``accepted``
    (``position < n``) and ``draft_token``. ``seed`` is passed unchanged to every generation; the
    problem's ``stop`` strings (if it has any) are passed as ``stop``.
    Returns ``recorder``; the generation results are attached as ``recorder.generations`` (a list of
    ``(dataset, id, GenerationResult)``).
    """
    from verispec.engine import generate  # lazy: the engine sits above the rules layer

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
            step = [0]
            dataset, pid = str(problem.dataset), str(problem.id)

            def observer(p, q, draft_tokens, n_accepted, _step=step, _ds=dataset, _pid=pid):
                g = int(q.shape[0])
                recorder.add(
                    p[:g], q,
                    dataset=_ds, problem_id=_pid, step=_step[0],
                    position=list(range(g)),
                    accepted=[int(j < int(n_accepted)) for j in range(g)],
                    draft_token=[int(t) for t in draft_tokens[:g]],
                )
                _step[0] += 1

            prompt_ids = target.chat_prompt(problem.prompt)
            result = generate(
                target, draft, prompt_ids,
                rule="lossless", sampling=sampling, gamma=gamma,
                max_new_tokens=max_new_tokens, stop=tuple(getattr(problem, "stop", ()) or ()),
                seed=seed, observer=observer,
            )
            results.append((dataset, pid, result))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(positions=len(recorder))
    finally:
        if bar is not None:
            bar.close()
    return recorder
