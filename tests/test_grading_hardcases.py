"""Hard cases for the graders, each with its stated verdict under the strict and the flexible score.

Every row is ``(case, gold, completion, truncated, strict, flexible)``; ``truncated`` means the
generation stopped at the token limit.  The verdicts follow the rules documented in the checker
modules (``verispec.tasks.checkers.gsm8k`` / ``latex_math`` / ``bfcl``): strict credits only a
stated answer; flexible also takes the last number / expression, or calls amid prose, but only
from a response that ended on its own.  The issue-13 reports are the first rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verispec.tasks.checkers import TRUNCATED_NO_ANSWER, check
from verispec.tasks.datasets import Problem, load_dataset

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"benchmark data not found at {DATA}")

ISSUE_TRUNCATED = "Her total is 322 - (60 - 3) = (322 - 60) + 3 ="  # cut off by the token limit
ISSUE_UNITS = "The rectangle's width is w = 11, so its length is w + 6 = 11 + 6 = 17 \\text{ centimeters}"


def _mk(answer, checker: str) -> Problem:
    return Problem(dataset="t", id="t/0", prompt="q", answer=answer, checker=checker, meta={})


# ==========================================================================================
# GSM8K (lm-eval strict-match / flexible-extract semantics)
# ==========================================================================================
GSM8K_CASES = [
    ("issue: truncated mid-computation", "265", ISSUE_TRUNCATED, True, False, False),
    ("same text, ended on its own: last number is the 3", "265", ISSUE_TRUNCATED, False, False, False),
    ("truncated after stating the answer", "265",
     "322 - 60 + 3 = 265.\nThe answer is 265.\nLet me double-check: 322 - 60 = 262, 262 +", True, True, True),
    ("issue: truncated with units, no answer stated", "17", ISSUE_UNITS, True, False, False),
    ("units after a stated answer", "17", "So the length is 17 cm.\nThe answer is 17 centimeters.", False, True, True),
    ("several boxed answers: the last one counts", "265",
     "First \\boxed{262}. Wait, I forgot the 3: 262 + 3 = 265, so \\boxed{265}.", False, True, True),
    ("several boxed answers, last one wrong", "265", "\\boxed{265}. Hmm, no: \\boxed{262}", False, False, False),
    ("thousands separators and dollars", "1450000",
     "The house costs $1,450,000.\nThe answer is $1,450,000.", False, True, True),
    ("decimal with trailing zeros equals the integer", "18", "She makes \\boxed{\\$18.00} a day.", False, True, True),
    ("fraction for a decimal gold (lm-eval's last number is the 2)", "0.5",
     "Half: \\boxed{\\frac{1}{2}}", False, True, False),
    ("a/b for a decimal gold", "0.5", "The answer is 1/2.", False, True, False),
    ("x = 5 in a box", "5", "Solving, \\boxed{x = 5}", False, True, True),
    ("restated question, then cut off", "18",
     "Janet's ducks lay 16 eggs per day. She eats 3 and bakes with 4, and sells the rest at $2 each, "
     "earning 18", True, False, False),
    ("answer followed by a check that ends on another number", "18",
     "The answer is 18.\nCheck: 9 eggs x $2 = $18, and 16 - 7 = 9.", False, True, False),
    ("'The answer is' followed by an expression states no number", "18",
     "The answer is 9 * 2 = 18", False, False, True),
    ("no answer at all", "5", "I don't know.", False, False, False),
    ("few-shot style #### answer", "72", "48 / 2 = 24 clips in May.\n48 + 24 = 72\n#### 72", False, True, True),
]


@pytest.mark.parametrize("case,gold,text,truncated,strict,flexible", GSM8K_CASES, ids=[c[0] for c in GSM8K_CASES])
def test_gsm8k_hard_cases(case, gold, text, truncated, strict, flexible):
    r = check(_mk(gold, "gsm8k"), text, truncated=truncated)
    assert (r.correct, r.correct_flexible) == (strict, flexible), r


def test_gsm8k_truncated_detail_and_nothing_extracted():
    r = check(_mk("265", "gsm8k"), ISSUE_TRUNCATED, truncated=True)
    assert r.extracted is None and TRUNCATED_NO_ANSWER in r.detail


# ==========================================================================================
# MATH / AIME (math-verify on the stated answer)
# ==========================================================================================
MATH_CASES = [
    ("issue: truncated mid-computation", "265", ISSUE_TRUNCATED, True, False, False),
    ("ended on its own with the value last: flexible only", "265", ISSUE_TRUNCATED + " 265", False, False, True),
    ("issue: truncated with units", "17", ISSUE_UNITS, True, False, False),
    ("units inside the box", "17", "The length is $\\boxed{17 \\text{ centimeters}}$.", False, True, True),
    ("several boxed answers: the last complete one", "3",
     "So $\\boxed{2}$. Wait, recheck: $\\boxed{3}$.", False, True, True),
    ("several boxed answers, last one wrong", "3",
     "So $\\boxed{3}$. Wait, recheck: $\\boxed{2}$.", False, False, False),
    ("decimal for a fraction gold", "\\frac{1}{2}", "The probability is $\\boxed{0.5}$.", False, True, True),
    ("fraction for a decimal gold", "0.5", "The probability is $\\boxed{\\frac{1}{2}}$.", False, True, True),
    ("x = 5 vs 5", "5", "Hence $\\boxed{x = 5}$.", False, True, True),
    ("thousands separator", "1000000", "There are $\\boxed{1,000,000}$ ways.", False, True, True),
    ("'final answer is' without a box", "\\frac{1}{2}",
     "The final answer is $\\frac{1}{2}$. I hope it is correct.", False, True, True),
    ("restated question, then cut off", "5",
     "We need $x$ such that $2x + 3 = 13$. First, subtract", True, False, False),
    ("restated question, no answer", "5", "We need to find $x$ such that $2x = 10$.", False, False, False),
    ("answer followed by a check", "5",
     "The final answer is $\\boxed{5}$.\n\nCheck: $2 \\cdot 5 + 3 = 13$, as required.", False, True, True),
    ("truncated inside a second box: the first was stated", "5",
     "So $\\boxed{5}$. Verify: $\\boxed{5", True, True, True),
    ("truncated inside the only box", "\\frac{1}{2}", "Thus $\\boxed{\\frac{1}{", True, False, False),
    ("AIME zero-padded gold", "025", "Therefore $xy = \\boxed{25}$.", False, True, True),
]


@pytest.mark.parametrize("case,gold,text,truncated,strict,flexible", MATH_CASES, ids=[c[0] for c in MATH_CASES])
def test_math_hard_cases(case, gold, text, truncated, strict, flexible):
    pytest.importorskip("math_verify")
    r = check(_mk(gold, "math"), text, truncated=truncated)
    assert (r.correct, r.correct_flexible) == (strict, flexible), r


def test_math_truncated_without_answer_says_so():
    r = check(_mk("265", "math"), ISSUE_TRUNCATED, truncated=True)
    assert not r.correct and r.extracted is None and TRUNCATED_NO_ANSWER in r.detail


# ==========================================================================================
# BFCL (official AST checker semantics) on real rows
# ==========================================================================================
_BFCL: dict[str, dict[str, Problem]] = {}


def bfcl(name: str, pid: str) -> Problem:
    if name not in _BFCL:
        _BFCL[name] = {p.id: p for p in load_dataset(name, data_dir=DATA).problems}
    return _BFCL[name][pid]


TRIANGLE = "calculate_triangle_area(base=10, height=5)"  # simple_python_0; `unit` optional ("units" or omitted)
SPOTIFY = "[spotify.play(artist='Taylor Swift', duration=20), spotify.play(artist='Maroon 5', duration=15)]"
STOCKS = ["get_stock_price(company_name='Apple', date='2022-02-01')",
          "get_stock_price(company_name='Apple', date='2022-01-01')",
          "get_stock_price(company_name='Microsoft', date='2022-02-01')",
          "get_stock_price(company_name='Microsoft', date='2022-01-01')"]
BFCL_CASES = [
    ("optional parameter omitted", "bfcl_simple", "simple_python_0", TRIANGLE, False, True, True),
    ("optional parameter with an allowed value", "bfcl_simple", "simple_python_0",
     "calculate_triangle_area(base=10, height=5, unit='units')", False, True, True),
    ("optional parameter with a value outside the answer", "bfcl_simple", "simple_python_0",
     "calculate_triangle_area(base=10, height=5, unit='cm')", False, False, False),
    ("float for an integer parameter", "bfcl_simple", "simple_python_0",
     "calculate_triangle_area(base=10.0, height=5)", False, False, False),
    ("positional arguments are dropped, so required ones are missing", "bfcl_simple", "simple_python_0",
     "calculate_triangle_area(10, 5)", False, False, False),
    ("call amid prose: strict rejects, flexible finds it", "bfcl_simple", "simple_python_0",
     f"Sure! I'll call the function like this:\n\n{TRIANGLE}\n\nThis uses a base of 10.", False, False, True),
    ("calls in a python code block", "bfcl_parallel", "parallel_0", f"```python\n{SPOTIFY}\n```", False, True, True),
    ("one call per line, reversed order", "bfcl_parallel", "parallel_0",
     "spotify.play(artist='Maroon 5', duration=15)\nspotify.play(artist='taylor swift', duration=20)",
     False, True, True),
    ("underscore for the dot in the name", "bfcl_parallel", "parallel_0",
     SPOTIFY.replace("spotify.play", "spotify_play"), False, False, False),
    ("cut off inside the second call", "bfcl_parallel", "parallel_0",
     "[spotify.play(artist='Taylor Swift', duration=20), spotify.play(artist='Ma", True, False, False),
    ("one call missing", "bfcl_parallel", "parallel_0", "spotify.play(artist='Taylor Swift', duration=20)",
     False, False, False),
    # BFCL matches answers to calls greedily: answer 0 allows Microsoft *or* Apple on 2022-01-01 and
    # claims the Apple call first, leaving no call for answer 2 (Apple, 2022-01-01).  A full matching
    # (the old simplification) accepted this order; the official checker does not.
    ("greedy matching: answer 0 claims the call answer 2 needed", "bfcl_parallel", "parallel_178",
     "[" + ", ".join(STOCKS) + "]", False, False, False),
    ("the same calls in the answer key's order", "bfcl_parallel", "parallel_178",
     "[" + ", ".join(reversed(STOCKS)) + "]", False, True, True),
    # parallel_multiple_12: the answer key files `permeability` (a parameter of
    # calculate_magnetic_field's doc) under calculate_voltage_difference, whose doc lacks it.
    ("parallel_multiple_12 without the misfiled optional parameter", "bfcl_parallel_multiple", "parallel_multiple_12",
     "[calculate_magnetic_field(current=4.0, distance=2.0), "
     "calculate_voltage_difference(electric_field=5.0, distance=3.0)]", False, True, True),
    ("parallel_multiple_12 with permeability where its doc puts it", "bfcl_parallel_multiple", "parallel_multiple_12",
     "[calculate_magnetic_field(current=4.0, distance=2.0, permeability=0.1), "
     "calculate_voltage_difference(electric_field=5.0, distance=3.0)]", False, False, False),
    # parallel_multiple_26: the key lists `type` (a field of a transaction) as a parameter of calculate_balance.
    ("parallel_multiple_26 with optional transactions=[]", "bfcl_parallel_multiple", "parallel_multiple_26",
     "[bank.get_transaction_history(account='00125648', days=7), "
     "bank.calculate_balance(account='00125648', transactions=[])]", False, True, True),
    ("parallel_multiple_26 with type='credit'", "bfcl_parallel_multiple", "parallel_multiple_26",
     "[bank.get_transaction_history(account='00125648', days=7), "
     "bank.calculate_balance(account='00125648', type='credit')]", False, False, False),
]


@needs_data
@pytest.mark.parametrize("case,name,pid,text,truncated,strict,flexible", BFCL_CASES, ids=[c[0] for c in BFCL_CASES])
def test_bfcl_hard_cases(case, name, pid, text, truncated, strict, flexible):
    r = check(bfcl(name, pid), text, truncated=truncated)
    assert (r.correct, r.correct_flexible) == (strict, flexible), r


# ==========================================================================================
# Code with stray prose (graded in the sandbox by the code checker)
# ==========================================================================================
HE0_WITH_PROSE = '''Sure! Here's my solution. First I sort, then compare neighbours:

```python
def has_close_elements(numbers, threshold):
    ordered = sorted(numbers)
    return any(b - a < threshold for a, b in zip(ordered, ordered[1:]))
```

Note: `sorted` makes this O(n log n). Example: has_close_elements([1.0, 2.0], 0.5) returns False.'''


@needs_data
def test_code_answer_with_stray_prose_is_graded_on_its_code():
    he0 = {p.id: p for p in load_dataset("humaneval", data_dir=DATA).problems}["HumanEval/0"]
    assert check(he0, HE0_WITH_PROSE).correct
    assert not check(he0, HE0_WITH_PROSE.replace("b - a < threshold", "b - a > threshold")).correct


# ==========================================================================================
# Regrading a stored bench with today's checkers
# ==========================================================================================
def _store_with_old_verdicts(tmp_path):
    """A bench directory as the old checkers left it: a custom JSONL with its own field names."""
    import json

    from verispec.bench.records import RunKey, SampleRecord
    from verispec.bench.store import ResultStore

    data = tmp_path / "mine.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"uid": "a", "text": "How much is 322 - (60 - 3)?", "gold": 265},
        {"uid": "b", "text": "Janet's ducks ...", "gold": 18},
        {"uid": "c", "text": "Solve 2x = 10.", "gold": 5},
    ]) + "\n")
    out = tmp_path / "bench"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"data_dir": None, "question_field": "text", "answer_field": "gold",
                                                 "id_field": "uid", "checker": "gsm8k", "check_timeout_s": 10.0}))
    key = RunKey(dataset=str(data), rule="target_only", sampling="temperature=0.7", gamma=0, draft="d", target="t",
                 max_new_tokens=320, seed=0, role="target_only")
    # (problem, output, stop reason, correct as stored by the old checkers)
    rows = [
        ("a", ISSUE_TRUNCATED, "length", True),          # the issue: credited from an intermediate expression
        ("b", "She sells 9 eggs at $2.\nThe answer is 18.", "eos", True),
        ("c", "Solving, \\boxed{x = 5}", "eos", False),  # say an old bug had missed it
        ("gone", "The answer is 1.", "eos", True),       # its problem was removed from the file since
    ]
    with ResultStore(out / "results.sqlite") as store:
        store.register_run(key)
        for pid, text, reason, ok in rows:
            store.add(SampleRecord(run_id=key.run_id, problem_id=pid, sample_idx=0, output=text, extracted="x",
                                   correct=ok, new_tokens=10, target_calls=10, draft_calls=0, accepted_hist=[10],
                                   wall_s=1.0, draft_s=0.0, verify_s=1.0, other_s=0.0,
                                   meta={"stop_reason": reason, "correct_flexible": ok, "check_detail": "old"},
                                   stats={"stop_reason": reason}))
    return out, key.run_id


def test_regrade_reports_changes_then_writes_them(tmp_path):
    from verispec.bench.regrade import regrade
    from verispec.bench.store import ResultStore

    out, run_id = _store_with_old_verdicts(tmp_path)
    dry = regrade(out)
    (run,) = dry.runs
    assert (run.n, run.missing, run.truncated) == (3, 1, 1)
    assert (run.correct_before, run.correct_after, run.to_wrong, run.to_correct) == (2, 2, 1, 1)
    assert (run.flexible_after, run.flexible_changed, run.extracted_changed) == (2, 2, 3)  # a: T->F, c: F->T
    assert dry.changed == 2 and not dry.written
    assert {(c.problem_id, c.before, c.after) for c in run.examples} == {("a", True, False), ("c", False, True)}
    assert "truncated before a final answer" in next(c.detail for c in run.examples if c.problem_id == "a")
    assert "2 of 3 verdicts changed" in dry.format()
    with ResultStore(out / "results.sqlite") as store:  # a dry run writes nothing
        assert {r.problem_id: r.correct for r in store.iter_samples(run_id)} == {"a": True, "b": True, "c": False,
                                                                                   "gone": True}
    done = regrade(out, write=True)
    assert done.changed == 2 and done.written
    with ResultStore(out / "results.sqlite") as store:
        recs = {r.problem_id: r for r in store.iter_samples(run_id)}
    assert {p: r.correct for p, r in recs.items()} == {"a": False, "b": True, "c": True, "gone": True}
    assert recs["a"].extracted is None and recs["c"].extracted == "5"
    assert recs["a"].meta["previous_verdict"] == {"correct": True, "extracted": "x", "correct_flexible": True,
                                                  "check_detail": "old"}
    assert recs["a"].meta["correct_flexible"] is False and "truncated" in recs["a"].meta["check_detail"]
    assert "previous_verdict" not in recs["gone"].meta
    assert regrade(out).changed == 0  # regrading the regraded store changes nothing


def test_regrade_names_a_missing_store(tmp_path):
    from verispec.bench.regrade import regrade

    with pytest.raises(FileNotFoundError, match="no result store"):
        regrade(tmp_path)


@needs_data
def test_regrade_keeps_a_code_verdict_of_todays_grader_and_reruns_the_others(tmp_path, monkeypatch):
    """A code sample stamped with today's grader version and limit keeps its stored verdict (the program is not run
    again: another grading is another try at learning across gradings); one stamped by another version, or not at
    all, is graded again in the sandbox."""
    import json

    from verispec.bench.records import RunKey, SampleRecord
    from verispec.bench.regrade import regrade
    from verispec.bench.store import ResultStore
    from verispec.tasks import checkers
    from verispec.tasks.checkers import coding

    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    out = tmp_path / "bench"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"data_dir": str(DATA), "check_timeout_s": 10.0}))
    key = RunKey(dataset="humaneval", rule="target_only", sampling="temperature=0", gamma=0, draft="d", target="t",
                 max_new_tokens=64, seed=0, role="target_only")
    stamps = {0: {"grader": coding.GRADER_VERSION, "grader_timeout_s": 10.0},          # today's: kept
              1: {"grader": "code/older", "grader_timeout_s": 10.0},                   # another version: re-run
              2: {}}                                                                   # none: re-run
    with ResultStore(out / "results.sqlite") as store:
        store.register_run(key)
        for k, stamp in stamps.items():    # all stored as correct, though the program is wrong
            store.add(SampleRecord(run_id=key.run_id, problem_id="HumanEval/0", sample_idx=k, output=wrong,
                                   extracted=None, correct=True, new_tokens=10, target_calls=10, draft_calls=0,
                                   accepted_hist=[], wall_s=1.0, draft_s=0.0, verify_s=1.0, other_s=0.0,
                                   meta={"stop_reason": "eos", "check_detail": "stored", **stamp},
                                   stats={"stop_reason": "eos"}))
    graded = []
    real = coding.grade
    monkeypatch.setattr(coding, "grade", lambda *a, **kw: graded.append(1) or real(*a, **kw))
    monkeypatch.setitem(checkers.CHECKERS, "code", coding.grade)
    (run,) = regrade(out).runs
    assert (run.n, run.reused, run.to_wrong, len(graded)) == (3, 1, 2, 2)
    assert "1 code verdicts kept: same grader" in regrade(out).format()
