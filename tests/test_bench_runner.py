"""The bench harness: planning and pairing, sweeps, resumability after kill -9, report; with fake models."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.bench_fakes import DigitLM, batched_fake_models, config, fake_models, write_dataset  # noqa: F401
from verispec.bench import runner
from verispec.bench.store import ResultStore

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


def test_split_rule_list_keeps_parameters_with_their_rule():
    assert runner.split_rule_list("lenience:ell=0.5,ceiling:kappa=2,base=we,lam=0.3,lossless,typical:0.1,0.3") == [
        "lenience:ell=0.5", "ceiling:kappa=2,base=we,lam=0.3", "lossless", "typical:0.1,0.3",
    ]


def test_plan_pairs_every_lossy_rule_with_its_true_baseline(tmp_path):
    cfg = config(tmp_path, rules=["lenience:ell=0.5", "speccascade:p_base=0.3", "typical:eps=0.2", "lossless", "block"])
    plan = runner.plan_runs(cfg, "d", "t")
    by_id = {r.key.run_id: r for r in plan}
    roles = sorted(r.key.role for r in plan)
    assert roles.count("target_only") == 1 and roles.count("lossless_ref") == 1 and roles.count("baseline") == 2
    for r in plan:
        if r.key.role != "method":
            continue
        base = by_id[r.pair["baseline"]]
        assert base.rule is None and base.key.gamma == 0
        assert by_id[r.pair["lossless_ref"]].key.rule == "lossless"
        if r.key.rule.startswith("speccascade"):
            assert base.sampling.min_p == 0.3 and base.key.role == "baseline"
        elif r.key.rule.startswith("typical"):
            assert base.sampling.eta == 0.2 and base.key.role == "baseline"
        else:
            assert base.key.role == "target_only" and base.sampling.min_p == 0 and base.sampling.eta == 0
    assert not any(r.key.role == "method" and r.key.rule == "lossless" for r in plan)  # the reference run is it
    no_base = runner.plan_runs(config(tmp_path, baselines=False, target_only=False, lossless_ref=False), "d", "t")
    assert all(r.key.role == "method" and "baseline" not in r.pair for r in no_base)


def test_sweep_files(tmp_path):
    toml = tmp_path / "grid.toml"
    toml.write_text('dataset = ["gsm8k", "math500"]\nrules = ["lenience:ell=0.5"]\ngamma = [3, 5]\nlimit = 2\n')
    cfg = runner.load_sweep(toml)
    assert cfg.datasets == ["gsm8k", "math500"] and cfg.gammas == [3, 5] and cfg.limit == 2
    assert len([r for r in runner.plan_runs(cfg, "d", "t") if r.key.role == "method"]) == 4
    yaml_file = tmp_path / "grid.yaml"
    yaml_file.write_text("datasets: humaneval\nsampling: ['temperature=0.7', 'temperature=0']\n")
    assert runner.load_sweep(yaml_file).samplings == ["temperature=0.7", "temperature=0"]
    bad = tmp_path / "bad.toml"
    bad.write_text("rulez = ['x']\n")
    with pytest.raises(ValueError, match="unknown sweep key 'rulez'"):
        runner.load_sweep(bad)
    bad.write_text("rules = ['lenience:ell=7']\n")
    with pytest.raises(ValueError, match="ell"):
        runner.load_sweep(bad)


def test_bench_runs_pairs_and_reports(tmp_path):
    cfg = config(tmp_path)
    out, report = runner.run_bench(cfg, progress=False, load_models=fake_models, log=lambda m: None)
    store = ResultStore(out / runner.STORE_NAME)
    runs = store.runs()
    assert len(runs) == 5  # target-only, lossless ref, lenience, speccascade, min-p baseline
    for key, pair in runs:
        samples = store.samples(key.run_id)
        assert len(samples) == 12 * 2
        assert {s.sample_idx for s in samples} == {0, 1}
        if key.role == "method":
            assert set(pair) == {"baseline", "lossless_ref"}
            assert all(s.target_calls >= 1 for s in samples)
    store.close()
    text = Path(report.markdown_path).read_text()
    assert "lenience:ell=0.5" in text and "speccascade:p_base=0.3" in text
    assert all(Path(p).stat().st_size > 1000 for p in report.plot_paths)
    # Identical seeds per (problem, sample) across runs: a lossless run emits the target-only tokens at T=0.
    (tmp_path / "g").mkdir()
    greedy = config(tmp_path / "g", samplings=["temperature=0"], rules=["lossless"], max_new_tokens=3, n_samples=1)
    out_g, _ = runner.run_bench(greedy, progress=False, load_models=fake_models, log=lambda m: None, report=False)
    store = ResultStore(out_g / runner.STORE_NAME)
    outputs = {key.role: {s.problem_id: s.output for s in store.samples(key.run_id)} for key, _ in store.runs()}
    assert outputs["target_only"] == outputs["lossless_ref"]


def test_rerun_resumes_and_never_duplicates(tmp_path):
    cfg = config(tmp_path)
    runner.run_bench(cfg, progress=False, load_models=fake_models, log=lambda m: None, report=False)
    messages = []
    runner.run_bench(cfg, progress=False, load_models=fake_models, log=messages.append, report=False)
    assert any("0 to go" in m for m in messages)


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = [{src!r}, {root!r}]
    import tests.helpers.bench_fakes as T
    from verispec.bench import runner
    from pathlib import Path
    cfg = T.config(Path({tmp!r}))
    slow = lambda c, need_draft: tuple(T.SlowLM(m) if m is not None else None
                                       for m in T.fake_models(c, need_draft)[:2]) + (10,)
    runner.run_bench(cfg, progress=False, load_models=slow, log=lambda m: print(m, flush=True), report=False)
    """
)


