"""Answer checkers on real rows of ``<repo>/../shared/data`` and on realistic model-style outputs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from verispec.tasks.checkers import (
    CheckResult,
    bfcl_match,
    build_code_program,
    check,
    decode_calls,
    extract_choice,
    extract_code,
    extract_gsm8k_answer,
    find_calls,
    last_boxed,
)
from verispec.tasks.datasets import Problem, load_dataset

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"benchmark data not found at {DATA}")

_CACHE: dict[str, dict[str, Problem]] = {}


def problems(name: str) -> dict[str, Problem]:
    if name not in _CACHE:
        _CACHE[name] = {p.id: p for p in load_dataset(name, data_dir=DATA).problems}
    return _CACHE[name]


def _mk(answer, checker, **meta) -> Problem:
    return Problem(dataset="t", id="t/0", prompt="q", answer=answer, checker=checker, meta=meta)


# ==========================================================================================
# Realistic (Qwen-style) completions used as fixtures
# ==========================================================================================
QWEN_GSM8K_BOXED = """To determine how much Janet makes every day at the farmers' market, we need to follow these steps:

1. **Calculate the total number of eggs laid by the ducks each day:**
   Janet's ducks lay 16 eggs per day.

2. **Determine the number of eggs Janet uses each day:**
   - She eats 3 eggs for breakfast.
   - She bakes muffins with 4 eggs.
   Total eggs used = 3 + 4 = 7 eggs.

3. **Calculate the number of eggs left to sell:**
   16 - 7 = 9 eggs.

4. **Determine the revenue from selling the eggs:**
   9 eggs * $2 per egg = $18.

Therefore, Janet makes \\(\\boxed{18}\\) dollars every day at the farmers' market."""

QWEN_GSM8K_ANSWER_IS = """Janet's ducks lay 16 eggs. She eats 3 and bakes with 4, so she has 16 - 3 - 4 = 9 eggs left.
She sells them for $2 each: 9 x $2 = $18.
The answer is 18."""

QWEN_GSM8K_DOLLARS = """First, 2 bolts of blue fiber.
White fiber is half of that: 2 / 2 = 1 bolt.
In total: 2 + 1 = 3 bolts.

**Final Answer:** The robe takes a total of \\boxed{3 \\text{ bolts}}."""

QWEN_MATH_FRAC = """We need the probability that the coin lands heads.

There are 2 equally likely outcomes and 1 of them is heads, so the probability is
\\[
\\frac{1}{2}.
\\]

Thus, the final answer is $\\boxed{\\frac{1}{2}}$."""

QWEN_CODE_HE0 = '''To solve this problem, I'll sort the list first, so that the closest pair of numbers must be
adjacent. Then I only need to compare neighbours.

```python
from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    """ Check if any two numbers are closer to each other than the threshold. """
    ordered = sorted(numbers)
    for a, b in zip(ordered, ordered[1:]):
        if b - a < threshold:
            return True
    return False
```

### Explanation
- Sorting takes O(n log n), the scan O(n).

### Example usage
```python
print(has_close_elements([1.0, 2.0, 3.0], 0.5))  # False
print(has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3))  # True
```'''

QWEN_CODE_MBPP2 = """Here is a function that returns the elements shared by both tuples:

```python
def similar_elements(test_tup1, test_tup2):
    # set intersection keeps each shared element once
    return tuple(set(test_tup1) & set(test_tup2))
```

This passes `assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))`."""

QWEN_BFCL_PROSE = """Sure! To find the area of the triangle, I'll call the function like this:

calculate_triangle_area(base=10, height=5)

This uses a base of 10 units and a height of 5 units."""

QWEN_BFCL_PARALLEL_BLOCK = """```python
[spotify.play(artist="Maroon 5", duration=15), spotify.play(artist="Taylor Swift", duration=20)]
```"""


