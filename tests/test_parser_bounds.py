"""Every parser the grader runs on model text is linear (or bounded) in the text's length (issue 34).

Each test feeds one parser 1 MiB of a worst case of the parser as it was -- a regex that retried
every split of a run of spaces, a brace scan per ``\\boxed{``, a parse per line of trailing prose,
arithmetic on numbers of millions of digits -- and asserts that it takes under
:data:`CPU_BOUND_S` of CPU: a correctness bound, generous (the linear code takes well under half of
it on a busy 2-core VM, the code before took minutes to years on the same inputs), not a speed
benchmark.  Beside each, an honest example is still read exactly as before.
"""

from __future__ import annotations

import time

import pytest

from verispec.tasks.checkers import bfcl_decode, check, coding, last_boxed, latex_math
from verispec.tasks.checkers.bfcl_decode import DecodeError, decode_calls, find_calls
from verispec.tasks.datasets import Problem

MIB = 1 << 20
CPU_BOUND_S = 1.0


def mib(unit: str, size: int = MIB) -> str:
    """``unit`` repeated to ``size`` characters (about)."""
    return unit * (size // len(unit))


def cpu(fn, *args):
    """``(CPU seconds, result)`` of ``fn(*args)``."""
    start = time.process_time()
    result = fn(*args)
    return time.process_time() - start, result


def assert_bounded(fn, text: str):
    seconds, result = cpu(fn, text)
    assert seconds < CPU_BOUND_S, f"{seconds:.2f} s CPU on {len(text):,} characters"
    return result


def _mk(answer, checker: str, **meta) -> Problem:
    return Problem(dataset="t", id="t/0", prompt="q", answer=answer, checker=checker, meta=meta)


# ------------------------------------------------------------------------------ \boxed{} (base)
@pytest.mark.parametrize("text", [
    mib("\\boxed{"),                       # every box unclosed: one scan per box before
    "\\boxed{" + mib("{}"),                # a brace per character
    "\\boxed{" + mib("{"),
    mib("\\boxed$"),                       # a bare \boxed: the text after it was copied per box
    "\\boxed{" + mib("\\{") + "}",
    mib("\\fbox {a}"),
], ids=["unclosed", "pairs", "opens", "dollar", "escapes", "closed"])
def test_last_boxed_is_linear(text):
    assert_bounded(last_boxed, text)
    assert last_boxed("so \\boxed{\\frac{1}{2}} and \\boxed{3") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{a \\} b} \\fbox 7") == "7"
    assert last_boxed("\\boxed{\\{x\\}}") == "\\{x\\}"


# ------------------------------------------------------------------------------ GSM8K
@pytest.mark.parametrize("text", [
    "The final answer" + " " * MIB + "x",  # three quantifiers shared the spaces: cubic before
    mib("final answer" + " " * 200 + "x"),
    mib("the answer is:" + " " * 100 + "$ "),
    "The answer is " + "1" * MIB,
    mib("\\boxed{"),
    "\\boxed{" + mib("\\frac{1}") + "}",
    mib("#### "),
], ids=["final-spaces", "final-spaces-many", "answer-is-markup", "digits", "unclosed-boxes", "fracs", "hashes"])
def test_gsm8k_is_linear(text):
    gsm8k = _mk("18", "gsm8k")
    assert_bounded(lambda t: check(gsm8k, t), text)
    res = check(gsm8k, "She sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars.\nThe final answer is: $18.")
    assert res.correct and res.extracted == "18"
    assert check(gsm8k, "So \\boxed{x = 18}").correct
    huge = check(gsm8k, "The answer is 1" + "0" * 400 + "/3.")  # beyond a float: no number, not a crash
    assert not huge.correct and "checker error" not in huge.detail


# ------------------------------------------------------------------------------ MATH / AIME (before math-verify)
@pytest.mark.parametrize("text", [
    mib("\\boxed{"),
    "\\boxed{" + "1" * MIB + "}",          # Python refused to convert it: a checker error before
    "final answer" + " " * MIB,
    mib("The answer is "),
], ids=["unclosed-boxes", "huge-integer", "cue-spaces", "cues"])
def test_math_extraction_is_linear(text):
    def before_math_verify(t):
        _source, boxed, _how = latex_math._stated_source(t)
        return latex_math._int_or_none(boxed)

    assert_bounded(before_math_verify, text)
    aime = _mk("73", "math")
    res = check(aime, "Adding up, the answer is \\boxed{073}.")  # two integers: no math-verify needed
    assert res.correct and res.extracted == "073"
    assert latex_math._stated_source("x \\boxed{\\frac{1}{2}} y") == ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "boxed")


