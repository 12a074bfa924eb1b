"""The bench's side of the Ray worker pool (:mod:`verispec.cluster`): each worker holds one model pair
and runs bench samples; their rows and recorded positions come back to the driver, which alone writes
the store. See :mod:`verispec.cluster` for scheduling, faults and resumption.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from verispec.bench.executors import SampleRunner, UnitResult
from verispec.cluster import WorkerPool, WorkerStartError, import_ray  # noqa: F401  (re-exported)
from verispec.models import load_pair
from verispec.settings import ClusterSettings


class BenchUnits:
    """The worker side of the bench: one model pair and a :class:`~verispec.bench.executors.SampleRunner`
    that saves recorded positions into a private folder; their files travel back with the row, and the
    driver writes them into the bench directory before committing it."""

    def __init__(self, cfg, need_draft: bool, load_models: Callable | None) -> None:
        # made by the first recording saved in it, removed once its files are read
        self.scratch = Path(tempfile.gettempdir()) / f"verispec-worker-{uuid.uuid4().hex}"
        self.runner = SampleRunner(cfg, (load_models or load_pair)(cfg, need_draft=need_draft), self.scratch)

    def __call__(self, unit):
        record = self.runner(unit)
        paths = sorted(p for p in self.scratch.rglob("*") if p.is_file())   # none: nothing was recorded
        files = {p.relative_to(self.scratch).as_posix(): p.read_bytes() for p in paths}
        shutil.rmtree(self.scratch, ignore_errors=True)   # SampleRecording.save makes its folders again
        return UnitResult(record, files)


class RayExecutor:
    """The bench's :class:`~verispec.bench.executors.Executor` over a :class:`WorkerPool`: every worker
    loads the pair of ``cfg`` (with ``n_threads`` = its threads) through ``load_models`` (default
    :func:`verispec.models.load_pair`; it must pickle, e.g. a module-level function, and its module
    must import on the workers)."""

    def __init__(self, cfg, cluster: ClusterSettings, *, load_models: Callable | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.cfg, self._load_models = cfg, load_models
        self.pool = WorkerPool(cluster, n_threads=cfg.n_threads, log=lambda m: log(f"bench: {m}"))

    def start(self, need_draft: bool) -> None:
        def factory(threads: int):
            cfg = dataclasses.replace(self.cfg, n_threads=threads)
            return functools.partial(BenchUnits, cfg, need_draft, self._load_models)

        self.pool.start(factory)

    def run(self, units, commit) -> None:
        self.pool.run(units, commit)

    def close(self) -> None:
        self.pool.close()
