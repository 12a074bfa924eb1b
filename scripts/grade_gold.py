"""Grade every bundled dataset's gold answers with today's checkers: they must all score correct.

For each dataset a gold completion is built the way a model is asked to answer:

* gsm8k: the dataset's own solution (``<<calc>>`` annotations and ``#### N`` kept), which states
  its answer after ``####``;
* math500: the dataset's solution (it boxes its answer); aime2024 / aime2025: ``\\boxed{gold}``
  after a sentence (the 2024 file's AoPS solutions do not all state their answer);
* every bfcl_* category: the ground truth's first allowed value of every parameter (optional
  ones left out unless they have a value), rendered as a Python list of calls.

It prints, per dataset, the share of gold completions scored correct under the strict and the
flexible score.  With ``--bfcl-official PATH`` (the official ``ast_checker.py`` of a
ShishirPatil/gorilla checkout, ``berkeley-function-call-leaderboard/bfcl_eval/eval_checker/
ast_eval/ast_checker.py``, with ``model_handler/utils.py`` next to the checkout's layout or given
by ``--bfcl-official-utils``) it also runs the official decoder and checker, with stubs for their
heavy imports, on the gold completion and on four perturbations of it per row (a value changed,
a required parameter dropped, an optional one given a value outside the answer, the calls
reversed) and prints how often our verdict agrees with theirs.

    .venv/bin/python scripts/grade_gold.py [--data-dir DIR] [--datasets gsm8k,math500,...]
"""

from __future__ import annotations

import argparse
import ast
import enum
import sys
import time
import types
from pathlib import Path

from verispec.tasks.checkers import bfcl as our_bfcl
from verispec.tasks.checkers import check
from verispec.tasks.datasets import Problem, load_dataset

DATASETS = ["gsm8k", "math500", "aime2024", "aime2025", "bfcl_simple", "bfcl_multiple", "bfcl_parallel",
            "bfcl_parallel_multiple", "bfcl_live_simple", "bfcl_live_multiple", "bfcl_live_parallel",
            "bfcl_live_parallel_multiple"]


# ------------------------------------------------------------------------------------------
# Gold completions
# ------------------------------------------------------------------------------------------
def _first(allowed: list):
    vals = [a for a in allowed if a != ""]
    return _pick(vals[0]) if vals else None


def _pick(v):
    """A possible-answer value -> one concrete value (dicts hold lists of allowed values per key)."""
    if isinstance(v, dict):
        out = {}
        for k, allowed in v.items():
            if not isinstance(allowed, list):  # a literal nested value, not a list of alternatives
                out[k] = allowed
            elif [a for a in allowed if a != ""]:
                out[k] = _first(allowed)
        return out
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        return [_pick(x) for x in v]
    return v


def gold_call_dicts(p: Problem) -> list[dict]:
    """``[{name: {param: value}}]`` from the first allowed value of every parameter that has one."""
    docs = {f["name"]: f for f in p.answer["functions"]}
    calls = []
    for entry in p.answer["ground_truth"]:
        name, params = next(iter(entry.items()))
        props = docs.get(name, {}).get("parameters", {}).get("properties", {})
        required = docs.get(name, {}).get("parameters", {}).get("required", [])
        kwargs = {}
        for k, allowed in params.items():
            has_value = [a for a in allowed if a != ""]
            # a parameter the doc lacks can only be left out (BFCL rejects it), if it is optional
            if has_value and (k in props or "" not in allowed):
                kwargs[k] = _first(allowed)
            elif k in required and "" in allowed:  # required, yet only "" allowed: the empty string passes
                kwargs[k] = ""
        calls.append({name: kwargs})
    return calls


def unsatisfiable(p: Problem) -> str | None:
    """Why no completion can pass this row under the official checker (a dataset defect), or None."""
    docs = {f["name"]: f for f in p.answer["functions"]}
    for entry in p.answer["ground_truth"]:
        name, params = next(iter(entry.items()))
        doc = docs.get(name, {}).get("parameters", {})
        props, required = doc.get("properties", {}), doc.get("required", [])
        for k in required:
            if k not in params:
                return f"{name}: required parameter {k!r} is not in the ground truth (giving it is 'unexpected')"
            if not params[k]:
                return f"{name}: required parameter {k!r} has no allowed value"
        for k, allowed in params.items():
            if k not in props and "" not in allowed:
                return f"{name}: the ground truth requires {k!r}, which the function doc lacks"
    return None


