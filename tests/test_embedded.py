"""End to end on the embedded default pair (real Qwen2.5-Coder GGUFs through llama.cpp): engine, CLI,
bench and diagnose, with few tokens so CI exercises the real path in reasonable time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verispec.cli import main

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def pair(embedded_pair_paths):
    from verispec.models import LlamaBackend, check_compatible

    target = LlamaBackend(embedded_pair_paths.target, n_ctx=1024)
    draft = LlamaBackend(embedded_pair_paths.draft, n_ctx=1024)
    return target, draft, check_compatible(target, draft)


def test_greedy_sd_agrees_with_greedy_target_only(pair):
    """Exact in law; numerically llama.cpp's block forward (6 rows at once) and its one-token forward
    round differently (logits differ by up to ~0.4), so greedy paths may split where the top two
    tokens are nearly tied. On this prompt they agree over the first tokens."""
    from verispec.engine import generate, generate_target_only
    from verispec.sampling import SamplingConfig

    target, draft, width = pair
    greedy = SamplingConfig.parse("temperature=0")
    ids = target.chat_prompt("Write a Python function is_even(n) that returns True if n is even.")
    ref = generate_target_only(target, ids, sampling=greedy, max_new_tokens=16, vocab_width=width)
    out = generate(target, draft, ids, rule="lossless", sampling=greedy, gamma=5, max_new_tokens=16, vocab_width=width)
    agree = next((i for i, (a, b) in enumerate(zip(out.tokens, ref.tokens)) if a != b),
                 min(len(out.tokens), len(ref.tokens)))
    assert agree >= 8, (out.text, ref.text)
    assert out.stats.block_efficiency > 1.5  # the 0.5B coder drafts the 1.5B coder's greedy path well
    assert "def" in out.text


def test_greedy_tree_sd_agrees_with_greedy_target_only(pair):
    """Trees on llama.cpp: every node attends to its own path only (tree rows differ from decoding the
    path alone by rounding, up to ~0.5 in logits, as block forwards do), so greedy tree SD follows the
    greedy target over the first tokens and accepts more per call than a chain of the same depth."""
    from verispec.engine import generate, generate_target_only
    from verispec.sampling import SamplingConfig

    target, draft, width = pair
    greedy = SamplingConfig.parse("temperature=0")
    ids = target.chat_prompt("Write a Python function is_even(n) that returns True if n is even.")
    ref = generate_target_only(target, ids, sampling=greedy, max_new_tokens=16, vocab_width=width)
    out = generate(target, draft, ids, rule="lossless", sampling=greedy, tree="dynamic:top_k=4,depth=4,nodes=12",
                   max_new_tokens=16, vocab_width=width)
    agree = next((i for i, (a, b) in enumerate(zip(out.tokens, ref.tokens)) if a != b),
                 min(len(out.tokens), len(ref.tokens)))
    assert agree >= 8, (out.text, ref.text)
    assert out.stats.block_efficiency > 1.5 and out.stats.nodes_per_call > 4


def test_sampled_sd_statistics_on_the_real_pair(pair):
    from verispec.engine import generate, measure_costs
    from verispec.sampling import SamplingConfig

    target, draft, width = pair
    ids = target.chat_prompt("Say hello in three languages.")
    costs = measure_costs(target, draft, ids, 4, repeats=3)
    assert 0 < costs.c < 1.5 and costs.v(4) >= 1 and costs.g_max == 4
    sampling = SamplingConfig.parse("temperature=0.7,top_k=20,top_p=0.8")
    for rule in ("lenience:ell=0.5", "speccascade:p_base=0.3"):
        out = generate(target, draft, ids, rule=rule, sampling=sampling, gamma=4, max_new_tokens=20, seed=1,
                       vocab_width=width, costs=costs)
        st = out.stats
        assert 1 <= len(out.tokens) <= 20 and out.text
        assert 1 <= st.block_efficiency <= 5 and st.cost_model_speedup > 0
        assert st.draft_calls >= st.target_calls - 1


def test_cli_generate_json_and_baseline(capsys):
    assert main(["generate", "--prompt", "Count to five.", "--max-new-tokens", "8", "--json",
                 "--rule", "lenience:ell=0.5", "--sampling", "temperature=0.7,top_k=20", "--no-cost-model"]) == 0
    record = json.loads(capsys.readouterr().out)
    for key in ("text", "tokens", "block_efficiency", "target_calls", "tokens_per_s"):
        assert key in record
    assert 1 <= len(record["tokens"]) <= 8
    assert main(["generate", "--prompt", "Count to five.", "--max-new-tokens", "6", "--baseline",
                 "--rule", "speccascade:p_base=0.3", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["mode"] == "target_only" and "min_p=0.3" in record["sampling"]


def test_cli_bench_and_diagnose_end_to_end(tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["bench", "--dataset", "humaneval", "--limit", "1", "--max-new-tokens", "12", "--rules",
            "lossless,speccascade:p_base=0.3", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    report = (out / "report.md").read_text()
    assert "speccascade:p_base=0.3" in report
    assert (out / "frontier.png").stat().st_size > 1000
    assert main(args) == 0  # resumes: nothing left to do
    assert "0 to go" in capsys.readouterr().err

    dout = tmp_path / "diag"
    assert main(["diagnose", "--dataset", "gsm8k", "--limit", "1", "--max-new-tokens", "12", "--rules",
                 "lossless,lenience:ell=0.5,speccascade:p_base=0.3", "--out", str(dout), "--no-progress",
                 "--bench", str(out)]) == 0
    diag = json.loads((dout / "diagnostics.json").read_text())
    for spec in ("lossless", "lenience:ell=0.5", "speccascade:p_base=0.3"):
        for key in ("tv", "kl", "overshoot", "ceiling_ratio", "tail_leak", "acceptance", "n_positions"):
            assert key in diag[spec], (spec, key)
    assert diag["lossless"]["tv"] == pytest.approx(0.0, abs=1e-6)
    assert diag["lenience:ell=0.5"]["n_positions"] >= 4
    assert Path(dout / "figure2_position.png").stat().st_size > 1000
