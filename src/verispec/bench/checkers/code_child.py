"""Child entry point of the code grader, and the plain-data codec both sides share.

Runs in the sandbox as ``python -I -B code_child.py MODE FILES...`` (:func:`verispec.bench.
sandbox.run_module`); standard library only, since it runs without the package installed.
The process holds what its mode needs and nothing more -- never a verdict, a token, the
expected outputs or (in ``outputs`` mode) the tests -- and sends plain data, one JSON line per
event, on the report channel (``$VERISPEC_REPORT_FD``).  The grader in the parent decides.

Modes:

``outputs SOLUTION CALLS``
    Load ``SOLUTION`` (a Python file: prompt + candidate code, or the canonical solution) as a
    module not named ``__main__``, then call its entry point on each call of ``CALLS`` (JSON:
    ``{"entry": name, "calls": [{"args": [...], "kwargs": {...}}]}``, values encoded as below).
    Reports ``{"ready": true}`` (or ``{"load_error": ...}``), then per call ``{"i": i, "out": v,
    "t": seconds}``, ``{"i": i, "digest": hex, "size": n, "t": seconds}`` (big outputs) or
    ``{"i": i, "raised": "TypeName: message", "t": seconds}``.
``record SOLUTION TEST ENTRY``
    HumanEval: run the dataset's ``check(candidate)`` from ``TEST`` against ``SOLUTION`` (the
    canonical solution) through a recording stub.  Reports each call the test makes
    ``{"i", "args", "kwargs", "out"|"raised", "t"}``, then ``{"done": true}`` or ``{"error": ...}``.
``replay PROMPT TEST CALLS RESULTS``
    HumanEval: run ``check(candidate)`` once more, where ``candidate`` is a stub that answers
    each recorded call with the candidate's result from ``RESULTS`` (plain data from an
    ``outputs`` run; no candidate code is present).  Reports ``{"passed": bool, "error": ...}``.

Codec: JSON where ``None``, ``bool``, ``int``, ``float`` (with ``NaN``/``Infinity``), ``str``
and ``list`` are themselves, and every other carried type is a one-key object: ``{"tuple": [...]}``,
``{"set": [...]}``, ``{"frozenset": [...]}``, ``{"dict": [[k, v], ...]}`` (also ``Counter``,
``OrderedDict``, ``defaultdict``), ``{"deque": [...]}``, ``{"bytes": base64}``,
``{"bytearray": base64}``, ``{"complex": [re, im]}``, ``{"int": hex}`` (integers too long for
JSON readers).  Types must match exactly; a value of any other class (subclasses included) is
sent as ``{"opaque": "module.Type"}`` and decodes to an :class:`Opaque` that equals nothing, so
an object that claims to equal everything never reaches a comparison as itself.  Set elements
are sorted by their encoding, so equal values encode equally.  In ``outputs`` mode a result
whose encoding exceeds :data:`BIG_OUTPUT_CHARS` is sent as ``{"digest": sha256, "size": n}`` of
its dict-order-independent encoding (:func:`digest`), computed while streaming so a huge output
is never held twice.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import sys
import time
from collections import Counter, OrderedDict, defaultdict, deque

#: Integers with more bits than this travel as hex (JSON readers cap decimal digits).
_MAX_PLAIN_INT_BITS = 4000
#: Outputs whose encoding is longer than this travel as a digest (see :func:`digest`).
BIG_OUTPUT_CHARS = 4 << 20


class Opaque:
    """Stands for a value of a type the codec does not carry: equal to nothing but itself, so
    it can only satisfy "is not None" checks (EvalPlus's not-None tasks return ``re.Match``)."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<opaque {self.type_name}>"


def _sort_key(e) -> str:
    return json.dumps(e, separators=(",", ":"))


def encode(x):
    """Value -> JSON-ready structure (see the module docstring); never raises for a type."""
    t = type(x)
    if x is None or t is bool or t is str or t is float:
        return x
    if t is int:
        return x if x.bit_length() <= _MAX_PLAIN_INT_BITS else {"int": hex(x)}
    if t is list:
        return [encode(v) for v in x]
    if t is tuple:
        return {"tuple": [encode(v) for v in x]}
    if t is set or t is frozenset:
        return {t.__name__: sorted((encode(v) for v in x), key=_sort_key)}
    if t in _DICTS:
        # dict.items, not x.items: a subclass defined in Python could have been patched
        return {_DICTS[t]: [[encode(k), encode(v)] for k, v in dict.items(x)]}
    if t is deque:
        return {"deque": [encode(v) for v in x]}
    if t is bytes or t is bytearray:
        return {t.__name__: base64.b64encode(bytes(x)).decode("ascii")}
    if t is complex:
        return {"complex": [x.real, x.imag]}
    return {"opaque": f"{t.__module__}.{t.__qualname__}"[:200]}


_LEAVES = {type(None), bool, int, float, str}
# Bound at import, before any solution runs, so a solution cannot swap them.
_DICTS = {dict: "dict", Counter: "Counter", OrderedDict: "OrderedDict", defaultdict: "defaultdict"}
_DICT_TYPES = {v: k for k, v in _DICTS.items()}


def decode(e):
    """Inverse of :func:`encode` (an opaque value becomes a fresh :class:`Opaque`); raises
    ``ValueError`` on anything :func:`encode` cannot have produced."""
    t = type(e)
    if e is None or t in (bool, int, float, str):
        return e
    if t is list:
        return [decode(v) for v in e]
    if t is dict and len(e) == 1:
        (tag, v), = e.items()
        if tag == "tuple" and type(v) is list:
            return tuple(decode(i) for i in v)
        if tag == "set" and type(v) is list:
            return {decode(i) for i in v}
        if tag == "frozenset" and type(v) is list:
            return frozenset(decode(i) for i in v)
        if tag in _DICT_TYPES and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
            items = {decode(k): decode(val) for k, val in v}  # a dict keeps their order
            return defaultdict(None, items) if tag == "defaultdict" else _DICT_TYPES[tag](items)
        if tag == "deque" and type(v) is list:
            return deque(decode(i) for i in v)
        if tag in ("bytes", "bytearray") and type(v) is str:
            raw = base64.b64decode(v.encode("ascii"), validate=True)
            return raw if tag == "bytes" else bytearray(raw)
        if tag == "complex" and type(v) is list and len(v) == 2 and all(type(p) is float for p in v):
            return complex(v[0], v[1])
        if tag == "int" and type(v) is str:
            return int(v, 16)
        if tag == "opaque" and type(v) is str:
            return Opaque(v)
    raise ValueError(f"not an encoded value: {str(e)[:100]}")


def dumps(e) -> str:
    return json.dumps(e, separators=(",", ":"))


def _chunks(x, depth: int = 0):
    """The encoding of ``x`` as a stream of JSON text, dict entries and set elements sorted: what
    :func:`digest` hashes.  Streaming keeps a huge output from being held twice in memory."""
    if depth > 900:
        raise RecursionError("value nested too deeply")
    t = type(x)
    if t is int:
        yield repr(x)  # decimal even when long, unlike encode(): the digest needs no JSON reader
    elif (t is list or t is tuple) and set(map(type, x)) <= _LEAVES:
        # Fast path (C speed) for sequences of scalars: the same text as the general path.
        body = json.dumps(x if t is list else list(x), separators=(",", ":"))
        yield body if t is list else '{"tuple":%s}' % body  # noqa: UP031 (JSON text: no doubled braces)
    elif t is list or t is tuple or t is deque:
        yield "[" if t is list else '{"%s":[' % t.__name__  # noqa: UP031 (as above)
        for i, v in enumerate(x):
            if i:
                yield ","
            yield from _chunks(v, depth + 1)
        yield "]" if t is list else "]}"
    elif t is set or t is frozenset or t in _DICTS:
        if t in _DICTS:
            parts = ["[%s,%s]" % ("".join(_chunks(k, depth + 1)), "".join(_chunks(v, depth + 1)))  # noqa: UP031
                     for k, v in dict.items(x)]
            tag = _DICTS[t]
        else:
            parts, tag = ["".join(_chunks(v, depth + 1)) for v in x], t.__name__
        if t is not OrderedDict:  # its order is part of its value
            parts.sort()
        yield '{"%s":[' % tag  # noqa: UP031 (JSON text: no doubled braces)
        yield ",".join(parts)
        yield "]}"
    else:
        yield dumps(encode(x))


def digest(x) -> tuple[str, int]:
    """``(SHA-256, length)`` of the sorted encoding of value ``x``: how big outputs are compared
    (equal values of equal types give equal digests, whatever their dicts' insertion order)."""
    h, size = hashlib.sha256(), 0
    for piece in _chunks(x):
        data = piece.encode("utf-8", "surrogatepass")
        h.update(data)
        size += len(data)
    return h.hexdigest(), size


# ------------------------------------------------------------------------------ child side
class _Sink(io.StringIO):
    def write(self, s):
        return len(s)

    def read(self, *a):
        raise OSError("stdin is not available")

    readline = readlines = read


class _Quiet:
    """Discard the solution's prints; without it a chatty solution could fill the pipe."""

    def __enter__(self):
        self.saved = sys.stdout, sys.stderr, sys.stdin
        sys.stdout = sys.stderr = sys.stdin = _Sink()

    def __exit__(self, *exc):
        sys.stdout, sys.stderr, sys.stdin = self.saved
        return False


class _Reporter:
    def __init__(self):
        self.fd = int(os.environ["VERISPEC_REPORT_FD"])

    def __call__(self, **obj) -> None:
        view = memoryview((json.dumps(obj, separators=(",", ":")) + "\n").encode())
        while view:
            view = view[os.write(self.fd, view):]


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:500]


