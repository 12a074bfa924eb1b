"""Store fixtures: a run key with defaults, and a store in the first schema (to test migrations)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

from verispec.bench.records import RunKey


def run_key(**kw) -> RunKey:
    base = dict(
        dataset="gsm8k",
        rule="cascade:0.5",
        sampling="t=1.0",
        gamma=4,
        draft="d",
        target="t",
        max_new_tokens=256,
        seed=0,
    )
    base.update(kw)
    return RunKey(**base)


_V1_SQL = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE runs (run_id TEXT PRIMARY KEY, key_json TEXT NOT NULL, pair_json TEXT NOT NULL DEFAULT '{}',
                   created_at REAL NOT NULL);
CREATE TABLE samples (run_id TEXT NOT NULL REFERENCES runs(run_id), problem_id TEXT NOT NULL,
    sample_idx INTEGER NOT NULL, output TEXT NOT NULL, extracted TEXT,
    correct INTEGER NOT NULL CHECK (correct IN (0, 1)), new_tokens INTEGER NOT NULL,
    target_calls INTEGER NOT NULL, draft_calls INTEGER NOT NULL, accepted_hist TEXT NOT NULL,
    wall_s REAL NOT NULL, draft_s REAL NOT NULL, verify_s REAL NOT NULL, other_s REAL NOT NULL,
    meta TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (run_id, problem_id, sample_idx));
INSERT INTO schema_version VALUES (1);
"""


def _v1_key_json(key: RunKey, baseline_of=None) -> tuple[str, str]:
    d = {**key.to_dict(), "baseline_of": baseline_of}
    canon = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()[:16], canon


def write_v1_store(path: Path, baseline_of=None) -> dict:
    con = sqlite3.connect(path)
    con.executescript(_V1_SQL)
    base = run_key(rule="target-only", sampling="t=1.0,min_p=0.5", gamma=0, role="baseline")
    meth = run_key()
    b_old, b_json = _v1_key_json(base)
    m_old, m_json = _v1_key_json(meth, baseline_of)
    con.execute("INSERT INTO runs VALUES (?, ?, '{}', 1.0)", (b_old, b_json))
    con.execute("INSERT INTO runs VALUES (?, ?, ?, 2.0)", (m_old, m_json, json.dumps({"baseline": b_old})))
    meta = {"stop_reason": "length", "cost_model_speedup": 2.5, "rule_s": 0.01, "difficulty": 3}
    for rid, ok in ((b_old, 1), (m_old, 0)):
        con.execute("INSERT INTO samples VALUES (?, 'p0', 0, 'out', '42', ?, 12, 4, 16, '[1, 0, 3]', "
                    "0.5, 0.1, 0.3, 0.1, ?, 3.0)", (rid, ok, json.dumps(meta)))
    con.commit()
    con.close()
    return {"base": base, "meth": meth, "b_old": b_old, "m_old": m_old}