# ==========================================================================================
# GSM8K
# ==========================================================================================
@pytest.mark.parametrize(
    "text,expected",
    [
        (QWEN_GSM8K_BOXED, "18"),
        (QWEN_GSM8K_ANSWER_IS, "18"),
        (QWEN_GSM8K_DOLLARS, "3"),
        ("So the total is $1,500.\nThe answer is $1,500.", "1,500"),
        ("#### 72", "72"),
        ("The final answer is 3.5", "3.5"),
        ("It costs \\boxed{\\$18.00}", "18.00"),
        ("half: \\boxed{\\frac{1}{2}}", "1/2"),
        ("The temperature drops to -5 degrees. The answer is -5.", "-5"),
        ("5 + 10 = 15 apples, then 15 x 2 = 30", "30"),
    ],
)
def test_gsm8k_extraction(text, expected):
    assert extract_gsm8k_answer(text)[0] == expected


@needs_data
def test_gsm8k_gold_rationales_and_off_by_one():
    ps = list(problems("gsm8k").values())[:200]
    for p in ps:
        r = check(p, p.meta["rationale"])
        assert r.correct, (p.id, r)
        assert float(r.extracted) == float(p.answer)
        wrong = check(p, f"The answer is {int(float(p.answer)) + 1}.")
        assert not wrong.correct, (p.id, wrong)
    first = problems("gsm8k")["0"]  # Janet's ducks, gold 18
    for text in (QWEN_GSM8K_BOXED, QWEN_GSM8K_ANSWER_IS):
        r = check(first, text)
        assert r.correct and r.extracted == "18", r
    assert not check(first, "The answer is 18.5.").correct
    assert check(problems("gsm8k")["1"], QWEN_GSM8K_DOLLARS).correct  # the robe: 3 bolts


def test_gsm8k_numeric_comparison():
    assert check(_mk("1450000", "gsm8k"), "The answer is 1,450,000.").correct
    assert not check(_mk("1450000", "gsm8k"), "The answer is 1,450,001.").correct
    assert check(_mk("0.5", "gsm8k"), "\\boxed{\\frac{1}{2}}").correct
    r = check(_mk("5", "gsm8k"), "I don't know.")
    assert not r.correct and r.extracted is None


# ==========================================================================================
# MATH / AIME
# ==========================================================================================
def test_last_boxed():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.") == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert last_boxed("so \\boxed 5") == "5"
    assert last_boxed("x \\boxed{2} then \\boxed{3") == "2"  # truncated last box
    assert last_boxed("no box") is None


@needs_data
def test_math500_gold_solutions_with_math_verify():
    pytest.importorskip("math_verify")
    ps = list(problems("math500").values())
    sample = ps[::10]  # 50 problems across subjects and levels
    for p in sample:
        r = check(p, p.meta["solution"])
        assert r.correct, (p.id, r)
        assert r.extracted == last_boxed(p.meta["solution"])
    # wrong: another problem's gold answer (where it genuinely differs)
    wrong = 0
    for p, q in zip(sample[:20], sample[1:21]):
        if p.answer.replace(" ", "") != q.answer.replace(" ", ""):
            r = check(p, f"The final answer is $\\boxed{{{q.answer}}}$.")
            assert not r.correct, (p.id, q.answer, r)
            wrong += 1
    assert wrong >= 15


@needs_data
def test_math_equivalences_on_real_rows():
    pytest.importorskip("math_verify")
    p = problems("math500")["test/precalculus/807.json"]  # gold \left( 3, \frac{\pi}{2} \right)
    r = check(p, "Converting, r = 3 and theta = pi/2, so the answer is $\\boxed{(3,\\frac{\\pi}{2})}$.")
    assert r.correct and r.extracted == "(3,\\frac{\\pi}{2})"
    assert not check(p, "$\\boxed{(3, \\pi)}$").correct


def test_math_realistic_outputs():
    pytest.importorskip("math_verify")
    half = _mk("\\frac{1}{2}", "math")
    r = check(half, QWEN_MATH_FRAC)
    assert r.correct and r.extracted == "\\frac{1}{2}"
    assert check(half, "so the probability is \\boxed{0.5}").correct
    assert not check(half, "\\boxed{\\frac{1}{3}}").correct
    assert check(_mk("3\\sqrt{13}", "math"), "\\boxed{\\sqrt{117}}").correct
    assert check(_mk("x^2+2x", "math"), "Thus $f(x) = \\boxed{x^2 + 2x}$").correct
    r = check(half, "I could not solve it.")
    assert not r.correct