def _load(path: str, ns: dict | None = None) -> dict:
    ns = {"__name__": "__verispec_solution__", "__builtins__": __builtins__} if ns is None else ns
    with open(path, encoding="utf-8") as f:
        src = f.read()
    code = compile(src, os.path.basename(path), "exec")
    with _Quiet():
        exec(code, ns)
    return ns


def _result(fn, args, kwargs) -> tuple[dict, float]:
    t0 = time.perf_counter()
    try:
        with _Quiet():
            out = fn(*args, **kwargs)
        sha, size = digest(out)
        res = {"out": encode(out)} if size <= BIG_OUTPUT_CHARS else {"digest": sha, "size": size}
    except BaseException as e:  # noqa: BLE001 - whatever the solution raises is its result
        res = {"raised": _err(e)}
    return res, time.perf_counter() - t0


def mode_outputs(report, solution: str, calls_path: str) -> None:
    with open(calls_path, encoding="utf-8") as f:
        spec = json.load(f)
    calls = [(decode(c["args"]), decode(c["kwargs"])) for c in spec["calls"]]
    try:
        fn = _load(solution)[spec["entry"]]
    except BaseException as e:  # noqa: BLE001
        report(load_error=_err(e))
        return
    report(ready=True)
    for i, (args, kwargs) in enumerate(calls):
        res, dt = _result(fn, args, kwargs)
        report(i=i, t=dt, **res)


