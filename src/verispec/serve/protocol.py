"""Requests of the OpenAI-compatible API, checked: every bad request becomes an :class:`APIError` (a 4xx
with OpenAI's error body) before anything is queued.

A request body is a JSON object. The OpenAI fields verispec implements are read with their types
checked (``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``, ``n``, ``stream``,
``stream_options``, ``logprobs`` / ``echo`` for completions); OpenAI fields that change generation in a
way verispec does not implement are refused unless at their neutral value (``presence_penalty: 0``,
``logit_bias: {}``, ...); fields that do not change generation (``user``, ``metadata``, ...) are
accepted; any other field is refused (as OpenAI's API does: "unrecognized request argument").

verispec's own fields (clients send them through ``extra_body``):

- ``verification``: ``{"rule": spec, "gamma": int | "auto", "tree": spec | null, "draft": "model" |
  "ngram" | "none"}`` (each key optional: the server's defaults fill the rest);
- ``baseline: true``: the rule's true baseline (target-only sampling with the baseline's truncation);
- ``top_k``, ``min_p``: more sampling truncation (the pipeline of :class:`~verispec.sampling.SamplingConfig`).

:class:`Decode` is what one choice asks of the engine; :class:`ParsedRequest` a whole request.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from verispec.engine.request import DRAFT_SOURCES, Decode, DecodeError, resolve_verification
from verispec.sampling import SamplingConfig

#: OpenAI's limits where it has them; generous where a harness sends more (lm-eval's stop lists).
MAX_STOP = 16
MAX_LOGPROBS = 20
#: Bounds of a request body checked before it is parsed into Python objects: nesting (a request nests 4
#: deep; the JSON parser recurses, so 100,000 nested arrays was a RecursionError) and the characters of one
#: number (int() of thousands of digits is slow and Python refuses it beyond 4,300).
MAX_DEPTH = 32
MAX_NUMBER_CHARS = 100
#: Values (array items, object members) a body may hold beyond what its prompts need (max_n prompts of a
#: full context): bounds what the parser builds, and how long it holds the interpreter.
SPARE_VALUES = 65_536
#: Characters of a refusal's message (a refusal may quote the request, which may be megabytes).
MAX_MESSAGE = 1_000

#: Fields of OpenAI's requests that do not change what is generated: accepted and ignored.
_IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "modalities", "prediction",
            "reasoning_effort", "web_search_options", "audio", "prompt_cache_key", "safety_identifier"}
#: Fields of OpenAI's requests verispec does not implement: refused unless at the neutral value.
_NEUTRAL = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},), "suffix": ("",),
            "tools": ([],), "functions": ([],), "tool_choice": ("none",), "function_call": ("none",),
            "response_format": ({"type": "text"},)}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "n", "stream",
           "stream_options", "verification", "baseline"}
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "best_of"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}


class APIError(Exception):
    """A request the server refuses: ``status`` and OpenAI's error body (:meth:`body`)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE - 1] + "…"
        if param is not None and len(param) > 200:
            param = param[:199] + "…"
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.code = code if code is not None else _CODES.get(status)
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
          413: "request_too_large", 429: "rate_limit_exceeded", 500: "internal_error", 503: "unavailable"}


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


# -- the body --------------------------------------------------------------------------------------------

