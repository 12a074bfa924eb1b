"""Bench and diagnose samples on Ray workers: the rows of an in-process run, none lost or doubled when a
worker or the driver dies; on the fake models, one local Ray cluster of 2 CPUs for the whole module."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'verispec[ray]'; scripts/setup.sh does)")

from tests.helpers.bench_fakes import DigitLM, SlowLM, fake_models  # noqa: E402
from tests.helpers.bench_fakes import config as runner_config  # noqa: E402
from verispec.bench import runner  # noqa: E402
from verispec.bench.distortion import positions_path  # noqa: E402
from verispec.bench.store import ResultStore  # noqa: E402
from verispec.cluster import WorkerPool, WorkerStartError  # noqa: E402
from verispec.settings import ClusterSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TWO = ClusterSettings(workers=2, threads_per_worker=1)


def config(path: Path, **kw) -> runner.BenchConfig:
    """The bench of ``tests/test_bench_runner.py`` with 4 new tokens: lossless samples record positions."""
    return runner_config(path, **{"max_new_tokens": 4, **kw})


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One local cluster; its workers import ``tests`` (the fake models) from the checkout."""
    with pytest.MonkeyPatch.context() as env:   # the cluster's processes keep the environment of its start
        env.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


class CrashingLM(DigitLM):
    """Ends its process (as a segfault or an OOM kill would) at the first forward of the problem asked
    with ``message``: the first time only (``marker`` remembers it across processes), or every time
    (``marker=""``)."""

    def __init__(self, seed: int, marker: str, message: str) -> None:
        super().__init__(seed)
        self.marker, self.message, self._armed = marker, message, False

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        self._armed = self.message in user_message
        return super().chat_prompt(user_message, system)

    def forward(self, tokens, *, all_logits=True):
        if self._armed and not (self.marker and os.path.exists(self.marker)):
            if self.marker:
                Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)
        return super().forward(tokens, all_logits=all_logits)


def crashing_models(cfg, need_draft, *, marker: str, message: str):
    return CrashingLM(1, marker, message), (DigitLM(2) if need_draft else None), 10


class PacedLM(SlowLM):
    """A forward takes 50 ms: the killed driver's bench is still running when it is killed."""

    def forward(self, tokens, *, all_logits=True):
        time.sleep(0.05)
        return self._inner.forward(tokens, all_logits=all_logits)


def slow_models(cfg, need_draft):
    return PacedLM(DigitLM(1)), (PacedLM(DigitLM(2)) if need_draft else None), 10


def failing_models(cfg, need_draft):
    raise FileNotFoundError("target model file not found: /nowhere.gguf")


def rows(out: Path) -> dict:
    """Every stored sample by (role, rule, problem, k): what a run decides (timings aside)."""
    store = ResultStore(out / runner.STORE_NAME)
    try:
        return {(k.role, k.rule, s.problem_id, s.sample_idx):
                (s.output, s.correct, s.new_tokens, s.target_calls, s.draft_calls, tuple(s.accepted_hist),
                 s.meta["seed"])
                for k, _ in store.runs() for s in store.samples(k.run_id)}
    finally:
        store.close()