def mode_record(report, solution: str, test: str, entry: str) -> None:
    try:
        ns = _load(solution)
        _load(test, ns)
        fn = ns[entry]
    except BaseException as e:  # noqa: BLE001
        report(error="loading the reference: " + _err(e))
        return
    count = [0]

    def recorder(*args, **kwargs):
        rec = {"i": count[0], "args": encode(list(args)), "kwargs": encode(dict(kwargs))}
        count[0] += 1
        t0 = time.perf_counter()
        try:
            with _Quiet():
                out = fn(*args, **kwargs)
        except BaseException as e:
            report(raised=_err(e), t=time.perf_counter() - t0, **rec)
            raise
        report(out=encode(out), t=time.perf_counter() - t0, **rec)
        return out

    random.seed(0)  # replay re-runs the same test: its random inputs must be the same
    try:
        with _Quiet():
            ns["check"](recorder)
    except BaseException as e:  # noqa: BLE001
        report(error="the reference fails its own test: " + _err(e))
        return
    report(done=True)


class ReplayError(Exception):
    """The test asked for a call the recording does not have (see :func:`mode_replay`)."""


class CandidateRaised(Exception):
    """Stands for the exception the candidate raised on this call in its own run."""


def mode_replay(report, prompt: str, test: str, calls_path: str, results_path: str) -> None:
    with open(calls_path, encoding="utf-8") as f:
        calls = json.load(f)["calls"]
    with open(results_path, encoding="utf-8") as f:
        results = json.load(f)
    ns = _load(prompt)
    _load(test, ns)
    count = [0]

    def replayer(*args, **kwargs):
        i = count[0]
        count[0] += 1
        if i >= len(calls) or i >= len(results):
            raise ReplayError(f"the test made call #{i}, beyond the {len(calls)} recorded")
        if encode(list(args)) != calls[i]["args"] or encode(dict(kwargs)) != calls[i]["kwargs"]:
            # The test built this call from an earlier answer that differs from the reference's.
            raise ReplayError(f"call #{i} has other arguments than the reference's run")
        r = results[i]
        if "raised" in r:
            raise CandidateRaised(r["raised"])
        if "digest" in r:
            return Opaque("output too large to replay")
        return decode(r["out"])

    random.seed(0)
    try:
        with _Quiet():
            ns["check"](replayer)
    except BaseException as e:  # noqa: BLE001
        report(passed=False, error=_err(e))
        return
    report(passed=True)


def main(argv: list[str]) -> int:
    try:
        sys.set_int_max_str_digits(0)
    except AttributeError:
        pass
    report = _Reporter()
    modes = {"outputs": (mode_outputs, 2), "record": (mode_record, 3), "replay": (mode_replay, 4)}
    if len(argv) < 1 or argv[0] not in modes or len(argv) - 1 != modes[argv[0]][1]:
        print(f"usage: code_child.py {{{'|'.join(modes)}}} FILES... (got {argv})", file=sys.stderr)
        return 2
    fn, _ = modes[argv[0]]
    fn(report, *argv[1:])
    return 0


if __name__ == "__main__":
    # os._exit: no atexit handlers or lingering threads of the solution run after the report.
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))
