"""lm-evaluation-harness, offline, on a few GSM8K problems: its ``local-completions`` and
``local-chat-completions`` models against a live ``verispec serve``, and the ``verispec`` model (through
``verispec lm-eval``'s command line and lm_eval's Python API), with lossless and a lossy rule. The task is a
copy of lm-eval's gsm8k YAML reading the local JSONL (``dataset_path: json``); a multiple-choice variant
sends loglikelihood requests (``max_tokens: 1, logprobs: 1, echo: true`` to the server)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.serve import save_tiny_pair, serve_tiny, tiny_served

lm_eval = pytest.importorskip("lm_eval")
requests = pytest.importorskip("requests")

GSM8K = Path(os.environ.get("VERISPEC_DATA", "")) / "gsm8k" / "test.jsonl"
LIMIT = 3
GEN = {"max_gen_toks": 12}
LOSSY = {"verification": {"rule": "lenience:ell=0.5", "gamma": 3}}


def write_tasks(folder: Path) -> Path:
    """lm-eval's gsm8k.yaml (task version 3.0: prompt, stop strings, strict-match and flexible-extract
    filters) reading the local JSONL, zero-shot; and a two-choice loglikelihood task on the same data."""
    import yaml

    src = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    cfg = yaml.safe_load(src.read_text())
    cfg.pop("tag", None)
    cfg.update(task="gsm8k_local", dataset_path="json", dataset_name=None, num_fewshot=0,
               dataset_kwargs={"data_files": {"test": str(GSM8K)}}, training_split=None, fewshot_split=None)
    (folder / "gsm8k_local.yaml").write_text(yaml.safe_dump(cfg))
    mc = {"task": "gsm8k_choice", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(GSM8K)}},
          "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "Question: {{question}}\nAnswer:",
          "doc_to_choice": "{{[' ' + answer.split('#### ')[-1], ' 0']}}", "doc_to_target": 0,
          "metric_list": [{"metric": "acc"}], "metadata": {"version": 1.0}}
    (folder / "gsm8k_choice.yaml").write_text(yaml.safe_dump(mc))
    return folder


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    if not GSM8K.is_file():
        pytest.skip("the local GSM8K copy ($VERISPEC_DATA/gsm8k/test.jsonl) is not here")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def tasks(task_dir):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(task_dir), include_defaults=False)   # the local tasks only: fast


@pytest.fixture(scope="module")
def pair():
    return tiny_served(rows=4)


@pytest.fixture(scope="module")
def live(pair):
    server = serve_tiny(pair)
    yield server
    server.stop()


def drafted_by_rule(url: str) -> dict[str, float]:
    out = {}
    for line in requests.get(url + "/metrics").text.splitlines():
        if line.startswith("verispec:spec_decode_draft_tokens_total{"):
            rule = line.split('rule="', 1)[1].split('"', 1)[0]
            out[rule] = float(line.rsplit(" ", 1)[1])
    return out


def check_gsm8k(results: dict) -> list[str]:
    res = results["results"]["gsm8k_local"]
    assert {"exact_match,strict-match", "exact_match,flexible-extract"} <= set(res)
    samples = [s for s in results["samples"]["gsm8k_local"] if s["filter"] == "strict-match"]   # one per filter
    assert sorted(s["doc_id"] for s in samples) == list(range(LIMIT))
    return [s["resps"][0][0] for s in samples]


@pytest.mark.parametrize("extra", [{}, LOSSY], ids=["lossless", "lenience"])
def test_local_completions_against_verispec_serve(live, tasks, extra):
    """Token-id prompts after probing /tokenizer_info and /tokenize; the rule travels in gen_kwargs (lm-eval puts
    them in the request body, as `--gen_kwargs '{"verification": {...}}'` does)."""
    before = drafted_by_rule(live.url)
    out = lm_eval.simple_evaluate(model="local-completions",
                                  model_args={"base_url": live.url + "/v1/completions", "model": "verispec",
                                              "num_concurrent": 3, "max_retries": 1, "max_length": 512},
                                  tasks=["gsm8k_local"], limit=LIMIT, gen_kwargs={**GEN, **extra}, task_manager=tasks)
    check_gsm8k(out)
    rule = extra.get("verification", {}).get("rule", "lossless")
    assert drafted_by_rule(live.url).get(rule, 0) > before.get(rule, 0)


@pytest.mark.parametrize("extra", [{}, LOSSY], ids=["lossless", "lenience"])
def test_local_chat_completions_against_verispec_serve(live, tasks, extra):
    before = drafted_by_rule(live.url)
    out = lm_eval.simple_evaluate(model="local-chat-completions",
                                  model_args={"base_url": live.url + "/v1/chat/completions", "model": "verispec",
                                              "max_retries": 1},
                                  tasks=["gsm8k_local"], limit=LIMIT, gen_kwargs={**GEN, **extra},
                                  apply_chat_template=True, task_manager=tasks)
    check_gsm8k(out)
    rule = extra.get("verification", {}).get("rule", "lossless")
    assert drafted_by_rule(live.url).get(rule, 0) > before.get(rule, 0)


@pytest.mark.parametrize("rule", ["lossless", "lenience:ell=0.5"])
def test_the_verispec_model_generates_with_its_rule_and_scores_with_the_target(live, pair, tasks, rule):
    """The verispec model with a lossless or a lossy rule writes what the engine writes; its loglikelihoods agree
    with the server's (both from the target), so the multiple-choice accuracies are the same."""
    from verispec.engine import generate
    from verispec.integrations.lm_eval_model import VerispecLM
    from verispec.sampling import SamplingConfig

    lm = VerispecLM(rule=rule, gamma=3, rows=4, max_gen_toks=12,
                    backends=(pair.target_rows, pair.draft_rows, pair.target, pair.draft))
    out = lm_eval.simple_evaluate(model=lm, tasks=["gsm8k_local", "gsm8k_choice"], limit=LIMIT, task_manager=tasks)
    greedy = SamplingConfig.parse("temperature=0")
    strict = [s for s in out["samples"]["gsm8k_local"] if s["filter"] == "strict-match"]
    for sample, resp in zip(strict, check_gsm8k(out)):
        prompt, kwargs = sample["arguments"][0]
        until = kwargs["until"]
        ref = generate(pair.target, pair.draft, pair.target.tokenize(prompt), rule=rule, sampling=greedy,
                       gamma=3, max_new_tokens=12, stop=until, seed=1234)
        assert resp == ref.text
    served = lm_eval.simple_evaluate(model="local-completions",
                                     model_args={"base_url": live.url + "/v1/completions", "model": "verispec",
                                                 "max_retries": 1, "max_length": 512},
                                     tasks=["gsm8k_choice"], limit=LIMIT, task_manager=tasks)
    mine = [s["filtered_resps"] for s in out["samples"]["gsm8k_choice"]]
    theirs = [s["filtered_resps"] for s in served["samples"]["gsm8k_choice"]]
    for a, b in zip(mine, theirs):
        assert [x[0] for x in a] == pytest.approx([x[0] for x in b], abs=1e-6)
        assert [x[1] for x in a] == [x[1] for x in b]


