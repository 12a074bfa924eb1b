"""SQLite result store for ``verispec bench`` (stdlib ``sqlite3`` only; resumable, crash-safe).

Layout
------
One database file holds every run of a grid and every sample of every run::

    schema_version(version INTEGER NOT NULL)                      -- exactly one row
    runs(run_id TEXT PRIMARY KEY, key_json TEXT NOT NULL,         -- canonical RunKey JSON
         pair_json TEXT NOT NULL DEFAULT '{}',                    -- {"baseline": id, "lossless_ref": id}
         created_at REAL NOT NULL)
    samples(run_id TEXT NOT NULL REFERENCES runs(run_id),
            problem_id TEXT NOT NULL, sample_idx INTEGER NOT NULL,
            output TEXT NOT NULL, extracted TEXT, correct INTEGER NOT NULL,   -- 0/1
            new_tokens INTEGER, target_calls INTEGER, draft_calls INTEGER,
            accepted_hist TEXT NOT NULL,                          -- JSON list[int]
            wall_s REAL, draft_s REAL, verify_s REAL, other_s REAL,
            meta TEXT NOT NULL,                                   -- JSON object
            created_at REAL NOT NULL,
            PRIMARY KEY (run_id, problem_id, sample_idx))

Durability
----------
The database runs in WAL mode with ``synchronous=NORMAL`` and the connection in autocommit
mode: every :meth:`ResultStore.add` is its own committed transaction.  A killed process
(SIGKILL, OOM, Ctrl-C) loses at most the row it was writing; committed rows survive because
they are in the WAL file the OS already holds (a *power loss* could additionally lose the last
few commits under ``synchronous=NORMAL``; pass ``synchronous="FULL"`` if that matters).  The
primary key makes re-adding a finished sample a no-op, so a resumed writer (or two writers
racing on the same run) can never create duplicates.  Several processes may read and write
the same file concurrently (``busy_timeout`` waits for the writer lock).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

__all__ = [
    "SCHEMA_VERSION",
    "DEFAULT_DB_NAME",
    "ROLES",
    "RunKey",
    "SampleRecord",
    "ResultStore",
]

SCHEMA_VERSION = 1
DEFAULT_DB_NAME = "results.sqlite"
ROLES = ("method", "baseline", "target_only", "lossless_ref")
RUN_ID_LEN = 16  # hex chars of sha256 (64 bits): collisions are not a practical concern

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id     TEXT PRIMARY KEY,
    key_json   TEXT NOT NULL,
    pair_json  TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    run_id        TEXT NOT NULL REFERENCES runs(run_id),
    problem_id    TEXT NOT NULL,
    sample_idx    INTEGER NOT NULL,
    output        TEXT NOT NULL,
    extracted     TEXT,
    correct       INTEGER NOT NULL CHECK (correct IN (0, 1)),
    new_tokens    INTEGER NOT NULL,
    target_calls  INTEGER NOT NULL,
    draft_calls   INTEGER NOT NULL,
    accepted_hist TEXT NOT NULL,
    wall_s        REAL NOT NULL,
    draft_s       REAL NOT NULL,
    verify_s      REAL NOT NULL,
    other_s       REAL NOT NULL,
    meta          TEXT NOT NULL,
    created_at    REAL NOT NULL,
    PRIMARY KEY (run_id, problem_id, sample_idx)
);
"""


@dataclass(frozen=True)
class RunKey:
    """Identity of one run of the grid.  ``run_id`` is a short sha256 of :meth:`canonical_json`."""

    dataset: str
    rule: str
    sampling: str
    gamma: int
    draft: str
    target: str
    max_new_tokens: int
    seed: int
    baseline_of: str | None = None  # for a baseline run: None; pairing is done via ``role``
    role: str = "method"  # "method" | "baseline" | "target_only" | "lossless_ref"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        for name in ("gamma", "max_new_tokens", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"RunKey.{name} must be int, got {type(v).__name__}")
        for name in ("dataset", "rule", "sampling", "draft", "target"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"RunKey.{name} must be str")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace, UTF-8 kept: the exact bytes that are hashed."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def run_id(self) -> str:
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()[:RUN_ID_LEN]

    @property
    def family(self) -> str:
        """Rule family: the rule name before the first ':' (``"cascade:0.5"`` -> ``"cascade"``)."""
        return self.rule.split(":", 1)[0]

    @classmethod
    def from_dict(cls, d: dict) -> "RunKey":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_json(cls, s: str) -> "RunKey":
        return cls.from_dict(json.loads(s))


