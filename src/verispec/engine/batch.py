"""Batched decoding: up to ``batch_size`` prompts advance together, each row at its own pace.

Continuous batching: the prompts wait in a queue; each free row (slot) of the batched backends
(:mod:`verispec.models.batch`) takes the next one, is prefilled, decodes until its output ends (EOS,
stop string, length), and is emptied for the next prompt. Every row keeps the cache invariant of
:mod:`verispec.engine.generate`: the target row holds every committed token but the last (the
*root*), the draft row lacks ``pending`` (the root, plus accepted tokens it never processed).

A step of :func:`generate_batch` over the active rows:

1. drafts: row ``r`` drafts ``g_r = min(γ, budget_r − 1)`` tokens. Depth ``d`` is one batched draft
   forward over the rows with ``g_r > d`` (at ``d = 0`` each row feeds its ``pending``), then each
   row samples its token from its processed draft row ``q`` on the device;
2. one batched target forward: row ``r`` appends ``[root, x_1..x_{g_r}]`` (ragged; a row with
   ``g_r = 0`` appends the root alone: a plain target step) -> processed ``p`` at each of them;
3. verification: one ``rule.verify(p [R, g+1, V], q [R, g, V], x [R, g], [generator_r ...])`` per draft
   length ``g`` over its ``R`` rows (usually one call: every row drafts γ), on the device, then one copy
   of every row's ``(n, z)`` to the host;
4. commits: row ``r`` emits ``x_1..x_n, z`` and rolls back its own target and draft rows.

Randomness: prompt ``i`` owns one ``torch.Generator`` on the logits' device seeded with
``seeds[i]``; its draft draws, the rule's uniforms and its next tokens all come from it, in the
order of :func:`~verispec.engine.generate.generate` (per step: ``g`` draft draws, then
``rule.verify``). So a row's tokens do not depend on which rows share the batch or on the batch
size, and equal those of ``generate(..., seed=seeds[i])`` up to the floating-point differences of
batched versus single-sequence model calls (none on the fake models of the tests; float64
round-off on transformers, which leaves greedy and sampled outputs equal in practice; llama.cpp's
quantised kernels differ between batch sizes). The batched ``verify`` gets one generator per row
(:func:`verispec.rules.base.uniform`): row ``r`` draws from its own generator exactly what a call on
row ``r`` alone would, so batching never ties a row's draws to its neighbours.

Statistics: each prompt's :class:`Stats` counts the forwards its row took part in (``target_calls``,
``draft_calls``), its accepted counts, and adds to ``draft_s`` / ``verify_s`` / ``rule_s`` the time of
every batched section it took part in (its latency, shared with its neighbours); ``wall_s`` runs from
its prefill to its end. :class:`BatchResult` has the totals of the whole call (batched forwards,
seconds, tokens/s).

Chains only: draft trees, prompt lookup and EAGLE heads are refused (``NotImplementedError``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from verispec.engine.decoding import Decoding, GenerationResult, Observer, VerifiedStep, check_prompt
from verispec.engine.stats import Section, Stats
from verispec.models.base import check_compatible, logits_device, tokenizer_size
from verispec.models.batch import BatchBackend, row_slices
from verispec.rules import Rule
from verispec.rules import get as get_rule
from verispec.rules.base import sample_categorical
from verispec.sampling import SamplingConfig


@dataclass
class BatchResult:
    """One :class:`GenerationResult` per prompt (in prompt order; indexable and iterable like a list)
    and the totals of the batched run. ``*_forwards``: batched model calls after the prefills; seconds
    of each section counted once (not per row)."""

    results: list[GenerationResult]
    batch_size: int
    wall_s: float = 0.0             # the whole call, prefills included
    target_forwards: int = 0
    draft_forwards: int = 0
    prefills: int = 0               # batched prefills (prompts admitted together; SD: of both models)
    row_steps: int = 0              # Σ over target forwards of the rows taking part
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    rule_s: float = 0.0

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[GenerationResult]:
        return iter(self.results)

    def __getitem__(self, i: int) -> GenerationResult:
        return self.results[i]

    @property
    def new_tokens(self) -> int:
        return sum(r.stats.new_tokens for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mean_rows(self) -> float:
        """Mean rows per target forward (how full the batch was)."""
        return self.row_steps / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Emitted tokens per batched target forward (all rows together)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0


class _Row:
    """A prompt in a slot: its decoding state (generator, output, stats) and the draft's ``pending``."""

    __slots__ = ("index", "run", "pending")

    def __init__(self, index: int, run: Decoding) -> None:
        self.index, self.run = index, run
        self.pending: list[int] = []