def count(out: Path) -> int:
    store = ResultStore(out / runner.STORE_NAME)
    try:
        return store.count()
    finally:
        store.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The in-process run every distributed run must reproduce."""
    base = tmp_path_factory.mktemp("local")
    out, _ = runner.run_bench(config(base), progress=False, load_models=fake_models, log=lambda m: None, report=False)
    return out, rows(out)


def lossless_samples(out: Path) -> list[tuple[str, str, int]]:
    store = ResultStore(out / runner.STORE_NAME)
    try:
        return sorted((k.run_id, s.problem_id, s.sample_idx) for k, _ in store.runs() if k.rule == "lossless"
                      for s in store.samples(k.run_id))
    finally:
        store.close()


def assert_positions_equal(out: Path, ref: Path) -> None:
    """Every lossless sample's recorded positions are in the bench directory and equal the local ones
    (run ids differ: the dataset is a file of each test's own folder)."""
    ours, theirs = lossless_samples(out), lossless_samples(ref)
    assert len(ours) == len(theirs) > 0
    for key, ref_key in zip(ours, theirs):
        assert key[1:] == ref_key[1:]
        with np.load(positions_path(ref, *ref_key)) as a, np.load(positions_path(out, *key)) as b:
            assert a.files == b.files
            for name in a.files:
                np.testing.assert_array_equal(a[name], b[name])
        tokens = positions_path(out, *key).with_suffix(".tokens.json")
        assert tokens.is_file() == positions_path(ref, *ref_key).with_suffix(".tokens.json").is_file()
    assert any(positions_path(out, *key).with_suffix(".tokens.json").is_file() for key in ours)


def test_two_workers_store_the_rows_of_the_local_run(tmp_path, reference):
    ref_out, expected = reference
    messages: list[str] = []
    out, report = runner.run_bench(config(tmp_path), progress=False, load_models=fake_models, log=messages.append,
                                   cluster=TWO)
    assert rows(out) == expected and count(out) == len(expected)
    assert any("2 workers × 1 thread on the Ray cluster at" in m for m in messages)
    assert sum(" ready on " in m for m in messages) == 2
    assert_positions_equal(out, ref_out)
    assert Path(report.markdown_path).is_file()
    again: list[str] = []
    runner.run_bench(config(tmp_path), progress=False, load_models=fake_models, log=again.append, cluster=TWO,
                     report=False)
    assert any("0 to go" in m for m in again) and not any(" × " in m for m in again)   # no worker started


def test_a_worker_that_dies_mid_run_loses_and_duplicates_nothing(tmp_path, reference):
    ref_out, expected = reference
    marker = tmp_path / "crashed"
    models = functools.partial(crashing_models, marker=str(marker), message="What is 5 + 2?")
    messages: list[str] = []
    out, _ = runner.run_bench(config(tmp_path), progress=False, load_models=models, log=messages.append,
                              cluster=TWO, report=False)
    assert marker.exists(), "the chosen problem should have ended a worker"
    assert any("died running unit" in m for m in messages) and any("replaces" in m for m in messages)
    assert rows(out) == expected and count(out) == len(expected)
    assert_positions_equal(out, ref_out)


def test_a_unit_that_kills_every_worker_is_set_aside_and_retried_by_the_next_run(tmp_path, reference):
    _, expected = reference
    models = functools.partial(crashing_models, marker="", message="What is 5 + 2?")
    messages: list[str] = []
    cfg = config(tmp_path, rules=[], lossless_ref=False, n_samples=1)   # one unit per problem
    with pytest.raises(RuntimeError, match="1 units were set aside after 3 worker deaths"):
        runner.run_bench(cfg, progress=False, load_models=models, log=messages.append, cluster=TWO, report=False)
    out = Path(cfg.out)
    wanted = {k: v for k, v in expected.items() if k[0] == "target_only" and k[3] == 0}
    got = rows(out)
    assert len(got) == len(wanted) - 1 and all(wanted[k] == v for k, v in got.items())
    assert sum("died running unit" in m for m in messages) == 3
    runner.run_bench(cfg, progress=False, load_models=fake_models, log=lambda m: None, cluster=TWO, report=False)
    assert rows(out) == wanted


def test_a_worker_that_cannot_load_its_models_stops_the_bench(tmp_path):
    with pytest.raises(WorkerStartError, match="could not load its models: FileNotFoundError: .*nowhere.gguf"):
        runner.run_bench(config(tmp_path), progress=False, load_models=failing_models, log=lambda m: None,
                         cluster=TWO, report=False)


KILL_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [{src!r}, {root!r}]
    from pathlib import Path
    import tests.test_bench_ray as T
    from verispec.bench import runner
    from verispec.settings import ClusterSettings
    cluster = ClusterSettings(workers=2, threads_per_worker=1, ray_address={address!r})
    runner.run_bench(T.config(Path({tmp!r})), progress=False, load_models=T.slow_models, cluster=cluster,
                     log=lambda m: print(m, flush=True), report=False)
    """
)


@pytest.mark.slow
def test_a_killed_driver_resumes_from_the_store(tmp_path, reference, cluster):
    _, expected = reference
    script = tmp_path / "driver.py"
    script.write_text(KILL_SCRIPT.format(src=str(ROOT / "src"), root=str(ROOT), tmp=str(tmp_path), address=cluster))
    out = tmp_path / "out"
    db = out / runner.STORE_NAME
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": ""},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if "to go" in line:
                break
        deadline = time.monotonic() + 180    # generous: a loaded machine starts Ray workers slowly
        while time.monotonic() < deadline and (not db.exists() or count(out) < 4):
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)   # the driver, mid-run, with units in flight on its workers
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    stored = count(out)
    assert 4 <= stored < len(expected), "the driver should have died mid-run"
    messages: list[str] = []   # this process joins the same cluster; the dead driver's workers are freed
    runner.run_bench(config(tmp_path), progress=False, load_models=fake_models, log=messages.append, cluster=TWO,
                     report=False)
    assert any(f"{stored} already done" in m for m in messages)
    assert rows(out) == expected and count(out) == len(expected)


def test_diagnose_corpus_on_workers_equals_the_local_corpus(tmp_path):
    from verispec.diagnose.corpus import collect_corpus, collect_corpus_on_workers
    from verispec.diagnose.record import PositionRecorder
    from verispec.diagnose.run import DiagnoseConfig
    from verispec.sampling import SamplingConfig
    from verispec.tasks.datasets import load_problems

    base = config(tmp_path, n_rows=6)
    cfg = DiagnoseConfig(datasets=base.datasets, question_field="question", answer_field="answer", id_field="id",
                         checker="gsm8k", limit=None, out=str(tmp_path / "diag"))
    problems = [p for ps in load_problems(cfg, lambda m: None).values() for p in ps]
    options = dict(sampling=SamplingConfig.parse("temperature=1"), gamma=3, max_new_tokens=6, seed=7)
    target, draft, _ = fake_models(cfg, True)
    local = collect_corpus(target, draft, problems, recorder=PositionRecorder(), progress=False, **options)
    pool = WorkerPool(TWO, log=lambda m: None)
    spread = collect_corpus_on_workers(cfg, problems, pool=pool, recorder=PositionRecorder(), progress=False,
                                       load_models=fake_models, **options)
    assert len(local) > 0 and len(spread) == len(local)
    for name, value in local.arrays.items():
        np.testing.assert_array_equal(spread.arrays[name], value)
    assert spread.strings("problem_id") == local.strings("problem_id")
    assert [(d, i, r.text) for d, i, r in spread.generations] == [(d, i, r.text) for d, i, r in local.generations]
    local.save(tmp_path / "a.npz")
    spread.save(tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_run_diagnose_on_workers_writes_the_diagnostics_of_the_local_run(tmp_path):
    from verispec.diagnose.run import DiagnoseConfig, run_diagnose

    base = config(tmp_path, n_rows=4)

    def cfg(out: str) -> DiagnoseConfig:
        return DiagnoseConfig(datasets=base.datasets, question_field="question", answer_field="answer", id_field="id",
                              checker="gsm8k", limit=None, out=str(tmp_path / out), gamma=3, max_new_tokens=6,
                              sampling="temperature=1", rules=["lossless", "lenience:ell=0.5", "mentored:D=0.1"])

    run_diagnose(cfg("local"), progress=False, log=lambda m: None, load_models=fake_models)
    run_diagnose(cfg("spread"), progress=False, log=lambda m: None, load_models=fake_models,
                 pool=WorkerPool(TWO, log=lambda m: None))
    for name in ("corpus.npz", "diagnostics.json"):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "spread" / name).read_bytes(), name
