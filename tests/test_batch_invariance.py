"""Batch size must not change results silently (issue 23, section 4): every stored sample records its
backend and how it was batched, the report shows it and warns where compared runs differ in it, and
``--batch-invariant`` makes a batched llama.cpp row bitwise equal to batch size 1."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.helpers.bench_fakes import DigitLM, config, fake_models
from verispec.bench import runner
from verispec.bench.report import build_report, decoding_warnings
from verispec.bench.rows import decoding_label, numerics_key
from verispec.bench.store import ResultStore
from verispec.settings import ClusterSettings


def batched_fakes(cfg, need_draft, batch_size=None, batch_invariant=False):
    from verispec.models import RowsOfBackends

    if batch_size is None:
        return fake_models(cfg, need_draft)
    return (RowsOfBackends([DigitLM(1) for _ in range(batch_size)]),
            RowsOfBackends([DigitLM(2) for _ in range(batch_size)]) if need_draft else None, 10)


def _metas(out: Path) -> dict:
    with ResultStore(out / runner.STORE_NAME, readonly=True) as st:
        return {(k.role, k.rule, s.problem_id): s.meta for k, _ in st.runs() for s in st.samples(k.run_id)}


def _bench(tmp_path: Path, name: str, cluster: ClusterSettings | None = None, **kw) -> Path:
    (tmp_path / name).mkdir()
    cfg = config(tmp_path / name, n_rows=3, n_samples=1, max_new_tokens=3, rules=["lenience:ell=0.5", "lossless"],
                 **kw)
    out, _ = runner.run_bench(cfg, progress=False, load_models=batched_fakes, log=lambda m: None, report=False,
                              cluster=cluster)
    return out


def test_every_sample_records_its_backend_and_batching(tmp_path):
    one = _metas(_bench(tmp_path, "one"))
    assert {(m["backend"], m["batched"], m["batch_size"]) for m in one.values()} == {("DigitLM", False, 1)}
    two = _metas(_bench(tmp_path, "two", ClusterSettings(batch_size=2)))
    assert {(m["batched"], m["batch_size"], m["batch_invariant"]) for m in two.values()} == {(True, 2, False)}
    inv = _metas(_bench(tmp_path, "inv", ClusterSettings(batch_size=2, batch_invariant=True)))
    assert {(m["batched"], m["batch_size"], m["batch_invariant"]) for m in inv.values()} == {(True, 2, True)}
    # the fakes are exact, so the outputs agree however they were batched
    strip = ("generate_s", "backend", "batched", "batch_size", "batch_invariant")
    assert {k: {x: v for x, v in m.items() if x not in strip} for k, m in one.items()} == \
        {k: {x: v for x, v in m.items() if x not in strip} for k, m in inv.items()}


def test_labels_and_numerics_keys():
    single = {"backend": "llama.cpp", "batched": False, "batch_size": 1}
    b1 = {"backend": "llama.cpp", "batched": True, "batch_size": 1, "batch_invariant": False}
    b4 = {**b1, "batch_size": 4}
    inv4 = {**b4, "batch_invariant": True}
    assert decoding_label(single) == "llama.cpp, one at a time"
    assert decoding_label(b4) == "llama.cpp, batch 4" and decoding_label(inv4) == "llama.cpp, batch 4 invariant"
    assert decoding_label({"seed": 3}) is None and numerics_key({"seed": 3}) is None
    # a row computed alone has the arithmetic of batch size 1, whatever the batch
    assert numerics_key(inv4) == numerics_key(b1) != numerics_key(b4)
    assert numerics_key(single) != numerics_key(b4)


def _set_meta(store: Path, roles: tuple[str, ...], **changes) -> None:
    con = sqlite3.connect(store)
    runs = {rid: json.loads(k)["role"] for rid, k in con.execute("SELECT run_id, key_json FROM runs")}
    for rowid, rid, meta in con.execute("SELECT rowid, run_id, meta FROM samples").fetchall():
        if runs[rid] in roles:
            con.execute("UPDATE samples SET meta = ? WHERE rowid = ?", (json.dumps({**json.loads(meta), **changes}),
                                                                         rowid))
    con.commit()
    con.close()


def test_report_shows_the_decoding_and_warns_where_compared_runs_differ(tmp_path):
    out = _bench(tmp_path, "b", ClusterSettings(batch_size=2))
    same = build_report(out, tmp_path / "r1")
    md = same.markdown_path.read_text()
    assert "| decoding |" in md and "DigitLM, batch 2" in md
    assert "Decoding warnings" not in md and decoding_warnings(same.table_rows) == []
    # the baseline decoded one at a time, the methods at batch size 2: say so
    _set_meta(out / runner.STORE_NAME, ("target_only",), batched=False, batch_size=1)
    res = build_report(out, tmp_path / "r2")
    md = res.markdown_path.read_text()
    assert "**Decoding warnings**" in md
    lines = decoding_warnings(res.table_rows)
    assert any("**lenience:ell=0.5**" in w and "its true baseline as DigitLM, one at a time" in w for w in lines)
    assert any("lossless (lossless-ref)" in w for w in lines)
    assert all("--batch-invariant" in w for w in lines)
    # an invariant run compares with batch size 1 without a warning
    _set_meta(out / runner.STORE_NAME, ("target_only",), batched=True, batch_size=1)
    _set_meta(out / runner.STORE_NAME, ("method", "lossless_ref"), batch_invariant=True)
    assert decoding_warnings(build_report(out, tmp_path / "r3").table_rows) == []
    # a run whose samples were decoded two ways (a resumed bench) is named
    con = sqlite3.connect(out / runner.STORE_NAME)
    rowid, meta = con.execute("SELECT rowid, meta FROM samples LIMIT 1").fetchone()
    con.execute("UPDATE samples SET meta = ? WHERE rowid = ?", (json.dumps({**json.loads(meta), "batch_size": 7,
                                                                            "batch_invariant": False}), rowid))
    con.commit()
    con.close()
    mixed = decoding_warnings(build_report(out, tmp_path / "r4").table_rows)
    assert any("mixes samples decoded as" in w for w in mixed)


def test_stores_written_before_it_was_recorded_show_no_column(tmp_path):
    from tests.helpers.stores import write_v1_store

    write_v1_store(tmp_path / "results.sqlite")
    res = build_report(tmp_path, tmp_path / "out")
    assert "| decoding |" not in res.markdown_path.read_text() and decoding_warnings(res.table_rows) == []


# --------------------------------------------------------------------------------------------------
# The real pair: batch-invariant llama.cpp rows are bitwise those of batch size 1


@pytest.mark.embedded
def test_invariant_rows_have_the_logits_of_batch_size_1(embedded_pair_paths):
    import torch

    from verispec.models.batch import LlamaBatchBackend

    one = LlamaBatchBackend(embedded_pair_paths.draft, batch_size=1, n_ctx=256)
    inv = LlamaBatchBackend(embedded_pair_paths.draft, batch_size=3, n_ctx=256, invariant=True)
    try:
        a = one.chat_prompt("Write a function that adds two numbers.")
        b = one.chat_prompt("What is the capital of France? Answer briefly.")
        ref = [one.forward_rows([a])]
        ref.append(one.forward_rows([[11, 22, 33]]))
        got = inv.forward_rows([b, a, b[:5]])                      # row 1 beside two others of other lengths
        assert torch.equal(got[len(b): len(b) + len(a)], ref[0])
        got = inv.forward_rows([[5], [11, 22, 33], []])
        assert torch.equal(got[1:4], ref[1])
        inv.rollback_row(1, len(a))                                   # rollback keeps the row's own cache exact
        assert torch.equal(inv.forward_rows([[], [11, 22, 33], []]), ref[1])
    finally:
        inv.close()
        one.close()


@pytest.mark.embedded
def test_greedy_bench_at_batch_size_2_invariant_equals_batch_size_1(tmp_path, embedded_pair_paths):
    """A greedy slice (target-only and lossless SD, 2 short prompts, 6 tokens) stores the same outputs
    at --batch-size 2 --batch-invariant as at --batch-size 1 (``benchmarks/batch_invariance.py`` runs
    the real pair on longer slices and measures the cost). The 0.5B model is target and draft here: the
    wiring (flags, executor, backends, store) is what this checks, at a third of the 1.5B's time."""
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in (
        "Count from one to five.", "Write a Python function that doubles a number.")))
    outs = {}
    for name, cluster in (("b1", ClusterSettings(batch_size=1)),
                          ("b2inv", ClusterSettings(batch_size=2, batch_invariant=True))):
        cfg = runner.BenchConfig(datasets=[str(data)], question_field="question", answer_field="answer",
                                 checker="gsm8k", limit=None, rules=["lossless"], samplings=["temperature=0"],
                                 gammas=[3], max_new_tokens=6, n_ctx=128, n_threads=1, out=str(tmp_path / name),
                                 target=str(embedded_pair_paths.draft), draft=str(embedded_pair_paths.draft))
        runner.run_bench(cfg, progress=False, log=lambda m: None, report=False, cluster=cluster)
        with ResultStore(tmp_path / name / runner.STORE_NAME, readonly=True) as st:
            outs[name] = {(k.role, s.problem_id): (s.output, s.meta["batch_size"], s.meta["batch_invariant"])
                          for k, _ in st.runs() for s in st.samples(k.run_id)}
    assert len(outs["b1"]) == 4
    assert {k: v[0] for k, v in outs["b1"].items()} == {k: v[0] for k, v in outs["b2inv"].items()}
    assert {v[1:] for v in outs["b2inv"].values()} == {(2, True)}