@pytest.mark.slow
def test_kill_minus_nine_loses_at_most_the_row_in_flight(tmp_path):
    reference_dir = tmp_path / "ref"
    reference_dir.mkdir()
    cfg_ref = config(reference_dir)
    out_ref, _ = runner.run_bench(cfg_ref, progress=False, load_models=fake_models, log=lambda m: None, report=False)
    store = ResultStore(out_ref / runner.STORE_NAME)
    expected = {(k.role, k.rule, s.problem_id, s.sample_idx): (s.output, s.correct)
                for k, _ in store.runs() for s in store.samples(k.run_id)}
    store.close()

    script = tmp_path / "kill_me.py"
    script.write_text(KILL_SCRIPT.format(src=str(SRC), root=str(TESTS.parent), tmp=str(tmp_path)))
    db = tmp_path / "out" / runner.STORE_NAME
    counts = []
    for delay in (0.5, 1.0, 0.8):
        proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": ""},
                                stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()   # the bench has started (imports take seconds on a loaded machine)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        if db.exists():
            store = ResultStore(db)
            counts.append(store.count())
            store.close()
    assert counts and counts[-1] > 0, "the killed runs should have written rows"
    assert counts == sorted(counts)
    # Finish in-process and compare with the uninterrupted run: same rows, same outcomes, no duplicates.
    runner.run_bench(config(tmp_path), progress=False, load_models=fake_models, log=lambda m: None, report=False)
    store = ResultStore(db)
    got = {(k.role, k.rule, s.problem_id, s.sample_idx): (s.output, s.correct)
           for k, _ in store.runs() for s in store.samples(k.run_id)}
    assert store.count() == len(expected)
    store.close()
    assert got == expected


def test_bad_dataset_rows_are_reported_not_fatal(tmp_path):
    cfg = config(tmp_path, n_rows=5)
    data = Path(cfg.datasets[0])
    with data.open("a") as fh:
        fh.write("{not json\n")
        fh.write(json.dumps({"question": "no answer here", "id": "x"}) + "\n")
    messages = []
    runner.run_bench(cfg, progress=False, load_models=fake_models, log=messages.append, report=False)
    assert sum("skipped malformed row" in m for m in messages) == 2
    cfg.on_bad_row = "error"
    with pytest.raises(ValueError, match="6"):
        runner.Bench(cfg, progress=False, load_models=fake_models).load_problems()


def test_cli_errors(tmp_path, capsys):
    from verispec.cli import main

    assert main(["bench", "--rules", "nonsense", "--dry-run"]) == 2
    assert "unknown rule" in capsys.readouterr().err
    assert main(["bench", "--gamma", "0", "--dry-run"]) == 2
    assert main(["generate", "--prompt", "x", "--target", str(tmp_path / "missing.gguf"), "--baseline"]) == 2
    assert "missing.gguf" in capsys.readouterr().err


