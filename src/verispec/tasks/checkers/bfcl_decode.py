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
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

__all__ = ["DecodeError", "decode_calls", "find_calls", "is_function_calling_format_output"]


class DecodeError(ValueError):
    """The response is not (only) Python function calls."""


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_MAX_POW = 64  # exponent bound for ``**`` between model-written numbers (10**9 is fine, 9**9**9 is not)


def _binop(node: ast.BinOp) -> Any:
    """Arithmetic the official decoder would ``eval``; numbers (and str + str) only."""
    left, right = resolve_ast_by_type(node.left), resolve_ast_by_type(node.right)
    op = _BINOPS.get(type(node.op))
    nums = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
    if op is operator.add and isinstance(left, str) and isinstance(right, str):
        return left + right
    if op is None or not nums:
        raise DecodeError(f"unsupported operation {ast.unparse(node)!r}")
    if op is operator.pow and abs(right) > _MAX_POW:
        raise DecodeError(f"exponent too large in {ast.unparse(node)!r}")
    try:
        return op(left, right)
    except (ArithmeticError, ValueError) as e:
        raise DecodeError(f"cannot evaluate {ast.unparse(node)!r}: {e}") from None


def resolve_ast_by_type(value: ast.AST) -> Any:
    if isinstance(value, ast.Constant):
        return "..." if value.value is Ellipsis else value.value
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
        return {resolve_ast_by_type(k): resolve_ast_by_type(v) for k, v in zip(value.keys, value.values)}
    if isinstance(value, ast.BinOp):
        return _binop(value)
    if isinstance(value, ast.Name):
        return value.id
    if isinstance(value, ast.Call):
        return ast.unparse(value) if not value.keywords else resolve_ast_call(value)
    if isinstance(value, ast.Tuple):
        return tuple(resolve_ast_by_type(v) for v in value.elts)
    if isinstance(value, ast.Subscript):
        return ast.unparse(value.value) + "[" + ast.unparse(value.slice) + "]"
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


def ast_parse(input_str: str) -> list[dict]:
    """BFCL's ``ast_parse`` for Python: one call, or a list/tuple of calls."""
    cleaned_input = input_str.strip().strip("'")
    try:
        parsed = ast.parse(cleaned_input, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise DecodeError(f"invalid syntax: {type(e).__name__}: {e}") from None
    if isinstance(parsed.body, ast.Call):
        return [resolve_ast_call(parsed.body)]
    if not isinstance(parsed.body, (ast.List, ast.Tuple)):
        raise DecodeError(f"not a call or a list of calls: {type(parsed.body).__name__}")
    out = []
    for elem in parsed.body.elts:
        if not isinstance(elem, ast.Call):
            raise DecodeError(f"list element is not a call: {ast.unparse(elem)[:80]!r}")
        out.append(resolve_ast_call(elem))
    return out


def default_decode_ast_prompting(result: str) -> list[dict]:
    result = result.strip("`\n ")
    if not result.startswith("["):
        result = "[" + result
    if not result.endswith("]"):
        result = result + "]"
    return ast_parse(result)


_FENCE_RE = re.compile(r"^\s*```[ \t]*(?:python|py|python3|tool_code)?[ \t]*\n(.*?)\n?```\s*$",
                       re.DOTALL | re.IGNORECASE)


def _unwrap(text: str) -> str:
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL)
    text = text.replace("<tool_call>", "").replace("</tool_call>", "")
    m = _FENCE_RE.match(text)
    return m.group(1) if m else text


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


_CODE_BLOCK_RE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def find_calls(text: str) -> list[dict]:
    """Flexible decoding: calls amid prose -- the last code block that decodes, the whole text,
    else every line that is a call expression (bullets and numbering removed).  ``[]`` if none."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL)
    text = text.replace("<tool_call>", "").replace("</tool_call>", "")
    for lang, body in reversed(_CODE_BLOCK_RE.findall(text)):
        if lang.lower() in ("", "python", "py", "python3", "tool_code"):
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