def _section(name: str, rows: Sequence[_Row], totals: BatchResult) -> Section:
    """Adds a section's seconds to ``name`` of every row's stats and of the batch totals."""
    return Section(name, *(row.run.stats for row in rows), totals)


def _seeds(seeds: int | Sequence[int], n: int) -> list[int]:
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        return [seeds + i for i in range(n)]
    out = [int(s) for s in seeds]
    if len(out) != n:
        raise ValueError(f"seeds: give one seed per prompt ({n}), got {len(out)}")
    return out


def _slots(batch_size: int | None, backends: Sequence[BatchBackend]) -> int:
    rows = min(be.batch_size for be in backends)
    if batch_size is None:
        return rows
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size > rows:
        raise ValueError(f"batch_size {batch_size} exceeds the rows of the batched backend(s) ({rows}); build them "
                         f"with batch_size >= {batch_size}")
    return batch_size


def _check_batch_backend(backend, role: str) -> None:
    if not isinstance(backend, BatchBackend):
        raise TypeError(f"the {role} must be a batched backend (verispec.models.batch: HFBatchBackend, "
                        f"LlamaBatchBackend, RowsOfBackends), got {type(backend).__name__}")


def _per_row(backend: BatchBackend, tokens: dict[int, list[int]]) -> list[list[int]]:
    """The ``forward_rows`` argument giving slot ``s`` the tokens ``tokens[s]`` (rows past the slots in
    use, or idle, get none)."""
    return [tokens.get(r, []) for r in range(backend.batch_size)]


def _sample_rows(probs: torch.Tensor, rows: Sequence[_Row]) -> torch.Tensor:
    """One token per row of ``probs [R, V]``, row ``i`` drawn with ``rows[i]``'s generator (exactly
    :func:`sample_categorical` on that row alone) -> ``[R]`` on the device."""
    return sample_categorical(probs, [row.run.gen for row in rows])


