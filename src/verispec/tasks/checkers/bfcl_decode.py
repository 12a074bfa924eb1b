"""Function calls read out of a model's response, for the BFCL checker (:mod:`verispec.tasks.checkers.bfcl`).

Ported from ShishirPatil/gorilla ``berkeley-function-call-leaderboard/bfcl_eval/model_handler/utils.py``
(``default_decode_ast_prompting``, ``ast_parse``, ``resolve_ast_call``, ``resolve_ast_by_type``), Apache
License 2.0, Copyright the Gorilla / BFCL authors; provenance and deviations in the checker's docstring.

Decoding: the strict and the flexible score
    strict (``correct``): the response must consist of the calls only, as the prompt asks.  It is
    decoded like ``default_decode_ast_prompting`` (strip backticks, newlines and spaces, wrap in
    ``[...]`` unless already bracketed, ``ast.parse`` as one Python expression: a call or a list
    of calls), after removing a ``<think>...</think>`` block, ``<tool_call>`` tags and one
    enclosing Markdown code fence; our prompt also allows one call per line, which is decoded as
    the list of those lines.  Any other text makes the strict decoding fail, as in BFCL.
    flexible (``correct_flexible``): calls picked out of surrounding prose (the last Python code
    block that holds calls, else the lines that are call expressions), then the same matching.
    A response cut off by the token limit is graded on its strict decoding only (a call cut in
    half does not parse).

Bounds (the decoder runs on model text in the grader's own process)
    Every pass over the text is linear in its length; the text read is at most
    :data:`MAX_DECODE_CHARS` once ``<think>`` blocks and ``<tool_call>`` tags are removed (a
    longer response is not decoded: neither score credits it); expressions nest at most
    :data:`MAX_NESTING` deep; every integer held -- literal, operand or result of arithmetic --
    has at most :data:`MAX_INT_BITS` bits, and an operation whose result would be larger is
    refused before it is computed.  Each refusal is a :class:`DecodeError` naming the bound.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

__all__ = ["DecodeError", "decode_calls", "find_calls", "is_function_calling_format_output"]


class DecodeError(ValueError):
    """The response is not (only) Python function calls."""


#: Most characters a decoding reads, after ``<think>`` blocks and ``<tool_call>`` tags are removed:
#: ``ast.parse`` costs about 1-4 s per MiB and a decoding parses the text up to five times.  The
#: longest correct answer of BFCL v4's Python categories renders in 1,236 characters (13 times
#: less), and 16 KiB is 16 times the bench's default of 256 new tokens at ~4 characters a token,
#: so no honest response of calls (with prose around them, for the flexible score) reaches it.
MAX_DECODE_CHARS = 16 * 1024
#: Largest integer the decoder holds, in bits (about 308 decimal digits; answers hold a handful).
MAX_INT_BITS = 1024
#: Deepest nesting of expressions resolved (calls in lists in dicts ...: honest answers nest < 10).
MAX_NESTING = 100

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_MAX_POW = 64  # exponent bound for ``**`` between model-written numbers (10**9 is fine, 9**9**9 is not)


def _unparse(node: ast.AST) -> str:
    """``ast.unparse``, or a DecodeError (Python will not print an integer of over 4,300 digits)."""
    try:
        return ast.unparse(node)
    except (ValueError, RecursionError) as e:
        raise DecodeError(f"cannot show an expression of the response: {e}") from None


def _bounded_int(value: Any, what: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise DecodeError(f"{what} has over {MAX_INT_BITS} bits; not evaluated")
    return value


def _result_bits_at_least(op, left: int, right: int) -> int:
    """A lower bound on the bit length of ``op(left, right)`` for two ints, known without computing it."""
    if op is operator.mul:
        return left.bit_length() + right.bit_length() - 1 if left and right else 0
    if op is operator.pow and right > 0 and abs(left) > 1:
        return (abs(left).bit_length() - 1) * right + 1
    return 0


def _binop(node: ast.BinOp) -> Any:
    """Arithmetic the official decoder would ``eval``; numbers (and str + str) only."""
    left, right = resolve_ast_by_type(node.left), resolve_ast_by_type(node.right)
    op = _BINOPS.get(type(node.op))
    nums = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
    if op is operator.add and isinstance(left, str) and isinstance(right, str):
        return left + right  # no longer than the response itself
    if op is None or not nums:
        raise DecodeError(f"unsupported operation {_unparse(node)!r}")
    if op is operator.pow and abs(right) > _MAX_POW:
        raise DecodeError(f"exponent too large in {_unparse(node)!r}")
    if isinstance(left, int) and isinstance(right, int) and _result_bits_at_least(op, left, right) > MAX_INT_BITS:
        raise DecodeError(f"the result of {_unparse(node)[:80]!r} has over {MAX_INT_BITS} bits; not evaluated")
    try:
        result = op(left, right)
    except (ArithmeticError, ValueError) as e:
        raise DecodeError(f"cannot evaluate {_unparse(node)[:80]!r}: {e}") from None
    return _bounded_int(result, f"the result of {_unparse(node)[:80]!r}")


def resolve_ast_by_type(value: ast.AST) -> Any:
    if isinstance(value, ast.Constant):
        return "..." if value.value is Ellipsis else _bounded_int(value.value, "an integer literal")
    if isinstance(value, ast.UnaryOp):
        operand = resolve_ast_by_type(value.operand)
        if isinstance(value.op, ast.USub) and isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand
        raise DecodeError(f"unsupported unary operation {ast.unparse(value)!r}")
    if isinstance(value, ast.List):
        return [resolve_ast_by_type(v) for v in value.elts]
    if isinstance(value, ast.Dict):
        if any(k is None for k in value.keys):
            raise DecodeError("unsupported dict unpacking (**) in an argument")
        try:
            return {resolve_ast_by_type(k): resolve_ast_by_type(v) for k, v in zip(value.keys, value.values)}
        except TypeError as e:  # a list as a key
            raise DecodeError(f"unsupported dict key: {e}") from None
    if isinstance(value, ast.BinOp):
        return _binop(value)
    if isinstance(value, ast.Name):
        return value.id
    if isinstance(value, ast.Call):
        return _unparse(value) if not value.keywords else resolve_ast_call(value)
    if isinstance(value, ast.Tuple):
        return tuple(resolve_ast_by_type(v) for v in value.elts)
    if isinstance(value, ast.Subscript):
        return _unparse(value.value) + "[" + _unparse(value.slice) + "]"
    raise DecodeError(f"unsupported AST type: {type(value).__name__}")


def resolve_ast_call(elem: ast.Call) -> dict:
    """``f.g(a=1)`` -> ``{"f.g": {"a": 1}}``; positional arguments are dropped, as in BFCL."""
    func_parts = []
    func_part = elem.func
    while isinstance(func_part, ast.Attribute):
        func_parts.append(func_part.attr)
        func_part = func_part.value
    if isinstance(func_part, ast.Name):
        func_parts.append(func_part.id)
    func_name = ".".join(reversed(func_parts))
    return {func_name: {arg.arg: resolve_ast_by_type(arg.value) for arg in elem.keywords}}


def _nesting(tree: ast.AST) -> int:
    """How deep ``tree`` nests (iteratively: a chain ``1+1+...`` is as deep as it is long)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            break
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def ast_parse(input_str: str) -> list[dict]:
    """BFCL's ``ast_parse`` for Python: one call, or a list/tuple of calls."""
    cleaned_input = input_str.strip().strip("'")
    try:
        parsed = ast.parse(cleaned_input, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise DecodeError(f"invalid syntax: {type(e).__name__}: {e}") from None
    if _nesting(parsed.body) > MAX_NESTING:
        raise DecodeError(f"expressions nested over {MAX_NESTING} deep")
    if isinstance(parsed.body, ast.Call):
        return [resolve_ast_call(parsed.body)]
    if not isinstance(parsed.body, (ast.List, ast.Tuple)):
        raise DecodeError(f"not a call or a list of calls: {type(parsed.body).__name__}")
    out = []
    for elem in parsed.body.elts:
        if not isinstance(elem, ast.Call):
            raise DecodeError(f"list element is not a call: {_unparse(elem)[:80]!r}")
        out.append(resolve_ast_call(elem))
    return out


def default_decode_ast_prompting(result: str) -> list[dict]:
    result = result.strip("`\n ")
    if not result.startswith("["):
        result = "[" + result
    if not result.endswith("]"):
        result = result + "]"
    return ast_parse(result)


_FENCE_LANGS = {"", "python", "py", "python3", "tool_code"}


def _clean(text: str) -> str:
    """The response without ``<think>...</think>`` blocks and ``<tool_call>`` tags."""
    text = _strip_think(text)
    return text.replace("<tool_call>", "").replace("</tool_call>", "")


def _strip_think(text: str) -> str:
    """``re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL)`` in one pass (the regex scans
    from every unclosed ``<think>`` to the end of the text: quadratic)."""
    kept, pos = [], 0
    while (start := text.find("<think>", pos)) >= 0:
        end = text.find("</think>", start + len("<think>"))
        if end < 0:
            break  # no block closes after this one, nor after any later "<think>"
        kept.append(text[pos:start])
        pos = end + len("</think>")
    kept.append(text[pos:])
    return "".join(kept)


def _fenced_body(text: str) -> str | None:
    """The body of a response that is one fenced code block, else None.

    What ``re.match(r"^\\s*```[ \\t]*(?:python|py|python3|tool_code)?[ \\t]*\\n(.*?)\\n?```\\s*$", text,
    re.DOTALL | re.IGNORECASE)`` captures, in linear time (the regex takes quadratic time on an
    opening line of spaces): the closing fence is the last three characters before the trailing
    whitespace, and the body stops before the newline in front of it, if any.
    """
    start = len(text) - len(text.lstrip())
    if not text.startswith("```", start):
        return None
    newline = text.find("\n", start + 3)
    if newline < 0 or text[start + 3 : newline].strip(" \t").lower() not in _FENCE_LANGS:
        return None
    body_start, close = newline + 1, len(text.rstrip()) - 3
    if close < body_start or not text.startswith("```", close):
        return None
    if close > body_start and text[close - 1] == "\n":
        close -= 1
    return text[body_start:close]


def _too_long(text: str) -> str | None:
    if len(text) > MAX_DECODE_CHARS:
        return (f"the response has {len(text):,} characters besides <think> blocks, over the "
                f"{MAX_DECODE_CHARS:,} an answer of calls can need; not decoded")
    return None


def _unwrap(text: str) -> str:
    text = _clean(text)
    if (why := _too_long(text)) is not None:
        raise DecodeError(why)
    body = _fenced_body(text)
    return text if body is None else body


def decode_calls(text: str) -> list[dict]:
    """Strict decoding: the response is calls only (see the module docstring); else DecodeError."""
    body = _unwrap(text)
    try:
        return default_decode_ast_prompting(body)
    except DecodeError as first:
        lines = [ln.strip() for ln in body.strip().splitlines() if ln.strip()]
        if len(lines) < 2:
            raise first
        calls: list[dict] = []
        for ln in lines:  # the prompt's "one call per line"
            try:
                calls += ast_parse(ln.rstrip(";"))
            except DecodeError:
                raise first from None
        return calls


_BLOCK_LANG_RE = re.compile(r"[ \t]*([\w+-]*)")


def _code_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced block: ``re.findall(r"```[ \\t]*([\\w+-]*)[^\\n]*\\n(.*?)```",
    text, re.DOTALL)`` in one pass (the regex takes quadratic time on a fence line without a
    newline, or on a line of many fences above an unclosed block)."""
    blocks, pos = [], 0
    while (start := text.find("```", pos)) >= 0:
        newline = text.find("\n", start + 3)
        if newline < 0:
            break
        close = text.find("```", newline + 1)
        if close < 0:
            break  # every later fence lies on this line or after it, and no block closes
        blocks.append((_BLOCK_LANG_RE.match(text, start + 3).group(1), text[newline + 1 : close]))
        pos = close + 3
    return blocks


def find_calls(text: str) -> list[dict]:
    """Flexible decoding: calls amid prose -- the last code block that decodes, the whole text,
    else every line that is a call expression (bullets and numbering removed).  ``[]`` if none,
    or if the response is over :data:`MAX_DECODE_CHARS`."""
    text = _clean(text)
    if _too_long(text) is not None:
        return []
    for lang, body in reversed(_code_blocks(text)):
        if lang.lower() in _FENCE_LANGS:
            try:
                return decode_calls(body)
            except DecodeError:
                pass
    try:
        return decode_calls(text)
    except DecodeError:
        pass
    out: list[dict] = []
    for line in text.splitlines():
        line = re.sub(r"^(?:[-*]\s+|\d+[.)]\s+)", "", line.strip()).strip("`").rstrip(";").strip()
        if "(" not in line:
            continue
        try:
            out += ast_parse(line)
        except DecodeError:
            continue
    return out


def is_function_calling_format_output(decoded_output) -> bool:
    if type(decoded_output) != list:  # noqa: E721 (as in BFCL)
        return False
    for item in decoded_output:
        if type(item) != dict or len(item) != 1 or type(list(item.values())[0]) != dict:  # noqa: E721
            return False
    return True
