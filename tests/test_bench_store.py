"""Tests for verispec.bench.store: round trips, idempotence, and real crash/resume with SIGKILL."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.stores import run_key, write_v1_store
from verispec.bench.records import RunKey, SampleRecord
from verispec.bench.store import DEFAULT_DB_NAME, SCHEMA_VERSION, ResultStore, StoreError

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _rec(run_id: str, pid: str, k: int, **kw) -> SampleRecord:
    base = dict(
        run_id=run_id,
        problem_id=pid,
        sample_idx=k,
        output=f"out {pid} {k}",
        extracted="42",
        correct=True,
        new_tokens=10,
        target_calls=4,
        draft_calls=16,
        accepted_hist=[1, 0, 2, 1],
        wall_s=0.5,
        draft_s=0.1,
        verify_s=0.3,
        other_s=0.1,
        meta={"stop": "eos", "difficulty": 2.5},
    )
    base.update(kw)
    return SampleRecord(**base)


# ------------------------------------------------------------------------------------------
# RunKey


def test_run_id_is_stable_short_sha256_of_canonical_json():
    k = run_key()
    canon = k.canonical_json()
    assert json.loads(canon) == {
        "dataset": "gsm8k", "rule": "cascade:0.5", "sampling": "t=1.0", "gamma": 4, "draft": "d",
        "target": "t", "max_new_tokens": 256, "seed": 0, "role": "method",
    }
    assert canon == json.dumps(json.loads(canon), sort_keys=True, separators=(",", ":"))
    assert k.run_id == hashlib.sha256(canon.encode()).hexdigest()[:16]
    assert k.run_id == run_key().run_id  # deterministic
    # every field takes part in the identity
    variants = [
        run_key(dataset="math"), run_key(rule="cascade:0.6"), run_key(sampling="t=0.7"), run_key(gamma=5),
        run_key(draft="d2"), run_key(target="t2"), run_key(max_new_tokens=512), run_key(seed=1),
        run_key(role="baseline"),
    ]
    ids = {v.run_id for v in variants} | {k.run_id}
    assert len(ids) == len(variants) + 1
    assert RunKey.from_json(canon) == k
    assert k.family == "cascade"


def test_run_key_validation():
    with pytest.raises(ValueError):
        run_key(role="nonsense")
    with pytest.raises(TypeError):
        run_key(gamma="4")
    with pytest.raises(TypeError):
        run_key(seed=True)


# ------------------------------------------------------------------------------------------
# Store basics


def test_schema_and_pragmas(tmp_path):
    path = tmp_path / "deep" / "dir" / DEFAULT_DB_NAME
    with ResultStore(path) as st:
        assert st.schema_version == SCHEMA_VERSION
    assert path.exists()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"schema_version", "runs", "samples"} <= tables
    pk = [r[1] for r in sorted(con.execute("PRAGMA table_info(samples)"), key=lambda r: r[5]) if r[5]]
    assert pk == ["run_id", "problem_id", "sample_idx"]
    con.close()
    # reopening does not add a second version row
    ResultStore(path).close()
    con = sqlite3.connect(path)
    assert con.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 1
    # a future schema version is refused rather than misread
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="schema version") as err:
        ResultStore(path)
    assert str(path) in str(err.value) and "--out" in str(err.value)


def test_register_run_idempotent_and_pairing(tmp_path):
    st = ResultStore(tmp_path / "r.sqlite")
    base = run_key(rule="target-only", sampling="t=1.0,min_p=0.5", gamma=0, role="baseline")
    ref = run_key(rule="lossless", role="lossless_ref")
    meth = run_key()
    b_id = st.register_run(base)
    r_id = st.register_run(ref)
    m_id = st.register_run(meth, {"baseline": b_id})
    assert m_id == meth.run_id and b_id == base.run_id
    assert st.register_run(meth) == m_id  # idempotent; pairing kept
    assert st.register_run(meth, {"lossless_ref": r_id, "ignored": None}) == m_id  # merged
    runs = st.runs()
    assert [k for k, _ in runs] == [base, ref, meth]  # registration order, no duplicates
    assert runs[2][1] == {"baseline": b_id, "lossless_ref": r_id}
    assert runs[0][1] == {}
    assert st.run(m_id) == (meth, {"baseline": b_id, "lossless_ref": r_id})
    assert st.run("nope") is None
    st.close()


def test_add_roundtrip_noop_on_duplicate(tmp_path):
    st = ResultStore(tmp_path / "r.sqlite")
    rid = st.register_run(run_key())
    r1 = _rec(rid, "p1", 0)
    r2 = _rec(rid, "p1", 1, correct=False, extracted=None, accepted_hist=[], meta={})
    r3 = _rec(rid, "p0", 0, output="ünïcödé ✓\n" * 3, meta={"nested": {"a": [1, 2]}})
    assert st.add(r1) is True
    assert st.add(r2) is True
    assert st.add(r3) is True
    # re-adding the same key, even with different content, is a no-op
    assert st.add(_rec(rid, "p1", 0, output="CHANGED", correct=False)) is False
    assert st.add(r1) is False
    assert st.count(rid) == 3 and st.count() == 3
    assert st.done(rid) == {("p1", 0), ("p1", 1), ("p0", 0)}
    got = st.samples(rid)
    assert got == [r3, r1, r2]  # ordered by (problem_id, sample_idx), exact round trip
    assert got[1].output == "out p1 0"
    assert st.done("other") == set() and st.samples("other") == []
    st.close()


def test_add_requires_registered_run_and_serialises_numpy_meta(tmp_path):
    np = pytest.importorskip("numpy")
    st = ResultStore(tmp_path / "r.sqlite")
    with pytest.raises(sqlite3.IntegrityError):
        st.add(_rec("unregistered", "p", 0))
    rid = st.register_run(run_key())
    st.add(_rec(rid, "p", 0, meta={"x": np.float32(1.5), "v": np.arange(3)}))
    assert st.samples(rid)[0].meta == {"x": 1.5, "v": [0, 1, 2]}
    with pytest.raises(ValueError):
        st.add(_rec(rid, "p", 1, wall_s=float("nan")))
    assert st.done(rid) == {("p", 0)}
    st.close()


def test_two_handles_see_each_others_writes(tmp_path):
    path = tmp_path / "r.sqlite"
    a, b = ResultStore(path), ResultStore(path)
    rid = a.register_run(run_key())
    assert a.add(_rec(rid, "p", 0))
    assert b.done(rid) == {("p", 0)}
    assert b.add(_rec(rid, "p", 0)) is False
    assert b.add(_rec(rid, "p", 1)) is True
    assert a.done(rid) == {("p", 0), ("p", 1)}
    a.close()
    b.close()


def test_from_stats_fills_columns_and_keeps_the_whole_stats_dict(tmp_path):
    from verispec.engine.stats import Stats

    st_ = Stats(mode="sd", rule="lossless", gamma=3, new_tokens=7, target_calls=3, draft_calls=9,
                accepted_hist=[1, 0, 1, 1], wall_s=0.4, draft_s=0.1, verify_s=0.2, stop_reason="length",
                cost_model_speedup=1.7)
    with ResultStore(tmp_path / "r.sqlite") as st:
        rid = st.register_run(run_key())
        rec = SampleRecord.from_stats(rid, "p", 0, output="x", extracted=None, correct=True,
                                      stats=st_.to_dict(), meta={"seed": 3})
        assert (rec.new_tokens, rec.target_calls, rec.draft_calls, rec.accepted_hist) == (7, 3, 9, [1, 0, 1, 1])
        assert rec.other_s == pytest.approx(0.1) and rec.truncated and rec.cost_model_speedup == 1.7
        st.add(rec)
        (got,) = st.samples(rid)
    assert got == rec and got.stats["block_efficiency"] == pytest.approx(7 / 3) and got.meta == {"seed": 3}
    with pytest.raises(ValueError, match="Stats.to_dict"):
        SampleRecord.from_stats(rid, "p", 1, output="x", extracted=None, correct=False, stats={"new_tokens": 1})


# A version-1 store exactly as verispec 0.1 wrote it (RunKey with baseline_of, no stats column).
def test_version_1_store_is_migrated_in_place_with_a_backup(tmp_path):
    path = tmp_path / "results.sqlite"
    v1 = write_v1_store(path)
    assert v1["b_old"] != v1["base"].run_id  # dropping baseline_of changes every run id
    with ResultStore(path) as st:
        assert st.schema_version == SCHEMA_VERSION
        runs = st.runs()
        assert [k for k, _ in runs] == [v1["base"], v1["meth"]]  # registration order kept
        assert runs[1][1] == {"baseline": v1["base"].run_id}   # pairing follows the new ids
        (b,) = st.samples(v1["base"].run_id)
        (m,) = st.samples(v1["meth"].run_id)
        assert b.correct and not m.correct and m.new_tokens == 12 and m.accepted_hist == [1, 0, 3]
        assert m.stats == {"new_tokens": 12, "target_calls": 4, "draft_calls": 16, "accepted_hist": [1, 0, 3],
                           "wall_s": 0.5, "draft_s": 0.1, "verify_s": 0.3, "other_s": 0.1,
                           "stop_reason": "length", "cost_model_speedup": 2.5, "rule_s": 0.01}
        assert m.truncated and m.meta["difficulty"] == 3
        # a resumed bench registers the same key: it finds the migrated run, not a new one
        assert st.register_run(v1["meth"]) == v1["meth"].run_id and len(st.runs()) == 2
        assert st.done(v1["meth"].run_id) == {("p0", 0)}
        assert st.integrity_check() == "ok"
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    con.close()
    backup = tmp_path / "results.sqlite.v1.bak"
    con = sqlite3.connect(backup)
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
    assert {r[0] for r in con.execute("SELECT run_id FROM runs")} == {v1["b_old"], v1["m_old"]}
    con.close()
    ResultStore(path).close()  # opening again is a no-op


def test_version_1_store_with_baseline_of_set_is_refused_untouched(tmp_path):
    path = tmp_path / "results.sqlite"
    write_v1_store(path, baseline_of="someone")
    with pytest.raises(StoreError, match="baseline_of") as err:
        ResultStore(path)
    assert str(path) in str(err.value) and "move the file aside" in str(err.value)
    con = sqlite3.connect(path)
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(1,)]  # rolled back
    con.close()


@pytest.mark.parametrize("content", [b"this is not a database\n" * 200, b"SQLite format 3\x00" + b"\x07" * 5000])
def test_corrupt_store_gives_a_clear_error(tmp_path, content):
    path = tmp_path / "results.sqlite"
    path.write_bytes(content)
    with pytest.raises(StoreError) as err:
        ResultStore(path)
    msg = str(err.value)
    assert str(path) in msg and "not a usable result store" in msg and "--out" in msg
    assert isinstance(err.value, ValueError)
    assert path.read_bytes() == content  # never overwritten


def test_foreign_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="not a verispec result store"):
        ResultStore(path)
    con = sqlite3.connect(path)
    assert {r[0] for r in con.execute("SELECT name FROM sqlite_master")} == {"people"}
    con.close()


# ------------------------------------------------------------------------------------------
# Real crash / resume: a writer subprocess is SIGKILLed at random moments.

WRITER = r'''
import sys, hashlib
from verispec.bench.store import ResultStore
from verispec.bench.records import RunKey, SampleRecord

db, n_prob, n_samp, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def content(pid, k):
    h = hashlib.sha256(f"{pid}/{k}".encode()).hexdigest()
    return (h * (size // 64 + 1))[:size]

st = ResultStore(db)
keys = [RunKey("ds", "cascade:0.5", "t=1", 4, "d", "t", 64, 0),
        RunKey("ds", "target-only", "t=1,min_p=0.5", 0, "d", "t", 64, 0, role="baseline")]
base_id = st.register_run(keys[1])
ids = [st.register_run(keys[0], {"baseline": base_id}), base_id]
print("ready", flush=True)
dups = 0
wrote = 0
for rid in ids:
    done = st.done(rid)
    for p in range(n_prob):
        pid = f"p{p:03d}"
        for k in range(n_samp):
            if (pid, k) in done:
                continue
            out = content(pid, k)
            rec = SampleRecord(rid, pid, k, out, str(p * k), (p + k) % 3 == 0, p + k, k + 1, 4 * (k + 1),
                               [p % 5, k % 4, 1], 0.25 * k, 0.1, 0.1, 0.05,
                               {"sha": hashlib.sha256(out.encode()).hexdigest(), "p": p, "k": k})
            # one short write() per line, so a line is either wholly in the pipe or not at all
            if st.add(rec):
                wrote += 1
                sys.stdout.write(f"ok {rid} {pid} {k}\n")
            else:
                dups += 1
                sys.stdout.write(f"dup {rid} {pid} {k}\n")
            sys.stdout.flush()
st.close()
print("finished", wrote, dups, flush=True)
'''


class _Writer:
    """Runs the writer script and collects its stdout lines in a thread (no pipe stalls)."""

    def __init__(self, script: Path, db: Path, n_prob: int, n_samp: int, size: int):
        env = dict(os.environ)
        env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(db), str(n_prob), str(n_samp), str(size)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _pump(self):
        for line in self.proc.stdout:
            if not line.endswith("\n"):  # torn by the kill: never acknowledged
                continue
            line = line.strip()
            self.lines.append(line)
            if line == "ready":
                self.ready.set()
        self.ready.set()

    def finish(self, timeout=60):
        self.proc.wait(timeout=timeout)
        self._t.join(timeout=10)
        err = self.proc.stderr.read()
        return self.proc.returncode, err

    def acked(self) -> set[tuple[str, str, int]]:
        out = set()
        for line in self.lines:
            if line.startswith("ok "):
                _, rid, pid, k = line.split()
                out.add((rid, pid, int(k)))
        return out

    def dups(self) -> int:
        return sum(1 for line in self.lines if line.startswith("dup "))


def _db_state(db: Path, n_prob: int, n_samp: int, size: int) -> set[tuple[str, str, int]]:
    """Open the store after a kill; check integrity and that every stored row is intact."""
    with ResultStore(db) as st:
        assert st.integrity_check() == "ok"
        runs = st.runs()
        # killed during start-up: the baseline is registered first, then the paired method run
        assert len(runs) <= 2
        if len(runs) == 2:
            (bkey, bpair), (mkey, mpair) = runs
            assert bkey.role == "baseline" and mkey.role == "method"
            assert mpair == {"baseline": bkey.run_id} and bpair == {}
        elif len(runs) == 1:
            assert runs[0][0].role == "baseline"
        state = set()
        for key, _ in runs:
            recs = st.samples(key.run_id)
            keys = [(r.problem_id, r.sample_idx) for r in recs]
            assert len(keys) == len(set(keys)), "duplicate rows"
            assert set(keys) == st.done(key.run_id)
            for r in recs:
                p, k = int(r.problem_id[1:]), r.sample_idx
                assert 0 <= p < n_prob and 0 <= k < n_samp
                h = hashlib.sha256(f"{r.problem_id}/{k}".encode()).hexdigest()
                assert r.output == (h * (size // 64 + 1))[:size], "torn/corrupt output"
                assert r.meta == {"sha": hashlib.sha256(r.output.encode()).hexdigest(), "p": p, "k": k}
                assert r.correct == ((p + k) % 3 == 0) and r.new_tokens == p + k
                assert r.accepted_hist == [p % 5, k % 4, 1] and r.wall_s == 0.25 * k
                state.add((key.run_id, r.problem_id, k))
    con = sqlite3.connect(db)
    n_rows = con.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    n_distinct = con.execute(
        "SELECT COUNT(*) FROM (SELECT DISTINCT run_id, problem_id, sample_idx FROM samples)"
    ).fetchone()[0]
    con.close()
    assert n_rows == n_distinct == len(state)
    return state


def test_resume_after_sigkill_real(tmp_path):
    n_prob, n_samp, size = 50, 40, 4000  # 2 runs x 2000 rows, 4 kB each (~1 s uninterrupted)
    total = 2 * n_prob * n_samp
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    db = tmp_path / "store" / "results.sqlite"
    rng = random.Random(1234)
    # rounds 0-1: kill during interpreter start-up / schema creation / registration;
    # rounds 2..: kill at random moments while rows are being written.
    delays = [("spawn", rng.uniform(0.0, 0.04)), ("spawn", rng.uniform(0.04, 0.12))]
    delays += [("ready", rng.uniform(0.0, 0.05)) for _ in range(5)]
    prev: set = set()
    killed_mid_write = 0
    for when, delay in delays:
        w = _Writer(script, db, n_prob, n_samp, size)
        if when == "ready":
            assert w.ready.wait(30), "writer never became ready"
        time.sleep(delay)
        w.proc.send_signal(signal.SIGKILL)
        rc, err = w.finish()
        if rc == 0:  # finished before the kill landed: the sizes above are far too small
            pytest.fail("writer finished before being killed; increase the workload")
        assert rc == -signal.SIGKILL, err
        if not db.exists():
            assert not w.acked()
            continue
        state = _db_state(db, n_prob, n_samp, size)
        acked = w.acked()
        assert w.dups() == 0, "resumed writer re-added a done() row"
        assert acked <= state, "an acknowledged (committed) row was lost"
        assert not (acked & prev), "resumed writer rewrote a row that was already done"
        assert prev <= state, "rows from an earlier round disappeared"
        # only the single in-flight row may be committed without having been acknowledged
        assert len(state - prev - acked) <= 1
        if acked and when == "ready":
            killed_mid_write += 1
        prev = state
    assert killed_mid_write >= 3, "kills did not land while rows were being written"
    assert len(prev) < total
    # final resume runs to completion and adds exactly the missing rows
    w = _Writer(script, db, n_prob, n_samp, size)
    rc, err = w.finish(timeout=120)
    assert rc == 0, err
    assert w.lines[-1] == f"finished {total - len(prev)} 0"
    final = _db_state(db, n_prob, n_samp, size)
    assert len(final) == total
    assert final == prev | w.acked() and not (prev & w.acked())


CONCURRENT = r'''
import sys
from verispec.bench.store import ResultStore
from verispec.bench.records import RunKey, SampleRecord
db, order = sys.argv[1], sys.argv[2]
st = ResultStore(db)
rid = st.register_run(RunKey("ds", "r", "s", 1, "d", "t", 8, 0))
keys = [(f"p{p}", k) for p in range(30) for k in range(10)]
if order == "rev":
    keys.reverse()
n = 0
for pid, k in keys:
    n += st.add(SampleRecord(rid, pid, k, "x" * 500, None, False, 1, 1, 0, [1], 0.0, 0.0, 0.0, 0.0, {}))
print(n, flush=True)
'''


def test_concurrent_writers_never_duplicate(tmp_path):
    script = tmp_path / "conc.py"
    script.write_text(CONCURRENT)
    db = tmp_path / "c.sqlite"
    ResultStore(db).close()  # create schema up front
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    procs = [
        subprocess.Popen([sys.executable, str(script), str(db), o], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for o in ("fwd", "rev", "fwd")
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    written = sum(int(out.strip()) for out, _ in outs)
    assert written == 300  # every row added exactly once across the racing writers
    with ResultStore(db) as st:
        (key, _), = st.runs()
        assert len(st.samples(key.run_id)) == 300
        assert st.integrity_check() == "ok"


# ------------------------------------------------------------------------------------------
# The command line names a corrupt store and what to do, without a traceback.


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "verispec", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("command", ["report", "bench"])
def test_cli_reports_a_corrupt_store_clearly(tmp_path, command):
    out = tmp_path / "run"
    out.mkdir()
    store = out / DEFAULT_DB_NAME
    store.write_bytes(b"definitely not SQLite\n" * 100)
    if command == "report":
        proc = _cli("report", str(out), cwd=tmp_path)
    else:
        data = tmp_path / "q.jsonl"
        data.write_text(json.dumps({"question": "1 + 1?", "answer": "2", "id": "a"}) + "\n")
        proc = _cli("bench", "--dataset", str(data), "--question-field", "question", "--answer-field", "answer",
                    "--checker", "gsm8k", "--out", str(out), "--no-progress", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "DatabaseError" not in proc.stderr
    assert f"verispec: error: {store} is not a usable result store" in proc.stderr
    assert "move the file aside" in proc.stderr and "--out" in proc.stderr
    assert store.read_bytes() == b"definitely not SQLite\n" * 100