def test_verispec_lm_eval_command_line(tmp_path, task_dir, monkeypatch):
    """`verispec lm-eval --rule ... -- <lm_eval args>` runs lm_eval's own CLI with the verispec model."""
    from lm_eval.tasks import TaskManager

    from verispec.integrations.lm_eval import main

    index = TaskManager.__init__
    monkeypatch.setattr(TaskManager, "__init__",        # index the local task only (not lm-eval's thousands): fast
                        lambda self, *a, **kw: index(self, *a, **{"include_defaults": False, **kw}))

    target, draft = save_tiny_pair(tmp_path)
    rc = main(["--target", str(target), "--draft", str(draft), "--dtype", "float64", "--batch-size", "2",
               "--rule", "speccascade:p_base=0.3", "--gamma", "2", "--",
               "--tasks", "gsm8k_local", "--include_path", str(task_dir), "--limit", str(LIMIT),
               "--gen_kwargs", json.dumps(GEN), "--output_path", str(tmp_path / "out"),
               "--log_samples"])
    assert rc == 0
    found = list((tmp_path / "out").rglob("results_*.json"))
    assert found, list((tmp_path / "out").rglob("*"))
    results = json.loads(found[0].read_text())
    assert "exact_match,strict-match" in results["results"]["gsm8k_local"]
    assert results["config"]["model"] == "verispec"
    # the responses are the engine's with the flags' rule
    from verispec.engine import generate
    from verispec.models.hf import HFBackend
    from verispec.sampling import SamplingConfig

    single_t, single_d = HFBackend(target, dtype="float64"), HFBackend(draft, dtype="float64")
    samples = [json.loads(x) for f in (tmp_path / "out").rglob("samples_gsm8k_local_*.jsonl")
               for x in f.read_text().splitlines()]
    assert len({s["doc_id"] for s in samples}) == LIMIT
    for s in samples:
        prompt, kwargs = s["arguments"]["gen_args_0"]["arg_0"], s["arguments"]["gen_args_0"]["arg_1"]
        ref = generate(single_t, single_d, single_t.tokenize(prompt), rule="speccascade:p_base=0.3", gamma=2,
                       sampling=SamplingConfig.parse("temperature=0"), max_new_tokens=12, stop=kwargs["until"],
                       seed=1234)
        assert s["resps"][0][0] == ref.text


