"""Child entry point of the code grader, and the plain-data codec both sides share.

Runs in the sandbox as ``python -I -B code_child.py MODE FILES...`` (:func:`verispec.bench.
sandbox.run_module`); standard library only, since it runs without the package installed.
The process holds what its mode needs and nothing more -- never a verdict, a token, the
expected outputs or (in ``outputs`` mode) the tests -- and sends plain data, one JSON line per
event, on the report channel (``$VERISPEC_REPORT_FD``).  The grader in the parent decides.

Modes:

``outputs SOLUTION ENTRY``
    Reports ``{"started": true}``, loads ``SOLUTION`` (a Python file: prompt + candidate code,
    or the canonical solution) as a module not named ``__main__`` and reports ``{"ready": true}``
    (or ``{"load_error": ...}``).  Then it reads calls one at a time from the request channel
    (``$VERISPEC_REQUEST_FD``: one JSON line ``{"args": [...], "kwargs": {...}}`` per call, values
    encoded as below; ``{"end": true}`` or end of file to stop), calls ``ENTRY`` and reports
    ``{"i": i, "out": v, "t": seconds}``, ``{"i": i, "digest": hex, "size": n, "t": seconds}``
    (big outputs) or ``{"i": i, "raised": "TypeName: message", "t": seconds}``.  The grader sends
    call ``i + 1`` only once result ``i`` has arrived, so no input is in the process before its
    turn: nothing can be computed ahead, at import time or in the background, and the per-input
    time limit keeps its meaning (its clock starts before the input's first byte is written).
    The grader never stops a run at a wrong answer -- it decides after the last input -- so
    nothing the process sees, or where its run ends, depends on whether an answer was right.
``record SOLUTION TEST ENTRY``
    HumanEval: run the dataset's ``check(candidate)`` from ``TEST`` against ``SOLUTION`` (the
    canonical solution) through a recording stub.  Reports each call the test makes
    ``{"i", "args", "kwargs", "out"|"raised", "t"}``, then ``{"done": true}`` or ``{"error": ...}``.
``replay PROMPT TEST CALLS RESULTS``
    HumanEval: run ``check(candidate)`` once more, where ``candidate`` is a stub that answers
    each recorded call with the candidate's result from ``RESULTS`` (plain data from an
    ``outputs`` run; no candidate code is present).  Reports ``{"passed": bool, "error": ...}``.

Reading a line (:func:`loads_line`, used by the grader on everything the child sends): before
it is parsed, a line must be at most :data:`MAX_LINE_CHARS` long, hold at most
:data:`MAX_CONTAINERS` arrays/objects and :data:`MAX_ITEMS` items outside its strings, nest at
most :data:`MAX_DEPTH` deep (all counted on the text, in linear time) and no integer may have
more than :data:`MAX_INT_DIGITS` digits; :func:`decode` refuses a set, frozenset or dict whose
elements' hashes collide more than :data:`MAX_HASH_COLLISIONS` times (``k * (2**61 - 1)`` all
hash to 0: building such a set is quadratic).  So parsing and decoding a line costs time and
memory linear in a bounded length.  The child keeps to the same bounds: an output that would
break one travels as a digest, like a big one.

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
import re
import sys
import time
from collections import Counter, OrderedDict, defaultdict, deque

#: Integers with more bits than this travel as hex (JSON readers cap decimal digits).
_MAX_PLAIN_INT_BITS = 4000
#: Outputs whose encoding is longer than this travel as a digest (see :func:`digest`).
BIG_OUTPUT_CHARS = 4 << 20
#: Bounds on one report line, checked on its text before it is parsed (:func:`loads_line`).
MAX_LINE_CHARS = 8 << 20
MAX_CONTAINERS = 1 << 16
MAX_ITEMS = 1 << 18
MAX_DEPTH = 100
MAX_INT_DIGITS = 1300  # > the 1,205 digits of a 4,000-bit integer; longer ones travel as hex
#: Most elements of one set / frozenset / dict allowed to share a hash value.
MAX_HASH_COLLISIONS = 64


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


def safe_for_set(items: list) -> list:
    """``items`` if they can go into one set or dict in linear time: hashable, and no hash value
    shared by more than :data:`MAX_HASH_COLLISIONS` *unequal* items (equal hashes of unequal
    values make every insertion compare with all the others: ``k * (2**61 - 1)`` all hash to 0).
    Equal items may repeat freely (a list handed to ``set()`` may hold duplicates)."""
    try:
        hashes = [hash(x) for x in items]
    except TypeError as e:
        raise ValueError(f"unhashable set element or dict key: {e}") from None
    if len(hashes) - len(set(hashes)) <= MAX_HASH_COLLISIONS:
        return items  # hardly any hash value repeats
    first: dict[int, object] = {}
    others: dict[int, list] = {}  # unequal items sharing a hash value with ``first[h]``
    for h, x in zip(hashes, items):
        y = first.setdefault(h, x)
        if x is y or x == y:
            continue
        same = others.setdefault(h, [y])
        if not any(x is z or x == z for z in same):  # at most MAX_HASH_COLLISIONS comparisons
            same.append(x)
            if len(same) > MAX_HASH_COLLISIONS:
                raise ValueError(f"more than {MAX_HASH_COLLISIONS} unequal set elements or dict keys share "
                                 "one hash value")
    return items


def decode(e):
    """Inverse of :func:`encode` (an opaque value becomes a fresh :class:`Opaque`); raises
    ``ValueError`` on anything :func:`encode` cannot have produced, and on sets and dicts whose
    hashes collide massively (see :func:`safe_for_set`)."""
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
            return set(safe_for_set([decode(i) for i in v]))
        if tag == "frozenset" and type(v) is list:
            return frozenset(safe_for_set([decode(i) for i in v]))
        if tag in _DICT_TYPES and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
            keys = safe_for_set([decode(k) for k, _ in v])
            items = dict(zip(keys, (decode(val) for _, val in v)))  # a dict keeps their order
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


_STRING_RE = re.compile(r'"[^"]*"')
_NOT_BRACKET_RE = re.compile(r"[^\[\]{}]+")


def line_problem(text: str, margin: int = 0) -> str | None:
    """Why the JSON line ``text`` must not be parsed (too long, too many arrays/objects or items,
    nested too deep), or ``None``.  Linear in ``len(text)``; ``margin`` tightens every bound a
    little (the child checks an output before wrapping it into its report line)."""
    if len(text) > MAX_LINE_CHARS - 1024 * margin:
        return f"line longer than {MAX_LINE_CHARS} characters"
    # Strings out: escaped backslashes and quotes first, then every "..." (now free of quotes).
    bare = _STRING_RE.sub("", text.replace("\\\\", "").replace('\\"', ""))
    if bare.count("[") + bare.count("{") > MAX_CONTAINERS - 8 * margin:
        return f"more than {MAX_CONTAINERS} arrays or objects"
    if bare.count(",") > MAX_ITEMS - 8 * margin:
        return f"more than {MAX_ITEMS} items"
    brackets = _NOT_BRACKET_RE.sub("", bare)
    for _ in range(MAX_DEPTH - 2 * margin):
        if not brackets:
            return None
        shorter = brackets.replace("[]", "").replace("{}", "")
        if len(shorter) == len(brackets):
            return "unbalanced brackets"
        brackets = shorter
    return None if not brackets else f"nested deeper than {MAX_DEPTH - 2 * margin}"


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer of more than {MAX_INT_DIGITS} digits")
    return int(digits)


def loads_line(text: str):
    """Parse one report line within the bounds above; ``ValueError`` saying why otherwise."""
    why = line_problem(text)
    if why is not None:
        raise ValueError(why)
    try:
        return json.loads(text, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError("nested too deeply") from None


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
        res = {"digest": sha, "size": size}
        if size <= BIG_OUTPUT_CHARS:
            enc = encode(out)
            if line_problem(dumps(enc), margin=1) is None:  # else the grader would refuse the line
                res = {"out": enc}
    except BaseException as e:  # noqa: BLE001 - whatever the solution raises is its result
        res = {"raised": _err(e)}
    return res, time.perf_counter() - t0


def mode_outputs(report, solution: str, entry: str) -> None:
    requests = open(int(os.environ["VERISPEC_REQUEST_FD"]), "rb", closefd=False)  # noqa: SIM115
    report(started=True)
    try:
        fn = _load(solution)[entry]
    except BaseException as e:  # noqa: BLE001
        report(load_error=_err(e))
        return
    report(ready=True)
    i = 0
    while True:
        line = requests.readline()
        if not line.strip():
            return
        call = json.loads(line)
        if call.get("end"):
            return
        res, dt = _result(fn, decode(call["args"]), decode(call["kwargs"]))
        report(i=i, t=dt, **res)
        i += 1


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
