"""One builder per dataset layout: a parsed row -> a :class:`Problem` (prompt with the task's template, gold
answer, checker name), or :class:`~verispec.tasks.records.BadRow` naming what is wrong with the row.

The layouts: GSM8K, MATH-500, AIME, HumanEval, EvalPlus (HumanEval+ / MBPP+), BFCL, multiple choice, and any
JSONL with a field mapping (:func:`build_custom`). Which file gets which builder, and where files are found:
:mod:`verispec.tasks.datasets`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import prompts
from .records import BadRow


@dataclass(frozen=True)
class Problem:
    dataset: str  # canonical dataset name, e.g. "gsm8k", "math500", "humaneval", "bfcl_simple"
    id: str  # stable id within the dataset
    prompt: str  # user message (task template applied), before any chat template
    answer: object  # gold (see the per-dataset notes in load_dataset)
    checker: str  # "gsm8k" | "math" | "code" | "bfcl" | "choice"
    meta: dict  # e.g. {"level": 3, "subject": ..., "difficulty": 3.0}
    stop: tuple[str, ...] = ()  # stop strings useful for this task (may be empty)


def required_field(row: dict, key: str, types: type | tuple[type, ...], *, nonempty: bool = True) -> Any:
    if not isinstance(row, dict):
        raise BadRow(f"row is a {type(row).__name__}, not a JSON object")
    if key not in row or row[key] is None:
        raise BadRow(f"missing field {key!r}")
    value = row[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in as_tuple(types)):
        want = "/".join(t.__name__ for t in as_tuple(types))
        raise BadRow(f"field {key!r} has type {type(value).__name__}, expected {want}")
    if nonempty and isinstance(value, (str, list, dict)) and not value:
        raise BadRow(f"field {key!r} is empty")
    return value


def as_tuple(t) -> tuple:
    return t if isinstance(t, tuple) else (t,)


@dataclass
class BuildContext:
    dataset: str
    index: int  # 0-based record position in the file
    file: Path
    few_shot: tuple[tuple[str, str], ...] = ()
    mapping: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def gsm8k_gold(answer: str) -> str:
    if "####" not in answer:
        raise BadRow("field 'answer' has no '#### <number>' final answer")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "").replace("$", "")
    if not NUMBER_RE.fullmatch(final):
        raise BadRow(f"final answer after '####' is not a number: {final!r}")
    return final


def build_gsm8k(row: dict, ctx: BuildContext) -> Problem:
    question = required_field(row, "question", str)
    answer = required_field(row, "answer", str)
    gold = gsm8k_gold(answer)
    return Problem(
        dataset=ctx.dataset,
        id=str(row["id"]) if isinstance(row.get("id"), (str, int)) else str(ctx.index),
        prompt=prompts.gsm8k_prompt(question, ctx.few_shot),
        answer=gold,
        checker="gsm8k",
        meta={"rationale": answer, "few_shot": len(ctx.few_shot)},
        stop=prompts.GSM8K_FEWSHOT_STOP if ctx.few_shot else (),
    )


def build_math500(row: dict, ctx: BuildContext) -> Problem:
    problem = required_field(row, "problem", str)
    answer = required_field(row, "answer", str)
    meta: dict = {}
    if "level" in row:
        level = row["level"]
        if isinstance(level, str) and level.startswith("Level "):  # Hendrycks MATH spelling
            level = level[6:]
        try:
            meta["level"] = int(level)
            meta["difficulty"] = float(meta["level"])
        except (TypeError, ValueError):
            raise BadRow(f"field 'level' is not an integer: {row['level']!r}") from None
    for k in ("subject", "type", "solution"):
        if isinstance(row.get(k), str):
            meta[k] = row[k]
    pid = row.get("unique_id", row.get("id", ctx.index))
    return Problem(ctx.dataset, str(pid), prompts.math_prompt(problem), answer.strip(), "math", meta)


_AIME_URL_RE = re.compile(r"(\d{4})_AIME_(I+)_Problems/Problem_(\d+)")


def aime_answer(value: Any) -> str:
    try:
        return str(int(str(value).strip()))
    except ValueError:
        raise BadRow(f"AIME answer is not an integer: {value!r}") from None


def build_aime(row: dict, ctx: BuildContext) -> Problem:
    text_field = "question" if isinstance(row, dict) and "problem" not in row and "question" in row else "problem"
    problem = required_field(row, text_field, str)
    if "answer" not in row or row["answer"] is None:
        raise BadRow("missing field 'answer'")
    if not isinstance(row["answer"], (str, int)) or isinstance(row["answer"], bool):
        raise BadRow(f"field 'answer' has type {type(row['answer']).__name__}, expected str/int")
    gold = aime_answer(row["answer"])
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


def build_humaneval(row: dict, ctx: BuildContext) -> Problem:
    task_id = required_field(row, "task_id", str)
    prompt = required_field(row, "prompt", str)
    entry = required_field(row, "entry_point", str)
    test = required_field(row, "test", str)
    canonical = row.get("canonical_solution", "")
    if not isinstance(canonical, str):
        raise BadRow("field 'canonical_solution' is not a string")
    answer = {
        "kind": "humaneval",
        "task_id": task_id,
        "prompt": prompt,
        "entry_point": entry,
        "test": test,
        "canonical_solution": canonical,
    }
    return Problem(ctx.dataset, task_id, prompts.humaneval_prompt(prompt), answer, "code", {"entry_point": entry})


def build_evalplus(row: dict, ctx: BuildContext) -> Problem:
    task_id = required_field(row, "task_id", str)
    prompt = required_field(row, "prompt", str)
    entry = required_field(row, "entry_point", str)
    canonical = required_field(row, "canonical_solution", str)
    # MBPP+ v0.2.0 stores Mbpp/793's (absent) plus inputs as {}: accept an empty dict as no inputs.
    base_input = [] if row.get("base_input") == {} else required_field(row, "base_input", list, nonempty=False)
    plus_input = [] if row.get("plus_input") == {} else required_field(row, "plus_input", list, nonempty=False)
    if not base_input and not plus_input:
        raise BadRow("no test inputs (base_input and plus_input are both empty)")
    atol = row.get("atol", 0)
    if not isinstance(atol, (int, float)) or isinstance(atol, bool):
        raise BadRow(f"field 'atol' is not a number: {atol!r}")
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


BFCL_CATEGORIES = {
    "bfcl_simple": "simple_python",
    "bfcl_multiple": "multiple",
    "bfcl_parallel": "parallel",
    "bfcl_parallel_multiple": "parallel_multiple",
    "bfcl_live_simple": "live_simple",
    "bfcl_live_multiple": "live_multiple",
    "bfcl_live_parallel": "live_parallel",
    "bfcl_live_parallel_multiple": "live_parallel_multiple",
}


def bfcl_kind(category: str) -> str:
    c = category.replace("live_", "")
    if c.startswith("parallel_multiple"):
        return "parallel_multiple"
    if c.startswith("parallel"):
        return "parallel"
    if c.startswith("multiple"):
        return "multiple"
    return "simple"


def build_bfcl(row: dict, ctx: BuildContext) -> Problem:
    pid = required_field(row, "id", str)
    question = required_field(row, "question", list)
    functions = required_field(row, "function", list)
    if not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in functions):
        raise BadRow("field 'function' must be a list of function docs with a 'name'")
    if not question or not isinstance(question[0], list):
        raise BadRow("field 'question' must be a list of turns (lists of messages)")
    answers: dict = ctx.extra.get("possible_answers", {})
    if pid not in answers:
        raise BadRow(f"no possible answer for id {pid!r}")
    gt = answers[pid]
    category = ctx.extra.get("category") or re.sub(r"_\d+$", "", pid)
    kind = bfcl_kind(category)
    answer = {"kind": kind, "category": category, "ground_truth": gt, "functions": functions}
    meta = {"category": category, "n_calls": len(gt), "n_functions": len(functions)}
    return Problem(ctx.dataset, pid, prompts.bfcl_prompt(question, functions), answer, "bfcl", meta)


CHOICE_LETTERS = "ABCDEFGHIJ"


def build_choice(row: dict, ctx: BuildContext) -> Problem:
    qf = ctx.mapping.get("question_field") or "question"
    question = required_field(row, qf, str)
    if isinstance(row.get("choices"), list):
        options = row["choices"]
    else:
        options = [row.get(f"option_{c}") for c in "abcdefghij"]
        while options and options[-1] is None:
            options.pop()
    if len(options) < 2 or not all(isinstance(o, (str, int, float)) for o in options):
        raise BadRow("needs a 'choices' list or option_a..option_d fields")
    af = ctx.mapping.get("answer_field") or "answer"
    if af not in row:
        raise BadRow(f"missing field {af!r}")
    gold = row[af]
    if isinstance(gold, bool):
        raise BadRow(f"field {af!r} is a bool")
    if isinstance(gold, int):
        if not 0 <= gold < len(options):
            raise BadRow(f"answer index {gold} out of range")
        gold = CHOICE_LETTERS[gold]
    elif isinstance(gold, str) and len(gold.strip()) == 1 and gold.strip().upper() in CHOICE_LETTERS[: len(options)]:
        gold = gold.strip().upper()
    elif isinstance(gold, str) and gold.strip().isdigit() and 0 <= int(gold) < len(options):
        gold = CHOICE_LETTERS[int(gold)]
    else:
        raise BadRow(f"answer {gold!r} is not a letter or an option index")
    idf = ctx.mapping.get("id_field")
    pid = str(row[idf]) if idf and idf in row else str(row.get("id", ctx.index))
    meta = {k: row[k] for k in ("language", "country", "domain", "subject", "level") if k in row}
    meta["options"] = [str(o) for o in options]
    return Problem(ctx.dataset, pid, prompts.choice_prompt(question, [str(o) for o in options]), gold, "choice", meta)


def build_custom(row: dict, ctx: BuildContext) -> Problem:
    """Any JSONL with a field mapping: ``question_field``, ``answer_field``, ``id_field``, ``checker``."""
    m = ctx.mapping
    checker = m.get("checker") or "math"
    if checker == "choice":
        return build_choice(row, ctx)
    if checker in ("code", "bfcl"):
        raise BadRow(f"checker {checker!r} needs a HumanEval/EvalPlus/BFCL-format file, not a field mapping")
    question = required_field(row, m.get("question_field") or "question", str)
    idf = m.get("id_field")
    if idf:
        if idf not in row or not isinstance(row[idf], (str, int)):
            raise BadRow(f"missing or non-scalar id field {idf!r}")
        pid = str(row[idf])
    else:
        pid = str(ctx.index)
    if checker == "speed":      # timed, never graded: the question as it is, no answer field
        return Problem(ctx.dataset, pid, question, None, "speed", {})
    af = m.get("answer_field") or "answer"
    if not isinstance(row, dict) or af not in row or row[af] is None:
        raise BadRow(f"missing field {af!r}")
    raw = row[af]
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise BadRow(f"field {af!r} has type {type(raw).__name__}, expected str/int/float")
    meta: dict = {}
    if checker == "gsm8k":
        gold = gsm8k_gold(raw) if isinstance(raw, str) and "####" in raw else str(raw).replace(",", "").strip()
        if not NUMBER_RE.fullmatch(gold):
            raise BadRow(f"gsm8k answer is not a number: {raw!r}")
        if isinstance(raw, str) and "####" in raw:
            meta["rationale"] = raw
        prompt = prompts.gsm8k_prompt(question, ctx.few_shot)
        stop = prompts.GSM8K_FEWSHOT_STOP if ctx.few_shot else ()
    elif checker == "math":
        gold = str(raw).strip()
        prompt, stop = prompts.math_prompt(question), ()
    else:
        raise BadRow(f"unknown checker {checker!r}")
    for k in ("level", "subject", "difficulty"):
        if k in row:
            meta[k] = row[k]
    if "level" in meta and "difficulty" not in meta:
        try:
            meta["difficulty"] = float(str(meta["level"]).replace("Level ", ""))
        except ValueError:
            pass
    return Problem(ctx.dataset, pid, prompt, gold, checker, meta, stop)


#: Spec-Bench (Xia et al. 2024): the dataset's name, and its columns in the layout of the paper's table: MT-bench's
#: eight categories form one column ("multi-turn conversation"; only the first turn is decoded here), each other
#: category is a column of its own.
SPEC_BENCH = "spec_bench"
SPEC_BENCH_MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_COLUMNS = (("mt_bench", SPEC_BENCH_MT_BENCH), ("translation", ("translation",)),
                      ("summarization", ("summarization",)), ("qa", ("qa",)),
                      ("math_reasoning", ("math_reasoning",)), ("rag", ("rag",)))


def spec_bench_dataset(category: str) -> str:
    """The dataset name of one Spec-Bench category (``spec_bench:qa``): each category is a dataset of its own,
    with its own target-only run and its own row in the report."""
    return f"{SPEC_BENCH}:{category}"


def build_spec_bench(row: dict, ctx: BuildContext) -> Problem:
    """A Spec-Bench question (``question_id``, ``category``, ``turns``): the first turn is the prompt, as is;
    speed only (checker ``speed``: the output is timed, never graded)."""
    qid = required_field(row, "question_id", (int, str))
    category = required_field(row, "category", str)
    if not re.fullmatch(r"[a-z0-9_]+", category):
        raise BadRow(f"field 'category' must be a lower-case name (letters, digits, _), got {category[:40]!r}")
    turns = required_field(row, "turns", list)
    if not isinstance(turns[0], str) or not turns[0].strip():
        raise BadRow("field 'turns' must start with a non-empty string (the first turn is the prompt)")
    return Problem(spec_bench_dataset(category), str(qid), turns[0], None, "speed", {"category": category})