def render(calls: list[dict]) -> str:
    return our_bfcl.render_calls(calls)


def gold_completion(p: Problem) -> str:
    if p.checker == "gsm8k":
        return p.meta["rationale"]
    if p.checker == "math":
        if p.dataset == "math500":  # MATH solutions box their answer
            return p.meta["solution"]
        # AIME: the 2024 file's AoPS solutions do not all state the answer (2024-I-1 ends "180 + 24 = 204")
        return f"Putting it together, the answer is $\\boxed{{{p.answer}}}$."
    if p.checker == "bfcl":
        return render(gold_call_dicts(p))
    raise ValueError(f"{p.dataset}: no gold completion for checker {p.checker!r}")


# ------------------------------------------------------------------------------------------
# The official BFCL decoder and checker (optional)
# ------------------------------------------------------------------------------------------
def load_official(checker_path: Path, utils_path: Path):
    """``(decode, ast_checker)`` from the official sources, their package imports stubbed."""

    class Language(enum.Enum):
        PYTHON = "python"
        JAVA = "java"
        JAVASCRIPT = "javascript"

    class _Cfg:
        underscore_to_dot = False  # prompting models keep dotted names

    stubs = {
        "bfcl_eval": {}, "bfcl_eval.constants": {},
        "bfcl_eval.constants.enums": {"Language": Language},
        "bfcl_eval.constants.model_config": {"MODEL_CONFIG_MAPPING": {"verispec": _Cfg()}},
        "bfcl_eval.constants.type_mappings": {"JAVA_TYPE_CONVERSION": {}, "JS_TYPE_CONVERSION": {}},
        "bfcl_eval.eval_checker": {}, "bfcl_eval.eval_checker.ast_eval": {},
        "bfcl_eval.eval_checker.ast_eval.type_convertor": {},
        "bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter": {"java_type_converter": None},
        "bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter": {"js_type_converter": None},
    }
    for name, attrs in stubs.items():
        mod = sys.modules.setdefault(name, types.ModuleType(name))
        for k, v in attrs.items():
            setattr(mod, k, v)
    ns: dict = {"__name__": "bfcl_official_ast_checker"}
    exec(compile(checker_path.read_text(), str(checker_path), "exec"), ns)

    # Only the decoder's functions are taken from utils.py (the module imports much more).
    tree = ast.parse(utils_path.read_text())
    wanted = {"ast_parse", "resolve_ast_call", "resolve_ast_by_type", "default_decode_ast_prompting"}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    module = ast.Module(body=body, type_ignores=[])

    class ReturnFormat(enum.Enum):
        PYTHON = "python"
        JAVA = "java"
        JAVASCRIPT = "javascript"
        VERBOSE_XML = "verbose_xml"
        CONCISE_XML = "concise_xml"
        JSON = "json"

    uns: dict = {"ast": ast, "re": __import__("re"), "ReturnFormat": ReturnFormat}
    exec(compile(module, str(utils_path), "exec"), uns)
    missing = wanted - set(uns)
    if missing:
        raise SystemExit(f"{utils_path}: functions {sorted(missing)} not found; "
                         "is it bfcl_eval/model_handler/utils.py?")

    def decode(text: str):
        return uns["default_decode_ast_prompting"](text)

    def checker(functions, decoded, possible, category):
        return ns["ast_checker"](functions, decoded, possible, Language.PYTHON, category, "verispec")

    return decode, checker


