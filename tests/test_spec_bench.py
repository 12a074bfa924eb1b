"""Spec-Bench: the dataset (per-category datasets, windows per category), the speed-only checker, the speed-up
interval, and the report's table in Spec-Bench's layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from verispec.bench.records import RunKey, SampleRecord
from verispec.bench.report import build_report
from verispec.bench.rows import collect_rows
from verispec.bench.spec_bench import column_speedups, methods
from verispec.bench.stats import speedup_interval
from verispec.bench.store import ResultStore
from verispec.settings import DataSettings
from verispec.tasks.checkers import check
from verispec.tasks.checkers.speed import NOT_GRADED
from verispec.tasks.datasets import load_dataset, load_problems

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"
CATEGORIES = ("writing", "translation", "qa")


def _write_questions(tmp_path: Path, per_category: int = 4) -> Path:
    folder = tmp_path / "data" / "spec_bench"
    folder.mkdir(parents=True)
    rows, qid = [], 0
    for cat in CATEGORIES:
        for j in range(per_category):
            qid += 1
            rows.append({"question_id": qid, "category": cat, "turns": [f"{cat} question {j}", "second turn"]})
    rows.insert(2, {"question_id": 99, "category": "qa", "turns": []})          # malformed: no first turn
    (folder / "question.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path / "data"


def test_each_category_is_a_dataset_and_the_window_is_per_category(tmp_path):
    data = _write_questions(tmp_path)
    loaded = load_dataset("spec_bench", data_dir=data, limit=2, offset=1)
    by_cat = {}
    for p in loaded.problems:
        by_cat.setdefault(p.meta["category"], []).append(p.prompt)
    assert by_cat == {cat: [f"{cat} question 1", f"{cat} question 2"] for cat in CATEGORIES}
    assert all(p.dataset == f"spec_bench:{p.meta['category']}" and p.checker == "speed" and p.answer is None
               for p in loaded.problems)
    assert [line for line, _ in loaded.skipped] == [3]                        # the row without a first turn

    settings = DataSettings(datasets=("spec_bench",), data_dir=str(data), limit=3)
    problems = load_problems(settings, lambda msg: None)
    assert {k: len(v) for k, v in problems.items()} == {f"spec_bench:{c}": 3 for c in CATEGORIES}

    one = load_dataset("spec_bench:translation", data_dir=data)
    assert {p.dataset for p in one.problems} == {"spec_bench:translation"} and len(one) == 4
    with pytest.raises(ValueError, match="no category 'nope'.*writing, translation, qa"):
        load_dataset("spec_bench:nope", data_dir=data)
    # the file itself, by path: the same problems
    by_path = load_dataset(str(data / "spec_bench" / "question.jsonl"), limit=2)
    assert [p.id for p in by_path.problems] == [p.id for p in load_dataset("spec_bench", data_dir=data, limit=2)]


@pytest.mark.skipif(not SHARED.is_file(), reason="the shared Spec-Bench copy is not beside the checkout")
def test_the_real_spec_bench_has_480_questions_in_13_categories():
    loaded = load_dataset(str(SHARED))
    counts = {}
    for p in loaded.problems:
        counts[p.meta["category"]] = counts.get(p.meta["category"], 0) + 1
    assert len(loaded) == 480 and not loaded.skipped and len(counts) == 13
    assert counts["translation"] == counts["rag"] == 80 and counts["writing"] == 10


def test_speed_only_problems_are_never_graded(tmp_path):
    problem = load_dataset("spec_bench", data_dir=_write_questions(tmp_path), limit=1).problems[0]
    verdict = check(problem, "any text at all")
    assert (verdict.correct, verdict.extracted, verdict.detail) == (False, None, NOT_GRADED)
    # any JSONL of prompts is speed-only with --checker speed: no answer field needed
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "Say hi."}\n{"text": "Count to 3."}\n')
    loaded = load_dataset(str(prompts), question_field="text", checker="speed")
    assert [(p.id, p.prompt, p.checker, p.answer) for p in loaded.problems] == [
        ("0", "Say hi.", "speed", None), ("1", "Count to 3.", "speed", None)]


def test_speedup_is_the_ratio_of_pooled_rates():
    # run a: 10 tokens in 1 s and 30 in 1 s -> 20 tok/s; run b: 10 in 2 s and 10 in 2 s -> 5 tok/s
    s = speedup_interval([10, 30], [1, 1], [10, 10], [2, 2], ["x", "y"])
    assert s.estimate == pytest.approx(4.0) and s.n == 2 and s.n_problems == 2
    assert s.lo <= s.estimate <= s.hi
    single = speedup_interval([10], [1], [10], [2], ["x"])
    assert single.estimate == pytest.approx(2.0) and single.lo is None
    assert speedup_interval([], [], [], [], []) is None
    assert speedup_interval([0], [1], [10], [1], ["x"]) is None                 # no tokens: no rate
    with pytest.raises(ValueError, match="finite"):
        speedup_interval([1], [float("nan")], [1], [1], ["x"])


def test_speedup_interval_covers_the_true_ratio_at_its_level():
    """Coverage of the 95% interval on 300 simulated paired runs of 40 prompts whose true speed-up is 1.5
    (method seconds = target-only seconds / 1.5 × lognormal noise, equal tokens). The percentile bootstrap of
    a smooth ratio of means is first-order accurate, so coverage should be near 0.95; we accept [0.88, 0.99]
    (300 runs: binomial sd 0.013 at 0.95, so a true 0.95 falls outside with probability < 1e-5; a broken
    interval that is half as wide covers ~0.68, outside with probability > 0.999)."""
    rng = np.random.default_rng(2026)
    hits, runs = 0, 300
    for r in range(runs):
        tokens = rng.integers(50, 200, 40).astype(float)
        base_s = tokens / 20.0 * rng.lognormal(0, 0.3, 40)
        method_s = base_s / 1.5 * rng.lognormal(0, 0.3, 40) / np.exp(0.3**2 / 2)
        # the true ratio of pooled rates is E[Σ tokens / Σ method_s] ... ≈ 1.5 by construction (mean-one noise)
        s = speedup_interval(tokens, method_s, tokens, base_s, range(40), resamples=1000, seed=r)
        hits += s.lo <= 1.5 <= s.hi
    assert 0.88 <= hits / runs <= 0.99


def _sample(rid, pid, tokens, calls, hist, wall):
    return SampleRecord(rid, pid, 0, "text", None, False, tokens, calls, 3, hist, wall, 0.1, 0.1, 0.0,
                        {"check_detail": NOT_GRADED, "stop_reason": "length"})


def _spec_bench_store(path: Path) -> dict:
    """Two categories × 3 prompts. Target-only: 40 tokens in 4 s per prompt (10 tok/s). Method (lossless, γ 4):
    40 tokens in 2 s on writing (20 tok/s), 40 tokens in 1 s on qa (40 tok/s); 10 target calls per prompt,
    accepted histogram [2, 0, 0, 0, 8] (8 steps accepting all 4 drafts, 2 accepting none)."""
    ids = {}
    with ResultStore(path) as st:
        for cat, method_wall in (("writing", 2.0), ("qa", 1.0)):
            ds = f"spec_bench:{cat}"
            plain = st.register_run(RunKey(ds, "", "temperature=0", 4, "d", "t", 64, 0, role="target_only"))
            method = st.register_run(RunKey(ds, "lossless", "temperature=0", 4, "d", "t", 64, 0))
            ids[cat] = (plain, method)
            for j in range(3):
                assert st.add(_sample(plain, f"{cat}{j}", 40, 40, [], 4.0))
                assert st.add(_sample(method, f"{cat}{j}", 40, 10, [2, 0, 0, 0, 8], method_wall))
    return ids


def test_spec_bench_rows_and_table_give_the_measured_speedups(tmp_path):
    store = tmp_path / "run" / "results.sqlite"
    store.parent.mkdir()
    _spec_bench_store(store)
    rows = collect_rows(store)
    assert all(r.speed_only and r.accuracy.estimate is None and r.vs_baseline is None for r in rows)
    method = {r.dataset: r for r in rows if r.role == "method"}
    assert method["spec_bench:writing"].speedup.estimate == pytest.approx(2.0)
    assert method["spec_bench:qa"].speedup.estimate == pytest.approx(4.0)
    assert method["spec_bench:qa"].acceptance_length == pytest.approx(1 + 32 / 10)
    assert method["spec_bench:qa"].block_efficiency == pytest.approx(4.0)
    (members,) = [m for m in methods(rows).values() if m[0].role == "method"]
    pooled = column_speedups(members, 0.95)
    # overall: 240 tokens in 9 s against 240 tokens in 24 s
    assert pooled["overall"].estimate == pytest.approx(24 / 9)
    assert pooled["mt_bench"].estimate == pytest.approx(2.0) and pooled["qa"].estimate == pytest.approx(4.0)
    assert pooled["translation"] is None

    result = build_report(store.parent, tmp_path / "report")
    md = result.markdown_path.read_text()
    assert "## Spec-Bench (speed only)" in md
    table = md.split("## Spec-Bench (speed only)")[1]
    lossless_line = next(line for line in table.splitlines() if line.startswith("| lossless, γ=4"))
    cells = [c.strip() for c in lossless_line.strip("|").split("|")]
    assert cells[2] == "2.00×" or cells[2].startswith("2.00× [")                 # MT-bench (writing)
    assert cells[5].startswith("4.00×")                                          # QA
    assert cells[3] == "n/a"                                                     # translation did not run
    assert cells[8].startswith("2.67×") and cells[9] == "4.00" and cells[10] == "4.20"
    assert "## spec_bench:writing" not in md                                     # no accuracy sections
    assert "Truncation warnings" not in md and "frontier.png" not in md          # every output was cut: no matter
    assert not (tmp_path / "report" / "frontier.png").exists()
    assert (tmp_path / "report" / "spec_bench.png").stat().st_size > 1000


def test_the_bench_plans_a_target_only_run_and_each_rule_per_category(tmp_path):
    from verispec.bench.runner import Bench, BenchConfig

    cfg = BenchConfig(datasets=["spec_bench"], data_dir=str(_write_questions(tmp_path)), limit=2,
                      rules=["lossless", "lenience:ell=0.5"], out=str(tmp_path / "out"))
    plan = Bench(cfg, progress=False).plan()
    by_dataset = {}
    for run in plan:
        by_dataset.setdefault(run.key.dataset, set()).add(run.key.role)
    assert by_dataset == {f"spec_bench:{c}": {"target_only", "lossless_ref", "method"} for c in CATEGORIES}