@needs_data
def test_aime_integer_answers():
    p = problems("aime2024")["2024-I-2"]  # gold "025"
    assert check(p, "... Therefore $xy = \\boxed{025}$.").correct
    assert check(p, "The answer is \\boxed{25}").correct
    assert not check(p, "\\boxed{24}").correct
    for q in problems("aime2025").values():
        assert check(q, f"**Final Answer**\n\\[\n\\boxed{{{q.answer}}}\n\\]").correct


def test_math_check_off_the_main_thread():
    """math-verify's signal.alarm only works in the main thread: other threads use a helper process."""
    pytest.importorskip("math_verify")
    results: list[CheckResult] = []
    t = threading.Thread(target=lambda: results.extend([
        check(_mk("\\frac{1}{2}", "math"), QWEN_MATH_FRAC, timeout_s=30),
        check(_mk("\\frac{1}{2}", "math"), "\\boxed{\\frac{2}{3}}", timeout_s=30),
    ]))
    t.start()
    t.join(120)
    assert [r.correct for r in results] == [True, False], results


# ==========================================================================================
# Code (runs in the sandbox)
# ==========================================================================================
def test_extract_code():
    code = extract_code(QWEN_CODE_HE0, "has_close_elements")
    assert code.lstrip().startswith("from typing import List") and "print(" not in code
    assert extract_code("    return 1\n", "f") == "    return 1\n"  # raw continuation
    assert "def f" in extract_code("```python\ndef f():\n    return 1\n", "f")  # unclosed fence
    assert extract_code("```bash\nls\n```\n```\ndef f(): pass\n```", "f").startswith("def f")
    unfenced = ("Here is my solution:\n\nimport math\n\ndef g(y):\n  return y\n\ndef f(x):\n    return math.sqrt(g(x))"
                "\n\nThis computes a root.")
    assert extract_code(unfenced, "f") == ("import math\n\ndef g(y):\n  return y\n\n"
                                           "def f(x):\n    return math.sqrt(g(x))\n\n")


@needs_data
def test_humaneval_canonical_solutions_pass():
    he = problems("humaneval")
    for tid in ("HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/38"):  # 32/38 use helpers from the prompt
        p = he[tid]
        r = check(p, p.answer["canonical_solution"])
        assert r.correct, (tid, r)


@needs_data
def test_humaneval_realistic_and_wrong_completions():
    p = problems("humaneval")["HumanEval/0"]
    r = check(p, QWEN_CODE_HE0)
    assert r.correct, r
    assert "def has_close_elements" in r.extracted and "print(" not in r.extracted
    wrong = QWEN_CODE_HE0.replace("b - a < threshold", "b - a > threshold")
    r = check(p, wrong)
    assert not r.correct and "AssertionError" in r.detail
    r = check(problems("humaneval")["HumanEval/2"], "    return number\n")
    assert not r.correct
    # exiting early is not passing
    r = check(p, "```python\nimport sys\nsys.exit(0)\n```")
    assert not r.correct
    # a hanging solution is stopped
    r = check(p, "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```",
              timeout_s=2)
    assert not r.correct and "timeout" in r.detail


@needs_data
def test_humaneval_plus_differential_testing():
    p = problems("humaneval_plus")["HumanEval/0"]
    r = check(p, p.answer["canonical_solution"])
    assert r.correct and "inputs" in r.detail, r
    assert check(p, QWEN_CODE_HE0).correct
    # Passes the 7 original tests (all lists have <= 6 numbers) but not the extra EvalPlus inputs.
    hack = QWEN_CODE_HE0.replace("    ordered = sorted(numbers)",
                                 "    if len(numbers) > 6:\n        return False\n    ordered = sorted(numbers)")
    assert check(problems("humaneval")["HumanEval/0"], hack).correct
    r = check(p, hack)
    assert not r.correct and "plus" in r.detail, r
    r = check(p, QWEN_CODE_HE0.replace("return True", "return False", 1))
    assert not r.correct and "base" in r.detail