# ------------------------------------------------------------------------------ multiple choice
@pytest.mark.parametrize("text", [
    "answer" + " " * MIB + "x",            # quadratic before
    "Answer is option" + " " * MIB + "x",
    mib("answer" + " " * 200 + "x"),
    mib(" A" + "." * 1000 + "x"),
    mib("(K) option Z "),
], ids=["answer-spaces", "option-spaces", "answer-spaces-many", "trailing", "loose"])
def test_choice_is_linear(text):
    problem = _mk("B", "choice", options=["Rome", "Paris", "Oslo", "Bern"])
    assert_bounded(lambda t: check(problem, t), text)
    assert check(problem, "Paris is the capital of France.\nAnswer:   (B)").correct
    assert check(problem, "I'd say option B is correct").correct


# ------------------------------------------------------------------------------ BFCL
BFCL = _mk({"category": "simple", "functions": [
    {"name": "f", "parameters": {"properties": {"a": {"type": "integer"}}, "required": ["a"]}}],
    "ground_truth": [{"f": {"a": [13]}}]}, "bfcl")
THINK = "<think>" + "x" * (MIB - 16 * 1024) + "</think>"  # removed first: what is left is under the cap


@pytest.mark.parametrize("text", [
    mib("<think>"),                        # never closed: scanned to the end from each before
    "```" + " " * MIB + "x",               # the fence regex split the spaces two ways
    "```" + "a" * MIB,                     # a fence line without a newline
    mib("``` ", MIB // 2) + "\n" + "x" * (MIB // 2),
    mib("f(a=1)\n"),                       # parsed line by line, four times over
    THINK + mib("f(a=1)\n", bfcl_decode.MAX_DECODE_CHARS),
    THINK + mib("- g(b=[1, 2], c={'k': 'v'}) and then\n", bfcl_decode.MAX_DECODE_CHARS),
    THINK + "f(a=" + mib("1+", bfcl_decode.MAX_DECODE_CHARS - 8) + "1)",  # nested as deep as it is long
    THINK + "f(a=" + "[" * 150 + "]" * 150 + ")" + mib("\nf(a=[[[[1]]]])", bfcl_decode.MAX_DECODE_CHARS - 320),
    THINK + "f(a=0x" + "f" * (bfcl_decode.MAX_DECODE_CHARS - 16) + ")",
], ids=["think", "fence-spaces", "fence-word", "fence-line", "calls", "calls-under-cap", "prose-under-cap",
        "plus-chain", "nesting", "hex-literal"])
def test_bfcl_decoding_is_linear(text):
    res = assert_bounded(lambda t: check(BFCL, t), text)
    assert not res.correct and not res.correct_flexible
    assert "checker error" not in res.detail, res.detail
    assert check(BFCL, "[f(a=13)]").correct
    assert check(BFCL, "<think>a=13, so</think>\n```python\nf(a=10 + 3)\n```").correct
    flexible = check(BFCL, "I would call it like this:\n- f(a=13)\nThat is all.")
    assert not flexible.correct and flexible.correct_flexible


@pytest.mark.parametrize("expr", [
    "((((9**64)**64)**64)**64)",           # 36 characters, ran for hours before
    "(9**64)**64",
    "*".join(["(2**60)"] * 40),
    "(2**60)**16 * (2**60)**16",
    "-(7**64)**8",
    "(2**31)**33 + (2**31)**33",
    "0x" + "f" * 300,                      # a literal of 1,200 bits
    "0x" + "f" * 200 + " * 0x" + "f" * 200,
])
def test_bfcl_arithmetic_bomb_is_refused_quickly(expr):
    def refused(text):
        with pytest.raises(DecodeError, match=f"over {bfcl_decode.MAX_INT_BITS} bits"):
            decode_calls(text)

    seconds, _ = cpu(refused, f"f(a={expr})")
    assert seconds < CPU_BOUND_S
    res = check(BFCL, f"f(a={expr})")
    assert not res.correct and "bits" in res.detail


def test_bfcl_honest_arithmetic_and_bounds_stated():
    assert decode_calls("f(a=10**9, b=2**64, c=3*4+1, d=-7//2, e=2**-2, g=(2**31)**33//(2**25)**40, h='a' + 'b')") == [
        {"f": {"a": 10**9, "b": 2**64, "c": 13, "d": -4, "e": 0.25, "g": 2**23, "h": "ab"}}]
    assert decode_calls("f(a=(2**31)**33)") == [{"f": {"a": 2**1023}}]  # 1,024 bits: the largest held
    with pytest.raises(DecodeError, match="nested over"):
        decode_calls("f(a=" + "1+" * 500 + "1)")
    with pytest.raises(DecodeError, match="dict key"):
        decode_calls("f(a={[1]: 2})")
    with pytest.raises(DecodeError, match="characters besides <think> blocks"):
        decode_calls("f(a=1)\n" * (bfcl_decode.MAX_DECODE_CHARS // 7 + 1))
    assert find_calls("x" * (bfcl_decode.MAX_DECODE_CHARS + 1) + "\nf(a=1)") == []
    assert find_calls("<think>" + "x" * bfcl_decode.MAX_DECODE_CHARS + "</think>\nf(a=1)") == [{"f": {"a": 1}}]


# ------------------------------------------------------------------------------ code extraction
ENTRY = "entry"


def _salvage_end_worst(size: int) -> str:
    """A def, code that parses, then 301 lines of prose: every try parses almost all of it."""
    prose = "This is prose, it is.\n" * 301
    return "Here:\ndef entry(x):\n" + mib("    x = 1\n", size - len(prose) - 32) + prose


def _salvage_start_worst(size: int) -> str:
    """Prose, then 299 imports above a def: every try upwards parses the whole function again."""
    head = "Here it is:\n" + "import os\n" * 299 + "def entry(x):\n"
    return head + mib("    x = 1\n", size - len(head) - 32)


@pytest.mark.parametrize("text", [
    "```" + "a" * MIB,                     # the fence regex: quadratic on a line without a newline
    "```" + "\t" * MIB,
    "   ```python" + " " * MIB,
    "```python\n" + "\n" * MIB + "```\n",  # \s* from each blank line over all the others
    "```python\n" + mib("async \n") + "```\n",
    mib("```python\nx = 1\n```\n"),
    mib("def entry(\n"),                   # unfenced: parsed whole, then line by line
    _salvage_end_worst(MIB),
    _salvage_end_worst(coding.MAX_SALVAGE_CHARS),  # searched: the parse budget bounds it
    _salvage_start_worst(coding.MAX_SALVAGE_CHARS),
], ids=["fence-word", "fence-tabs", "fence-spaces", "blank-lines", "async-lines", "many-blocks", "defs",
        "salvage-end-1mib", "salvage-end-under-cap", "salvage-start-under-cap"])
def test_code_extraction_is_linear(text):
    assert_bounded(lambda t: coding.build_code_program("def entry(x):\n    \"\"\"doc\"\"\"\n", t, ENTRY), text)
    fenced = "Sure:\n```python\ndef helper():\n    pass\n```\nand\n```python\ndef entry(x):\n    return x\n```\nDone."
    assert coding.extract_code(fenced, ENTRY) == "def entry(x):\n    return x\n"
    unfenced = ("Here is my solution:\nimport math\n\ndef entry(x):\n    return math.sqrt(x)\n\n"
                "This works because the square root is what is asked.\n")
    assert coding.extract_code(unfenced, ENTRY) == "import math\n\ndef entry(x):\n    return math.sqrt(x)\n\n"


def test_salvage_bounds_keep_the_search_for_honest_sizes():
    # code amid prose well under the cap: found exactly as before the bounds
    body = "def entry(x):\n" + "    x += 1\n" * 200 + "    return x\n"
    text = "Let me write it.\n" + "import os\n" * 20 + body + "It adds one, 200 times.\n" * 40
    assert len(text) < coding.MAX_SALVAGE_CHARS
    assert coding.extract_code(text, ENTRY) == "import os\n" * 20 + body
    # over the cap: taken whole, like any text that parses, and never searched
    long = "Prose first.\n" + body + "x = 1\n" * (coding.MAX_SALVAGE_CHARS // 6)
    assert coding.extract_code(long, ENTRY) == long