@dataclass
class SampleRecord:
    """One generated sample of one problem in one run."""

    run_id: str
    problem_id: str
    sample_idx: int
    output: str
    extracted: str | None
    correct: bool
    new_tokens: int
    target_calls: int
    draft_calls: int
    accepted_hist: list[int]  # index = number of draft tokens accepted in a step, value = count
    wall_s: float
    draft_s: float
    verify_s: float
    other_s: float
    meta: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return (self.problem_id, self.sample_idx)


_SAMPLE_COLS = (
    "run_id, problem_id, sample_idx, output, extracted, correct, new_tokens, target_calls, "
    "draft_calls, accepted_hist, wall_s, draft_s, verify_s, other_s, meta"
)


def _row_to_record(row: tuple) -> SampleRecord:
    return SampleRecord(
        run_id=row[0],
        problem_id=row[1],
        sample_idx=int(row[2]),
        output=row[3],
        extracted=row[4],
        correct=bool(row[5]),
        new_tokens=int(row[6]),
        target_calls=int(row[7]),
        draft_calls=int(row[8]),
        accepted_hist=[int(v) for v in json.loads(row[9])],
        wall_s=float(row[10]),
        draft_s=float(row[11]),
        verify_s=float(row[12]),
        other_s=float(row[13]),
        meta=json.loads(row[14]),
    )


