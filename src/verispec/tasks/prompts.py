"""Prompt templates: one zero-shot chain-of-thought template per task family.

Every template produces the *user message* only; the chat template of the model (if any) is
applied later by the harness.  The templates ask for an answer format that the matching checker
in :mod:`verispec.tasks.checkers` extracts:

==========  ===========================================================  =====================
family      asks for                                                     checker extracts
==========  ===========================================================  =====================
math        step-by-step reasoning, final answer in ``\\boxed{}``          last ``\\boxed{}``
gsm8k       step-by-step, then ``The answer is N.`` (``\\boxed{N}`` ok)    boxed / "answer is" /
                                                                         ``####`` / last number
code        the complete function in one ```` ```python ```` block        the code block
bfcl        the call(s) only, Python syntax ``func(arg=val)``            calls parsed by ``ast``
choice      step-by-step, then ``Answer: X`` with X in A-D               the letter
==========  ===========================================================  =====================

GSM8K can also be prompted few-shot (``few_shot=k``): the exemplars come from the GSM8K *train*
split when a ``gsm8k/train.jsonl`` is present in the data directory (first ``k`` rows, with
the ``<<calc>>`` annotations removed and ``#### N`` rewritten as ``The answer is N.``), else
from :data:`GSM8K_FEWSHOT` (the eight chain-of-thought exemplars of Wei et al., 2022).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

__all__ = [
    "MATH_TEMPLATE",
    "GSM8K_TEMPLATE",
    "CODE_TEMPLATE",
    "MBPP_TEMPLATE",
    "BFCL_TEMPLATE",
    "CHOICE_TEMPLATE",
    "GSM8K_FEWSHOT",
    "GSM8K_FEWSHOT_STOP",
    "math_prompt",
    "gsm8k_prompt",
    "gsm8k_rationale_from_train",
    "humaneval_prompt",
    "mbpp_prompt",
    "bfcl_prompt",
    "choice_prompt",
]

#: MATH-500 / AIME (Qwen2.5-Math style chain-of-thought instruction).
MATH_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."

#: GSM8K, zero-shot chain of thought.
GSM8K_TEMPLATE = (
    "{question}\n\n"
    "Please reason step by step. At the end, write the final answer as a single number in the form "
    '"The answer is N." (you may also put it within \\boxed{{}}).'
)

#: GSM8K few-shot: instruction, then ``Question:/Answer:`` exemplars, then the question.
GSM8K_FEWSHOT_HEADER = (
    "Solve the math word problem. Reason step by step and finish with \"The answer is N.\"\n\n"
)
GSM8K_FEWSHOT_ITEM = "Question: {question}\nAnswer: {answer}\n\n"
GSM8K_FEWSHOT_QUERY = "Question: {question}\nAnswer:"
#: Stop strings for the few-shot format (the model would go on to invent the next question).
GSM8K_FEWSHOT_STOP = ("\n\nQuestion:", "\nQuestion:")

#: HumanEval / HumanEval+: complete a function given its signature and docstring.
# Code tasks ask for the code alone: explanations before the code block cost a large share of the
# token budget (with 160 new tokens, every HumanEval answer of the embedded pair was cut off).
CODE_TEMPLATE = (
    "Complete the following Python function. Reply with the complete function (with its signature and "
    "any imports or helper functions it needs) in a single ```python code block, without explanation."
    "\n\n```python\n{prompt}```"
)

#: MBPP+: a task description with one example assertion.
MBPP_TEMPLATE = (
    "{description}\n\n"
    "Write a Python function `{entry_point}` that solves this task; it must pass the example test above. "
    "Reply with the complete function (with any imports it needs) in a single ```python code block, "
    "without explanation."
)

#: BFCL single-turn (simple / multiple / parallel / parallel_multiple).
BFCL_TEMPLATE = (
    "You can call the following functions, described in JSON:\n{functions}\n\n"
    "{request}\n\n"
    "Answer with the function call(s) that fulfil the request. Respond with the call(s) only, as Python "
    "syntax `func(arg=val)` with keyword arguments (one call per line, or a Python list "
    "`[func_a(x=1), func_b(y=2)]` for several calls), and nothing else."
)

#: Multiple choice with four options (INCLUDE).
CHOICE_TEMPLATE = (
    "{question}\n\n{options}\n\n"
    'Please reason step by step, then give your final answer as "Answer: X", where X is one of {letters}.'
)

#: Wei et al. (2022), chain-of-thought exemplars for GSM8K (question, rationale ending "The answer is N.").
GSM8K_FEWSHOT: tuple[tuple[str, str], ...] = (
    (
        "There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are "
        "done, there will be 21 trees. How many trees did the grove workers plant today?",
        "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must "
        "have been 21 - 15 = 6. The answer is 6.",
    ),
    (
        "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.",
    ),
    (
        "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
        "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating "
        "35, they had 74 - 35 = 39. The answer is 39.",
    ),
    (
        "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops did "
        "Jason give to Denny?",
        "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8. "
        "The answer is 8.",
    ),
    (
        "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he "
        "have now?",
        "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. "
        "5 + 4 = 9. The answer is 9.",
    ),
    (
        "There were nine computers in the server room. Five more computers were installed each day, from monday "
        "to thursday. How many computers are now in the server room?",
        "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 "
        "computers were added. 9 + 20 is 29. The answer is 29.",
    ),
    (
        "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many "
        "golf balls did he have at the end of wednesday?",
        "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 "
        "more, he had 35 - 2 = 33 golf balls. The answer is 33.",
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 "
        "dollars left. 23 - 15 is 8. The answer is 8.",
    ),
)


def math_prompt(problem: str) -> str:
    return MATH_TEMPLATE.format(problem=problem.strip())


def gsm8k_rationale_from_train(answer: str) -> str:
    """GSM8K train ``answer`` -> exemplar rationale: drop ``<<...>>``, ``#### N`` -> ``The answer is N.``"""
    text = re.sub(r"<<[^>]*>>", "", answer)
    body, _, final = text.rpartition("####")
    if not _:
        return text.strip()
    return f"{body.strip()}\nThe answer is {final.strip()}."


