"""SQLite result store for ``verispec bench`` (stdlib ``sqlite3`` only; resumable, crash-safe).

Layout (schema version 2)
-------------------------
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
            meta TEXT NOT NULL,                                   -- JSON object (bench: checker, seed, ...)
            created_at REAL NOT NULL,
            stats TEXT NOT NULL DEFAULT '{}',                     -- JSON: the engine's Stats.to_dict()
            PRIMARY KEY (run_id, problem_id, sample_idx))

The numeric columns repeat the fields of ``stats`` that queries and the report aggregate; ``stats`` is
the engine's whole record of the generation (stop reason, cost-model speedup, per-position acceptance,
timings), stored as the engine wrote it rather than copied field by field.

Versions
--------
Version 2 removed ``RunKey.baseline_of`` (never set; pairing is the ``pair_json`` of a run), which
changes every run id, and added the ``stats`` column.  Opening a version-1 file migrates it in place in
one transaction, after copying it to ``<name>.v1.bak``: run ids are recomputed (samples and pairings
follow) and ``stats`` is filled from the version-1 columns and ``meta``.  A file of a newer version,
a SQLite file that is not a verispec store, and a file that is not a database are refused with a
:class:`StoreError` naming the file and what to do.

Reading only
------------
``ResultStore(path, readonly=True)`` (the report, a regrade that writes nothing) never changes the
file: it opens it with ``mode=ro`` and, where SQLite cannot create the WAL's shared-memory file (a
read-only mount), with ``immutable=1`` (commits still in a ``-wal`` file, left by a killed writer,
are then invisible: :attr:`ResultStore.warnings` says so). A version-1 file is migrated in a copy in
memory. An empty (0-byte) file is refused: it is not a store, and reading it must not make it one.

Errors while writing
--------------------
A full disk, a read-only file or a lock held too long raise :class:`StoreError` naming the file and
what to do; every row committed before stays (the same command resumes after the cause is fixed).

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

import json
import shutil
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from verispec.bench.records import STAT_COLUMNS, RunKey, SampleRecord

__all__ = [
    "SCHEMA_VERSION",
    "DEFAULT_DB_NAME",
    "ResultStore",
    "StoreError",
    "write_error",
]

SCHEMA_VERSION = 2
DEFAULT_DB_NAME = "results.sqlite"

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
    stats         TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, problem_id, sample_idx)
);
"""

#: what a user can do about a store this version cannot use
_WHAT_TO_DO = "move the file aside (or delete it) or choose another --out directory"


class StoreError(ValueError):
    """A result store file that cannot be used: not a database, not a verispec store, a newer schema,
    or one that cannot be written (full disk, read-only file system, lock held).

    A ``ValueError`` so that the command line reports it as a plain error (exit status 2)."""


def write_error(path: Path, exc: sqlite3.Error) -> StoreError:
    """A :class:`StoreError` saying what a failed write of the store ``path`` means and what to do."""
    msg = str(exc)
    kept = "every sample stored before is kept; run the same command again to resume"
    if "full" in msg:
        return StoreError(f"the disk holding {path} is full (SQLite: {msg}): free some space; {kept}")
    if "readonly" in msg or "read-only" in msg or "unable to open" in msg:
        return StoreError(f"cannot write the result store {path} (SQLite: {msg}): the file or its folder is read-only; "
                          "choose a writable --out (report and regrade --dry-run only read a store)")
    if "locked" in msg or "busy" in msg:
        return StoreError(f"{path} stayed locked by another process (SQLite: {msg}): wait for the other bench on this "
                          f"--out to end, or choose another --out; {kept}")
    if "disk I/O" in msg:
        return StoreError(f"the disk failed writing {path} (SQLite: {msg}); {kept}")
    return StoreError(f"cannot write the result store {path} (SQLite: {msg}); {kept}")


#: ``Stats.to_dict()`` fields that version 1 stores hand-copied into ``meta``
_V1_META_STATS = ("stop_reason", "cost_model_speedup", "rule_s", "prefill_s", "per_position_acceptance")

_SAMPLE_COLS = (
    "run_id, problem_id, sample_idx, output, extracted, correct, new_tokens, target_calls, "
    "draft_calls, accepted_hist, wall_s, draft_s, verify_s, other_s, meta, stats"
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
        stats=json.loads(row[15]),
    )