def test_verispec_lm_eval_refuses_bad_flags_before_running(capsys):
    """A flag that makes no valid decoding, or unknown model_args: one error line naming it, status 2."""
    from verispec.integrations.lm_eval import main

    assert main(["--rule", "no_such_rule", "--", "--tasks", "gsm8k_local"]) == 2
    assert "--rule" in capsys.readouterr().err
    assert main(["--rule", "lenience:ell=0.5", "--tree", "iid:2,2", "--", "--tasks", "gsm8k_local"]) == 2
    assert "lossy" in capsys.readouterr().err
    assert main(["--rule", "lossless"]) == 2
    assert "after `--`" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown model_args.*colour"):
        from verispec.integrations.lm_eval_model import VerispecLM

        VerispecLM(colour="red")


BAD_MODEL_ARGS = [
    ({"gamma": 2.5}, r"model_args gamma must be an integer in \[1, 64\], got 2.5 \(or auto\)"),
    ({"gamma": "five"}, "model_args gamma must be an integer"),
    ({"gamma": 0}, "model_args gamma"),
    ({"baseline": "maybe"}, "model_args baseline must be true or false, got 'maybe'"),
    ({"batch_invariant": 2}, "model_args batch_invariant must be true or false"),
    ({"add_bos_token": "sometimes"}, "model_args add_bos_token"),
    ({"seed": -1}, r"model_args seed must be an integer in \[0, "),
    ({"rows": 0}, r"model_args rows must be an integer in \[1, 4096\]"),
    ({"rows": 1.5}, "model_args rows"),
    ({"max_gen_toks": float("inf")}, "model_args max_gen_toks"),
    ({"n_ctx": "big"}, "model_args n_ctx"),
    ({"n_threads": 0}, "model_args n_threads"),
    ({"rule": ""}, "model_args rule must be a non-empty string"),
    ({"tree": ""}, "model_args tree must be a non-empty string"),
    ({"target": ""}, "model_args target"),
    ({"draft_source": "quantum"}, "model_args draft_source must be one of model, ngram, none"),
    ({"draft_source": "none", "rule": "lenience:ell=0.5"}, "draft_source=none decodes the target alone, so "
                                                           "rule=lenience:ell=0.5 cannot apply"),
    ({"device": "quantum"}, "--device 'quantum' is not a torch device"),
    ({"dtype": "float16"}, "--dtype 'float16' applies to transformers models"),
]