def _finish(row: _Row, slots: list, results: list, backends: Sequence[BatchBackend], slot: int,
            on_done: Callable[[int, GenerationResult], None] | None = None) -> None:
    results[row.index] = row.run.result()
    if on_done is not None:
        on_done(row.index, results[row.index])
    for be in backends:
        be.reset_row(slot)
    slots[slot] = None


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
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per step) must be an integer >= 1, got {gamma!r}"
                         + (" ('auto' is not supported in batches)" if gamma == "auto" else ""))
    if draft is None:
        raise ValueError("batched SD needs a draft model (prompt lookup is not supported in batches)")
    _check_batch_backend(target, "target")
    _check_batch_backend(draft, "draft")
    rule = get_rule(rule)
    if getattr(rule, "needs_raw", False):
        raise NotImplementedError(f"rule {rule.spec()!r} reads raw distributions, which batched decoding does not "
                                  "keep: run it one sequence at a time (verispec.engine.generate)")
    slots_n = _slots(batch_size, (target, draft))
    width = vocab_width or check_compatible(target, draft)
    device = logits_device(target)
    seeds = _seeds(seeds, len(prompts))
    if observers is not None and len(observers) != len(prompts):
        raise ValueError(f"one observer (or None) per prompt: got {len(observers)} for {len(prompts)} prompts")
    runs = [Decoding(target, ids, stats=Stats(mode="sd", rule=rule.spec(), gamma=gamma, gamma_policy="fixed"),
                      max_new_tokens=max_new_tokens, stop=st, seed=s, gamma=gamma)
            for ids, s, st in zip(prompts, seeds, _stops(stop, len(prompts)))]
    for run in runs:
        check_prompt(draft, run.ids, max_new_tokens)
    totals = BatchResult([], slots_n)
    results: list[GenerationResult | None] = [None] * len(prompts)
    queue = deque(range(len(prompts)))
    slots: list[_Row | None] = [None] * slots_n
    t0 = time.perf_counter()

    while True:
        _admit_sd(queue, slots, runs, target, draft, totals)
        active = [(s, row) for s, row in enumerate(slots) if row is not None]
        if not active:
            break
        gs = {s: min(gamma, row.run.out.remaining - 1) for s, row in active}

        # 1. draft g_s tokens per row (rows with g_s = 0 take a plain target step)
        d_start = {s: draft.row_length(s) for s, _ in active if gs[s] >= 1}
        drafted, q_rows = _draft_chains(draft, slots, gs, sampling, width, device, totals)

        # 2. one batched target forward over [root, drafts] of every active row
        blocks = _per_row(target, {s: [row.pending[-1]] + drafted.get(s, []) for s, row in active})
        t_start = {s: target.row_length(s) for s, _ in active}
        rows = [row for _, row in active]
        with _section("verify_s", rows, totals):
            logits = target.forward_rows(blocks)
        totals.target_forwards += 1
        totals.row_steps += len(active)

        # 3. verify: one call per draft length over its rows, each row with its own generator (the
        #    rule draws row by row from the row's generator); one copy to the host
        where = row_slices(blocks)
        with _section("rule_s", rows, totals):
            p = sampling.process(logits[:, :width])                            # [Σ (g_r + 1), V]
            n_of, z_of = _verify_groups(rule, p, where, active, drafted, q_rows, device)
            decided = torch.cat([n_of, z_of]).tolist()
            decided = {s: (decided[k], decided[len(active) + k]) for k, (s, _) in enumerate(active)}
        if observers is not None:
            for s, row in active:
                watch = observers[row.index]
                if watch is not None and s in drafted:
                    step = VerifiedStep.from_chain(p[where[s]], torch.stack(q_rows[s]), drafted[s], *decided[s])
                    watch(step.on_host())

        # 4. commit: each row emits its accepted drafts and z, and rolls back its own caches
        for s, row in active:
            n, z = decided[s]
            stats, g = row.run.stats, gs[s]
            stats.target_calls += 1
            stats.record_gamma(g)
            if g:
                stats.record_step(n, g)
            emitted = drafted.get(s, [])[:n] + [z]
            if row.run.out.extend(emitted):
                _finish(row, slots, results, (target, draft), s, on_done)
                continue
            target.rollback_row(s, t_start[s] + 1 + n)          # keep the root and the accepted drafts
            if g:
                seen = min(n, g - 1)                            # accepted drafts the draft model processed
                draft.rollback_row(s, d_start[s] + len(row.pending) + seen)
                row.pending = emitted[seen:]
            else:
                row.pending = row.pending + [z]

    totals.wall_s = time.perf_counter() - t0
    totals.results = results
    return totals


