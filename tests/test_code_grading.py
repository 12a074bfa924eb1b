"""Code grading that the graded code cannot forge (issue 14).

The attacks (completions graded through the real ``checkers.check`` path, each of which must
score wrong) are the table of ``tests/test_grader_attacks.py``.  Here: the plain-data codec, what
the candidate's process holds, honest verdicts that need the task's own tolerance, and a sample
of ``benchmarks/code_gold.py``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections import Counter, OrderedDict, defaultdict, deque
from pathlib import Path

import pytest

from tests.helpers.grading import fenced, needs_data, problem
from verispec.tasks.checkers import check, coding
from verispec.tasks.checkers.code_child import Opaque, decode, digest, dumps, encode
from verispec.tasks.datasets import Problem

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")


# ------------------------------------------------------------------------------ codec
def _trip(v):
    return decode(json.loads(dumps(encode(v))))


def test_codec_round_trips_plain_data_with_exact_types():
    values = [None, True, False, 0, -7, 2**5000, -(2**5000), 1.5, -0.0, math.inf, "x\u00e9\n", b"\x00\xff",
              bytearray(b"ab"), 1 + 2j, [1, [2.0, "3"]], (1, (2,)), {3, 1, 2}, frozenset({(1, 2), (0,)}),
              {1: "a", (2, 3): [None], "k": {"n": 1}}, [], (), set(), {}, Counter("abca"),
              OrderedDict([(2, 1), (1, 2)]), deque([1, (2,)])]
    for v in values:
        back = _trip(v)
        assert back == v and type(back) is type(v), (v, back)
    dd = defaultdict(list, {"a": [1]})
    assert _trip(dd) == dd and type(_trip(dd)) is defaultdict
    nan = _trip(float("nan"))
    assert type(nan) is float and math.isnan(nan)
    # bool stays bool, int stays int, float stays float: types are not merged
    assert [type(_trip(x)) for x in (True, 1, 1.0)] == [bool, int, float]
    assert dumps(encode({"b", "a", "c"})) == dumps(encode({"c", "a", "b"}))
    # big outputs are compared by a digest that ignores dict order but not values or types
    assert digest({1: 2, 3: 4}) == digest({3: 4, 1: 2}) and digest({1, 2, 3}) == digest({3, 2, 1})
    values = ({1: 2, 3: 4}, {1: 2, 3: 5}, {1: 2.0, 3: 4}, [1, 2], (1, 2), OrderedDict([(1, 2), (3, 4)]),
              OrderedDict([(3, 4), (1, 2)]), [[1], 2], [1, [2]], ["a,b"], ["a", "b"])
    assert len({digest(v) for v in values}) == len(values)


def test_codec_sends_other_objects_as_opaque_values_equal_to_nothing():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    class SneakyInt(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    for v in (AlwaysEqual(), SneakyInt(3), type("S", (str,), {})("x"), type("L", (list,), {})([1])):
        e = encode(v)
        assert list(e) == ["opaque"], e
        back = _trip(v)
        assert isinstance(back, Opaque)
        assert all(back != x for x in (True, 1, 3, "x", [1], None, _trip(v)))
    assert encode([1, SneakyInt(2)])[1] == {"opaque": encode(SneakyInt(2))["opaque"]}
    for junk in ({"tuple": 3}, {"a": 1, "b": 2}, {"eval": "1+1"}, {"complex": ["1", 2]}, {"bytes": "@@"},
                 {"dict": [[1]]}):
        with pytest.raises(ValueError):
            decode(junk)


# ------------------------------------------------------------------------------ what the candidate holds
# The attacks themselves (forged grades, the sandbox's side doors, the grader's channel) are the
# table-driven suite of tests/test_grader_attacks.py.
@needs_data
def test_candidate_process_holds_no_tests_expected_outputs_or_reference():
    """What the candidate can see: its own source, the inputs, the child's plain code -- nothing else."""
    p = problem("humaneval_plus", "HumanEval/0")
    spy = """
import os, sys
def has_close_elements(numbers, threshold):
    main = sys.modules['__main__']
    return [sorted(os.listdir('.')), sorted(n for n in vars(main) if not n.startswith('__'))]
"""
    program, _ = coding.build_code_program(p.answer["prompt"], fenced(spy), "has_close_elements")
    ref = coding._evalplus_reference(p.answer, p.id)
    run = coding._outputs_run(program, "has_close_elements", ref.calls[:1], timeout_s=10, memory_mb=1024)
    files, names = decode(run.result(0)["out"])
    # no calls.json either: the inputs arrive one at a time on the request channel
    assert set(files) <= {"solution.py", "_verispec_audit_hook.py", "code_child.py"}, files
    leaked = [n for n in names if any(w in n.lower() for w in ("expect", "token", "verdict", "reference", "test"))]
    assert leaked == [], leaked