@needs_data
def test_mbpp_plus_code_field_and_realistic_outputs():
    mb = problems("mbpp_plus")
    for tid in ("Mbpp/2", "Mbpp/3", "Mbpp/4"):
        p = mb[tid]
        r = check(p, p.answer["canonical_solution"])
        assert r.correct, (tid, r)
    p = mb["Mbpp/2"]
    r = check(p, QWEN_CODE_MBPP2)
    assert r.correct and r.extracted.strip().startswith("def similar_elements"), r
    r = check(p, QWEN_CODE_MBPP2.replace("&", "|"))
    assert not r.correct and "wrong output" in r.detail


def test_build_code_program():
    prompt = 'def f(x):\n    """doc"""\n'
    prog, code = build_code_program(prompt, "```python\ndef f(x):\n    return x + 1\n```", "f")
    assert prog.startswith(prompt) and code.startswith("def f")
    prog, code = build_code_program(prompt, "    return x + 1\n", "f")
    assert prog == prompt + "    return x + 1\n\n"


@needs_data
def test_code_checker_never_raises_on_garbage():
    samples = [problems("humaneval")["HumanEval/0"], problems("humaneval_plus")["HumanEval/0"],
               problems("mbpp_plus")["Mbpp/2"], _mk({"entry_point": "f"}, "code"), _mk("not a dict", "code")]
    for p in samples:
        for junk in ("", None, "```python\n", "[[[(((", "\x00\xff" * 10, "def " + "(" * 5000):
            r = check(p, junk, timeout_s=5)
            assert isinstance(r, CheckResult) and r.correct is False, (p.id, junk, r)


# ==========================================================================================
# BFCL
# ==========================================================================================
def _pick(v):
    if isinstance(v, dict):
        return {k: _pick([a for a in vals if a != ""][0]) for k, vals in v.items() if [a for a in vals if a != ""]}
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        return [_pick(x) for x in v]
    return v


def gold_calls(p: Problem) -> list[str]:
    """Python calls built from the first allowed value of every non-optional parameter."""
    calls = []
    docs = {f["name"]: f for f in p.answer["functions"]}
    for entry in p.answer["ground_truth"]:
        name, params = next(iter(entry.items()))
        props = docs[name]["parameters"]["properties"]
        # (a few answers list an optional parameter the function doc lacks: leave those out)
        args = [f"{k}={_pick([a for a in allowed if a != ''][0])!r}" for k, allowed in params.items()
                if [a for a in allowed if a != ""] and (k in props or "" not in allowed)]
        calls.append(f"{name}({', '.join(args)})")
    return calls


@needs_data
@pytest.mark.parametrize("name", ["bfcl_simple", "bfcl_multiple", "bfcl_parallel", "bfcl_parallel_multiple"])
def test_bfcl_gold_answers_match(name):
    ps = list(problems(name).values())
    assert len(ps) >= 200
    for i, p in enumerate(ps):
        calls = gold_calls(p)
        r = check(p, "[" + ", ".join(calls) + "]")
        assert r.correct, (p.id, r)
        # order-insensitive (BFCL matches greedily, so not for every order: see parallel_178 in
        # test_grading_hardcases.py; the first 40 rows have no such ambiguity)
        if len(calls) > 1 and i < 40:
            assert check(p, "\n".join(reversed(calls))).correct, p.id