def _verify_groups(rule: Rule, p: torch.Tensor, where: dict, active: list, drafted: dict, q_rows: dict,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n_accepted [A], next_token [A])`` of the active rows, in their order: rows that drafted the same
    number of tokens are verified in one batched ``rule.verify`` (``p [R, g+1, V]``, ``q [R, g, V]``,
    ``x [R, g]``, one generator per row), rows without drafts take their next token from ``p``."""
    groups: dict[int, list[int]] = {}
    for k, (s, _) in enumerate(active):
        groups.setdefault(len(drafted.get(s, [])), []).append(k)
    n_of = torch.zeros(len(active), dtype=torch.long, device=device)
    z_of = torch.zeros(len(active), dtype=torch.long, device=device)
    for g, members in groups.items():
        slots = [active[k][0] for k in members]
        gens = [active[k][1].run.gen for k in members]
        idx = torch.tensor(members, device=device)
        p_g = torch.stack([p[where[s]] for s in slots])                       # [R, g+1, V]
        if g == 0:
            z_of[idx] = sample_categorical(p_g[:, 0], gens)
            continue
        q_g = torch.stack([torch.stack(q_rows[s]) for s in slots])            # [R, g, V]
        x_g = torch.tensor([drafted[s] for s in slots], device=device)         # [R, g]
        n_of[idx], z_of[idx] = rule.verify(p_g, q_g, x_g, gens)
    return n_of, z_of


def _draft_chains(draft: BatchBackend, slots: list, gs: dict[int, int], sampling: SamplingConfig, width: int,
                  device: torch.device, totals: BatchResult) -> tuple[dict[int, list[int]], dict[int, list]]:
    """Draft ``gs[s]`` tokens in every slot with ``gs[s] >= 1``: depth ``d`` is one batched draft forward over
    the rows still drafting (``pending`` first, then the last drafted token; the last draft is not fed),
    each row sampling from its processed row ``q`` with its own generator. -> ``(tokens, q rows)`` per slot."""
    drafted: dict[int, list[int]] = {s: [] for s, g in gs.items() if g >= 1}
    q_rows: dict[int, list[torch.Tensor]] = {s: [] for s in drafted}
    feed = {s: slots[s].pending for s in drafted}
    while feed:
        rows = [slots[s] for s in feed]
        with _section("draft_s", rows, totals):
            logits = draft.forward_rows(_per_row(draft, feed), last_only=True)
        totals.draft_forwards += 1
        with _section("rule_s", rows, totals):
            q = sampling.process(logits[:, :width].to(device))                # [rows drafting, V]
            toks = _sample_rows(q, rows).tolist()
        for i, s in enumerate(feed):
            slots[s].run.stats.draft_calls += 1
            drafted[s].append(toks[i])
            q_rows[s].append(q[i])
        feed = {s: drafted[s][-1:] for s in feed if len(drafted[s]) < gs[s]}
    return drafted, q_rows


def _admit_sd(queue: deque, slots: list, runs: list[Decoding], target: BatchBackend, draft: BatchBackend,
              totals: BatchResult) -> None:
    """Fill the free slots from the queue and prefill them: both models process ``ids[:-1]``."""
    new = []
    for s in range(len(slots)):
        if slots[s] is None and queue:
            i = queue.popleft()
            slots[s] = _Row(i, runs[i])
            new.append(s)
    if not new:
        return
    feed = {}
    for s in new:
        target.reset_row(s)
        draft.reset_row(s)
        feed[s] = slots[s].run.ids[:-1]
        slots[s].pending = slots[s].run.ids[-1:]
    rows = [slots[s] for s in new]
    if any(feed.values()):
        with _section("prefill_s", rows, totals):
            target.forward_rows(_per_row(target, feed), last_only=True)
            draft.forward_rows(_per_row(draft, feed), last_only=True)
        totals.prefills += 1
    for row in rows:
        row.run.start()


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
    per active row per step. Prompt ``i``'s result equals ``generate_target_only(target_i, prompts[i],
    seed=seeds[i], ...)`` up to batched-versus-single model numerics."""
    _check_batch_backend(target, "target")
    slots_n = _slots(batch_size, (target,))
    width = vocab_width or min(target.vocab_size, tokenizer_size(target))
    seeds = _seeds(seeds, len(prompts))
    runs = [Decoding(target, ids, stats=Stats(mode="target_only", rule="", gamma=0), max_new_tokens=max_new_tokens,
                      stop=st, seed=s, gamma=0) for ids, s, st in zip(prompts, seeds, _stops(stop, len(prompts)))]
    totals = BatchResult([], slots_n)
    results: list[GenerationResult | None] = [None] * len(prompts)
    queue = deque(range(len(prompts)))
    slots: list[_Row | None] = [None] * slots_n
    feed = _per_row(target, {})                              # what each row forwards next
    t0 = time.perf_counter()
    while True:
        new = []
        for s in range(slots_n):
            if slots[s] is None and queue:
                i = queue.popleft()
                slots[s] = _Row(i, runs[i])
                target.reset_row(s)
                feed[s] = runs[i].ids
                new.append(s)
        stepping = [s for s in range(slots_n) if feed[s]]
        if not stepping:
            break
        rows = [slots[s] for s in stepping]
        t_forward = time.perf_counter()
        logits = target.forward_rows(feed, last_only=True)                     # [rows stepping, V]
        dt = time.perf_counter() - t_forward
        for s, row in zip(stepping, rows):          # a prompt's first forward is its prefill
            section = "prefill_s" if s in new else "verify_s"
            setattr(row.run.stats, section, getattr(row.run.stats, section) + dt)
        if len(new) == len(stepping):
            totals.prefills += 1
            totals.prefill_s += dt
        else:
            totals.target_forwards += 1
            totals.row_steps += len(stepping) - len(new)
            totals.verify_s += dt
        for s in new:
            slots[s].run.start()
        with _section("rule_s", rows, totals):
            toks = _sample_rows(sampling.process(logits[:, :width]), rows).tolist()
        for s, row, tok in zip(stepping, rows, toks):
            row.run.stats.target_calls += 1
            if row.run.out.extend([tok]):
                _finish(row, slots, results, (target,), s, on_done)
                feed[s] = []
            else:
                feed[s] = [tok]
    totals.wall_s = time.perf_counter() - t0
    totals.results = results
    return totals