def perturbations(p: Problem) -> list[tuple[str, str]]:
    """(label, completion) variants of the gold calls that the official checker should mostly reject."""
    gold = gold_call_dicts(p)
    docs = {f["name"]: f for f in p.answer["functions"]}
    out = []
    name, kwargs = next(iter(gold[0].items()))
    if kwargs:
        k = next(iter(kwargs))
        v = kwargs[k]
        if isinstance(v, bool):
            nv = not v
        elif isinstance(v, (int, float)):
            nv = v + 1
        elif isinstance(v, str):
            nv = v + " extra"
        elif isinstance(v, list):
            nv = v + v[:1] if v else ["x"]
        else:
            nv = "changed"
        out.append(("value changed", render([{name: {**kwargs, k: nv}}] + gold[1:])))
    req = docs.get(name, {}).get("parameters", {}).get("required", [])
    if req and req[0] in kwargs:
        out.append(("required dropped", render([{name: {a: b for a, b in kwargs.items() if a != req[0]}}] + gold[1:])))
    props = docs.get(name, {}).get("parameters", {}).get("properties", {})
    gt_params = next(iter(p.answer["ground_truth"][0].values()))
    for k, spec in props.items():
        if k not in kwargs and k in gt_params and spec.get("type") == "string":
            out.append(("optional given an unlisted value", render([{name: {**kwargs, k: "zzz unlisted"}}] + gold[1:])))
            break
    if len(gold) > 1:
        out.append(("calls reversed", render(list(reversed(gold)))))
    return out


# ------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_data = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    ap.add_argument("--data-dir", default=str(default_data) if default_data.is_dir() else None)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--bfcl-official", type=Path, help="path to the official ast_checker.py")
    ap.add_argument("--bfcl-official-utils", type=Path, help="path to the official model_handler/utils.py")
    args = ap.parse_args(argv)

    official = None
    if args.bfcl_official:
        utils = args.bfcl_official_utils or args.bfcl_official.parents[2] / "model_handler" / "utils.py"
        if not args.bfcl_official.is_file() or not utils.is_file():
            ap.error(f"--bfcl-official: {args.bfcl_official} or {utils} is not a file")
        official = load_official(args.bfcl_official, utils)

    all_ok = True
    print(f"{'dataset':30} {'n':>5} {'strict':>8} {'flexible':>9} {'s/row':>7}"
          + ("   agreement with official BFCL (gold + perturbed)" if official else ""))
    for name in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        ds = load_dataset(name, data_dir=args.data_dir, on_bad_row="skip")
        t0 = time.perf_counter()
        strict = flexible = 0
        failures = []
        agree = total = 0
        disagreements = []
        defects = []
        for p in ds.problems:
            if p.checker == "bfcl" and (why := unsatisfiable(p)):
                defects.append((p.id, why))
            r = check(p, gold_completion(p), timeout_s=30)
            strict += bool(r.correct)
            flexible += bool(r.correct_flexible) if r.correct_flexible is not None else bool(r.correct)
            if not r.correct and not (defects and defects[-1][0] == p.id):
                failures.append((p.id, r.detail))
            if official and p.checker == "bfcl":
                decode, off_check = official
                for label, text in [("gold", gold_completion(p))] + perturbations(p):
                    try:
                        off = bool(off_check(p.answer["functions"], decode(text), p.answer["ground_truth"],
                                             p.answer["category"])["valid"])
                    except Exception as e:  # the official decoder raises on bad syntax
                        off = False
                        label += f" (official raised {type(e).__name__})"
                    ours = bool(check(p, text).correct)
                    total += 1
                    agree += ours == off
                    if ours != off:
                        disagreements.append((p.id, label, ours, off))
        n = len(ds.problems)
        per_row = (time.perf_counter() - t0) / max(n, 1)
        line = f"{name:30} {n:5d} {strict / n:8.1%} {flexible / n:9.1%} {per_row:7.3f}"
        if official and total:
            line += f"   {agree}/{total} ({agree / total:.1%})"
        print(line, flush=True)
        if defects:
            m = n - len(defects)
            print(f"    {len(defects)} rows no answer can pass (dataset defects); on the other {m}: "
                  f"strict {strict / m:.1%}, flexible {flexible / m:.1%}")
            for pid, why in defects:
                print(f"    UNSATISFIABLE {pid}: {why}")
        if ds.skipped:
            print(f"    ({len(ds.skipped)} malformed rows skipped by the loader)")
        for pid, detail in failures[:5]:
            print(f"    NOT CORRECT {pid}: {detail[:200]}")
        for pid, label, ours, off in disagreements[:5]:
            print(f"    DISAGREE {pid} [{label}]: ours={ours} official={off}")
        all_ok &= not failures and not disagreements
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
