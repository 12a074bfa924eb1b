"""Tests for verispec.bench.report on a synthetic store with hand-set outcomes."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from verispec.bench.records import RunKey, SampleRecord
from verispec.bench.report import (
    TRUNCATION_WARN_SHARE,
    Accuracy,
    RunRow,
    Truncation,
    build_report,
    collect_rows,
    format_table,
    order_datasets,
)
from verispec.bench.stats import (
    clustered_paired_difference,
    clustered_proportion,
    mcnemar_exact,
    newcombe_paired_interval,
    paired_difference,
    wilson_interval,
)
from verispec.bench.store import ResultStore

Z95 = 1.959963984540054
N_PROB, N_SAMP = 10, 2
KEYS = [(f"q{i:02d}", s) for i in range(N_PROB) for s in range(N_SAMP)]  # 20 keys, index j


def _wilson(k, n):
    p = k / n
    c = (2 * n * p + Z95**2) / (2 * (n + Z95**2))
    h = Z95 * math.sqrt(Z95**2 + 4 * n * p * (1 - p)) / (2 * (n + Z95**2))
    return max(0.0, c - h), min(1.0, c + h)


def _key(ds, rule, sampling, gamma=4, role="method"):
    return RunKey(ds, rule, sampling, gamma, "draft-s", "target-l", 128, 7, role=role)


def _fill(st, rid, correct_idx, *, difficulty=None, method=True, keys=KEYS, speedup=True):
    """Samples with correct = (j in correct_idx).  Methods: tokens 100 (even j) / 300 (odd j),
    50 target calls each -> BE = 4.0; wall 1 s -> 200 tok/s; hist [1, 2, 3] -> 8/6 accepted/step;
    cost_model_speedup 2.0 (even) / 3.0 (odd) -> token-weighted 2.75.
    References: 100 tokens, 100 target calls (BE 1.0), wall 4 s (25 tok/s), no hist/speedup."""
    for j, (pid, s) in enumerate(keys):
        meta = {"stop_reason": "eos"}
        if difficulty is not None:
            meta["difficulty"] = difficulty
        if method:
            tok = 100 if j % 2 == 0 else 300
            if speedup:
                meta["cost_model_speedup"] = 2.0 if j % 2 == 0 else 3.0
            rec = SampleRecord(rid, pid, s, f"out{j}", str(j), j in correct_idx, tok, 50, 200,
                               [1, 2, 3], 1.0, 0.2, 0.7, 0.1, meta)
        else:
            rec = SampleRecord(rid, pid, s, f"ref{j}", str(j), j in correct_idx, 100, 100, 0,
                               [], 4.0, 0.0, 4.0, 0.0, meta)
        assert st.add(rec)


# Hand-set correctness (indices j into KEYS, 20 samples per run)
EASY = {
    "target_only": set(range(18)),                  # 18/20
    "base_min_p": set(range(16)),                   # 16/20
    "base_eta": set(range(2, 20)),                  # 18/20
    "cascade:0.5": (set(range(16)) - {0, 1, 2, 3, 4}) | {16},   # 12/20; vs base_min_p: n01=5, n10=1
    "typical:0.3": set(range(2, 20)),               # 18/20; identical to base_eta: no discordant
    "lossless": set(range(17)) | {19},              # 18/20; vs target_only: n01=1 (j=17), n10=1 (j=19)
}
HARD = {
    "target_only": set(range(8)),                   # 8/20
    "base_min_p": set(range(6)),                    # 6/20
    "base_eta": set(range(10)),                     # 10/20
    "cascade:0.5": set(range(6, 12)),               # 6/20; vs base: n01=6, n10=6
    "typical:0.3": set(range(2)),                   # 2/20; vs base: n01=8, n10=0
    "lossless": set(range(8)),                      # 8/20; identical
}


def _make_store(path: Path, with_difficulty: bool = True) -> dict:
    ids = {}
    with ResultStore(path) as st:
        for ds, spec, diff in (("hard-ds", HARD, 5.0), ("easy-ds", EASY, 1.0)):
            d = diff if with_difficulty else None
            to = st.register_run(_key(ds, "target-only", "t=1.0", 0, "target_only"))
            b1 = st.register_run(_key(ds, "target-only", "t=1.0,min_p=0.5", 0, "baseline"))
            b2 = st.register_run(_key(ds, "target-only", "t=1.0,eta=0.3", 0, "baseline"))
            m1 = st.register_run(_key(ds, "cascade:0.5", "t=1.0"), {"baseline": b1, "lossless_ref": to})
            m2 = st.register_run(_key(ds, "typical:0.3", "t=1.0"), {"baseline": b2})
            m3 = st.register_run(_key(ds, "lossless", "t=1.0"), {"baseline": to})
            _fill(st, to, spec["target_only"], difficulty=d, method=False)
            _fill(st, b1, spec["base_min_p"], difficulty=d, method=False)
            _fill(st, b2, spec["base_eta"], difficulty=d, method=False)
            _fill(st, m1, spec["cascade:0.5"], difficulty=d)
            _fill(st, m2, spec["typical:0.3"], difficulty=d)
            _fill(st, m3, spec["lossless"], difficulty=d, speedup=False)
            ids[ds] = dict(to=to, b1=b1, b2=b2, m1=m1, m2=m2, m3=m3)
    return ids


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    assert data[-8:-4] == b"IEND", "truncated PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("rep")
    ids = _make_store(d / "results.sqlite")
    res = build_report(d / "results.sqlite", d / "out")
    return res, ids, d


def _row(rows, ds, rule, role="method", sampling=None):
    hits = [r for r in rows if r.dataset == ds and r.rule == rule and r.role == role
            and (sampling is None or r.sampling == sampling)]
    assert len(hits) == 1
    return hits[0]


def _outcomes(correct_idx):
    return [j in correct_idx for j in range(len(KEYS))]


PROBLEMS = [pid for pid, _ in KEYS]


def test_table_numbers(report):
    res, ids, _ = report
    rows = res.table_rows
    assert len(rows) == 12 and all(isinstance(r, RunRow) for r in rows)
    # grouping: datasets ordered easy -> hard by difficulty; references before methods
    assert [r.dataset for r in rows] == ["easy-ds"] * 6 + ["hard-ds"] * 6
    assert [r.role for r in rows[:6]] == ["target_only", "baseline", "baseline", "method", "method", "method"]
    assert [r.rule for r in rows[3:6]] == ["cascade:0.5", "lossless", "typical:0.3"]

    c = _row(rows, "easy-ds", "cascade:0.5")
    assert (c.n_problems, c.n_samples, c.accuracy.n_correct) == (10, 20, 12)
    assert c.accuracy.estimate == pytest.approx(0.6)
    # two samples per problem: the interval shown is problem-clustered, the sample-level one is kept
    assert c.accuracy.clustered
    assert (c.accuracy.iid_lo, c.accuracy.iid_hi) == pytest.approx(_wilson(12, 20), abs=1e-12)
    assert (round(c.accuracy.iid_lo, 4), round(c.accuracy.iid_hi, 4)) == (0.3866, 0.7812)
    cl = clustered_proportion(_outcomes(EASY["cascade:0.5"]), PROBLEMS)
    assert (c.accuracy.lo, c.accuracy.hi) == (cl.lo, cl.hi) and c.accuracy.design_effect == cl.design_effect
    # pairing with its true baseline (min_p=0.5): 16/20 -> 12/20, n01 = 5 lost, n10 = 1 gained
    assert c.baseline_run_id == ids["easy-ds"]["b1"]
    v = c.vs_baseline
    assert v.ref_run_id == ids["easy-ds"]["b1"] and v.diff == pytest.approx(-0.2)
    assert (v.n_pairs, v.n01, v.n10) == (20, 5, 1)
    assert v.iid_p_value == pytest.approx(2 * 7 / 64)
    # table [[both, method only], [baseline only, neither]] = [[11, 1], [5, 3]]
    assert (v.iid_lo, v.iid_hi) == newcombe_paired_interval(11, 1, 5, 3)
    cd = clustered_paired_difference(_outcomes(EASY["cascade:0.5"]), _outcomes(EASY["base_min_p"]), PROBLEMS)
    assert v.clustered and (v.lo, v.hi, v.p_value) == (cd.ci_lo, cd.ci_hi, cd.p_value)
    assert v.test == "mcnemar_clustered"
    # efficiency numbers
    assert c.block_efficiency == pytest.approx(4000 / 1000)
    assert c.tokens_per_s == pytest.approx(4000 / 20)
    assert c.mean_accepted == pytest.approx(8 / 6)
    assert c.cost_model_speedup == pytest.approx((10 * 100 * 2.0 + 10 * 300 * 3.0) / 4000)  # 2.75
    # lossless reference pairing (cascade vs target-only 18/20)
    ll = c.vs_lossless
    assert ll.diff == pytest.approx(0.6 - 0.9) and ll.n01 == 6 and ll.n10 == 0
    # the wrong baseline: plain target-only sampling with the same sampling (18/20), next to the true one
    w = c.vs_target_only
    assert c.target_only_run_id == ids["easy-ds"]["to"] and w.ref_run_id == ids["easy-ds"]["to"]
    ref = paired_difference(_outcomes(EASY["cascade:0.5"]), _outcomes(EASY["target_only"]))
    assert (w.diff, w.n01, w.n10) == (pytest.approx(-0.3), ref.n01, ref.n10)

    t = _row(rows, "easy-ds", "typical:0.3")
    assert t.accuracy.estimate == pytest.approx(0.9) and (t.vs_baseline.n01, t.vs_baseline.n10) == (0, 0)
    assert t.vs_baseline.diff == 0.0 and t.vs_baseline.p_value == 1.0
    assert t.vs_baseline.lo < 0 < t.vs_baseline.hi
    assert t.vs_lossless is None and t.vs_target_only is not None  # typical's baseline is η, not target-only

    lo = _row(rows, "easy-ds", "lossless")
    assert lo.baseline_run_id == ids["easy-ds"]["to"]
    assert (lo.vs_baseline.n01, lo.vs_baseline.n10, lo.vs_baseline.diff) == (1, 1, 0.0)
    assert lo.vs_baseline.p_value == 1.0
    assert lo.cost_model_speedup is None
    assert lo.vs_target_only is None  # its true baseline is target-only: no second comparison

    h = _row(rows, "hard-ds", "typical:0.3")
    assert (h.accuracy.n_correct, h.vs_baseline.n01, h.vs_baseline.n10) == (2, 8, 0)
    assert h.vs_baseline.diff == pytest.approx(-0.4)
    assert h.vs_baseline.iid_p_value == pytest.approx(mcnemar_exact(8, 0)) == pytest.approx(2 / 256)
    hc = _row(rows, "hard-ds", "cascade:0.5")
    assert (hc.vs_baseline.n01, hc.vs_baseline.n10, hc.vs_baseline.diff, hc.vs_baseline.p_value) == (6, 6, 0.0, 1.0)

    ref = _row(rows, "easy-ds", "target-only", "baseline", "t=1.0,min_p=0.5")
    assert ref.is_reference and ref.vs_baseline is None and ref.vs_target_only is None
    assert ref.accuracy.estimate == pytest.approx(0.8)
    assert (ref.accuracy.iid_lo, ref.accuracy.iid_hi) == wilson_interval(16, 20)
    assert ref.block_efficiency == 1.0 and ref.tokens_per_s == 25.0
    assert ref.mean_accepted is None and ref.cost_model_speedup is None
    assert ref.difficulty == 1.0
    # every sample ended on EOS: nothing truncated, finished accuracy = accuracy, no flexible verdicts
    assert ref.truncation == Truncation(0, 20, 0.0, 20, 0.8, False) and ref.flexible is None


def test_markdown(report):
    res, _, d = report
    md = res.markdown_path.read_text()
    assert res.markdown_path == d / "out" / "report.md"
    assert md.index("## easy-ds") < md.index("## hard-ds")
    easy = md[md.index("## easy-ds"):md.index("## hard-ds")]
    line = next(ln for ln in easy.splitlines() if ln.startswith("| cascade:0.5 | t=1.0 | 4 | method "))
    cells = [c.strip() for c in line.strip("|").split("|")]
    rows = res.table_rows
    c = _row(rows, "easy-ds", "cascade:0.5")
    assert cells[:6] == ["cascade:0.5", "t=1.0", "4", "method", "10", "20"]
    assert cells[6] == f"0.600 [{c.accuracy.lo:.3f}, {c.accuracy.hi:.3f}] ᶜ"
    assert cells[7:9] == ["0.00", "0.600"]                     # truncated share, accuracy of finished
    v = c.vs_baseline
    assert cells[9] == f"-0.200 [{v.lo:+.3f}, {v.hi:+.3f}] ᶜ"
    assert cells[10] == f"{v.p_value:.3f}"
    assert cells[-4:] == ["4.00", "200.0", "1.33", "2.75×"]
    base_line = next(ln for ln in easy.splitlines() if "min_p=0.5" in ln and "**baseline**" in ln)
    assert "| — |" in base_line
    assert "**target-only**" in easy
    # sample-level intervals beside the clustered ones
    assert "### Problem-clustered vs sample-level intervals" in easy
    lo, hi = newcombe_paired_interval(11, 1, 5, 3)
    assert f"-0.200 [{lo:+.3f}, {hi:+.3f}]" in easy and "0.600 [0.387, 0.781]" in easy
    # the wrong baseline table: both gaps of every truncation rule
    wrong = easy[easy.index("### Truncation rules"):]
    line = next(ln for ln in wrong.splitlines() if ln.startswith("| cascade:0.5 "))
    assert "target + min_p=0.5" in line and "-0.200 [" in line and "-0.300 [" in line
    assert "Truncation warnings" not in md
    # images are referenced relative to the markdown file
    assert "](frontier.png)" in md and "](accuracy_gap.png)" in md
    summary = json.loads((d / "out" / "summary.json").read_text())
    assert len(summary) == 12 and summary[3]["key"]["rule"] == "cascade:0.5"
    assert summary[3]["vs_baseline"]["n01"] == 5 and summary[3]["accuracy"]["n_correct"] == 12


def test_plots_are_valid_pngs(report):
    res, _, d = report
    assert [p.name for p in res.plot_paths] == ["frontier.png", "accuracy_gap.png"]
    for p in res.plot_paths:
        assert p.exists() and p.stat().st_size > 20_000, p
        w, h = _png_size(p)
        assert w >= 600 and h >= 400
        import matplotlib.image as mpimg

        img = mpimg.imread(p)  # decodes completely
        assert img.shape[0] == h and img.shape[1] == w
        assert img[..., :3].std() > 0.05  # not a blank canvas


def test_frontier_writes_no_text_on_the_axes_and_names_every_run_in_the_legend(report, monkeypatch):
    """Overlapping labels came from per-point annotations: now the axes hold none and the legend has
    one entry per method run, per true baseline and per reference line."""
    from matplotlib.figure import Figure

    from verispec.bench.report_plots import plot_frontier

    res, _, d = report
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **kw: (saved.append(self), Path(path).write_bytes(b"")))
    rows = res.table_rows
    plot_frontier(rows, order_datasets(rows), d / "unused.png")
    (fig,) = saved
    for ax in fig.axes:
        assert len(ax.texts) == 0, [t.get_text() for t in ax.texts]
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert len(labels) == len(set(labels))
    assert {"cascade:0.5", "typical:0.3", "lossless"} <= set(labels)
    assert "true baseline of cascade: target + min_p=0.5" in labels
    assert "true baseline of typical: target + eta=0.3" in labels
    assert "target-only accuracy" in labels and "lossless SD (speed reference)" not in labels  # none here


def _flat_row(**kw) -> RunRow:
    acc = Accuracy.of([True, False], ["p0", "p1"], 0.95)
    base = dict(key=RunKey("a", "r", "s", 2, "d", "t", 8, 0), n_problems=2, n_samples=2, accuracy=acc,
                truncation=Truncation(0, 2, 0.0, 2, 0.5, False), flexible=None, new_tokens=4, target_calls=2,
                wall_s=1.0, block_efficiency=None, tokens_per_s=None, mean_accepted=None,
                cost_model_speedup=None, difficulty=None)
    base.update(kw)
    return RunRow(**base)


def test_format_table_columns_and_escaping():
    rows = [
        _flat_row(key=RunKey("a", "r|x", "s", 2, "d", "t", 8, 0)),
        _flat_row(key=RunKey("b", "r", "s", 3, "d2", "t", 8, 0, role="baseline"), block_efficiency=1.0,
                  tokens_per_s=10.0, flexible=Accuracy.of([True, True], ["p0", "p1"], 0.95)),
    ]
    md = format_table(rows)
    lines = md.strip().splitlines()
    assert len(lines) == 4
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[0] == "dataset" and "draft" in header and "seed" not in header
    assert "Δ vs lossless [95% CI]" not in header and "flexible acc." in header
    assert "r\\|x" in lines[2]
    assert "| n/a |" in lines[2] and "**baseline**" in lines[3] and "| 1.000 |" in lines[3]
    assert format_table([]) == "_no runs_\n"


def test_ordering_without_difficulty_and_partial_pairing(tmp_path):
    db = tmp_path / "s" / "a.sqlite"
    _make_store(db, with_difficulty=False)
    # reference accuracy (baseline + target-only pooled): easy 52/60, hard 24/60 -> easy first
    rows = collect_rows(tmp_path / "s")
    assert order_datasets(rows) == ["easy-ds", "hard-ds"]
    assert all(r.difficulty is None for r in rows)
    # a second store file in the same directory with a partially-paired method: merged
    with ResultStore(tmp_path / "s" / "b.sqlite") as st:
        base = _key("easy-ds", "target-only", "t=1.0,min_p=0.5", 0, "baseline")
        bid = st.register_run(base)  # same run_id as in a.sqlite: merged, not duplicated
        mid = st.register_run(_key("easy-ds", "cascade:0.9", "t=1.0"), {"baseline": bid})
        _fill(st, mid, set(range(6)), keys=KEYS[:6] + [("q99", 0)])
        orphan = st.register_run(_key("easy-ds", "cascade:0.8", "t=1.0"))
        _fill(st, orphan, {0}, keys=KEYS[:2])
    res = build_report(tmp_path / "s", tmp_path / "out")
    rows = res.table_rows
    assert len(rows) == 14
    p = _row(rows, "easy-ds", "cascade:0.9")
    assert p.n_samples == 7 and p.vs_baseline.n_pairs == 6 and p.n_problems == 4
    assert p.vs_baseline.diff == pytest.approx(1.0 - 1.0)
    o = _row(rows, "easy-ds", "cascade:0.8")
    assert o.vs_baseline is None and o.baseline_run_id is None
    md = res.markdown_path.read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("| cascade:0.9 | t=1.0"))
    assert "(n=6)" in line
    line = next(ln for ln in md.splitlines() if ln.startswith("| cascade:0.8 | t=1.0"))
    assert "| n/a |" in line
    for pth in res.plot_paths:
        _png_size(pth)


def test_one_sample_per_problem_keeps_the_sample_level_intervals(tmp_path):
    keys = [(f"q{i:02d}", 0) for i in range(20)]
    with ResultStore(tmp_path / "r.sqlite") as st:
        b = st.register_run(_key("ds", "target-only", "t=1.0", 0, "baseline"))
        m = st.register_run(_key("ds", "cascade:0.5", "t=1.0"), {"baseline": b})
        _fill(st, b, set(range(16)), method=False, keys=keys)
        _fill(st, m, set(range(4, 16)) | {17}, keys=keys)
    rows = collect_rows(tmp_path / "r.sqlite")
    r = _row(rows, "ds", "cascade:0.5")
    assert not r.accuracy.clustered and (r.accuracy.lo, r.accuracy.hi) == wilson_interval(13, 20)
    assert not r.vs_baseline.clustered and r.vs_baseline.test == "mcnemar_exact"
    assert (r.vs_baseline.lo, r.vs_baseline.hi) == newcombe_paired_interval(12, 1, 4, 3)
    assert r.vs_baseline.p_value == mcnemar_exact(4, 1)
    assert "Problem-clustered" not in build_report(tmp_path / "r.sqlite", tmp_path / "o").markdown_path.read_text()


def test_truncation_and_flexible_accuracy_are_shown_and_warned(tmp_path):
    """8 of 20 samples hit the token limit (40% >= the warning share); 2 of them are correct, so
    accuracy is 10/20 overall and 8/12 among the samples that finished."""
    keys = [(f"q{i:02d}", 0) for i in range(20)]
    with ResultStore(tmp_path / "r.sqlite") as st:
        rid = st.register_run(_key("math", "target-only", "t=1.0", 0, "target_only"))
        for j, (pid, s) in enumerate(keys):
            cut = j < 8
            correct = j in {0, 1} or 8 <= j < 16
            stats = {"new_tokens": 64, "target_calls": 64, "draft_calls": 0, "accepted_hist": [],
                     "wall_s": 1.0, "draft_s": 0.0, "verify_s": 1.0, "other_s": 0.0,
                     "stop_reason": "length" if cut else "eos"}
            meta = {"correct_flexible": correct or j == 19} if j >= 4 else {}
            st.add(SampleRecord.from_stats(rid, pid, s, output="x", extracted=None, correct=correct,
                                           stats=stats, meta=meta))
    res = build_report(tmp_path / "r.sqlite", tmp_path / "o")
    (r,) = res.table_rows
    assert r.truncation == Truncation(8, 20, 0.4, 12, 8 / 12, True) and 0.4 >= TRUNCATION_WARN_SHARE
    # flexible verdicts on the 16 samples that have one: j = 4..19 -> correct 8..15 plus 19 = 9 of 16
    assert (r.flexible.n_correct, r.flexible.n) == (9, 16)
    md = res.markdown_path.read_text()
    assert "**Truncation warnings**" in md
    (warn,) = [ln for ln in md.splitlines() if ln.startswith("- ⚠")]
    assert "**math**" in warn and "128-token limit in 1 run(s)" in warn
    assert "target-only (target-only): 8/20 cut (40%), accuracy 0.500 vs 0.667 on the finished" in warn
    line = next(ln for ln in md.splitlines() if ln.startswith("| target-only "))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[6:10] == ["0.500 [0.299, 0.701]", "0.562", "0.40 ⚠", "0.667"]


def test_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError):
        build_report(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        build_report(tmp_path / "empty", tmp_path / "out")


def test_a_version_1_store_is_reported_from_a_migrated_copy_and_left_as_it_is(tmp_path):
    """The report only reads: a version-1 store is migrated in memory, the file is not touched."""
    from tests.helpers.stores import write_v1_store

    v1 = write_v1_store(tmp_path / "results.sqlite")
    before = (tmp_path / "results.sqlite").read_bytes()
    res = build_report(tmp_path, tmp_path / "out")
    meth = _row(res.table_rows, "gsm8k", "cascade:0.5")
    assert meth.run_id == v1["meth"].run_id != v1["m_old"]
    assert meth.baseline_run_id == v1["base"].run_id and meth.vs_baseline.n01 == 1
    # the stop reason that version 1 kept in meta is read from the migrated stats
    assert meth.truncation == Truncation(1, 1, 1.0, 0, None, True) and meth.cost_model_speedup == 2.5
    assert (tmp_path / "results.sqlite").read_bytes() == before
    assert not (tmp_path / "results.sqlite.v1.bak").exists()
    md = res.markdown_path.read_text()
    assert "### Per-token distortion" not in md and "no recorded positions" not in md  # no lossless run here
