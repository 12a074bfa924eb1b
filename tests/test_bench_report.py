"""Tests for verispec.bench.report on a synthetic store with hand-set outcomes."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from verispec.bench.report import build_report, collect_rows, format_table, order_datasets
from verispec.bench.stats import mcnemar_exact, newcombe_paired_interval, wilson_interval
from verispec.bench.store import ResultStore, RunKey, SampleRecord

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
        meta = {"stop": "eos"}
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
    hits = [r for r in rows if r["dataset"] == ds and r["rule"] == rule and r["role"] == role
            and (sampling is None or r["sampling"] == sampling)]
    assert len(hits) == 1
    return hits[0]


def test_table_numbers(report):
    res, ids, _ = report
    rows = res.table_rows
    assert len(rows) == 12
    # grouping: datasets ordered easy -> hard by difficulty; references before methods
    assert [r["dataset"] for r in rows] == ["easy-ds"] * 6 + ["hard-ds"] * 6
    assert [r["role"] for r in rows[:6]] == ["target_only", "baseline", "baseline", "method", "method", "method"]
    assert [r["rule"] for r in rows[3:6]] == ["cascade:0.5", "lossless", "typical:0.3"]

    c = _row(rows, "easy-ds", "cascade:0.5")
    assert (c["n_problems"], c["n_samples"], c["n_correct"]) == (10, 20, 12)
    assert c["accuracy"] == pytest.approx(0.6)
    assert (c["acc_lo"], c["acc_hi"]) == pytest.approx(_wilson(12, 20), abs=1e-12)
    assert (round(c["acc_lo"], 4), round(c["acc_hi"], 4)) == (0.3866, 0.7812)
    # pairing with its true baseline (min_p=0.5): 16/20 -> 12/20, n01 = 5 lost, n10 = 1 gained
    assert c["baseline_run_id"] == ids["easy-ds"]["b1"]
    assert c["diff"] == pytest.approx(-0.2)
    assert (c["n_pairs"], c["n01"], c["n10"]) == (20, 5, 1)
    assert c["p_value"] == pytest.approx(2 * 7 / 64)
    # table [[both, method only], [baseline only, neither]] = [[11, 1], [5, 3]]
    assert (c["diff_lo"], c["diff_hi"]) == newcombe_paired_interval(11, 1, 5, 3)
    # efficiency numbers
    assert c["block_efficiency"] == pytest.approx(4000 / 1000)
    assert c["tokens_per_s"] == pytest.approx(4000 / 20)
    assert c["mean_accepted"] == pytest.approx(8 / 6)
    assert c["cost_model_speedup"] == pytest.approx((10 * 100 * 2.0 + 10 * 300 * 3.0) / 4000)  # 2.75
    # lossless reference pairing (cascade vs target-only 18/20)
    assert c["ll_diff"] == pytest.approx(0.6 - 0.9) and c["ll_n01"] == 6 and c["ll_n10"] == 0

    t = _row(rows, "easy-ds", "typical:0.3")
    assert t["accuracy"] == pytest.approx(0.9) and (t["n01"], t["n10"]) == (0, 0)
    assert t["diff"] == 0.0 and t["p_value"] == 1.0 and t["diff_lo"] < 0 < t["diff_hi"]

    ll = _row(rows, "easy-ds", "lossless")
    assert ll["baseline_run_id"] == ids["easy-ds"]["to"]
    assert (ll["n01"], ll["n10"], ll["diff"]) == (1, 1, 0.0) and ll["p_value"] == 1.0
    assert ll["cost_model_speedup"] is None

    h = _row(rows, "hard-ds", "typical:0.3")
    assert (h["n_correct"], h["n01"], h["n10"]) == (2, 8, 0)
    assert h["diff"] == pytest.approx(-0.4) and h["p_value"] == pytest.approx(mcnemar_exact(8, 0))
    assert h["p_value"] == pytest.approx(2 / 256)
    hc = _row(rows, "hard-ds", "cascade:0.5")
    assert (hc["n01"], hc["n10"], hc["diff"], hc["p_value"]) == (6, 6, 0.0, 1.0)

    ref = _row(rows, "easy-ds", "target-only", "baseline", "t=1.0,min_p=0.5")
    assert ref["is_reference"] and ref["diff"] is None
    assert ref["accuracy"] == pytest.approx(0.8) and (ref["acc_lo"], ref["acc_hi"]) == wilson_interval(16, 20)
    assert ref["block_efficiency"] == 1.0 and ref["tokens_per_s"] == 25.0
    assert ref["mean_accepted"] is None and ref["cost_model_speedup"] is None
    assert ref["difficulty"] == 1.0


def test_markdown(report):
    res, _, d = report
    md = res.markdown_path.read_text()
    assert res.markdown_path == d / "out" / "report.md"
    assert md.index("## easy-ds") < md.index("## hard-ds")
    easy = md[md.index("## easy-ds"):md.index("## hard-ds")]
    line = next(l for l in easy.splitlines() if l.startswith("| cascade:0.5 "))
    cells = [c.strip() for c in line.strip("|").split("|")]
    lo, hi = newcombe_paired_interval(11, 1, 5, 3)
    assert cells[:6] == ["cascade:0.5", "t=1.0", "4", "method", "10", "20"]
    assert cells[6] == "0.600 [0.387, 0.781]"
    assert cells[7] == f"-0.200 [{lo:+.3f}, {hi:+.3f}]"
    assert cells[8] == "0.219"  # 2 * 7 / 64 = 0.21875
    assert cells[-4:] == ["4.00", "200.0", "1.33", "2.75×"]
    base_line = next(l for l in easy.splitlines() if "min_p=0.5" in l)
    assert "**baseline**" in base_line and "| — |" in base_line
    assert "**target-only**" in easy
    # images are referenced relative to the markdown file
    assert "](frontier.png)" in md and "](accuracy_gap.png)" in md
    summary = json.loads((d / "out" / "summary.json").read_text())
    assert len(summary) == 12 and summary[3]["rule"] == "cascade:0.5"


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


def test_format_table_columns_and_escaping():
    rows = [
        dict(dataset="a", rule="r|x", family="r|x", sampling="s", gamma=2, role="method",
             is_reference=False, draft="d", target="t", max_new_tokens=8, seed=0, n_problems=1,
             n_samples=2, n_correct=1, accuracy=0.5, acc_lo=0.1, acc_hi=0.9, diff=None, p_value=None,
             n_pairs=0, block_efficiency=None, tokens_per_s=None, mean_accepted=None,
             cost_model_speedup=None),
        dict(dataset="b", rule="r", family="r", sampling="s", gamma=3, role="baseline",
             is_reference=True, draft="d2", target="t", max_new_tokens=8, seed=0, n_problems=1,
             n_samples=2, n_correct=2, accuracy=1.0, acc_lo=0.3, acc_hi=1.0, diff=None, p_value=None,
             n_pairs=0, block_efficiency=1.0, tokens_per_s=10.0, mean_accepted=None,
             cost_model_speedup=None),
    ]
    md = format_table(rows)
    lines = md.strip().splitlines()
    assert len(lines) == 4
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[0] == "dataset" and "draft" in header and "seed" not in header
    assert "Δ vs lossless [95% CI]" not in header
    assert "r\\|x" in lines[2]
    assert "| n/a |" in lines[2] and "**baseline**" in lines[3]
    assert format_table([]) == "_no runs_\n"


def test_ordering_without_difficulty_and_partial_pairing(tmp_path):
    db = tmp_path / "s" / "a.sqlite"
    _make_store(db, with_difficulty=False)
    # reference accuracy (baseline + target-only pooled): easy 52/60, hard 24/60 -> easy first
    rows = collect_rows(tmp_path / "s")
    assert order_datasets(rows) == ["easy-ds", "hard-ds"]
    assert all(r["difficulty"] is None for r in rows)
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
    assert p["n_samples"] == 7 and p["n_pairs"] == 6 and p["n_problems"] == 4
    assert p["diff"] == pytest.approx(1.0 - 1.0)
    o = _row(rows, "easy-ds", "cascade:0.8")
    assert o["diff"] is None and o["baseline_run_id"] is None
    md = res.markdown_path.read_text()
    line = next(l for l in md.splitlines() if l.startswith("| cascade:0.9 "))
    assert "(n=6)" in line
    line = next(l for l in md.splitlines() if l.startswith("| cascade:0.8 "))
    assert "| n/a |" in line
    for pth in res.plot_paths:
        _png_size(pth)


def test_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError):
        build_report(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        build_report(tmp_path / "empty", tmp_path / "out")