_BRACKETS = re.compile(r"[\[\]{}]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _NumberTooLong(Exception):
    pass


def _number(kind):
    def parse(text: str):
        if len(text) > MAX_NUMBER_CHARS:
            raise _NumberTooLong(text)
        return kind(text)
    return parse


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_body(raw: bytes, max_values: int) -> dict:
    """A request body (UTF-8 JSON text) -> its object, or a 400 naming what is wrong. Before the parser
    builds anything, a linear pass bounds the body's values (``max_values``), nesting (:data:`MAX_DEPTH`)
    and strings; the parser then refuses numbers longer than :data:`MAX_NUMBER_CHARS` before converting
    them, and NaN / Infinity (not JSON); the result holds no unpaired surrogate (``"\\ud800"``), which no
    tokenizer can encode. CPU-bound for up to tenths of a second on a large body: call it off the event loop."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad(f"the request body is not UTF-8 text (byte {exc.start + 1}): send UTF-8 JSON") from None
    _check_structure(text, max_values)
    try:
        data = json.loads(text, parse_int=_number(int), parse_float=_number(float), parse_constant=_no_constant)
    except _NumberTooLong as exc:
        raise bad(f"the request body holds a number of {len(exc.args[0])} characters; numbers here have at most "
                  f"{MAX_NUMBER_CHARS}") from None
    except json.JSONDecodeError as exc:
        raise bad(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:     # NaN / Infinity; nesting the pass above did not see
        raise bad(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad(f"the request body must be a JSON object, got {_type_name(data)}")
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):     # only an escape puts a surrogate into parsed text
        check_surrogates(data)
    return data


def _check_structure(text: str, max_values: int) -> None:
    """Refuse JSON text with more than ``max_values`` values or nested deeper than :data:`MAX_DEPTH`, at the
    speed of str methods (each holds the interpreter for milliseconds per MiB). Counted over the whole
    text first (strings' text included: an upper bound); only where that bound is exceeded is the structure
    outside strings found: escaped backslashes and quotes go first, so every quote left opens or closes a
    string (for valid JSON; invalid JSON fails in the parser no later than where this reading and the
    parser's part ways, and the parser builds nothing past that point)."""
    opened = text.count("[") + text.count("{")
    if opened <= MAX_DEPTH and text.count(",") + opened <= max_values:
        return
    unescaped = text.replace("\\\\", "").replace('\\"', "") if "\\" in text else text
    quotes = unescaped.count('"')
    if quotes > 4 * max_values:
        raise bad(f"the request body holds {quotes // 2} strings; this server takes at most {2 * max_values}")
    skeleton = "".join(unescaped.split('"')[0::2]) if quotes else unescaped
    opened = skeleton.count("[") + skeleton.count("{")
    depth = 0
    brackets = islice(_BRACKETS.finditer(skeleton), 2 * max_values) if opened > MAX_DEPTH else ()   # fewer: shallow
    for m in brackets:
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_DEPTH:
            raise bad(f"the request body nests arrays and objects more than {MAX_DEPTH} deep; a request nests 4 deep")
    values = skeleton.count(",") + opened
    if values > max_values:
        raise bad(f"the request body holds about {values} values; this server takes at most {max_values} (send fewer "
                  "or shorter prompts per request)")


def check_surrogates(data: Any) -> None:
    """Refuse text holding an unpaired UTF-16 surrogate (``"\\ud800"`` in JSON) anywhere in ``data``, keys
    included: no tokenizer can encode it, and no response holding it can be written as UTF-8."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            where = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]"
            if isinstance(key, str) and not _utf8(key):
                raise bad(f"a key of the request body{' at ' + path.lstrip('.') if path else ''} holds an unpaired "
                          "UTF-16 surrogate (\\ud800-\\udfff): send valid Unicode text", path.lstrip(".") or None)
            if isinstance(value, str):
                if not _utf8(value):
                    raise bad(f"'{where.lstrip('.')}' holds an unpaired UTF-16 surrogate (\\ud800-\\udfff): send "
                              "valid Unicode text", where.lstrip("."))
            elif isinstance(value, (dict, list)):
                stack.append((value, where))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def prompt_char_limit(model, context_length: int) -> int | None:
    """Characters beyond which a text is certainly longer than ``context_length`` tokens of ``model`` (the
    served model's text side): the context times the longest text one token stands for (a vocabulary
    entry's characters: byte-level entries have one character per byte, decoded text no more). None if the
    vocabulary cannot be read."""
    tok = getattr(model.single, "tokenizer", None)
    try:
        if tok is not None and hasattr(tok, "get_vocab"):
            longest = max(map(len, tok.get_vocab()), default=0)
        elif 0 < model.vocab_size <= (1 << 21):
            longest = max(len(model.piece(i)) for i in range(model.vocab_size))
        else:
            return None
    except Exception:       # a backend without a readable vocabulary: prompts are only tokenized off the loop
        return None
    return context_length * max(longest, 1)


@dataclass(frozen=True)
class Policy:
    """What the server decodes by default and what requests may choose (from ``verispec serve``'s flags).

    ``allowed_rules``: rule names (``lenience``, ``lossless``, ...) a request may ask for (None: any);
    ``draft_sources``: the draft sources this server has (``model`` needs a loaded draft model);
    ``max_tokens``: the most one choice may generate; ``max_n``: most choices per request (prompts × n).
    """

    model_name: str = "verispec"
    rule: str = "lossless"
    gamma: int | str = 5
    draft: str = "model"
    tree: str | None = None
    allowed_rules: frozenset[str] | None = None
    draft_sources: tuple[str, ...] = DRAFT_SOURCES
    allow_auto: bool = True
    allow_trees: bool = True
    allow_baseline: bool = True
    max_tokens: int = 4096
    default_chat_max_tokens: int = 512
    max_n: int = 64
    context_length: int = 4096
    vocab_size: int = 0
    #: characters a prompt may have: more than ``context_length`` tokens of the model hold whatever their
    #: split (:func:`prompt_char_limit`), so longer text is refused before it is tokenized (None: no bound)
    max_prompt_chars: int | None = None
    #: vLLM's ``--per-request-spec-decode-metrics``: ``none``, ``summary`` or ``detailed`` (the response's
    #: ``metrics.speculative_decoding``, :mod:`verispec.serve.spec_metrics`)
    spec_decode_metrics: str = "none"

    @property
    def max_values(self) -> int:
        """Values a request body may hold (:func:`parse_body`)."""
        return self.max_n * (self.context_length + 1) + SPARE_VALUES


@dataclass
class ParsedRequest:
    """A checked request: ``prompts`` (token ids, one list per prompt), ``n`` choices of each, one
    :class:`Decode` per choice (``decodes[i * n + j]``: prompt ``i``, choice ``j``), the streaming and
    log-probability options."""

    kind: str                                   # "completion" or "chat"
    prompts: list[list[int]]
    n: int
    decodes: list[Decode]
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None
    echo: bool = False


# -- field readers ------------------------------------------------------------------------------------

def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _quoted(text: str, limit: int = 100) -> str:
    """At most ``limit`` characters of a request's text, for a message that names it."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def get_bool(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"'{key}' must be a boolean (true or false), got {_type_name(value)}", key)
    return value


def get_int(body: dict, key: str, default: int | None, lo: int | None = None, hi: int | None = None,
            param: str | None = None) -> int | None:
    value = body.get(key, default)
    param = param or key
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{param}' must be an integer, got {_type_name(value)} {value!r}"[:300], param)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise bad(f"'{param}' must be in {span}, got {value}", param)
    return value


def get_float(body: dict, key: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"'{key}' must be a number, got {_type_name(value)} {value!r}"[:300], key)
    if value > hi or value < lo or (lo_open and value == lo):
        raise bad(f"'{key}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}", key)
    return float(value)


def get_stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("'stop' must be a string or an array of strings", "stop")
    if len(stop) > MAX_STOP:
        raise bad(f"'stop' holds at most {MAX_STOP} strings, got {len(stop)}", "stop")
    return [s for s in stop if s]


def check_fields(body: dict, known: set[str]) -> None:
    """Refuse unknown fields and unimplemented ones away from their neutral value."""
    for key, value in body.items():
        if key in known or key in _IGNORED:
            continue
        if key in _NEUTRAL:
            if value is None or value in _NEUTRAL[key]:
                continue
            raise bad(f"'{key}' is not supported by verispec serve (only its neutral value "
                      f"{_NEUTRAL[key][0]!r}); drop it", key)
        raise bad(f"unrecognized request argument supplied: '{_quoted(key)}'", _quoted(key))


def check_model(body: dict, policy: Policy) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise bad(f"'model' must be a string, got {_type_name(model)}", "model")
    if model != policy.model_name:
        raise APIError(404, f"The model '{_quoted(model)}' does not exist: this server serves '{policy.model_name}' "
                            "(GET /v1/models)", param="model", code="model_not_found")


# -- decoding settings ----------------------------------------------------------------------------------

def sampling_of(body: dict) -> SamplingConfig:
    temperature = get_float(body, "temperature", 1.0, 0.0, 2.0)
    top_p = get_float(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = get_int(body, "top_k", 0, -1, (1 << 31) - 1)
    min_p = get_float(body, "min_p", 0.0, 0.0, 1.0)
    return SamplingConfig(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), min_p=min_p)


def decode_of(body: dict, policy: Policy, max_tokens: int, stop: list[str], seed: int) -> Decode:
    """The decoding a request asks for (``verification`` and ``baseline`` over the server's defaults),
    checked (:func:`verispec.engine.request.resolve_decode`: rule spec, γ, tree, draft source and their
    combination), then against the server's restrictions (:class:`Policy`)."""
    sampling = sampling_of(body)
    baseline = get_bool(body, "baseline")
    ver = body.get("verification")
    if isinstance(ver, dict) and ver.get("draft") == "none" and not baseline and \
            any(ver.get(k) is not None for k in ("rule", "gamma", "tree")):
        raise bad("'verification.draft': 'none' decodes from the target alone, where no rule, gamma or tree "
                  "applies: drop them, or ask for the rule's true baseline with baseline: true", "verification.draft")
    try:
        d = resolve_verification(ver, rule=policy.rule, gamma=policy.gamma, tree=policy.tree, draft=policy.draft,
                                 baseline=baseline, sampling=sampling, max_tokens=max_tokens, stop=stop, seed=seed,
                                 draft_sources=policy.draft_sources)
    except DecodeError as exc:
        raise bad(exc.args[0] if exc.param == "verification" else f"{exc.param}: {exc}", exc.param) from None
    name = (d.rule_spec or (ver or {}).get("rule") or policy.rule).split(":", 1)[0]
    if policy.allowed_rules is not None and name not in policy.allowed_rules:
        raise bad(f"rule '{name}' is not allowed on this server (allowed: {', '.join(sorted(policy.allowed_rules))})",
                  "verification.rule")
    if d.baseline and not policy.allow_baseline:
        raise bad("true-baseline requests are not allowed on this server", "baseline")
    if d.gamma == "auto" and not policy.allow_auto:
        raise bad("gamma 'auto' is not allowed on this server: give an integer", "verification.gamma")
    if d.tree is not None and not policy.allow_trees:
        raise bad("draft trees are not allowed on this server", "verification.tree")
    return d


def check_room(prompt: Sequence[int], decode: Decode, policy: Policy, param: str) -> None:
    """Refuse a prompt that, with ``max_tokens`` and the verification's room, exceeds the context."""
    room = policy.context_length - len(prompt) - decode.verify_room
    if decode.max_tokens > room:
        extra = f" + {decode.verify_room} tokens of verification room" if decode.verify_room else ""
        raise bad(f"This model's maximum context length is {policy.context_length} tokens; the prompt has "
                  f"{len(prompt)} tokens and max_tokens is {decode.max_tokens}{extra}: shorten the prompt or lower "
                  f"max_tokens to at most {max(room, 0)}", param)


def seeds_of(body: dict, count: int) -> list[int]:
    seed = get_int(body, "seed", None, -(2 ** 63), 2 ** 63 - 1)
    base = seed if seed is not None else secrets.randbits(62)
    return [(base + j) % (2 ** 63) for j in range(count)]


def stream_options(body: dict, stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
        raise bad("'stream_options' must be an object {include_usage: bool}", "stream_options")
    if not stream:
        raise bad("'stream_options' applies to stream: true only", "stream_options")
    return get_bool(opts, "include_usage")


def check_token_ids(ids: Sequence[Any], policy: Policy, param: str) -> list[int]:
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < policy.vocab_size:
            raise bad(f"'{param}' holds token id {t!r}, outside this model's vocabulary 0..{policy.vocab_size - 1}",
                      param)
    if not ids:
        raise bad(f"'{param}' is empty: give at least one token", param)
    return [int(t) for t in ids]


def _prompts(prompt: Any, model, policy: Policy) -> list[list[int]]:
    """The prompt forms of ``/v1/completions``: a string, a list of strings, token ids, or a list of
    token-id lists -> token ids per prompt (strings tokenized as ``verispec generate --no-chat`` does)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            for i, p in enumerate(prompt):
                check_prompt_chars(len(p), policy, f"prompt {i}", "prompt")
            out = [model.tokenize(p) for p in prompt]
            for i, ids in enumerate(out):
                if not ids:
                    raise bad(f"prompt {i} is empty: give at least one character", "prompt")
            return out
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [check_token_ids(prompt, policy, "prompt")]
        if all(isinstance(p, list) for p in prompt):
            return [check_token_ids(p, policy, f"prompt[{i}]") for i, p in enumerate(prompt)]
    raise bad("'prompt' must be a non-empty string, an array of strings, an array of token ids, or an array of "
              "token-id arrays", "prompt")


def check_prompt_chars(chars: int, policy: Policy, what: str, param: str) -> None:
    """Refuse text too long for the context whatever its tokens, before tokenizing it (a 30 MiB prompt took a
    minute to tokenize only to be refused)."""
    if policy.max_prompt_chars is not None and chars > policy.max_prompt_chars:
        raise bad(f"This model's maximum context length is {policy.context_length} tokens; {what} has {chars} "
                  f"characters, more than {policy.context_length} tokens of this model hold (at most "
                  f"{policy.max_prompt_chars}): shorten it", param)


def _common(body: dict, policy: Policy, prompts: list[list[int]], default_max: int | None,
            max_key: str = "max_tokens", allow_zero: bool = False) -> tuple[int, list[Decode], bool, bool]:
    """``(n, decodes, stream, include_usage)`` shared by both endpoints."""
    check_model(body, policy)
    n = get_int(body, "n", 1, 1, policy.max_n)
    if n * len(prompts) > policy.max_n:
        raise bad(f"{len(prompts)} prompts x n = {n} asks for {n * len(prompts)} choices; this server answers at "
                  f"most {policy.max_n} per request", "n")
    stream = get_bool(body, "stream")
    include_usage = stream_options(body, stream)
    stop = get_stop(body)
    seeds = seeds_of(body, n)
    requested = get_int(body, max_key, None, 0 if allow_zero else 1, policy.max_tokens)
    decodes = []
    for ids in prompts:
        for j in range(n):
            max_tokens = requested if requested is not None else default_max
            dec = decode_of(body, policy, max_tokens or 0, stop, seeds[j])
            if requested is None and default_max is None:      # chat: what the context leaves, up to the default
                dec.max_tokens = min(policy.default_chat_max_tokens,
                                     policy.context_length - len(ids) - dec.verify_room)
                if dec.max_tokens < 1:
                    raise bad(f"the prompt has {len(ids)} tokens and leaves no room in this model's context of "
                              f"{policy.context_length} tokens: shorten it", "messages")
            check_room(ids, dec, policy, "prompt" if default_max is not None else "messages")
            decodes.append(dec)
    return n, decodes, stream, include_usage


def parse_completion(body: Any, policy: Policy, model) -> ParsedRequest:
    """A ``/v1/completions`` body -> :class:`ParsedRequest` (``model``: the served model's text methods)."""
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {_type_name(body)}")
    check_fields(body, COMPLETION_FIELDS)
    if "prompt" not in body:
        raise bad("'prompt' is required", "prompt")
    prompts = _prompts(body["prompt"], model, policy)
    echo = get_bool(body, "echo")
    logprobs = get_int(body, "logprobs", None, 0, MAX_LOGPROBS)
    best_of = get_int(body, "best_of", None, 1, policy.max_n)
    n, decodes, stream, include_usage = _common(body, policy, prompts, 16, allow_zero=echo)
    if best_of is not None and best_of != n:
        raise bad("'best_of' other than n is not supported: drop it", "best_of")
    if decodes and decodes[0].max_tokens == 0 and stream:
        raise bad("max_tokens 0 (score the prompt only) does not stream: drop stream", "max_tokens")
    if (logprobs is not None or echo) and stream:
        raise bad("'logprobs' and 'echo' are answered without streaming: drop stream", "stream")
    return ParsedRequest("completion", prompts, n, decodes, stream, include_usage, logprobs, echo)


def parse_chat(body: Any, policy: Policy, model) -> ParsedRequest:
    """A ``/v1/chat/completions`` body -> :class:`ParsedRequest` (messages rendered with the chat template)."""
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {_type_name(body)}")
    check_fields(body, CHAT_FIELDS)
    messages = check_messages(body.get("messages"))
    if get_bool(body, "logprobs") or body.get("top_logprobs") is not None:
        raise bad("chat log-probabilities are not supported: use /v1/completions with logprobs (and echo)",
                  "logprobs")
    check_prompt_chars(sum(len(m["content"]) for m in messages), policy, "the messages' content", "messages")
    try:
        ids = model.chat(messages)
    except ValueError as exc:
        raise bad(f"messages: {exc}", "messages") from None
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    n, decodes, stream, include_usage = _common(body, policy, [ids], None, max_key=key)
    return ParsedRequest("chat", [ids], n, decodes, stream, include_usage)


def check_messages(messages: Any) -> list[dict]:
    """Chat messages: ``role`` in system / developer / user / assistant, ``content`` a string or text parts."""
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty array of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object {{role, content}}, got {_type_name(m)}", where)
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "developer", "user", "assistant"):
            raise bad(f"{where}.role must be system, developer, user or assistant, got {role!r}", f"{where}.role")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad(f"{where}.content: only text parts ({{type: text, text}}) are supported",
                              f"{where}.content")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise bad(f"{where}.content must be a string or an array of text parts, got {_type_name(content)}",
                      f"{where}.content")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out
