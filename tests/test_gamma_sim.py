"""benchmarks/gamma_sim.py replays positions recorded on a real pair (benchmarks/confidence_acceptance.py)."""

import importlib.util
import json
from pathlib import Path

import pytest

from verispec.engine.costs import CostProfile

_path = Path(__file__).resolve().parent.parent / "benchmarks" / "gamma_sim.py"
_spec = importlib.util.spec_from_file_location("gamma_sim", _path)
gamma_sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gamma_sim)

PROF = CostProfile(draft_token=0.01, target_block=tuple(0.1 * (1 + 0.2 * g) for g in range(17)))


def test_replayed_positions_set_each_step_exactly():
    # every recorded position accepted: a fixed γ emits γ + 1 tokens a step at cost(γ)
    always = {"easy": [(1.0, 1)]}
    assert gamma_sim.rate(PROF, "easy", 40, 0, fixed=3, records=always) == pytest.approx(4 / PROF.step_cost(3))
    # every position rejected: one token a step whatever γ
    never = {"hard": [(0.5, 0)]}
    assert gamma_sim.rate(PROF, "hard", 40, 0, fixed=5, records=never) == pytest.approx(1 / PROF.step_cost(5))


def test_replay_feeds_the_policy_the_recorded_confidences():
    # confident tokens always accepted, unsure ones never: the per-token stop drafts long where the
    # records say so, and beats a one-token draft
    mixed = {"m": [(0.99, 1)] * 9 + [(0.1, 0)]}
    auto = gamma_sim.rate(PROF, "m", 200, 1, settings={"by_confidence": 1.0}, records=mixed)
    one = gamma_sim.rate(PROF, "m", 200, 1, fixed=1, records=mixed)
    assert auto > one


def test_records_file_replaces_the_processes(tmp_path, capsys):
    f = tmp_path / "r.json"
    f.write_text(json.dumps([["code", 0, 1.0, 1], ["code", 1, 0.4, 0], ["prose", 0, 0.3, 0]]))
    assert gamma_sim.main(["--records", str(f), "--seeds", "2", "--tokens", "16", "--settings", "by_confidence=1"]) == 0
    out = capsys.readouterr().out
    assert "code:" in out.replace(" ", "") and "prose:" in out.replace(" ", "") and "all:" in out.replace(" ", "")


def test_sequential_replay_reads_the_positions_in_their_recorded_order():
    # one rejection after every three accepted positions: read in order, γ = 3 accepts all three each step
    # (4 tokens a step), γ = 4 accepts three and meets the rejection (4 tokens a step, dearer); i.i.d. draws
    # of the same positions accept a whole block of 3 only (3/4)^3 of the time
    cycle = {"c": [(0.9, 1), (0.9, 1), (0.9, 1), (0.2, 0)]}
    seq = gamma_sim.rate(PROF, "c", 400, 0, fixed=3, records=cycle, sequential=True)
    assert seq == pytest.approx(4 / PROF.step_cost(3), rel=0.01)
    assert gamma_sim.rate(PROF, "c", 400, 0, fixed=4, records=cycle, sequential=True) == pytest.approx(
        4 / PROF.step_cost(4), rel=0.01)
    assert gamma_sim.rate(PROF, "c", 400, 0, fixed=3, records=cycle) < 0.8 * seq