@needs_data
def test_bfcl_wrong_answers_fail():
    p = problems("bfcl_simple")["simple_python_0"]  # calculate_triangle_area(base=10, height=5, unit optional)
    r = check(p, QWEN_BFCL_PROSE)  # BFCL's decoder rejects prose; the flexible score finds the call
    assert not r.correct and r.correct_flexible, r
    assert check(p, "calculate_triangle_area(base=10, height=5, unit='units')").correct
    assert check(p, "calculate_triangle_area(base=10.0, height=5)").correct is False  # integer param, float given
    r = check(p, "calculate_triangle_area(base=10, height=6)")
    assert not r.correct and "height" in r.detail
    r = check(p, "calculate_triangle_area(base=10)")
    assert not r.correct and "missing" in r.detail
    r = check(p, "calculate_triangle_area(10, 5)")  # BFCL drops positional arguments
    assert not r.correct and "missing_required" in r.detail
    r = check(p, "calculate_triangle_area(base=10, height=5, colour='red')")
    assert not r.correct and "unexpected" in r.detail
    r = check(p, "triangle_area(base=10, height=5)")
    assert not r.correct
    assert not check(p, "[calculate_triangle_area(base=10, height=5), "
                        "calculate_triangle_area(base=10, height=5)]").correct
    assert not check(p, "I'm sorry, I cannot call functions.").correct
    par = problems("bfcl_parallel")["parallel_0"]  # spotify.play x2 (Taylor Swift 20, Maroon 5 15)
    r = check(par, QWEN_BFCL_PARALLEL_BLOCK)
    assert r.correct, r
    assert not check(par, QWEN_BFCL_PARALLEL_BLOCK.replace("duration=15", "duration=20")).correct
    assert not check(par, 'spotify.play(artist="Taylor Swift", duration=20)').correct  # one call missing
    # strings compare case-insensitively without spaces/punctuation, like BFCL
    assert check(par, "spotify.play(artist='taylor swift', duration=20)\n"
                      "spotify.play(artist='Maroon5', duration=15)").correct


def test_decode_and_find_calls_forms():
    assert decode_calls("[f(a=1), g.h(b='x')]") == [{"f": {"a": 1}}, {"g.h": {"b": "x"}}]
    assert decode_calls("<tool_call>\nget_weather(city=\"Paris\")\n</tool_call>") == [
        {"get_weather": {"city": "Paris"}}]
    assert decode_calls("```python\nf(a=-2, b=2**10, c=(1, 2))\n```") == [{"f": {"a": -2, "b": 1024, "c": (1, 2)}}]
    for bad in ("1. f(a=[1, 2])\n2. f(a={'k': True})", "Call: f(a=1)", "f(a=9**9**9)", "f(a=[x for x in y])"):
        with pytest.raises(ValueError):
            decode_calls(bad)
    # a nested call without keywords is kept as its source text (BFCL), never run
    assert decode_calls("f(a=__import__('os').getcwd())") == [{"f": {"a": "__import__('os').getcwd()"}}]
    assert find_calls("1. f(a=[1, 2])\n2. f(a={'k': True})") == [{"f": {"a": [1, 2]}}, {"f": {"a": {"k": True}}}]
    assert find_calls("no calls here") == []
    ok, why = bfcl_match([{"f": {"x": 1}}], {
        "category": "simple", "ground_truth": [{"f": {"x": [1]}}],
        "functions": [{"name": "f", "parameters": {"properties": {"x": {"type": "integer"}}, "required": ["x"]}}],
    })
    assert ok, why


# ==========================================================================================
# Multiple choice and robustness
# ==========================================================================================
@pytest.mark.parametrize(
    "text,letter",
    [
        ("Let's think. Paris is the capital.\nAnswer: B", "B"),
        ("**Answer: (C)**", "C"),
        ("Therefore, the answer is \\boxed{D}.", "D"),
        ("The answer is a tricky one, but I pick A", "A"),
        ("None of these.", None),
    ],
)
def test_choice_extraction(text, letter):
    assert extract_choice(text) == letter


def test_choice_checker():
    p = _mk("B", "choice", options=["Rome", "Paris", "Oslo", "Bern"])
    assert check(p, "Paris is the capital of France.\nAnswer: B").correct
    assert not check(p, "Answer: A").correct


@needs_data
def test_checkers_never_raise_on_garbage():
    samples = [
        next(iter(problems("gsm8k").values())),
        next(iter(problems("aime2025").values())),
        next(iter(problems("bfcl_parallel").values())),
        _mk("A", "choice"),
        _mk("1", "nonexistent"),
    ]
    for p in samples:
        for junk in ("", None, "\\boxed{", "```python\n", "[[[(((", "\x00\xff" * 10):
            r = check(p, junk)
            assert isinstance(r, CheckResult) and r.correct is False