@pytest.mark.parametrize("kwargs, says", BAD_MODEL_ARGS, ids=[str(k) for k, _ in BAD_MODEL_ARGS])
def test_bad_model_args_are_refused_before_any_model_loads(kwargs, says):
    """lm_eval hands model_args over as it parsed them (``gamma=2.5`` a float, ``baseline=maybe`` a string):
    each is refused by name before anything is loaded (the embedded pair is the default: nothing here loads it)."""
    from verispec.integrations.lm_eval_model import VerispecLM

    with pytest.raises(ValueError, match=says):
        VerispecLM(**kwargs)


def test_bad_model_args_through_lm_eval_s_command_line(tmp_path, task_dir, monkeypatch, capsys):
    """`verispec lm-eval -- --model_args gamma=2.5` and `baseline=maybe`: one error line, status 2."""
    from lm_eval.tasks import TaskManager

    from verispec.integrations.lm_eval import main

    index = TaskManager.__init__
    monkeypatch.setattr(TaskManager, "__init__",
                        lambda self, *a, **kw: index(self, *a, **{"include_defaults": False, **kw}))
    for args, says in (("gamma=2.5", "model_args gamma must be an integer in [1, 64], got 2.5"),
                       ("baseline=maybe", "model_args baseline must be true or false, got 'maybe'")):
        rc = main(["--", "--model_args", args, "--tasks", "gsm8k_local", "--include_path", str(task_dir),
                   "--limit", "1"])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err, err
        assert [x for x in err.splitlines() if x.strip()][-1].startswith(f"verispec: error: {says}")


def test_bad_gen_kwargs_are_refused(pair):
    from verispec.integrations.lm_eval_model import VerispecLM

    lm = VerispecLM(backends=(pair.target_rows, pair.draft_rows, pair.target, pair.draft))
    with pytest.raises(ValueError, match="gen_kwargs baseline must be true or false, got 'maybe'"):
        lm.decoding({"baseline": "maybe"})
    with pytest.raises(ValueError, match="gen_kwargs temperature must be a number >= 0"):
        lm.decoding({"do_sample": True, "temperature": float("nan")})
    with pytest.raises(ValueError, match="gen_kwargs do_sample must be true or false"):
        lm.decoding({"do_sample": "perhaps"})
    assert lm.decoding({"baseline": "false", "do_sample": 1, "temperature": 0.5}).sampling.temperature == 0.5


def test_model_args_and_gen_kwargs_override_the_command_line_flags(pair):
    """`verispec lm-eval`'s flags are the defaults of the model's arguments; --model_args override them, and a
    task's gen_kwargs (verification, baseline, sampling) override both for its requests."""
    from verispec.integrations import lm_eval_model as m

    backends = (pair.target_rows, pair.draft_rows, pair.target, pair.draft)
    m.DEFAULTS.clear()
    m.DEFAULTS.update(rule="lenience:ell=0.5", gamma=2, device="cpu", seed=7)
    try:
        lm = m._Configured(gamma=4, device="cuda:0", backends=backends)       # lm_eval's own --device is dropped
        d = lm.decoding({})
        assert (d.rule_spec, d.gamma, d.seed, d.sampling.temperature, d.batched) == \
            ("lenience:ell=0.5", 4, 7, 0.0, True)
        d = lm.decoding({"verification": {"rule": "lossless", "draft": "ngram"}, "do_sample": True,
                         "temperature": 0.5, "top_k": 20}, max_tokens=9, stop=["\n"])
        assert (d.rule_spec, d.draft, d.sampling.temperature, d.sampling.top_k, d.max_tokens, d.stop, d.batched) == \
            ("lossless", "ngram", 0.5, 20, 9, ["\n"], False)
        base = lm.decoding({"baseline": True, "verification": {"rule": "speccascade:p_base=0.3"}})
        assert base.rule is None and base.baseline
        with pytest.raises(ValueError, match="verification"):
            lm.decoding({"verification": {"rulez": "lossless"}})
    finally:
        m.DEFAULTS.clear()
