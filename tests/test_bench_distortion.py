"""Per-token distortion in the bench: (p, q) recorded in lossless runs, summarised in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.bench_fakes import DigitLM
from verispec import rules as R
from verispec.bench import distortion, runner
from verispec.bench.report import build_report
from verispec.bench.store import ResultStore
from verispec.diagnose.measures import snap
from verispec.engine import VerifiedStep
from verispec.sampling import SamplingConfig

RULES = ["lossless", "speccascade:p_base=0.3", "lenience:ell=0.5", "cos_we:lam=0.5", "ceiling:kappa=2,base=we,lam=0.5"]


#: logits scale of the digit models here: peakier than the bench tests' (the distortions are larger)
SCALE = 1.5


def fake_models(cfg, need_draft):
    return DigitLM(1, SCALE), (DigitLM(2, SCALE) if need_draft else None), 10


def _config(tmp_path: Path, **kw) -> runner.BenchConfig:
    data = tmp_path / "digits.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str((i + 1) % 10), "id": f"d/{i}"})
                            + "\n" for i in range(5)))
    base = dict(datasets=[str(data)], question_field="question", answer_field="answer", id_field="id", checker="gsm8k",
                rules=list(RULES), samplings=["temperature=1"], gammas=[3], limit=None, max_new_tokens=12, n_samples=1,
                out=str(tmp_path / "out"))
    base.update(kw)
    return runner.BenchConfig(**base)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    out, report = runner.run_bench(_config(tmp), progress=False, load_models=fake_models, log=lambda m: None)
    return tmp, out, report


def _lossless_run(out: Path):
    with ResultStore(out / runner.STORE_NAME) as st:
        (key, _), = [(k, p) for k, p in st.runs() if k.rule == "lossless"]
        return key, st.samples(key.run_id)


def test_every_stored_lossless_sample_has_its_recorded_positions(bench):
    _, out, _ = bench
    key, samples = _lossless_run(out)
    assert len(samples) == 5
    for s in samples:
        path = distortion.positions_path(out, key.run_id, s.problem_id, s.sample_idx)
        assert path.exists() and path.with_suffix(".tokens.json").exists()
        assert "/" not in path.name and path.parent.name == key.run_id
    records, tokens, missing = distortion.load_positions(out, key.run_id, [s.key for s in samples])
    assert missing == [] and set(tokens) <= set(range(10)) and tokens[3] == "3"
    # one recorded position per drafted token: a verification of g drafts records g rows
    meta = records.meta()
    steps = sum(sum(s.accepted_hist) for s in samples)
    assert len({(pid, st) for pid, st in zip(meta["problem_id"], meta["step"])}) == steps
    assert set(meta["problem_id"]) == {s.problem_id for s in samples}
    assert (meta["n_kept"] <= 10).all() and (records.arrays["p_rest"] == 0).all()  # exact records


def test_recorded_rows_are_the_target_and_draft_distributions_of_the_trajectory(bench):
    """Replay one sample: the recorded p at (step, position) is the target's processed distribution at
    the prefix the engine verified, which for lossless SD is the committed output."""
    tmp, out, _ = bench
    key, samples = _lossless_run(out)
    s = samples[0]
    records, _, _ = distortion.load_positions(out, key.run_id, [s.key])
    target, draft = DigitLM(1, SCALE), DigitLM(2, SCALE)
    sampling = SamplingConfig.parse("temperature=1")
    (problems,) = runner.load_problems(_config(tmp), lambda m: None).values()
    (problem,) = [x for x in problems if x.id == s.problem_id]
    prompt = target.chat_prompt(problem.prompt)
    a = records.arrays
    # step 0, position 0: the distributions after the prompt itself
    (i0,) = [i for i in range(len(records)) if a["step"][i] == 0 and a["position"][i] == 0]
    p_rec, q_rec = records.full_row(i0)
    p = sampling.process(target.next_logits(prompt)[None])[0]
    q = sampling.process(draft.next_logits(prompt)[None])[0]
    assert torch.allclose(p_rec, p, atol=1e-6) and torch.allclose(q_rec, q, atol=1e-6)


def test_observer_does_not_change_the_generation(tmp_path):
    from verispec.engine import generate

    target, draft = DigitLM(1, SCALE), DigitLM(2, SCALE)
    kw = dict(rule="lossless", sampling=SamplingConfig.parse("temperature=1"), gamma=3, max_new_tokens=20, seed=11)
    plain = generate(target, draft, [1, 2], **kw)
    rec = distortion.SampleRecording("ds", "p")
    observed = generate(DigitLM(1, SCALE), DigitLM(2, SCALE), [1, 2], observers=[rec], **kw)
    assert observed.tokens == plain.tokens and rec.steps == sum(plain.stats.accepted_hist) > 0


def test_report_shows_each_rules_exact_distortion(bench):
    tmp, out, report = bench
    rows = {r.rule: r for r in report.table_rows if r.role != "baseline" and r.role != "target_only"}
    d = {rule: rows[rule].distortion for rule in RULES}
    assert all(x is not None for x in d.values())
    n = d["lossless"].n_positions
    assert n > 20 and all(x.n_positions == n for x in d.values())
    # lossless: no distortion, acceptance = 1 - TV(p, q) on average
    assert d["lossless"].tv == 0.0 and d["lossless"].overshoot == 0.0 and d["lossless"].ceiling_ratio_max == 1.0
    # lenience l = 0.5 never exceeds P/p = 2 (eq. 2.3); the ceiling kappa = 2 on CoS-WE caps its overshoot
    # before renormalising (norm(min(pi, 2p)), so P/p <= 2 / sum min(pi, 2p)), below CoS-WE's own
    assert d["lenience:ell=0.5"].ceiling_ratio_max <= 2 + 1e-9
    assert d["cos_we:lam=0.5"].ceiling_ratio_max > 2
    assert d["ceiling:kappa=2,base=we,lam=0.5"].ceiling_ratio_max < d["cos_we:lam=0.5"].ceiling_ratio_max
    assert d["ceiling:kappa=2,base=we,lam=0.5"].overshoot < d["cos_we:lam=0.5"].overshoot
    # collaborative rules are judged against p itself: TV to target = TV to the true baseline
    for rule in ("lenience:ell=0.5", "cos_we:lam=0.5", "ceiling:kappa=2,base=we,lam=0.5"):
        assert d[rule].tv_to_target == pytest.approx(d[rule].tv, abs=1e-12) and not d[rule].truncation
    # the truncation rule: its distance to plain p (the wrong baseline) computed independently here
    key, samples = _lossless_run(out)
    records, _, _ = distortion.load_positions(out, key.run_id, [s.key for s in samples])
    rule = R.get("speccascade:p_base=0.3")
    tvs = []
    for i in range(len(records)):
        p, q = (x.double() / x.double().sum() for x in records.full_row(i))
        P = snap(rule.induced(p, q), p, q)
        tvs.append(float(0.5 * (P - p).abs().sum()))
    sc = d["speccascade:p_base=0.3"]
    assert sc.truncation and sc.tv_to_target == pytest.approx(sum(tvs) / len(tvs), abs=1e-9)
    assert sc.tv_to_target == sc.overshoot  # between distributions TV(P, p) = sum (P - p)+
    assert sc.tv_to_target != pytest.approx(sc.tv, abs=1e-3)
    # rendered beside accuracy, with the Figure-2 picture
    md = Path(report.markdown_path).read_text()
    assert "### Per-token distortion" in md and f"{n} drafted positions" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| cos_we:lam=0.5 | target p |"))
    assert f"{d['cos_we:lam=0.5'].tv:.4f}" in line
    assert "### Truncation rules: true baseline vs the wrong one" in md
    fig = [p for p in report.plot_paths if Path(p).name.startswith("figure2_")]
    assert len(fig) == 1 and Path(fig[0]).stat().st_size > 10_000 and f"]({Path(fig[0]).name})" in md


def test_missing_positions_are_reported_not_fatal(bench, tmp_path):
    tmp, out, _ = bench
    key, samples = _lossless_run(out)
    gone = distortion.positions_path(out, key.run_id, samples[0].problem_id, 0)
    data = gone.read_bytes()
    try:
        gone.unlink()
        res = build_report(out, tmp_path / "rep")
        md = res.markdown_path.read_text()
        assert "(1 stored lossless samples had no recorded positions)" in md
        for sample in samples[1:]:
            stored = distortion.positions_path(out, key.run_id, sample.problem_id, 0)
            stored.rename(tmp_path / sample.problem_id.replace("/", "_"))
        md = build_report(out, tmp_path / "rep1").markdown_path.read_text()
        assert "### Per-token distortion" not in md and "has no recorded positions" in md
        for sample in samples[1:]:
            stored = distortion.positions_path(out, key.run_id, sample.problem_id, 0)
            (tmp_path / sample.problem_id.replace("/", "_")).rename(stored)
        gone.write_bytes(b"garbage")
        with pytest.raises(ValueError, match="unreadable position record"):
            build_report(out, tmp_path / "rep2")
    finally:
        gone.write_bytes(data)


def test_a_resumed_bench_does_not_re_record(bench):
    tmp, out, _ = bench
    key, samples = _lossless_run(out)
    path = distortion.positions_path(out, key.run_id, samples[0].problem_id, 0)
    before = path.stat().st_mtime_ns
    messages = []
    runner.run_bench(_config(tmp), progress=False, load_models=fake_models, log=messages.append, report=False)
    assert any("0 to go" in m for m in messages) and path.stat().st_mtime_ns == before


@pytest.mark.parametrize("max_keep", [4096, 8, 3])  # deferred, mixed, immediate
def test_deferred_recording_is_bit_identical_to_recording_each_step(max_keep):
    """The observer keeps only each block's joint support and compresses after the generation (or at
    once when the support is wider than the recorder keeps): the records are the same either way."""
    from verispec.diagnose.record import PositionRecorder

    gen = torch.Generator().manual_seed(3)
    sampling = SamplingConfig.parse("temperature=0.8,top_k=4")
    rec = distortion.SampleRecording("ds", "p")
    rec.recorder = PositionRecorder(max_keep=max_keep)
    direct = PositionRecorder(max_keep=max_keep)
    for step in range(7):
        g = 1 + step % 3
        p = sampling.process(torch.randn(g + 1, 50, generator=gen) * 2)
        q = sampling.process(torch.randn(g, 50, generator=gen) * 2)
        drafts = torch.multinomial(q, 1, generator=gen)[:, 0]
        rec(VerifiedStep.from_chain(p, q, drafts.tolist(), step % (g + 1), 0))
        direct.add(p[:g], q, dataset="ds", problem_id="p", step=step, position=list(range(g)),
                   accepted=[int(j < step % (g + 1)) for j in range(g)], draft_token=drafts.tolist())
    rec.flush()
    got, want = rec.recorder.arrays, direct.arrays
    assert len(rec.recorder) == len(direct) == sum(1 + s % 3 for s in range(7))
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and (got[k] == want[k]).all(), k
