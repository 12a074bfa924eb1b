"""The server's engine: one thread owns the batched session, a second decodes what batches cannot.

:class:`Scheduler` takes :class:`Job` s (one per choice) from the HTTP layer. Jobs the batched engine can
decode (chains of the draft model with a fixed γ, target-only and true-baseline rows) wait in a bounded
queue; the engine thread admits them into the free rows of a :class:`~verispec.engine.session.BatchSession`
(continuous batching: a row that ends or is cancelled takes the next job at the next step) and steps the
session while any row is active. Jobs it cannot batch (prompt lookup, draft trees, ``gamma: "auto"``,
rules reading raw distributions) go, one at a time, to a second thread that runs
:func:`verispec.engine.generate` on single-sequence backends that share the batched backends' weights
(``one_sequence()``: a second llama.cpp context on the loaded model, a sibling of the transformers
module), made on first use: one copy of each model per process.

Between steps the engine thread applies cancellations (a client that disconnects frees its row before
the next step), expires jobs past their deadline, and runs scoring forwards (the target's
log-probabilities of a token sequence, for ``logprobs`` / ``echo``) on a free row. Callbacks
(``on_tokens``, ``on_done``) run on the engine threads; the HTTP layer hands them to its event loop.

Threads and what they own: the engine thread owns the session and the batched backends; the single
thread owns the single-sequence backends, the cost profiles and the job it runs; the queues, the running
set, the pending cancellations and scores and the step count are read and written under ``_lock`` by
every thread (the HTTP side calls :meth:`submit`, :meth:`cancel`, :meth:`score`, :attr:`running`,
:attr:`waiting`, :attr:`steps`). A job's ``result`` / ``error`` are written by the engine thread before its
``on_done`` runs and read by the HTTP side only after it. The backends' text methods (called by every
thread) are safe to call concurrently (:mod:`verispec.models.llama`, :func:`verispec.models.hf.tokenizer_lock`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from verispec.engine.decoding import GenerationResult
from verispec.engine.request import Decode, generate_single, row_request
from verispec.engine.session import BatchSession, RowHandle, Scores
from verispec.models.batch import one_sequence_views
from verispec.serve.protocol import APIError

_log = logging.getLogger("verispec.serve")


class Overloaded(Exception):
    """The queue is full (the HTTP layer answers 429)."""


class _Abort(Exception):
    pass


@dataclass(eq=False)
class Job:
    """One choice to decode. ``on_tokens(tokens)`` (optional) is called with the committed tokens after every
    step that added some; ``on_done(job)`` once, with ``result`` or ``error`` set."""

    prompt: list[int]
    decode: Decode
    on_done: Callable[[Job], None]
    on_tokens: Callable[[list[int]], None] | None = None
    timeout_s: float | None = None
    result: GenerationResult | None = None
    error: APIError | None = None
    state: str = "new"              # waiting, running, done, cancelled
    t_submit: float = 0.0
    t_start: float = 0.0
    t_first: float = 0.0
    t_end: float = 0.0
    handle: RowHandle | None = field(default=None, repr=False)
    #: set (once, under the scheduler's lock) when the client left; the single thread polls it between
    #: verified steps without the lock: a flag that only turns True, read late by at most one step
    cancelled: bool = False

    @property
    def deadline(self) -> float | None:
        return self.t_submit + self.timeout_s if self.timeout_s else None


class Scheduler:
    """The engine threads (module docstring). ``target_rows`` / ``draft_rows``: batched backends
    (``draft_rows`` None: no draft model; SD requests then need ``single``). ``single``: None refuses
    what batches cannot run; otherwise those jobs run on the batched backends' ``one_sequence()`` views
    (the same weights), or, for batched backends that have none (fakes of the tests), on what ``single()``
    returns, a single-sequence ``(target, draft or None)`` (called once, on first need).
    ``max_waiting``: jobs that may wait for a row before :meth:`submit` raises :class:`Overloaded`.
    ``on_finish(job)``: called for every ended job (metrics)."""

    def __init__(self, target_rows: Any, draft_rows: Any | None = None, *, batch_size: int | None = None,
                 single: Callable[[], tuple[Any, Any | None]] | None = None, max_waiting: int = 256,
                 n_threads: int | None = None, on_finish: Callable[[Job], None] | None = None) -> None:
        self.session = BatchSession(target_rows, draft_rows, batch_size=batch_size)
        self.target_rows, self.draft_rows = target_rows, draft_rows
        self.slots = self.session.slots_n
        self.max_waiting = max_waiting
        self.n_threads = n_threads
        self._single_factory = single
        self._single: tuple[Any, Any | None] | None = None
        self._profiles: dict[bool, Any] = {}
        self.on_finish = on_finish
        self._lock = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: set[Job] = set()
        self._cancels: list[Job] = []
        self._scores: deque[tuple[list[int], int, Future]] = deque()
        self._single_q: deque[Job] = deque()
        self._single_job: Job | None = None
        self._steps = 0
        self._stop = False
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        for name, target in (("verispec-engine", self._loop), ("verispec-single", self._single_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish every job in flight, then end the threads."""
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        for t in self._threads:
            t.join(timeout)

    # -- the HTTP side -----------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting) + len(self._single_q)

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running) + (self._single_job is not None)

    @property
    def steps(self) -> int:
        """Batched engine steps taken so far."""
        with self._lock:
            return self._steps

    def submit(self, jobs: Sequence[Job]) -> None:
        """Queue every job of a request, or none (:class:`Overloaded` when the queue cannot hold them)."""
        now = time.perf_counter()
        with self._lock:
            if self._stop:
                raise Overloaded("the server is shutting down")
            free = self.slots - len(self._running)
            if len(self._waiting) + len(self._single_q) + len(jobs) - max(free, 0) > self.max_waiting:
                raise Overloaded(f"{len(self._waiting) + len(self._single_q)} requests are waiting (limit "
                                 f"{self.max_waiting})")
            for job in jobs:
                job.state, job.t_submit = "waiting", now
                (self._waiting if job.decode.batched else self._single_q).append(job)
            self._lock.notify_all()

    def cancel(self, job: Job) -> None:
        """Drop ``job`` (its client went away): a waiting job leaves the queue, a running one frees its row
        before the next step. Its ``on_done`` is not called."""
        with self._lock:
            if job.state in ("done", "cancelled"):
                return
            job.cancelled = True
            if job in self._waiting:
                self._waiting.remove(job)
                job.state = "cancelled"
            elif job in self._single_q:
                self._single_q.remove(job)
                job.state = "cancelled"
            elif job.state == "running":
                self._cancels.append(job)
            self._lock.notify_all()

    def score(self, tokens: Sequence[int], top: int = 0) -> Future:
        """A future of the :class:`Scores` of ``tokens`` under the target (one forward on a free row)."""
        fut: Future = Future()
        with self._lock:
            self._scores.append((list(tokens), top, fut))
            self._lock.notify_all()
        return fut

    # -- the engine thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        session = self.session
        while True:
            with self._lock:
                while not (self._waiting or self._cancels or self._scores or session.busy or self._stop):
                    self._lock.wait(0.5)
                if self._stop and not (self._waiting or self._scores or session.busy):
                    return
                cancels, self._cancels = self._cancels, []
            for job in cancels:
                if job.handle is not None and session.cancel(job.handle):
                    self._end(job, "cancelled")
            self._expire()
            self._run_scores()
            self._admit()
            if session.busy:
                try:
                    session.step()
                    with self._lock:
                        self._steps += 1
                except Exception as exc:     # the rows' caches are unknown now: drop them all
                    _log.exception("batched step failed")
                    for handle in session.fail_all():
                        job = handle.request.tag
                        job.error = APIError(500, f"the engine failed while decoding: {type(exc).__name__}: {exc}",
                                             type="server_error")
                        self._end(job, "done")

    def _admit(self) -> None:
        while True:
            with self._lock:
                if not self._waiting or self.session.free_slots - len(self.session.queue) <= 0:
                    return
                job = self._waiting.popleft()
                job.state = "running"
                self._running.add(job)
            job.t_start = time.perf_counter()
            try:
                job.handle = self.session.admit(row_request(
                    job.prompt, job.decode, on_done=self._row_done, tag=job,
                    on_commit=self._row_tokens if job.on_tokens is not None else None))
            except (ValueError, NotImplementedError) as exc:
                job.error = APIError(400, str(exc))
                self._end(job, "done")

    def _row_tokens(self, handle: RowHandle) -> None:
        job = handle.request.tag
        if not job.t_first:
            job.t_first = time.perf_counter()
        try:
            job.on_tokens(list(handle.tokens))
        except Exception:
            _log.exception("on_tokens callback failed")

    def _row_done(self, handle: RowHandle) -> None:
        job = handle.request.tag
        job.result = handle.result
        self._end(job, "done")

    def _end(self, job: Job, state: str) -> None:
        with self._lock:
            self._running.discard(job)
            if job is self._single_job:
                self._single_job = None
            job.state = state
        job.t_end = time.perf_counter()
        if not job.t_first:
            job.t_first = job.t_end
        if self.on_finish is not None:
            try:
                self.on_finish(job)
            except Exception:       # metrics must never take the engine down
                _log.exception("metrics hook failed")
        if state == "done":
            try:
                job.on_done(job)
            except Exception:       # e.g. the event loop of a client that left has closed
                _log.exception("on_done callback failed")

    def _expire(self) -> None:
        now = time.perf_counter()
        with self._lock:
            late = [j for j in (*self._waiting, *self._single_q, *self._running)
                    if j.deadline is not None and now > j.deadline]
            for job in late:
                if job in self._waiting:
                    self._waiting.remove(job)
                elif job in self._single_q:
                    self._single_q.remove(job)
        for job in late:
            if job.handle is not None:
                self.session.cancel(job.handle)
            job.error = _timeout(job)
            self._end(job, "done")

    def _run_scores(self) -> None:
        while self.session.free_slots > len(self.session.queue):
            with self._lock:
                if not self._scores:
                    return
                tokens, top, fut = self._scores.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(self._score(tokens, top))
            except Exception as exc:
                fut.set_exception(exc)

    def _score(self, tokens: list[int], top: int) -> Scores:
        return self.session.score(tokens, top)

    # -- the single-sequence thread ------------------------------------------------------------------
    def _single_loop(self) -> None:
        while True:
            with self._lock:
                while not self._single_q and not self._stop:
                    self._lock.wait(0.5)
                if not self._single_q:
                    return
                job = self._single_q.popleft()
                job.state = "running"
                self._single_job = job
            job.t_start = time.perf_counter()
            try:
                if job.deadline is not None and job.t_start > job.deadline:
                    raise _Abort
                job.result = self._run_single(job)
            except _Abort:
                if job.cancelled:
                    self._end(job, "cancelled")
                    continue
                job.error = _timeout(job)
            except (ValueError, NotImplementedError) as exc:
                job.error = APIError(400, str(exc))
            except Exception as exc:
                _log.exception("single-sequence decoding failed")
                job.error = APIError(500, f"the engine failed while decoding: {type(exc).__name__}: {exc}",
                                     type="server_error")
            self._end(job, "done")

    def _singles(self) -> tuple[Any, Any | None]:
        if self._single is None:
            if self._single_factory is None:
                raise ValueError("this server decodes batched chains only (no single-sequence models were "
                                 "given): prompt lookup, trees, gamma 'auto' and raw-distribution rules are off")
            self._single = one_sequence_views(self.target_rows, self.draft_rows) or self._single_factory()
        return self._single

    def _run_single(self, job: Job) -> GenerationResult:
        from verispec.engine import cached_profile

        target, draft = self._singles()
        d = job.decode
        costs = None
        if d.gamma == "auto":
            key = d.draft == "model" and draft is not None
            if key not in self._profiles:     # measured once per server (and cached on disk)
                self._profiles[key], _ = cached_profile(target, draft if key else None, job.prompt,
                                                        n_threads=self.n_threads)
            costs = self._profiles[key]
        # Streaming reads the committed tokens from the verified steps; prompt lookup and γ auto also take
        # plain steps, which observers do not see: those jobs stream their text when done.
        exact = d.draft == "model" and d.gamma != "auto"
        eos = target.eos_token_ids
        committed: list[int] = []

        def watch(step) -> None:
            if job.cancelled or (job.deadline is not None and time.perf_counter() > job.deadline):
                raise _Abort
            if exact and job.on_tokens is not None:
                if not job.t_first:
                    job.t_first = time.perf_counter()
                committed.extend([step.proposal.tokens[i] for i in step.path] + [step.next_token])
                end = next((i for i, t in enumerate(committed) if t in eos), len(committed))
                job.on_tokens(committed[:end])

        return generate_single(target, draft, job.prompt, d, costs=costs, observers=[watch])


def _timeout(job: Job) -> APIError:
    return APIError(408, f"the request ran past this server's time limit of {job.timeout_s:g} s: ask for fewer "
                         "tokens, or raise the limit (verispec serve --request-timeout)", type="timeout_error")
