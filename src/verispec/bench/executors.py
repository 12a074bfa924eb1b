"""Where bench samples are decoded: a :class:`SampleRunner` turns a :class:`Unit` (one sample of one planned
run) into its checked row on one loaded model pair; an :class:`Executor` runs units -- :class:`LocalExecutor`
one after another in this process, :class:`BatchExecutor` continuously batched on batched backends, the Ray
pool of :mod:`verispec.bench.distributed` on workers -- and hands each result to the driver, which alone
commits (:class:`verispec.bench.runner.Bench`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from verispec import rules as rule_registry
from verispec.bench.distortion import RECORDED_RULE, SampleRecording, positions_path
from verispec.bench.records import RunKey, SampleRecord
from verispec.engine import cached_profile, generate, generate_target_only, measure_costs
from verispec.engine.batch import generate_batch, generate_target_only_batch
from verispec.engine.costs import DEFAULT_G_MAX
from verispec.engine.ngram import lookup_for
from verispec.models import backend_label, is_ngram_draft, load_pair
from verispec.outputs import OutputError, os_error_text
from verispec.sampling import SamplingConfig
from verispec.tasks.checkers import check, grader_stamp
from verispec.tasks.datasets import Problem


@dataclass(frozen=True)
class PlannedRun:
    key: RunKey
    sampling: SamplingConfig
    rule: str | None            # None: target-only decoding
    pair: dict


def sample_seed(seed: int, dataset: str, problem_id: str, k: int) -> int:
    digest = hashlib.sha256(f"{seed}\x00{dataset}\x00{problem_id}\x00{k}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Unit:
    """One sample of one run: what an executor runs and the store commits once."""

    problem: Problem
    k: int
    run: PlannedRun


@dataclass
class UnitResult:
    """A unit's row, and the files that must be in the bench directory before it (paths relative to
    the directory: the recorded positions of a lossless sample made away from it, e.g. by a Ray worker)."""

    record: SampleRecord
    files: dict[str, bytes] = field(default_factory=dict)


class SampleRunner:
    """The body of the bench loop: runs units on one loaded model pair (``models``: ``load_pair``'s
    ``(target, draft, width)``) and returns their rows; a lossless sample's positions are saved under
    ``out`` before its row is returned. Prompts and per-γ call costs are computed once per runner."""

    def __init__(self, cfg, models: tuple, out: Path, decoding: dict | None = None) -> None:
        self.cfg, self.out = cfg, Path(out)
        self.target, self.draft, self.width = models
        # how this runner's samples are decoded, stored in each row's meta (the report compares it)
        self.decoding = {"backend": backend_label(self.target), "batched": False, "batch_size": 1,
                         **(decoding or {})}
        self._costs: dict = {}
        self._prompts: dict[tuple[str, str], list[int]] = {}

    def __call__(self, unit: Unit) -> SampleRecord:
        problem, k, run = unit.problem, unit.k, unit.run
        target, draft, width, costs = self.target, self.draft, self.width, self._costs
        ids = self._prompts.get((problem.dataset, problem.id))
        if ids is None:
            ids = self._prompts[(problem.dataset, problem.id)] = target.chat_prompt(problem.prompt)
        seed = sample_seed(self.cfg.seed, problem.dataset, problem.id, k)
        t0 = time.perf_counter()
        if run.rule is None:
            res = generate_target_only(target, ids, sampling=run.sampling, max_new_tokens=self.cfg.max_new_tokens,
                                       stop=problem.stop, seed=seed, vocab_width=width)
        else:
            gamma, tree = run.key.gamma, run.key.tree or None
            if run.key.gamma_policy == "auto":
                gamma = "auto"
                if gamma not in costs:
                    costs[gamma] = cached_profile(target, draft, ids, n_threads=self.cfg.n_threads,
                                                  g_max=DEFAULT_G_MAX)[0]
            elif gamma not in costs and tree is None and draft is not None:
                costs[gamma] = measure_costs(target, draft, ids, gamma)
            # lossless runs record every drafted (p, q): the report's exact per-token distortion
            recording = SampleRecording(problem.dataset, problem.id) if run.rule == RECORDED_RULE else None
            res = generate(target, draft, ids, rule=run.rule, sampling=run.sampling, gamma=gamma,
                           max_new_tokens=self.cfg.max_new_tokens, stop=problem.stop, seed=seed,
                           vocab_width=width, costs=costs.get(gamma) if tree is None else None,
                           observers=[recording] if recording is not None else (), tree=tree,
                           lookup=lookup_for(self.cfg, DEFAULT_G_MAX if gamma == "auto" else gamma))
            if recording is not None:  # on disk before the row: a stored row implies its positions
                save_recording(recording, positions_path(self.out, run.key.run_id, problem.id, k), target.token_piece)
        return self.row(unit, res, time.perf_counter() - t0)

    def row(self, unit: Unit, res, gen_s: float) -> SampleRecord:
        """The checked row of a unit's generation ``res`` (a ``GenerationResult``) that took ``gen_s``
        seconds; also for executors that generate several units together."""
        problem, st = unit.problem, res.stats
        verdict = check(problem, res.text, timeout_s=self.cfg.check_timeout_s, truncated=st.stop_reason == "length")
        return SampleRecord.from_stats(
            unit.run.key.run_id, problem.id, unit.k, output=res.text, extracted=verdict.extracted,
            correct=bool(verdict.correct), stats=st.to_dict(),
            meta={
                "difficulty": problem.meta.get("difficulty"), "generate_s": gen_s,
                "seed": sample_seed(self.cfg.seed, problem.dataset, problem.id, unit.k),
                "check_detail": verdict.detail[:500], "correct_flexible": verdict.correct_flexible,
                **grader_stamp(problem, self.cfg.check_timeout_s),
                **self.decoding,
            },
        )


Commit = Callable[[Unit, UnitResult], None]


class Executor(Protocol):
    """Runs units wherever their models are and hands each result to ``commit`` (on the driver, in
    any order, each unit at most once); :class:`LocalExecutor` here, the Ray pool in
    :mod:`verispec.bench.distributed`."""

    def start(self, need_draft: bool) -> None:
        """Load the models (or start the workers that hold them)."""

    def run(self, units: Sequence[Unit], commit: Commit) -> None: ...

    def close(self) -> None: ...


class LocalExecutor:
    """Units one after another, in order, in this process, on one model pair."""

    def __init__(self, cfg, out: Path, load_models: Callable | None = None) -> None:
        self.cfg, self.out, self._load_models = cfg, Path(out), load_models
        self._runner: SampleRunner | None = None

    def start(self, need_draft: bool) -> None:
        models = (self._load_models or load_pair)(self.cfg, need_draft=need_draft)
        self._runner = SampleRunner(self.cfg, models, self.out)

    def run(self, units: Sequence[Unit], commit: Commit) -> None:
        for unit in units:
            commit(unit, UnitResult(self._runner(unit)))

    def close(self) -> None:
        self._runner = None


class BatchExecutor:
    """Units decoded ``batch_size`` at a time on batched backends (:mod:`verispec.engine.batch`), in this
    process: the work list is cut into chunks of about ``batch_size`` problems (so an interrupted bench
    still compares every run on the same problems), and within a chunk the samples of each run form one
    continuously batched call; each row is committed as soon as its prompt ends. Chains only."""

    def __init__(self, cfg, out: Path, batch_size: int, load_models: Callable | None = None,
                 invariant: bool = False) -> None:
        check_batchable(cfg)
        self.cfg, self.out, self.batch_size, self._load_models = cfg, Path(out), batch_size, load_models
        self.invariant = invariant
        self._runner: SampleRunner | None = None

    def start(self, need_draft: bool) -> None:
        load = self._load_models or load_pair
        extra = {"batch_invariant": True} if self.invariant else {}
        models = load(self.cfg, need_draft=need_draft, batch_size=self.batch_size, **extra)
        self._runner = SampleRunner(self.cfg, models, self.out, decoding={
            "batched": True, "batch_size": self.batch_size, "batch_invariant": self.invariant})

    def run(self, units: Sequence[Unit], commit: Commit) -> None:
        runner, cfg = self._runner, self.cfg
        problems = list(dict.fromkeys((u.problem.dataset, u.problem.id) for u in units))
        per_chunk = max(1, self.batch_size // max(1, cfg.n_samples))
        for start in range(0, len(problems), per_chunk):
            chunk = set(problems[start:start + per_chunk])
            groups: dict[str, list[Unit]] = {}
            for u in units:
                if (u.problem.dataset, u.problem.id) in chunk:
                    groups.setdefault(u.run.key.run_id, []).append(u)
            for group in groups.values():
                run = group[0].run
                prompts = [runner.target.chat_prompt(u.problem.prompt) for u in group]
                seeds = [sample_seed(cfg.seed, u.problem.dataset, u.problem.id, u.k) for u in group]
                stops = [list(u.problem.stop) for u in group]
                recordings = [SampleRecording(u.problem.dataset, u.problem.id) if run.rule == RECORDED_RULE
                              else None for u in group]

                def done(i: int, res, group=group, recordings=recordings) -> None:
                    unit = group[i]
                    if recordings[i] is not None:   # on disk before the row: a stored row implies its positions
                        save_recording(recordings[i], positions_path(self.out, unit.run.key.run_id, unit.problem.id,
                                                                     unit.k), runner.target.token_piece)
                    commit(unit, UnitResult(runner.row(unit, res, res.stats.wall_s)))

                common = dict(sampling=run.sampling, max_new_tokens=cfg.max_new_tokens, stop=stops, seeds=seeds,
                              batch_size=self.batch_size, vocab_width=runner.width, on_done=done)
                if run.rule is None:
                    generate_target_only_batch(runner.target, prompts, **common)
                else:
                    generate_batch(runner.target, runner.draft, prompts, rule=run.rule, gamma=run.key.gamma,
                                   observers=recordings, **common)

    def close(self) -> None:
        self._runner = None


def save_recording(recording: SampleRecording, path: Path, decode: Callable[[int], str]) -> None:
    """Save a lossless sample's recorded positions; a failure (a full disk) leaves no partial file and
    says which file could not be written."""
    try:
        recording.save(path, decode=decode)
    except OSError as exc:
        for tmp in (path.with_name(path.name + ".tmp"), path.with_suffix(".tokens.json.tmp")):
            tmp.unlink(missing_ok=True)      # the temporary files SampleRecording.save writes first
        exc.filename = str(path)
        raise OutputError(os_error_text(exc)) from None


def check_batchable(cfg) -> None:
    """``--batch-size`` decodes chains of a fixed γ: refuse trees, prompt lookup and ``--gamma auto``."""
    if cfg.trees or cfg.lookup or is_ngram_draft(cfg.draft) or "auto" in cfg.gammas:
        raise ValueError("--batch-size decodes chains of a fixed γ: it does not combine with --tree, --lookup, "
                         "--draft ngram or --gamma auto (drop one)")
    raw = [spec for spec in cfg.rules if getattr(rule_registry.get(spec), "needs_raw", False)]
    if raw:
        raise ValueError(f"rule(s) {', '.join(raw)} read the raw distributions, which --batch-size does not keep: "
                         "run them without --batch-size (or drop them)")