def gsm8k_prompt(question: str, exemplars: Sequence[tuple[str, str]] = ()) -> str:
    """Zero-shot CoT prompt, or few-shot when ``exemplars`` (question, rationale) are given."""
    if not exemplars:
        return GSM8K_TEMPLATE.format(question=question.strip())
    parts = [GSM8K_FEWSHOT_HEADER]
    parts += [GSM8K_FEWSHOT_ITEM.format(question=q.strip(), answer=a.strip()) for q, a in exemplars]
    parts.append(GSM8K_FEWSHOT_QUERY.format(question=question.strip()))
    return "".join(parts)


def humaneval_prompt(prompt: str) -> str:
    if not prompt.endswith("\n"):
        prompt += "\n"
    return CODE_TEMPLATE.format(prompt=prompt)


def mbpp_prompt(prompt: str, entry_point: str) -> str:
    """MBPP+ ``prompt`` is a docstring (``\"\"\"`` description + example assert ``\"\"\"``); unwrap it."""
    description = prompt.strip()
    for q in ('"""', "'''"):
        if description.startswith(q) and description.endswith(q) and len(description) >= 6:
            description = description[3:-3].strip()
    return MBPP_TEMPLATE.format(description=description, entry_point=entry_point)


def _bfcl_request(question) -> str:
    """BFCL ``question``: a list of turns, each a list of ``{role, content}``; single-turn uses turn 0."""
    turns = question if isinstance(question, list) else [[{"role": "user", "content": str(question)}]]
    messages = turns[0] if turns and isinstance(turns[0], list) else turns
    system = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "system"]
    user = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") != "system"]
    parts = []
    if system:
        parts.append("\n".join(system).strip())
    parts.append("Request: " + "\n".join(user).strip())
    return "\n\n".join(parts)


def bfcl_prompt(question, functions: Iterable[dict]) -> str:
    docs = json.dumps(list(functions), indent=2, ensure_ascii=False)
    return BFCL_TEMPLATE.format(functions=docs, request=_bfcl_request(question))


def choice_prompt(question: str, options: Sequence[str]) -> str:
    letters = [chr(ord("A") + i) for i in range(len(options))]
    rendered = "\n".join(f"{letter}. {str(o).strip()}" for letter, o in zip(letters, options))
    shown = ", ".join(letters[:-1]) + (f" or {letters[-1]}" if len(letters) > 1 else letters[-1])
    return CHOICE_TEMPLATE.format(question=question.strip(), options=rendered, letters=shown)