class ResultStore:
    """Append-only store of runs and samples in one SQLite file.  See the module docstring.

    Usable as a context manager.  One instance per thread (sqlite3 connections are not shared);
    any number of processes may open the same file.
    """

    def __init__(self, path: str | Path, *, timeout: float = 60.0, synchronous: str = "NORMAL",
                 readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        #: what a reader could not see (commits in a WAL it cannot open), for the caller to show
        self.warnings: list[str] = []
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"bad synchronous level {synchronous!r}")
        self._conn = None
        if readonly:
            if not self.path.is_file():
                raise FileNotFoundError(f"no result store at {self.path}")
            if self.path.stat().st_size == 0:
                raise StoreError(f"{self.path} is empty (0 bytes), not a result store (a bench stopped before it "
                                 "stored anything, or a failed copy); it is left as it is: point at the bench's own "
                                 "folder or delete the file")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if readonly:
                self._open_readonly(timeout)
            else:
                self._open(timeout, synchronous.upper())
        except sqlite3.IntegrityError:
            self.close()
            raise
        except sqlite3.OperationalError as exc:  # full, read-only, locked: nothing wrong with the file itself
            self.close()
            if readonly:
                raise StoreError(f"cannot read the result store {self.path} (SQLite: {exc}): check that the file "
                                 "and its folder are readable") from None
            raise write_error(self.path, exc) from None
        except sqlite3.DatabaseError as exc:  # "file is not a database", "disk image is malformed"
            self.close()
            raise StoreError(f"{self.path} is not a usable result store (SQLite: {exc}); {_WHAT_TO_DO}") from exc
        except BaseException:
            self.close()
            raise

    def _open_readonly(self, timeout: float) -> None:
        uri = "file:" + urllib.parse.quote(str(self.path.resolve()))
        try:
            self._conn = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=timeout, isolation_level=None)
            self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError:   # a WAL database on a read-only mount: no -shm can be made
            if self._conn is not None:
                self._conn.close()
            self._conn = sqlite3.connect(uri + "?mode=ro&immutable=1", uri=True, isolation_level=None)
            wal = self.path.with_name(self.path.name + "-wal")
            if wal.is_file() and wal.stat().st_size > 0:
                self.warnings.append(f"{wal} holds commits SQLite cannot read on this read-only file system "
                                     "(a writer was killed before it folded them in); copy the folder to writable "
                                     "storage to see them")
        tables = self._tables()
        if "schema_version" not in tables:
            raise StoreError(f"{self.path} is a SQLite database but not a verispec result store "
                             f"(tables: {', '.join(sorted(tables)) or 'none'}); {_WHAT_TO_DO}")
        rows = self._versions()
        if rows == [1]:   # migrate a copy in memory: a reader never changes the file
            mem = sqlite3.connect(":memory:", isolation_level=None)
            self._conn.backup(mem)
            self._conn.close()
            self._conn = mem
            mem.execute("BEGIN IMMEDIATE")
            try:
                self._migrate_v1()
                mem.execute("COMMIT")
            except BaseException:
                mem.execute("ROLLBACK")
                raise
        elif rows != [SCHEMA_VERSION]:
            raise StoreError(f"{self.path}: schema version {rows} is not {SCHEMA_VERSION}; this verispec cannot read "
                             f"it. Use the verispec that wrote it, or {_WHAT_TO_DO}")

    def _open(self, timeout: float, synchronous: str) -> None:
        # isolation_level=None: autocommit; transactions are explicit (BEGIN IMMEDIATE ... COMMIT)
        self._conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
        c = self._conn
        c.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        mode = c.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":  # e.g. a filesystem without shared memory support
            raise RuntimeError(f"could not put {self.path} in WAL mode (got {mode!r})")
        c.execute(f"PRAGMA synchronous = {synchronous}")
        c.execute("PRAGMA foreign_keys = ON")
        self._init_schema()

    # -- schema -----------------------------------------------------------------------------
    def _tables(self) -> set[str]:
        return {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def _versions(self) -> list[int]:
        return [r[0] for r in self._conn.execute("SELECT version FROM schema_version")]

    def _init_schema(self) -> None:
        c = self._conn
        tables = self._tables()
        if tables and "schema_version" not in tables:
            raise StoreError(f"{self.path} is a SQLite database but not a verispec result store "
                             f"(tables: {', '.join(sorted(tables))}); {_WHAT_TO_DO}")
        if "schema_version" in tables and self._versions() == [1]:
            self._backup(self.path.with_name(self.path.name + ".v1.bak"))
        c.execute("BEGIN IMMEDIATE")
        try:
            if "schema_version" not in self._tables():
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        c.execute(stmt)
            rows = self._versions()
            if not rows:
                c.execute("INSERT INTO schema_version(version) VALUES (?)", (SCHEMA_VERSION,))
            elif rows == [1]:  # re-read under the write lock: another process may have migrated it
                self._migrate_v1()
            elif rows != [SCHEMA_VERSION]:
                raise StoreError(
                    f"{self.path}: schema version {rows} is not {SCHEMA_VERSION}; this verispec cannot read it. "
                    f"Use the verispec that wrote it, or {_WHAT_TO_DO}"
                )
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise

    def _backup(self, dest: Path) -> None:
        """A consistent copy of the database (WAL content included) before it is changed in place."""
        if dest.exists():
            return
        tmp = dest.with_name(dest.name + ".tmp")
        copy = sqlite3.connect(str(tmp))
        try:
            self._conn.backup(copy)
        finally:
            copy.close()
        shutil.move(str(tmp), str(dest))

    def _migrate_v1(self) -> None:
        """Version 1 -> 2 inside the caller's transaction: drop ``baseline_of`` from every run key
        (recomputing run ids everywhere they appear) and fill the ``stats`` column."""
        c = self._conn
        old = c.execute("SELECT run_id, key_json, pair_json FROM runs ORDER BY rowid").fetchall()
        new_id: dict[str, str] = {}
        new_key: dict[str, RunKey] = {}
        for rid, key_json, _ in old:
            d = json.loads(key_json)
            if d.get("baseline_of") is not None:
                raise StoreError(f"{self.path}: run {rid} sets baseline_of={d['baseline_of']!r}, which schema "
                                 f"{SCHEMA_VERSION} no longer has; {_WHAT_TO_DO}")
            key = RunKey.from_dict(d)
            new_id[rid], new_key[rid] = key.run_id, key
        if len(set(new_id.values())) != len(new_id):
            raise StoreError(f"{self.path}: two version-1 runs have the same identity without baseline_of; "
                             f"{_WHAT_TO_DO}")
        # Ids change under the samples' foreign key: check it at COMMIT, not per statement.
        c.execute("PRAGMA defer_foreign_keys = ON")
        for rid, _, pair_json in old:
            pair = {k: new_id.get(v, v) for k, v in json.loads(pair_json).items()}
            c.execute("UPDATE runs SET run_id = ?, key_json = ?, pair_json = ? WHERE run_id = ?",
                      (new_id[rid], new_key[rid].canonical_json(), json.dumps(pair, sort_keys=True), rid))
            c.execute("UPDATE samples SET run_id = ? WHERE run_id = ?", (new_id[rid], rid))
        c.execute("ALTER TABLE samples ADD COLUMN stats TEXT NOT NULL DEFAULT '{}'")
        cols = ", ".join(STAT_COLUMNS)
        for row in c.execute(f"SELECT rowid, {cols}, meta FROM samples").fetchall():
            stats = dict(zip(STAT_COLUMNS, row[1:-1]))
            stats["accepted_hist"] = json.loads(stats["accepted_hist"])
            meta = json.loads(row[-1])
            stats.update({k: meta[k] for k in _V1_META_STATS if k in meta})
            c.execute("UPDATE samples SET stats = ? WHERE rowid = ?", (json.dumps(stats, sort_keys=True), row[0]))
        c.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

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
        try:
            c.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise write_error(self.path, exc) from None
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
        except sqlite3.OperationalError as exc:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise write_error(self.path, exc) from None
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
            json.dumps(rec.stats if rec.stats is not None else {}, sort_keys=True, default=_json_default),
            time.time(),
        )
        # autocommit mode: a single INSERT is one atomic, committed transaction
        try:
            cur = self._conn.execute(
                f"INSERT OR IGNORE INTO samples({_SAMPLE_COLS}, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                params,
            )
        except sqlite3.OperationalError as exc:   # full disk, read-only, lock held: the row is not stored
            raise write_error(self.path, exc) from None
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
        if getattr(self, "_conn", None) is not None:
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