# ------------------------------------------------------------------------------ honest verdicts
@needs_data
def test_outputs_within_the_tests_tolerance_still_pass():
    """HumanEval tests with tolerances or several valid answers keep their meaning (replay)."""
    p = problem("humaneval", "HumanEval/4")  # abs(candidate(...) - expected) < 1e-6
    close = """
def mean_absolute_deviation(numbers):
    mean = sum(numbers) / len(numbers)
    return sum(abs(x - mean) for x in numbers) / len(numbers) + 1e-9
"""
    r = check(p, fenced(close))
    assert r.correct and "identical" not in r.detail, r.detail  # decided by the test's own assertion
    r = check(p, fenced(close.replace("1e-9", "1e-3")))
    assert not r.correct and "AssertionError" in r.detail, r.detail
    p = problem("humaneval", "HumanEval/32")  # find_zero: any root within 1e-4
    bisect = """
def find_zero(xs):
    lo, hi = -1e3, 1e3
    f = lambda x: sum(c * x ** i for i, c in enumerate(xs))
    for _ in range(200):
        mid = (lo + hi) / 2
        if (f(lo) < 0) == (f(mid) < 0):
            lo = mid
        else:
            hi = mid
    return lo
"""
    assert check(p, fenced(bisect)).correct


def _gold_module():
    spec = importlib.util.spec_from_file_location("code_gold", ROOT / "benchmarks" / "code_gold.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@needs_data
@pytest.mark.parametrize("dataset,pids", [
    ("humaneval", ["HumanEval/0", "HumanEval/32", "HumanEval/38", "HumanEval/53"]),
    ("humaneval_plus", ["HumanEval/2", "HumanEval/32"]),
    # 88 returns a Counter, 737 an re.Match (a not-None task)
    ("mbpp_plus", ["Mbpp/2", "Mbpp/88", "Mbpp/124", "Mbpp/581", "Mbpp/737"]),
])
def test_gold_sample_canonical_passes_and_perturbed_fails(dataset, pids):
    """A sample of benchmarks/code_gold.py (which runs all 164 + 164 + 378 problems)."""
    gold = _gold_module()
    for pid in pids:
        p = problem(dataset, pid)
        r = check(p, gold.canonical_completion(p), timeout_s=30)
        assert r.correct, (pid, r.detail)
        r = check(p, gold.wrong_completion(p), timeout_s=30)
        assert not r.correct, (pid, r.detail)


def test_big_outputs_are_compared_by_digest():
    """Outputs over 4 MiB travel as a digest of their sorted encoding (dict order is free)."""
    ans = {"kind": "evalplus", "flavour": "humaneval", "task_id": "T/big", "entry_point": "table",
           "prompt": 'def table(n):\n    """Numbers to strings."""\n',
           "canonical_solution": "    return {i: str(i) for i in range(n)}\n",
           "base_input": [[400_000]], "plus_input": [[3]], "atol": 0}
    p = Problem(dataset="t", id="T/big", prompt="", answer=ans, checker="code", meta={})
    assert check(p, ans["canonical_solution"]).correct
    reverse = "def table(n):\n    return {i: str(i) for i in reversed(range(n))}\n"
    assert check(p, fenced(reverse)).correct  # same dict, other insertion order
    off_by_one = "def table(n):\n    d = {i: str(i) for i in range(n)}\n    d[n // 2] = 'x'\n    return d\n"
    r = check(p, fenced(off_by_one))
    assert not r.correct and "wrong output" in r.detail, r.detail