class ResultStore:
    """Append-only store of runs and samples in one SQLite file.  See the module docstring.

    Usable as a context manager.  One instance per thread (sqlite3 connections are not shared);
    any number of processes may open the same file.
    """

    def __init__(self, path: str | Path, *, timeout: float = 60.0, synchronous: str = "NORMAL"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: autocommit; transactions are explicit (BEGIN IMMEDIATE ... COMMIT)
        self._conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
        c = self._conn
        c.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        mode = c.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":  # e.g. a filesystem without shared memory support
            raise RuntimeError(f"could not put {self.path} in WAL mode (got {mode!r})")
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"bad synchronous level {synchronous!r}")
        c.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        c.execute("PRAGMA foreign_keys = ON")
        self._init_schema()

    # -- schema -----------------------------------------------------------------------------
    def _init_schema(self) -> None:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            rows = c.execute("SELECT version FROM schema_version").fetchall()
            if not rows:
                c.execute("INSERT INTO schema_version(version) VALUES (?)", (SCHEMA_VERSION,))
            elif len(rows) > 1 or rows[0][0] != SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path}: schema version {[r[0] for r in rows]} is not "
                    f"{SCHEMA_VERSION}; this verispec cannot read it"
                )
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise

    @property
    def schema_version(self) -> int:
        return int(self._conn.execute("SELECT version FROM schema_version").fetchone()[0])

    # -- runs -------------------------------------------------------------------------------
    def register_run(self, key: RunKey, pair: dict | None = None) -> str:
        """Record ``key`` (idempotent) and merge ``pair`` into its pairing info; return run_id.

        ``pair`` maps a relation to another run's id, e.g.
        ``{"baseline": <run_id>, "lossless_ref": <run_id>}``.  Keys given again overwrite the
        stored value; keys not given are kept; ``None`` values are ignored.
        """
        run_id = key.run_id
        new_pair = {k: v for k, v in (pair or {}).items() if v is not None}
        for k, v in new_pair.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("pair must map str -> run_id str")
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            row = c.execute("SELECT key_json, pair_json FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO runs(run_id, key_json, pair_json, created_at) VALUES (?, ?, ?, ?)",
                    (run_id, key.canonical_json(), json.dumps(new_pair, sort_keys=True), time.time()),
                )
            else:
                if row[0] != key.canonical_json():  # 64-bit hash collision or tampering
                    raise RuntimeError(f"run_id {run_id} already stored for a different key: {row[0]}")
                merged = {**json.loads(row[1]), **new_pair}
                c.execute(
                    "UPDATE runs SET pair_json = ? WHERE run_id = ?",
                    (json.dumps(merged, sort_keys=True), run_id),
                )
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        return run_id

    def runs(self) -> list[tuple[RunKey, dict]]:
        """All registered runs in registration order, each with its pairing info dict."""
        rows = self._conn.execute("SELECT key_json, pair_json FROM runs ORDER BY rowid").fetchall()
        return [(RunKey.from_json(k), json.loads(p)) for k, p in rows]

    def run(self, run_id: str) -> tuple[RunKey, dict] | None:
        row = self._conn.execute(
            "SELECT key_json, pair_json FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        return None if row is None else (RunKey.from_json(row[0]), json.loads(row[1]))

    # -- samples ----------------------------------------------------------------------------
    def done(self, run_id: str) -> set[tuple[str, int]]:
        """The (problem_id, sample_idx) pairs already stored for ``run_id``."""
        rows = self._conn.execute(
            "SELECT problem_id, sample_idx FROM samples WHERE run_id = ?", (run_id,)
        ).fetchall()
        return {(p, int(k)) for p, k in rows}

    def add(self, rec: SampleRecord) -> bool:
        """Insert one sample in its own committed transaction.

        Returns True if the row was written, False if (run_id, problem_id, sample_idx) was
        already stored (the stored row is left untouched).  The run must be registered first
        (``sqlite3.IntegrityError`` otherwise).
        """
        timings = [float(rec.wall_s), float(rec.draft_s), float(rec.verify_s), float(rec.other_s)]
        if any(t != t for t in timings):  # SQLite stores NaN as NULL
            raise ValueError(f"NaN timing in sample {rec.problem_id}/{rec.sample_idx}")
        hist = [int(v) for v in rec.accepted_hist]
        if any(v < 0 for v in hist):
            raise ValueError("accepted_hist counts must be >= 0")
        params = (
            rec.run_id,
            str(rec.problem_id),
            int(rec.sample_idx),
            rec.output,
            rec.extracted,
            1 if rec.correct else 0,
            int(rec.new_tokens),
            int(rec.target_calls),
            int(rec.draft_calls),
            json.dumps(hist),
            *timings,
            json.dumps(rec.meta if rec.meta is not None else {}, sort_keys=True, default=_json_default),
            time.time(),
        )
        # autocommit mode: a single INSERT is one atomic, committed transaction
        cur = self._conn.execute(
            f"INSERT OR IGNORE INTO samples({_SAMPLE_COLS}, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            params,
        )
        return cur.rowcount == 1

    def samples(self, run_id: str) -> list[SampleRecord]:
        """All samples of ``run_id`` ordered by (problem_id, sample_idx)."""
        return list(self.iter_samples(run_id))

    def iter_samples(self, run_id: str) -> Iterator[SampleRecord]:
        cur = self._conn.execute(
            f"SELECT {_SAMPLE_COLS} FROM samples WHERE run_id = ? ORDER BY problem_id, sample_idx",
            (run_id,),
        )
        for row in cur:
            yield _row_to_record(row)

    def count(self, run_id: str | None = None) -> int:
        if run_id is None:
            return int(self._conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
        return int(
            self._conn.execute("SELECT COUNT(*) FROM samples WHERE run_id = ?", (run_id,)).fetchone()[0]
        )

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` result ("ok" when healthy)."""
        return str(self._conn.execute("PRAGMA integrity_check").fetchone()[0])

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None  # type: ignore[assignment]

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort
        try:
            self.close()
        except Exception:
            pass


def _json_default(o):
    """Make numpy scalars / arrays and other simple objects JSON-serialisable in ``meta``."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"meta value of type {type(o).__name__} is not JSON serialisable")
