"""A step-wise batched decoding session: rows join, advance one batched step at a time, and leave.

:class:`BatchSession` is the one batched loop of verispec (:func:`~verispec.engine.batch.generate_batch`
and :func:`~verispec.engine.batch.generate_target_only_batch` run on it; so does ``verispec serve``).
Requests (:class:`RowRequest`) are :meth:`~BatchSession.admit` ted to a queue; every
:meth:`~BatchSession.step` first gives each free row (slot) of the batched backends
(:mod:`verispec.models.batch`) the next queued request and prefills it, then advances every active row
by one batched step; a row that ends (EOS, stop string, length) or is :meth:`~BatchSession.cancel` led
frees its slot at once for the next request (continuous batching).

Each request has its own settings: the rule (``None``: target-only, a row without drafts), the sampling
pipeline, the draft length γ, ``max_new_tokens``, stop strings and seed. A step over the active rows:

1. drafts: row ``r`` drafts ``g_r = min(γ_r, budget_r − 1)`` tokens (``g_r = 0`` for a target-only row).
   Depth ``d`` is one batched draft forward over the rows with ``g_r > d`` (at ``d = 0`` each row feeds its
   ``pending``), then each row samples its token from its processed draft row ``q`` (its own sampling
   pipeline) with its own generator;
2. one batched target forward: row ``r`` appends ``[root, x_1..x_{g_r}]`` (ragged; ``g_r = 0``: the root
   alone, a plain target step) -> the processed ``p`` of every row, with its own pipeline (a target-only
   row's first token comes from its prefill, which processes the whole prompt as
   :func:`~verispec.engine.generate.generate_target_only` does);
3. verification: rows of equal (rule, ``g``) are verified by one ``rule.verify(p [R, g+1, V], q [R, g, V],
   x [R, g], [generator_r ...])``; rows with ``g = 0`` sample their next token from ``p``; one copy of
   every row's ``(n, z)`` to the host;
4. commits: row ``r`` emits ``x_1..x_n, z``, rolls back its own target and draft rows and calls its
   ``on_commit``; a row that ended calls its ``on_done`` and frees its slot.

Cache invariant (as :mod:`verispec.engine.generate`): the target row holds every committed token but the
last (the *root*), the draft row lacks ``pending`` (the root, plus accepted tokens it never processed); a
target-only row just prefilled holds the whole prompt and the logits of its first token.

Randomness: each request owns one ``torch.Generator`` on the logits' device seeded with its seed; its
draft draws, the rule's uniforms and its next tokens all come from it, in the order of
:func:`~verispec.engine.generate.generate` (per step: ``g`` draft draws, then ``rule.verify``). The
batched ``verify`` and sampling get one generator per row (:func:`verispec.rules.base.uniform`), and the
sampling pipelines and rules work row by row, so a row's tokens do not depend on which rows share the
batch, on their settings or on the batch size: they equal those of ``generate(..., seed=seed)`` (SD
rows) or of ``generate_target_only`` (target-only rows) up to the floating-point differences of batched
versus single-sequence model calls
(none on the fake models of the tests; float64 round-off on transformers; llama.cpp's quantised kernels
differ between batch compositions unless the backend is batch-invariant,
``LlamaBatchBackend(invariant=True)``).

Statistics: each request's :class:`Stats` counts the forwards its row took part in (``target_calls``,
``draft_calls``), its accepted counts, and adds to ``draft_s`` / ``verify_s`` / ``rule_s`` the time of
every batched section it took part in (shared with its neighbours); ``wall_s`` runs from its prefill to
its end. :attr:`BatchSession.totals` (a :class:`BatchResult`) has the totals of the session.

Chains only: draft trees, prompt lookup, γ = "auto" and rules that read raw distributions are refused
(run them one sequence at a time with :func:`verispec.engine.generate`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from verispec.engine.decoding import Decoding, GenerationResult, Observer, VerifiedStep
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


@dataclass
class RowRequest:
    """One sequence to decode in a :class:`BatchSession`.

    ``prompt``: token ids. ``rule``: a rule or its spec (SD with the draft model, chains of ``gamma``
    tokens), or ``None``: target-only sampling (no draft; a true baseline is target-only with the
    baseline's truncation in ``sampling``). ``on_commit(handle)`` is called after every step that
    committed tokens to this row (``handle.tokens`` grew), ``on_done(handle)`` once when it ends
    (``handle.result`` set), both on the thread that calls :meth:`BatchSession.step`. ``observer``
    sees every verified step (SD rows) as a :class:`VerifiedStep` on the host. ``tag``: anything."""

    prompt: Sequence[int]
    max_new_tokens: int
    sampling: SamplingConfig
    rule: Rule | str | None = None
    gamma: int = 5
    stop: Sequence[str] = ()
    seed: int = 0
    observer: Observer | None = None
    on_commit: Callable[[RowHandle], None] | None = None
    on_done: Callable[[RowHandle], None] | None = None
    tag: Any = None


@dataclass(eq=False)
class RowHandle:
    """A request in a session: its state (``queued``, ``active``, ``done``, ``cancelled``), its decoding
    (generator, output, statistics), its slot while active and its result once done."""

    request: RowRequest
    run: Decoding
    rule: Rule | None
    gamma: int                      # draft tokens per step (0: target-only)
    width: int
    state: str = "queued"
    slot: int | None = None
    result: GenerationResult | None = None
    pending: list[int] = field(default_factory=list)
    first_logits: torch.Tensor | None = field(default=None, repr=False)   # a target-only row's, from its prefill

    @property
    def tokens(self) -> list[int]:
        """The tokens committed so far (EOS excluded; cut at a completed stop string)."""
        return self.run.out.tokens

    @property
    def stats(self) -> Stats:
        return self.run.stats

    @property
    def finished(self) -> bool:
        return self.state in ("done", "cancelled")


def check_batch_backend(backend, role: str) -> None:
    if not isinstance(backend, BatchBackend):
        raise TypeError(f"the {role} must be a batched backend (verispec.models.batch: HFBatchBackend, "
                        f"LlamaBatchBackend, RowsOfBackends), got {type(backend).__name__}")


def session_slots(batch_size: int | None, backends: Sequence[BatchBackend]) -> int:
    """The rows a session uses: ``batch_size`` (checked against the backends' rows) or all of them."""
    rows = min(be.batch_size for be in backends)
    if batch_size is None:
        return rows
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size > rows:
        raise ValueError(f"batch_size {batch_size} exceeds the rows of the batched backend(s) ({rows}); build them "
                         f"with batch_size >= {batch_size}")
    return batch_size


def check_session_rule(rule: Rule | str) -> Rule:
    """The rule of a batched SD row, refused (``NotImplementedError``) if it reads raw distributions."""
    rule = get_rule(rule)
    if getattr(rule, "needs_raw", False):
        raise NotImplementedError(f"rule {rule.spec()!r} reads raw distributions, which batched decoding does not "
                                  "keep: run it one sequence at a time (verispec.engine.generate)")
    return rule


def check_gamma(gamma) -> int:
    """A batched row's draft length: a fixed integer >= 1."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per step) must be an integer >= 1, got {gamma!r}"
                         + (" ('auto' is not supported in batches)" if gamma == "auto" else ""))
    return gamma


class BatchSession:
    """Continuous batching over batched backends (see the module docstring).

    ``target``, ``draft``: :class:`BatchBackend` s (``draft=None``: target-only rows only). ``batch_size``:
    rows used (default: all the backends have). ``vocab_width``: the width SD rows read (default
    :func:`check_compatible`); ``target_width``: the width target-only rows read (default: the target's
    tokenizer size). Not thread-safe: one thread admits, cancels and steps.
    """

    def __init__(self, target: BatchBackend, draft: BatchBackend | None = None, *, batch_size: int | None = None,
                 vocab_width: int | None = None, target_width: int | None = None) -> None:
        check_batch_backend(target, "target")
        if draft is not None:
            check_batch_backend(draft, "draft")
        self.target, self.draft = target, draft
        self.backends = (target,) if draft is None else (target, draft)
        self.slots_n = session_slots(batch_size, self.backends)
        self.sd_width = (vocab_width or check_compatible(target, draft)) if draft is not None else None
        self.plain_width = target_width or min(target.vocab_size, tokenizer_size(target))
        self.device = logits_device(target)
        self.slots: list[RowHandle | None] = [None] * self.slots_n
        self.queue: deque[RowHandle] = deque()
        self.totals = BatchResult([], self.slots_n)

    # -- requests ----------------------------------------------------------------------------------
    def admit(self, request: RowRequest) -> RowHandle:
        """Check ``request`` and queue it (it takes a slot at the next :meth:`step`). Raises
        ``ValueError`` (empty prompt, prompt too long, bad γ, unknown rule, no draft model) or
        ``NotImplementedError`` (a rule batched decoding cannot run) before anything is queued."""
        if request.rule is None:
            rule, gamma, width = None, 0, self.plain_width
            stats = Stats(mode="target_only", rule="", gamma=0)
        else:
            if self.draft is None:
                raise ValueError("this session has no draft model: SD rows need one (rule=None: target-only)")
            rule, gamma, width = check_session_rule(request.rule), check_gamma(request.gamma), self.sd_width
            stats = Stats(mode="sd", rule=rule.spec(), gamma=gamma, gamma_policy="fixed")
        run = Decoding(self.target, request.prompt, stats=stats, max_new_tokens=request.max_new_tokens,
                       stop=request.stop, seed=request.seed, gamma=gamma)
        if rule is not None:
            run.check_prompt(self.draft)
        handle = RowHandle(request, run, rule, gamma, width)
        self.queue.append(handle)
        return handle

    def cancel(self, handle: RowHandle) -> bool:
        """Drop a queued or active request; an active one frees its slot at once. Its ``on_done`` is not
        called. False if it had already ended."""
        if handle.finished:
            return False
        if handle.state == "queued":
            self.queue.remove(handle)
        else:
            self._free(handle)
        handle.state = "cancelled"
        return True

    def fail_all(self) -> list[RowHandle]:
        """Empty every slot and the queue (after a model call failed: the rows' caches are unknown);
        returns the requests dropped, marked cancelled, without calling their ``on_done``."""
        dropped = [h for h in self.slots if h is not None] + list(self.queue)
        self.queue.clear()
        for be in self.backends:
            be.reset()
        self.slots = [None] * self.slots_n
        for h in dropped:
            h.state, h.slot = "cancelled", None
        return dropped

    @property
    def active(self) -> list[RowHandle]:
        return [h for h in self.slots if h is not None]

    @property
    def free_slots(self) -> int:
        return sum(h is None for h in self.slots)

    @property
    def busy(self) -> bool:
        """Whether a request is queued or active."""
        return bool(self.queue) or any(h is not None for h in self.slots)

    def run(self) -> None:
        """Step until every admitted request has ended."""
        while self.step():
            pass

    def score(self, tokens: Sequence[int], top: int = 0) -> Scores:
        """The target's log-probabilities of ``tokens`` (:class:`Scores`): one all-logits forward of
        ``tokens`` on a free row (``RuntimeError`` if none is free), which is then emptied. Call it between
        steps, from the thread that steps."""
        free = [s for s, h in enumerate(self.slots) if h is None]
        if len(free) <= len(self.queue):
            raise RuntimeError("no free row to score on: wait for a row to end")
        slot, target = free[-1], self.target           # the queued requests take the first free rows
        target.reset_row(slot)
        try:
            logits = target.forward_rows(_per_row(target, {slot: list(tokens)}))         # [len(tokens), V]
        finally:
            target.reset_row(slot)
        return scores_of(logits[:, :self.plain_width], tokens, top)

    # -- the batched step --------------------------------------------------------------------------
    def step(self) -> bool:
        """Admit queued requests into free slots (prefill), then one batched step over the active rows.
        Returns False when nothing was left to do (no active row after admission)."""
        self._fill()
        active = [(s, h) for s, h in enumerate(self.slots) if h is not None]
        if not active:
            return False
        target, draft, totals = self.target, self.draft, self.totals
        gs = {s: min(h.gamma, h.run.out.remaining - 1) if h.rule is not None else 0 for s, h in active}

        # 1. draft g_s tokens per row (rows with g_s = 0 take a plain target step)
        d_start = {s: draft.row_length(s) for s, _ in active if gs[s] >= 1}
        drafted, q_rows = self._draft_chains(gs) if d_start else ({}, {})

        # 2. one batched target forward over [root, drafts] of every active row but the target-only rows just
        #    prefilled (their prefill gave the logits of their first token)
        primed = [(s, h) for s, h in active if h.first_logits is not None]
        stepping = [(s, h) for s, h in active if h.first_logits is None]
        blocks = _per_row(target, {s: [h.pending[-1]] + drafted.get(s, []) for s, h in stepping})
        t_start = {s: target.row_length(s) for s, _ in stepping}
        rows = [h for _, h in active]
        if stepping:
            with _section("verify_s", [h for _, h in stepping], totals):
                logits = target.forward_rows(blocks)
            totals.target_forwards += 1
            totals.row_steps += len(stepping)

        # 3. verify: one call per (rule, draft length) over its rows, each row with its own generator;
        #    one copy to the host
        where = row_slices(blocks)
        with _section("rule_s", rows, totals):
            processed = _process(logits, [(where[s], h) for s, h in stepping]) if stepping else []
            p = {s: processed[k] for k, (s, _) in enumerate(stepping)}            # slot -> [g_s + 1, V]
            if primed:
                firsts = torch.stack([h.first_logits for _, h in primed])
                p.update((s, x) for (s, _), x in zip(primed, _process(firsts, [(slice(k, k + 1), h)
                                                                               for k, (_, h) in enumerate(primed)])))
            n_of, z_of = self._verify_groups(p, active, drafted, q_rows)
            decided = torch.cat([n_of, z_of]).tolist()
            decided = {s: (decided[k], decided[len(active) + k]) for k, (s, _) in enumerate(active)}
        for s, h in active:
            watch = h.request.observer
            if watch is not None and s in drafted:
                step = VerifiedStep.from_chain(p[s], torch.stack(q_rows[s]), drafted[s], *decided[s])
                watch(step.on_host())

        # 4. commit: each row emits its accepted drafts and z, and rolls back its own caches
        for s, h in active:
            n, z = decided[s]
            stats, g = h.run.stats, gs[s]
            stats.target_calls += 1
            if h.rule is not None:
                stats.record_gamma(g)
            if g:
                stats.record_step(n, g)
            emitted = drafted.get(s, [])[:n] + [z]
            if h.first_logits is not None:      # the target holds the whole prompt: z is the next root
                h.first_logits = None
                h.pending = [z]
                if h.run.out.extend(emitted):
                    self._finish(h)
                elif h.request.on_commit is not None:
                    h.request.on_commit(h)
                continue
            if h.run.out.extend(emitted):
                self._finish(h)
                continue
            target.rollback_row(s, t_start[s] + 1 + n)          # keep the root and the accepted drafts
            if g:
                seen = min(n, g - 1)                            # accepted drafts the draft model processed
                draft.rollback_row(s, d_start[s] + len(h.pending) + seen)
                h.pending = emitted[seen:]
            elif h.rule is not None:
                h.pending = h.pending + [z]
            else:
                h.pending = [z]
            if h.request.on_commit is not None:
                h.request.on_commit(h)
        return True

    def _verify_groups(self, p: dict[int, torch.Tensor], active: list, drafted: dict, q_rows: dict,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(n_accepted [A], next_token [A])`` of the active rows, in their order: rows of the same rule that
        drafted the same number of tokens are verified in one batched ``rule.verify`` (``p [R, g+1, V]``,
        ``q [R, g, V]``, ``x [R, g]``, one generator per row), rows without drafts take their next token from
        ``p`` (grouped by width)."""
        groups: dict[tuple, list[int]] = {}
        for k, (s, h) in enumerate(active):
            g = len(drafted.get(s, []))
            key = (h.rule.spec(), g) if g else ("", 0, h.width)
            groups.setdefault(key, []).append(k)
        device = self.device
        n_of = torch.zeros(len(active), dtype=torch.long, device=device)
        z_of = torch.zeros(len(active), dtype=torch.long, device=device)
        for key, members in groups.items():
            slots = [active[k][0] for k in members]
            handles = [active[k][1] for k in members]
            gens = [h.run.gen for h in handles]
            idx = torch.tensor(members, device=device)
            p_g = torch.stack([p[s] for s in slots])                              # [R, g+1, V]
            g = key[1]
            if g == 0:
                z_of[idx] = sample_categorical(p_g[:, 0], gens)
                continue
            q_g = torch.stack([torch.stack(q_rows[s]) for s in slots])            # [R, g, V]
            x_g = torch.tensor([drafted[s] for s in slots], device=device)         # [R, g]
            n_of[idx], z_of[idx] = handles[0].rule.verify(p_g, q_g, x_g, gens)
        return n_of, z_of

    def _draft_chains(self, gs: dict[int, int]) -> tuple[dict[int, list[int]], dict[int, list]]:
        """Draft ``gs[s]`` tokens in every slot with ``gs[s] >= 1``: depth ``d`` is one batched draft forward
        over the rows still drafting (``pending`` first, then the last drafted token; the last draft is not
        fed), each row sampling from its processed row ``q`` with its own generator. -> ``(tokens, q rows)``
        per slot."""
        draft, slots, totals = self.draft, self.slots, self.totals
        drafted: dict[int, list[int]] = {s: [] for s, g in gs.items() if g >= 1}
        q_rows: dict[int, list[torch.Tensor]] = {s: [] for s in drafted}
        feed = {s: slots[s].pending for s in drafted}
        while feed:
            rows = [slots[s] for s in feed]
            with _section("draft_s", rows, totals):
                logits = draft.forward_rows(_per_row(draft, feed), last_only=True)
            totals.draft_forwards += 1
            with _section("rule_s", rows, totals):
                logits = logits.to(self.device)
                q = _process(logits, [(slice(i, i + 1), h) for i, h in enumerate(rows)])
                q = torch.cat(q) if len(q) > 1 else q[0]                          # [rows drafting, V]
                toks = sample_categorical(q, [h.run.gen for h in rows]).tolist()
            for i, s in enumerate(feed):
                slots[s].run.stats.draft_calls += 1
                drafted[s].append(toks[i])
                q_rows[s].append(q[i])
            feed = {s: drafted[s][-1:] for s in feed if len(drafted[s]) < gs[s]}
        return drafted, q_rows

    # -- slots -------------------------------------------------------------------------------------
    def _fill(self) -> None:
        """Fill the free slots from the queue and prefill them: the target (and the draft, for SD rows)
        processes ``ids[:-1]``; the last prompt token is the first step's root."""
        new = []
        for s in range(self.slots_n):
            if self.slots[s] is None and self.queue:
                h = self.queue.popleft()
                h.state, h.slot = "active", s
                self.slots[s] = h
                new.append(s)
        if not new:
            return
        t_feed, d_feed = {}, {}
        for s in new:
            h = self.slots[s]
            for be in self.backends:
                be.reset_row(s)
            # SD rows: all but the last token (the first root); target-only rows: the whole prompt, whose last
            # logits give the first token (as generate_target_only does)
            t_feed[s] = h.run.ids[:-1] if h.rule is not None else h.run.ids
            if h.rule is not None:
                d_feed[s] = h.run.ids[:-1]
            h.pending = h.run.ids[-1:]
        rows = [self.slots[s] for s in new]
        if any(t_feed.values()):
            with _section("prefill_s", rows, self.totals):
                last = self.target.forward_rows(_per_row(self.target, t_feed), last_only=True)   # [rows fed, V]
                if any(d_feed.values()):
                    self.draft.forward_rows(_per_row(self.draft, d_feed), last_only=True)
            self.totals.prefills += 1
            for k, s in enumerate(s for s in sorted(t_feed) if t_feed[s]):
                if self.slots[s].rule is None:
                    self.slots[s].first_logits = last[k]
        for h in rows:
            h.run.start()

    def _free(self, h: RowHandle) -> None:
        for be in self.backends:
            be.reset_row(h.slot)
        self.slots[h.slot] = None
        h.slot = None

    def _finish(self, h: RowHandle) -> None:
        h.result = h.run.result()
        h.state = "done"
        self._free(h)
        self.totals.results.append(h.result)
        if h.request.on_done is not None:
            h.request.on_done(h)


def _section(name: str, rows: Sequence[RowHandle], totals: BatchResult) -> Section:
    """Adds a section's seconds to ``name`` of every row's stats and of the session's totals."""
    return Section(name, *(h.run.stats for h in rows), totals)


def _per_row(backend: BatchBackend, tokens: dict[int, list[int]]) -> list[list[int]]:
    """The ``forward_rows`` argument giving slot ``s`` the tokens ``tokens[s]`` (rows past the slots in
    use, or idle, get none)."""
    return [tokens.get(r, []) for r in range(backend.batch_size)]


def _process(logits: torch.Tensor, parts: Sequence[tuple[slice, RowHandle]]) -> list[torch.Tensor]:
    """Each part's rows of the packed ``logits [N, V_model]`` through its request's sampling pipeline, sliced
    to its width -> the processed rows of each part, in the order of ``parts``. Parts of one pipeline and
    width are processed in one call (one call for the whole tensor when every part shares them: a pipeline
    processes its rows one by one, so grouping never changes a row's numbers)."""
    groups: dict[tuple, list[int]] = {}
    for i, (_, h) in enumerate(parts):
        groups.setdefault((h.request.sampling, h.width), []).append(i)
    out: list[torch.Tensor] = [logits] * len(parts)
    if len(groups) == 1:
        sampling, width = next(iter(groups))
        probs = sampling.process(logits[:, :width])
        return [probs[where] for where, _ in parts]
    for (sampling, width), members in groups.items():
        index = [j for i in members for j in range(parts[i][0].start, parts[i][0].stop)]
        probs = sampling.process(logits[torch.tensor(index, device=logits.device), :width])
        at = 0
        for i in members:
            n = parts[i][0].stop - parts[i][0].start
            out[i] = probs[at: at + n]
            at += n
    return out


@dataclass
class Scores:
    """Target log-probabilities of ``tokens``: ``token_logprobs[i]`` of token ``i`` given ``tokens[:i]``
    (None for ``i = 0``), ``top[i]`` the ``k`` most probable ``(token, logprob)`` there (None for ``i = 0``);
    ``next_logprobs [V]``: the distribution after the last token."""

    token_logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None]
    next_logprobs: torch.Tensor

    def next_top(self, k: int) -> list[tuple[int, float]]:
        if k <= 0:
            return []
        vals, ids = self.next_logprobs.topk(min(k, self.next_logprobs.shape[-1]))
        return list(zip(ids.tolist(), vals.tolist()))




def scores_of(logits: torch.Tensor, tokens: Sequence[int], top: int) -> Scores:
    """:class:`Scores` from the target's ``logits [L, V]`` at every position of ``tokens`` (the raw model
    distribution: temperature 1, no truncation)."""
    logp = torch.log_softmax(logits.double(), dim=-1)                          # [L, V]; row i predicts i + 1
    nxt = torch.tensor(tokens[1:], dtype=torch.long, device=logp.device)
    picked = logp[:-1].gather(1, nxt[:, None])[:, 0].tolist() if len(tokens) > 1 else []
    tops: list[list[tuple[int, float]] | None] = [None]
    if top > 0 and len(tokens) > 1:
        vals, ids = logp[:-1].topk(min(top, logp.shape[-1]), dim=-1)
        tops += [list(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]
    else:
        tops += [[] for _ in picked]
    return Scores([None] + picked, tops, logp[-1].cpu())