def test_flags_given_override_the_sweep_file_even_at_their_default(tmp_path):
    from verispec.bench.cli import config_from_args
    from verispec.cli import build_parser

    sweep = tmp_path / "grid.toml"
    sweep.write_text('dataset = "gsm8k"\nseed = 7\nn_samples = 3\nout = "elsewhere"\noffset = 4\n'
                     'check_timeout_s = 2.5\nn_ctx = 1024\ngamma = [2, 3]\n')

    def cfg(*argv):
        return config_from_args(build_parser().parse_args(["bench", "--sweep", str(sweep), *argv]))

    from_file = cfg()
    assert (from_file.seed, from_file.n_samples, from_file.out, from_file.offset, from_file.check_timeout_s,
            from_file.n_ctx, from_file.gammas) == (7, 3, "elsewhere", 4, 2.5, 1024, [2, 3])
    # each flag below is given at its default value, and still wins over the file
    given = cfg("--seed", "0", "--n-samples", "1", "--out", runner.DEFAULT_OUT, "--offset", "0",
                "--check-timeout", "10", "--n-ctx", "4096", "--gamma", "5")
    assert (given.seed, given.n_samples, given.out, given.offset, given.check_timeout_s, given.n_ctx, given.gammas) == (
        0, 1, runner.DEFAULT_OUT, 0, 10.0, 4096, [5])
    assert given.datasets == ["gsm8k"]   # not given: the file's value stays
    # without a sweep file every flag applies (its default is the config's own)
    plain = config_from_args(build_parser().parse_args(["bench", "--dataset", "gsm8k"]))
    assert plain.seed == 0 and plain.out == runner.DEFAULT_OUT and plain.limit == runner.DEFAULT_LIMIT


def _stored(out: Path) -> dict:
    store = ResultStore(out / runner.STORE_NAME)
    try:
        return {(k.role, k.rule, s.problem_id, s.sample_idx): (s.output, s.correct, s.new_tokens, s.target_calls,
                                                              tuple(s.accepted_hist), s.meta["seed"])
                for k, _ in store.runs() for s in store.samples(k.run_id)}
    finally:
        store.close()


def test_batch_size_stores_the_rows_of_one_at_a_time_decoding(tmp_path):
    """bench --batch-size: every row (outputs, verdicts, counts, seeds) and every recorded lossless position
    file equals the one-at-a-time run; a rerun finds everything done."""
    from verispec.settings import ClusterSettings

    for d in "abc":
        (tmp_path / d).mkdir()
    ref = config(tmp_path / "a", n_rows=5, max_new_tokens=6)
    batched = config(tmp_path / "b", n_rows=5, max_new_tokens=6)
    runner.run_bench(ref, progress=False, load_models=batched_fake_models, log=lambda m: None, report=False)
    runner.run_bench(batched, progress=False, load_models=batched_fake_models, log=lambda m: None, report=False,
                     cluster=ClusterSettings(batch_size=3))
    a, b = _stored(Path(ref.out)), _stored(Path(batched.out))
    assert len(a) == 5 * 2 * 5 and a == b      # 5 problems x 2 samples x (target, baseline, 3 rules)
    # the run ids differ (they name the dataset file, in another folder here): compare by sample
    files_a = {p.name: p for p in Path(ref.out).rglob("*.npz")}
    files_b = {p.name: p for p in Path(batched.out).rglob("*.npz")}
    assert sorted(files_a) == sorted(files_b) and files_a
    for name_ in files_a:
        za, zb = np.load(files_a[name_]), np.load(files_b[name_])
        assert sorted(za.files) == sorted(zb.files)
        for name in za.files:
            np.testing.assert_array_equal(za[name], zb[name])
    messages: list[str] = []
    runner.run_bench(batched, progress=False, load_models=batched_fake_models, log=messages.append, report=False,
                     cluster=ClusterSettings(batch_size=3))
    assert any("0 to go" in m or "already done" in m for m in messages)
    with pytest.raises(ValueError, match="does not combine with --tree"):
        runner.run_bench(config(tmp_path / "c", trees=["2,1"]), progress=False, load_models=batched_fake_models,
                         log=lambda m: None, report=False, cluster=ClusterSettings(batch_size=2))
    with pytest.raises(ValueError, match="does not combine with Ray workers"):
        ClusterSettings(batch_size=2, workers=2).validate()
