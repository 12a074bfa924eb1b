"""Re-check every stored sample of a bench store with today's checkers.

A bench store keeps each sample's full ``output``, so a checker fix can be applied to finished runs
without generating anything again: :func:`regrade` reloads every run's problems (from the run's
dataset name and the ``config.json`` the bench wrote beside the store: data directory, field
mapping, checker), grades each stored output again -- with ``truncated`` taken from the sample's
stop reason, as the bench does -- and counts, per run, the verdicts that changed.  With
``write=True`` it stores the new ``correct`` / ``extracted`` and the new ``correct_flexible`` /
``check_detail`` in ``meta``, keeping the verdict it replaced under ``meta["previous_verdict"]``,
all in one transaction.

A dry run (``write=False``) only reads the store (:class:`~verispec.bench.store.ResultStore` with
``readonly=True``: a store on a read-only mount is read, an older schema is migrated in memory); with
``write=True`` an older schema is first migrated in place (the store keeps a backup of the old file).
Problems are looked up by id among *all* rows of the dataset (a bench run with ``--limit`` /
``--offset`` stores only some of them).  A sample whose problem cannot be found any more is
counted as ``missing`` and left untouched.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from verispec.bench.store import DEFAULT_DB_NAME, ResultStore, StoreError, write_error
from verispec.params import check_number
from verispec.settings import MAX_CHECK_TIMEOUT_S
from verispec.tasks.checkers import CheckResult, check, same_grader
from verispec.tasks.datasets import Problem, load_dataset
from verispec.tasks.sandbox import require_contained

__all__ = ["regrade", "RegradeSummary", "RunRegrade", "Change"]


@dataclass
class Change:
    """One sample whose strict verdict changed."""

    problem_id: str
    sample_idx: int
    truncated: bool
    before: bool
    after: bool
    extracted_before: str | None
    extracted_after: str | None
    detail: str


@dataclass
class RunRegrade:
    """Per run: how many samples were re-checked and how their verdicts moved."""

    run_id: str
    dataset: str
    rule: str
    role: str
    n: int = 0
    correct_before: int = 0
    correct_after: int = 0
    to_correct: int = 0  # wrong before, correct now
    to_wrong: int = 0  # correct before, wrong now
    flexible_after: int = 0  # correct under today's flexible score
    flexible_changed: int = 0  # samples whose flexible verdict differs from the stored one (if one was stored)
    extracted_changed: int = 0  # samples whose extracted answer differs (verdict changed or not)
    truncated: int = 0
    missing: int = 0  # samples whose problem is no longer in the dataset
    reused: int = 0  # code samples whose stored verdict was decided by today's grader at this limit (not re-run)
    examples: list[Change] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return self.to_correct + self.to_wrong


@dataclass
class RegradeSummary:
    store: Path
    written: bool
    runs: list[RunRegrade]

    @property
    def n(self) -> int:
        return sum(r.n for r in self.runs)

    @property
    def changed(self) -> int:
        return sum(r.changed for r in self.runs)

    def format(self) -> str:
        """A plain-text table, one line per run, then the example changes."""
        lines = [f"regrade {self.store}: {self.changed} of {self.n} verdicts changed"
                 + (" (written)" if self.written else " (dry run: pass write=True / --write to store them)")]
        lines.append("  (before/after: correct under the stored / today's strict score; +/-: changed to correct / "
                     "to wrong; flex: correct under today's flexible score; extr: extracted answer changed)")
        lines.append(f"  {'run':16} {'role':12} {'dataset':14} {'rule':28} {'n':>4} {'before':>6} {'after':>6} "
                     f"{'+':>3} {'-':>3} {'flex':>4} {'extr':>4} {'trunc':>5}")
        for r in self.runs:
            lines.append(f"  {r.run_id:16} {r.role:12} {r.dataset[:14]:14} {r.rule[:28]:28} {r.n:4d} "
                         f"{r.correct_before:6d} {r.correct_after:6d} {r.to_correct:3d} {r.to_wrong:3d} "
                         f"{r.flexible_after:4d} {r.extracted_changed:4d} {r.truncated:5d}"
                         + (f"  ({r.missing} missing)" if r.missing else "")
                         + (f"  ({r.reused} code verdicts kept: same grader)" if r.reused else ""))
        for r in self.runs:
            for c in r.examples:
                lines.append(f"  {r.run_id} {c.problem_id}#{c.sample_idx}{' [truncated]' if c.truncated else ''}: "
                             f"{'correct' if c.before else 'wrong'} -> {'correct' if c.after else 'wrong'}; "
                             f"extracted {c.extracted_before!r} -> {c.extracted_after!r}; {c.detail[:160]}")
        return "\n".join(lines)


def _store_path(store_dir: str | Path) -> Path:
    p = Path(store_dir)
    path = p if p.is_file() else p / DEFAULT_DB_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no result store at {path}: pass the --out directory of a bench (it holds "
                                f"{DEFAULT_DB_NAME}) or the .sqlite file itself")
    if path.stat().st_size == 0:
        raise StoreError(f"{path} is empty (0 bytes), not a result store; it is left as it is: point at the bench's "
                         "own folder or delete the file")
    return path


def _bench_config(path: Path) -> dict:
    cfg_file = path.parent / "config.json"
    if not cfg_file.is_file():
        return {}
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e}); fix or remove it") from None
    return cfg if isinstance(cfg, dict) else {}


def _problems(dataset: str, cfg: dict, data_dir) -> dict[str, Problem]:
    ds = load_dataset(
        dataset, data_dir=data_dir if data_dir is not None else cfg.get("data_dir"),
        question_field=cfg.get("question_field"), answer_field=cfg.get("answer_field"),
        id_field=cfg.get("id_field"), checker=cfg.get("checker"), on_bad_row="skip",
        few_shot=int(cfg.get("few_shot") or 0),
    )
    return {p.id: p for p in ds.problems}


def _truncated(rec) -> bool:
    stats = getattr(rec, "stats", None) or {}
    reason = stats.get("stop_reason", rec.meta.get("stop_reason"))
    return reason == "length"


def regrade(store_dir: str | Path, *, write: bool = False, data_dir: str | Path | None = None,
            timeout_s: float | None = None, max_examples: int = 5) -> RegradeSummary:
    """Grade every sample of the bench store in ``store_dir`` again with today's checkers.

    ``store_dir``: a bench ``--out`` directory (or its ``results.sqlite``).  ``write``: store the new
    verdicts (the replaced one is kept in ``meta["previous_verdict"]``); default: only report.
    ``data_dir``: where the datasets are (default: the bench's own ``config.json`` setting, else the
    usual search).  ``timeout_s``: per check (default: the bench's ``check_timeout_s``, else 10).
    Returns a :class:`RegradeSummary`; ``.format()`` prints it, with up to ``max_examples`` changed
    samples per run.
    """
    path = _store_path(store_dir)
    cfg = _bench_config(path)
    # a stored Infinity (a bench from before the check) would fail correct answers inside the checkers
    timeout = float(check_number(timeout_s if timeout_s is not None else cfg.get("check_timeout_s") or 10.0,
                                 "the check timeout" if timeout_s is not None else "the bench's stored check_timeout_s",
                                 lo=0.0, lo_open=True, hi=MAX_CHECK_TIMEOUT_S, unit="seconds"))
    cache: dict[str, dict[str, Problem]] = {}
    results: list[RunRegrade] = []
    updates: list[tuple] = []
    with ResultStore(path, readonly=not write) as store:  # (writing: migrates an older schema in place first)
        for key, _pair in store.runs():
            run = RunRegrade(run_id=key.run_id, dataset=key.dataset, rule=key.rule, role=key.role)
            results.append(run)
            if key.dataset not in cache:
                cache[key.dataset] = _problems(key.dataset, cfg, data_dir)
                if any(p.checker == "code" for p in cache[key.dataset].values()):
                    require_contained()     # before grading code: refused where the sandbox cannot hold it
            problems = cache[key.dataset]
            for rec in store.iter_samples(key.run_id):
                problem = problems.get(rec.problem_id)
                if problem is None:
                    run.missing += 1
                    continue
                truncated = _truncated(rec)
                if same_grader(problem, rec.meta, timeout):
                    # code graded by today's grader at this limit: its stored verdict stands (running the
                    # program again would only give it another try at learning across gradings)
                    run.reused += 1
                    verdict = CheckResult(bool(rec.correct), rec.extracted, str(rec.meta.get("check_detail", "")),
                                          rec.meta.get("correct_flexible"))
                else:
                    verdict = check(problem, rec.output, timeout_s=timeout, truncated=truncated)
                before, after = bool(rec.correct), bool(verdict.correct)
                old_flex = rec.meta.get("correct_flexible")
                run.n += 1
                run.truncated += truncated
                run.correct_before += before
                run.correct_after += after
                run.to_correct += (not before) and after
                run.to_wrong += before and not after
                run.flexible_after += bool(verdict.correct_flexible)
                run.extracted_changed += (rec.extracted or None) != (verdict.extracted or None)
                run.flexible_changed += old_flex is not None and verdict.correct_flexible is not None and \
                    bool(old_flex) != bool(verdict.correct_flexible)
                if before != after and len(run.examples) < max_examples:
                    run.examples.append(Change(rec.problem_id, rec.sample_idx, truncated, before, after,
                                               rec.extracted, verdict.extracted, verdict.detail))
                if write:
                    meta = dict(rec.meta)
                    meta["previous_verdict"] = {
                        "correct": before, "extracted": rec.extracted, "correct_flexible": old_flex,
                        "check_detail": rec.meta.get("check_detail"),
                    }
                    meta.update(correct_flexible=verdict.correct_flexible, check_detail=verdict.detail[:500],
                                regraded_at=time.time())
                    updates.append((1 if after else 0, verdict.extracted, json.dumps(meta, sort_keys=True, default=str),
                                    key.run_id, rec.problem_id, rec.sample_idx))
    if write and updates:
        _write(path, updates)
    return RegradeSummary(store=path, written=write, runs=results)


def _write(path: Path, updates: list[tuple]) -> None:
    # The store's API is append-only; the verdict columns are updated here, all in one transaction
    # (a failure -- full disk, read-only file -- leaves every stored verdict as it was).
    try:
        conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "UPDATE samples SET correct = ?, extracted = ?, meta = ? "
                    "WHERE run_id = ? AND problem_id = ? AND sample_idx = ?", updates)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        raise write_error(path, exc) from None
