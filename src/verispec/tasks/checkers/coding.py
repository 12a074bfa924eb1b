"""Code answers, graded so that the graded code cannot forge its grade.

code (HumanEval, HumanEval+, MBPP+)
    The code is taken from the completion: the last fenced ```` ```python ```` (or unlabelled)
    block that defines the entry point, else the first such block; with no fence, the
    ``def entry_point`` found in the prose (with the imports above it, trailing prose dropped;
    searched within :data:`MAX_SALVAGE_CHARS` and :data:`SALVAGE_PARSE_CHARS`), else the raw
    text (a HumanEval-style continuation of the prompt).  The solution is
    ``prompt + code`` (the prompt's docstring-only stub is simply redefined when the code contains
    the whole function).

    The solution runs only in the sandbox (:func:`verispec.tasks.sandbox.run_module`), whose
    file system holds the interpreter and its standard library and nothing else of the host (no
    installed package, no dataset), in a process (:mod:`.code_child`) that holds the solution
    -- no tests, no expected outputs, no reference solution, no verdict function or token --
    and receives its inputs one at a time: call ``i + 1`` is sent only once result ``i`` has
    arrived.  Loading the solution has its own limit (:data:`IMPORT_LIMIT_S`).  It sends back
    each output as plain data with exact types (:mod:`.code_child`'s codec: an object of any
    other class arrives as an opaque value equal to nothing, anywhere it is nested; outputs over
    4 MiB, or beyond the reading bounds of :func:`.code_child.loads_line`, as a digest of their
    encoding, which must then match exactly), read here within fixed bounds of length, items
    and nesting, and compared here.  Time limits are kept from outside: the grader kills the
    run when a result is late, whatever the solution does to its own signals and clocks.
    Where the sandbox cannot run code with its guarantees (no namespaces, no opt-in), nothing is
    graded: the verdict says why.  ``truncated`` is not used: code is judged by running it.

    * HumanEval+ / MBPP+: EvalPlus differential testing.  The canonical solution runs once per
      task in its own sandboxed run on ``base_input + plus_input`` (MBPP+ inputs rebuilt with
      EvalPlus's ``mbpp_deserialize_inputs``); its outputs and times are cached.  The candidate
      then runs on the same inputs, each output compared as EvalPlus does (:mod:`.code_compare`),
      with a per-input limit of ``max(1 s, 4 x reference time)`` (plus :data:`REPORT_SLACK_S`
      and the time to move the input and output through the pipes at :data:`TRANSFER_BYTES_S`),
      counted from before the input's first byte is written (the write is inside the limit).  Every
      input is answered and the verdict decided at the end: a wrong output never stops a run, so a
      program cannot learn which input it failed from being stopped.  CPU beyond one core's worth
      fails it.  A verdict is kept per (:data:`GRADER_VERSION`, task, program text, time limit) per
      process, so a second grading of the same completion reproduces the first.
    * HumanEval: the task's ``check(candidate)`` is run once with the canonical solution behind a
      recording stub (sandboxed, cached), which yields the calls the test makes.  The candidate
      runs on exactly those calls.  Outputs identical to the reference's pass; otherwise the
      test's own assertions decide, re-run in a third sandboxed process where ``candidate``
      answers each call with the candidate's recorded plain output (so tolerances and
      several-valid-answer tests keep their meaning).  Limitations: a test that calls the
      candidate with arguments built from an earlier *different* answer fails (the reference
      never made that call), and helpers the prompt defines are the prompt's own.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..sandbox import refusal, run_module
from . import code_child
from .base import CheckResult
from .code_child import decode, digest, dumps, encode, loads_line
from .code_compare import Digest, expected_output, mbpp_deserialize_inputs, same_output

# Possessive quantifiers: a fence line without a newline fails in one pass instead of retrying
# every split of its characters (quadratic); no match is lost, since every split needs that newline.
_FENCE_RE = re.compile(r"^[ \t]*+```[ \t]*+([\w+#.-]*+)[^\n]*+\n", re.MULTILINE)
_FENCE_END_RE = re.compile(r"^[ \t]*+```[ \t]*+$", re.MULTILINE)
_PY_LANGS = {"python", "py", "python3", "py3", ""}
#: Longest unfenced completion searched for the code amid its prose; a longer one is taken whole
#: (as one that parses is).  Each parse costs about 1 s per MiB; an honest completion is a few KiB
#: (256 new tokens by default, ~1 KiB), so none comes near this.
MAX_SALVAGE_CHARS = 32 * 1024
#: Most characters the search for the code amid prose parses in all (besides the two parses of the
#: whole text) before it stops, as it does after 300 lines: a completion of 4 KiB gets 64 tries,
#: while code with prose around it takes one try per line of trailing prose or leading helpers.
SALVAGE_PARSE_CHARS = 256 * 1024


def _code_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` for each fenced block; an unclosed last fence runs to the end."""
    blocks = []
    pos = 0
    while True:
        m = _FENCE_RE.search(text, pos)
        if not m:
            break
        lang = m.group(1).lower()
        end = _FENCE_END_RE.search(text, m.end())
        if end is None:
            blocks.append((lang, text[m.end() :]))
            break
        blocks.append((lang, text[m.end() : end.start()]))
        pos = end.end()
    return blocks


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The code in a completion (see the module docstring for the rule)."""
    blocks = [b for lang, b in _code_blocks(completion) if lang in _PY_LANGS]
    if not blocks:
        return _salvage_unfenced(completion, entry_point)
    if entry_point:
        # [^\S\n]*, not \s*: a match may start at any line, and \s* would rescan every run of
        # blank lines from each of its lines (quadratic) to find the same "def" lines.
        pat = re.compile(rf"^[^\S\n]*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
        defining = [b for b in blocks if pat.search(b)]
        if defining:
            return defining[-1]
    return blocks[0]


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def _salvage_unfenced(text: str, entry_point: str | None) -> str:
    """No code fence: the raw text if it parses (code, or a HumanEval-style continuation), else
    the code around ``def entry_point`` inside prose.

    In the second case the code runs from the furthest top-level statement above the ``def``
    from which everything still parses (imports, helpers) to the longest following stretch that
    parses (trailing prose dropped).  The search stops after 300 lines either way, or once it has
    parsed :data:`SALVAGE_PARSE_CHARS`; a text over :data:`MAX_SALVAGE_CHARS` is not searched.
    """
    if not entry_point or len(text) > MAX_SALVAGE_CHARS or _parses(text) or _parses("def _f():\n" + text):
        return text
    lines = text.splitlines(keepends=True)
    pat = re.compile(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(")
    idx = next((i for i, ln in enumerate(lines) if pat.match(ln)), None)
    if idx is None:
        return text
    offsets = [0]  # offsets[i]: where line i starts in text, so lines[a:b] is text[offsets[a]:offsets[b]]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    budget = SALVAGE_PARSE_CHARS

    def parses(a: int, b: int) -> bool | None:
        """Whether lines[a:b] parse; None once the budget is spent."""
        nonlocal budget
        budget -= offsets[b] - offsets[a]
        return None if budget < 0 else _parses(text[offsets[a] : offsets[b]])

    end = None
    for e in range(len(lines), idx, -1):
        ok = parses(idx, e)
        if ok is None:
            break
        if ok:
            end = e
            break
        if len(lines) - e > 300:
            break
    if end is None:
        return "".join(lines[idx:])
    start = idx
    for s in range(idx - 1, max(-1, idx - 300), -1):
        line = lines[s]
        if not line.strip() or line[0] in " \t":
            continue  # only top-level statements can start the chunk
        if not parses(s, end):
            break
        start = s
    return "".join(lines[start:end])


def build_code_program(prompt: str, completion: str, entry_point: str) -> tuple[str, str]:
    """``(solution source, extracted code)``: ``prompt + code`` (see the module docstring)."""
    code = extract_code(completion, entry_point)
    if not prompt.endswith("\n"):
        prompt += "\n"
    pat = re.compile(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
    if pat.search(code) or code.lstrip().startswith(("import ", "from ", "def ", "class ", "@")):
        return prompt + "\n" + code + "\n", code  # whole function(s): redefine the prompt's stub
    return prompt + code + "\n", code  # a continuation of the prompt (function body)


# ------------------------------------------------------------------------------ sandbox runs
_CHILD = Path(code_child.__file__).resolve()
#: Wall-clock limit of a one-off reference run (canonical solution) of a task.
REFERENCE_TIMEOUT_S = 300.0
#: Memory limit of EvalPlus runs (EvalPlus itself uses 4 GiB); HumanEval runs get 1 GiB.
EVALPLUS_MEMORY_MB = 4096
HUMANEVAL_MEMORY_MB = 1024
#: Per-input time limit of EvalPlus: max(MIN_CALL_S, CALL_FACTOR x the reference's time).
MIN_CALL_S, CALL_FACTOR = 1.0, 4.0
#: Slack on every per-input deadline for the report's trip through the pipe.
REPORT_SLACK_S = 0.25
#: Extra time per byte of input and (reference) output on each per-input deadline: the child
#: decodes the input and encodes the output inside that window.
TRANSFER_BYTES_S = 10e6
#: Seconds for the child to start (trusted code only), then for the solution to load (its
#: module-level code runs then, with no input in the process).
STARTUP_S, IMPORT_LIMIT_S = 10.0, 3.0
#: Disk (tmpfs) for the run directory of code runs: inputs of some MBPP+ tasks are large.
CODE_DISK_MB = 256
#: Longest report line read from a child (see :func:`.code_child.loads_line`).
REPORT_LINE_BYTES = code_child.MAX_LINE_CHARS
#: Most report text the grader keeps from one candidate run (HumanEval keeps its outputs for the
#: replay; EvalPlus compares each output as it arrives and keeps none).
KEEP_REPORT_BYTES = 8 << 20


@dataclass
class _Run:
    """What an ``outputs`` run of :mod:`.code_child` reported, in call order.

    With a ``judge`` every output is judged and dropped (``wrong`` / ``first_wrong``); without
    one each result is kept as compact JSON text (:class:`_Kept`), never as decoded objects:
    decoded values cost up to 30x their text (issue 34, item 6).
    """

    results: list = field(default_factory=list)  # _Kept, one per call (runs without a judge)
    answered: int = 0  # results received (judged or kept)
    times: list[float] = field(default_factory=list)  # the child's own clock (trusted code only)
    sizes: list[int] = field(default_factory=list)  # length of each result's report line
    load_error: str | None = None
    failure: str | None = None  # why the run broke off (protocol, time, memory), with ``failed_at``
    failed_at: int | None = None  # the call it broke off on
    wrong: int = 0  # outputs the judge refused
    first_wrong: tuple[int, str] | None = None  # (call, why) of the first of them
    status: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    cpu_s: float | None = None  # CPU seconds of all the run's processes, where known (see _sandboxed)

    def result(self, i: int) -> dict:
        """Kept result ``i`` as ``{"out": encoded} | {"raised": str} | {"digest": hex}``."""
        return loads_line(self.results[i].text.decode())

    def over_cpu(self) -> str | None:
        """Why the run used more than one core's worth of CPU, or ``None`` (see :data:`CPU_SLACK_S`)."""
        if self.cpu_s is None or self.cpu_s <= self.duration_s + CPU_SLACK_S:
            return None
        return (f"the run used {self.cpu_s:.1f} CPU seconds in {self.duration_s:.1f} s: more than one core "
                "(a run gets one core's worth of CPU)")


@dataclass(frozen=True)
class _Kept:
    """One kept result: its kind, its compact JSON text ``{"out"|"raised"|"digest": ...}`` and
    whether an opaque value is nested in it (then it is identical to nothing)."""

    kind: str
    text: bytes
    opaque: bool = False


#: Bumped whenever a change below can change a code verdict: part of the verdict cache's key.
GRADER_VERSION = "code/2026-12-03 (issue 34: no stop at the first wrong output, request clock, CPU)"
#: CPU seconds a run may use beyond one core's worth of its wall-clock time (start-up, clock ticks).
CPU_SLACK_S = 1.0
#: Verdicts kept per process (see :func:`_verdict_once`); each holds a bool and a short detail.
VERDICT_CACHE_SIZE = 4096


def _read_line(line: str, why: list | None = None) -> dict | None:
    """One report line as a dict, read within :func:`.code_child.loads_line`'s bounds, or ``None``
    (the reason appended to ``why``).  The child writes ASCII only (``json.dumps``' default): any
    other character is a forged line, refused before it can expand 12-fold when the kept text is
    written out again (``\\ud83d\\ude00`` for one astral character)."""
    if not line.isascii():
        if why is not None:
            why.append("not ASCII")
        return None
    try:
        obj = loads_line(line)
    except ValueError as e:
        if why is not None:
            why.append(str(e))
        return None
    return obj if isinstance(obj, dict) else None


# ------------------------------------------------------------------------------ CPU of a run
_CPU_LOCK = threading.Lock()
_RUNS = {"in_flight": 0, "started": 0}  # sandboxed runs of this process (under _CPU_LOCK)
_GRADING = threading.local()  # .sandbox_error: a run of the current grading could not be set up


def _sandboxed(*args, **kwargs):
    """``run_module(*args, **kwargs)`` and the CPU seconds of every process of the run.

    The sandbox's own count (``SandboxResult.cpu_s``) where it gives one; else this process's
    reaped children's CPU (``RUSAGE_CHILDREN``, which takes in every process of the run: each is
    reaped inside the run and its time added up the chain to the relay) over the run -- only when
    no other run of this process overlapped it, since the count is per process.
    """
    import resource

    def children_cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    with _CPU_LOCK:
        _RUNS["in_flight"] += 1
        _RUNS["started"] += 1
        alone, started, before = _RUNS["in_flight"] == 1, _RUNS["started"], children_cpu()
    try:
        res = run_module(*args, **kwargs)
    finally:
        with _CPU_LOCK:
            _RUNS["in_flight"] -= 1
            alone = alone and _RUNS["started"] == started
            after = children_cpu()
    if res.status == "error":
        _GRADING.sandbox_error = True
    cpu = getattr(res, "cpu_s", None)
    if not isinstance(cpu, (int, float)) or isinstance(cpu, bool):
        cpu = after - before if alone else None
    return res, cpu


# ------------------------------------------------------------------------------ one run
def _outputs_run(solution: str, entry: str, calls: list[dict], *, timeout_s: float, memory_mb: int,
                 limits: list[float] | None = None, judge=None, out_sizes: list[int] | None = None,
                 keep_bytes: int | None = None) -> _Run:
    """Run ``solution``'s ``entry`` on ``calls`` in the sandbox, one call at a time.

    Call ``i + 1`` is sent once result ``i`` has arrived.  ``limits[i]``: seconds allowed for call
    ``i`` (else the whole ``timeout_s``), plus slack for the pipe and for the sizes of the input
    and of ``out_sizes[i]`` (the reference's output), counted from *before* the input's first byte
    is written (:mod:`..sandbox.watch`: a program that reads slowly spends its own time).

    ``judge(i, value) -> None | str`` says why the decoded output ``value`` fails.  A wrong output
    does **not** stop the run: every input is answered and the verdict is decided at the end, so
    where a run stops never depends on whether an answer was right, and a program that remembers
    where it was stopped (in whatever survives a run) learns nothing it can use in a later grading
    of the same text (issue 34, item 1).  Output ``i`` is judged once input ``i + 1`` has been
    written (or at the end), so the time the judging takes is not in the delay before the next
    input either.  Runs stop only for what the program does whatever its answers' correctness:
    a late result, a malformed line, an unreadable output, an exit.  Judged outputs are not kept.
    ``keep_bytes``: most result text kept for the caller (more fails the run).
    """
    run = _Run()
    n = len(calls)
    stage = ["start"]  # start -> load -> calls
    kept = [0]
    pending: list = []  # [(i, decoded output | raised text)]: the output not yet judged
    requests = [(dumps(c) + "\n").encode() for c in calls]

    def judge_pending() -> None:
        while pending:
            i, value, raised = pending.pop()
            why = raised if raised is not None else judge(i, value)
            if why:
                run.wrong += 1
                if run.first_wrong is None:
                    run.first_wrong = (i, why)

    def send(i: int):
        then = judge_pending if judge is not None else None
        if i >= n:
            return 2.0, b'{"end":true}\n', then  # time to exit after the last result
        base = limits[i] + REPORT_SLACK_S if limits else timeout_s
        extra = (len(requests[i]) + (out_sizes[i] if out_sizes else 0)) / TRANSFER_BYTES_S
        return base + extra, requests[i], then

    def fail(why: str, at: int | None = None):
        run.failure, run.failed_at = why, at
        return None

    def on_report(line: str):
        judge_pending()  # normally done already: the program answered before reading its input
        why: list = []
        obj = _read_line(line, why)
        if obj is None:
            return fail("malformed report line from the solution's process" + "".join(f" ({w})" for w in why),
                        run.answered)
        if stage[0] == "start":
            if obj.get("started") is not True:
                return fail("malformed report: the child did not start")
            stage[0] = "load"
            return IMPORT_LIMIT_S
        if stage[0] == "load":
            if "load_error" in obj:
                run.load_error = str(obj["load_error"])[:500]
                return None
            if obj.get("ready") is not True:
                return fail("malformed report: results before the solution was loaded")
            stage[0] = "calls"
            return send(0)
        i = run.answered
        kinds = [k for k in ("out", "raised", "digest") if k in obj]
        if i >= n or obj.get("i") != i or len(kinds) != 1:
            return fail(f"malformed report for call #{i}", i)
        kind, t = kinds[0], obj.get("t")
        payload = obj.pop(kind) if kind == "out" else str(obj[kind])[:500]
        del obj
        value = None
        try:
            if kind != "raised":
                value = _value({kind: payload})  # refuses what cannot be compared
        except (ValueError, TypeError, RecursionError) as e:
            return fail(f"unreadable output: {e}", i)
        run.answered += 1
        run.times.append(t if type(t) is float else float(t) if type(t) is int and abs(t) < 1 << 53 else 0.0)
        run.sizes.append(len(line))
        if judge is not None:
            pending.append((i, value, payload if kind == "raised" else None))
        else:
            del value
            text = dumps({kind: payload})
            kept[0] += len(text)
            if keep_bytes is not None and kept[0] > keep_bytes:
                return fail(f"outputs larger than {keep_bytes >> 20} MiB in all", i)
            run.results.append(_Kept(kind, text.encode("ascii"), kind == "out" and _has_opaque(payload)))
        return send(i + 1)

    total = timeout_s + STARTUP_S + IMPORT_LIMIT_S
    res, run.cpu_s = _sandboxed(_CHILD, ["outputs", "solution.py", entry], files={"solution.py": solution},
                                timeout_s=total, memory_mb=memory_mb, max_disk_mb=CODE_DISK_MB,
                                on_report=on_report, first_report_s=STARTUP_S, max_line_bytes=REPORT_LINE_BYTES)
    if judge is not None:
        judge_pending()  # the last output, when the program ended before reading what followed it
    run.status, run.stderr, run.duration_s = res.status, res.stderr, res.duration_s
    if run.failure is None and run.load_error is None and run.answered < n:
        k = run.failed_at = run.answered
        if res.status == "timeout":
            if stage[0] == "calls":
                limit = f" ({limits[k]:.2f}s)" if limits else ""
                # res.detail: the run's CPU budget over all its processes was spent (the sandbox's)
                run.failure = f"timeout: {res.detail or f'time limit{limit} exceeded'} on input #{k}"
            else:
                run.failure = f"timeout: the solution did not load within {IMPORT_LIMIT_S:g} s"
        elif res.detail:
            run.failure = res.detail
        else:
            tail = (res.stderr.strip().splitlines() or [""])[-1][:300]
            run.failure = (f"the solution's process ended ({res.status}, rc={res.returncode}) "
                           f"after {k} of {n} inputs {tail}").strip()
    return run


def _value(res: dict):
    """The output a result stands for: decoded plain data, or a :class:`Digest` of a big one."""
    return Digest(res["digest"]) if "digest" in res else decode(res["out"])


def _reference_key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


_REF_CACHE: dict[str, object] = {}
_REF_LOCKS: dict[str, threading.Lock] = {}
_REF_GLOBAL_LOCK = threading.Lock()


def _cached(key: str, compute):
    """``compute()`` once per key (per process); failures of the sandbox itself are not cached."""
    with _REF_GLOBAL_LOCK:
        lock = _REF_LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key in _REF_CACHE:
            return _REF_CACHE[key]
        value, cacheable = compute()
        if cacheable:
            _REF_CACHE[key] = value
        return value


# ------------------------------------------------------------------------------ verdict cache
_VERDICTS: dict[str, tuple[bool, str]] = {}  # key -> (correct, detail), oldest first
_VERDICT_BUSY: dict[str, list] = {}  # key -> [lock, gradings waiting on it]: one grading per key at a time
_VERDICT_LOCK = threading.Lock()  # guards both dicts


def _verdict_key(ans: dict, task_id: str, program: str, timeout_s: float) -> str:
    """(grader version, the task as graded, the program's text, the time limit)."""
    task = {k: v for k, v in ans.items() if k in ("kind", "flavour", "entry_point", "prompt", "canonical_solution",
                                                    "test", "base_input", "plus_input", "atol")}
    return _reference_key(GRADER_VERSION, task_id, task, program, float(timeout_s))


def _verdict_once(key: str, compute) -> tuple[bool, str]:
    """``compute() -> ((correct, detail), cacheable)`` once per key in this process: a second
    grading of the same program text for the same task gets the first one's verdict.

    So a program cannot learn anything from one grading that changes the next in this process
    (the bench grades one completion several times: lossless rules reproduce target-only's text,
    several rules run on the same problems; ``regrade`` grades every stored run).  At most
    :data:`VERDICT_CACHE_SIZE` verdicts, the least recently used dropped first; a grading where
    the sandbox could not run is not kept.
    """
    with _VERDICT_LOCK:
        if key in _VERDICTS:
            _VERDICTS[key] = _VERDICTS.pop(key)  # most recently used last
            return _VERDICTS[key]
        busy = _VERDICT_BUSY.setdefault(key, [threading.Lock(), 0])
        busy[1] += 1
    try:
        with busy[0]:
            with _VERDICT_LOCK:
                if key in _VERDICTS:
                    return _VERDICTS[key]
            verdict, cacheable = compute()
            if cacheable:
                with _VERDICT_LOCK:
                    _VERDICTS[key] = verdict
                    while len(_VERDICTS) > VERDICT_CACHE_SIZE:
                        del _VERDICTS[next(iter(_VERDICTS))]
            return verdict
    finally:
        with _VERDICT_LOCK:
            busy[1] -= 1
            if busy[1] == 0:
                del _VERDICT_BUSY[key]


# ------------------------------------------------------------------------------ EvalPlus
@dataclass
class _EvalPlusRef:
    calls: list[dict]
    inputs: list  # decoded (as the candidate receives them), for the special oracles
    expected: list  # decoded reference outputs, already mapped by ``expected_output``
    limits: list[float]
    sizes: list[int] = field(default_factory=list)  # length of each reference result's report line
    error: str | None = None


def _evalplus_reference(ans: dict, task_id: str) -> _EvalPlusRef:
    flavour, entry = ans.get("flavour", "humaneval"), ans["entry_point"]
    raw = list(ans.get("base_input") or []) + list(ans.get("plus_input") or [])

    def compute():
        inputs = mbpp_deserialize_inputs(task_id, raw) if flavour == "mbpp" else raw
        calls = [{"args": encode(list(inp)), "kwargs": encode({})} for inp in inputs]
        solution = ans["prompt"] + ans["canonical_solution"]
        run = _outputs_run(solution, entry, calls, timeout_s=REFERENCE_TIMEOUT_S, memory_mb=EVALPLUS_MEMORY_MB)
        why = run.load_error or run.failure
        if why is None:
            bad = next((i for i, r in enumerate(run.results) if r.kind == "raised"), None)
            why = None if bad is None else f"input #{bad}: {run.result(bad)['raised']}"
        if why is not None:
            err = f"reference solution failed: {why}"
            return _EvalPlusRef(calls, inputs, [], [], error=err), run.status != "error"
        expected = [expected_output(flavour, entry, _value(run.result(i))) for i in range(len(run.results))]
        limits = [max(MIN_CALL_S, CALL_FACTOR * t) for t in run.times]
        return _EvalPlusRef(calls, [decode(c["args"]) for c in calls], expected, limits, run.sizes), True

    return _cached(_reference_key("evalplus", task_id, flavour, entry, ans["prompt"], ans["canonical_solution"], raw),
                   compute)


def _broke_off(run: _Run, n: int) -> tuple[int, str] | None:
    """``(input, why)`` of the first thing wrong with a judged run, in input order, or ``None``."""
    found = []
    if run.first_wrong is not None:
        found.append(run.first_wrong)
    if run.failure is not None:
        found.append((n if run.failed_at is None else run.failed_at, run.failure))
    cpu = run.over_cpu()
    if cpu is not None:
        found.append((n, cpu))
    return min(found, key=lambda f: f[0]) if found else None


def _grade_evalplus(ans: dict, task_id: str, program: str, code: str, timeout_s: float) -> CheckResult:
    ref = _evalplus_reference(ans, task_id)
    if ref.error:
        return CheckResult(False, code, ref.error)
    flavour, entry = ans.get("flavour", "humaneval"), ans["entry_point"]
    atol = float(ans.get("atol") or 0)
    n, n_base = len(ref.calls), len(ans.get("base_input") or [])

    def judge(i: int, out):
        return None if same_output(flavour, entry, atol, out, ref.expected[i], ref.inputs[i]) else "wrong output"

    # EvalPlus: per input max(1 s, 4 x reference time); the whole run up to the sum of those
    # limits + 2 s (EvalPlus also caps it at 61 s; not done here, so a solution as fast as the
    # reference still passes on a loaded machine), plus the per-input slack.  timeout_s is a floor.
    # A wrong output does not shorten the run (see _outputs_run): a wrong solution may take the
    # whole budget, the same as a right one.
    moved = sum(len(dumps(c)) for c in ref.calls) + sum(ref.sizes)
    total = max(timeout_s, sum(ref.limits) + n * REPORT_SLACK_S + moved / TRANSFER_BYTES_S + 2.0)
    run = _outputs_run(program, entry, ref.calls, timeout_s=total, memory_mb=EVALPLUS_MEMORY_MB,
                       limits=ref.limits, judge=judge, out_sizes=ref.sizes)
    if run.load_error:
        return CheckResult(False, code, f"failed at load; {run.load_error}")
    first = _broke_off(run, n)
    if first is not None:
        i, why = first
        stage = "base" if i < n_base else "plus" if i < n else "run"
        wrong = f"; wrong on {run.wrong} of the {run.answered} inputs answered" if run.wrong else ""
        if i >= n:
            return CheckResult(False, code, f"failed at {stage}; {run.answered} of {n} inputs answered; {why}{wrong}")
        inp = repr(ref.inputs[i])[:300]
        return CheckResult(False, code, f"failed at {stage}; input #{i} of {n}; {why}{wrong}; input {inp}")
    return CheckResult(True, code, f"passed ({n} inputs)")


# ------------------------------------------------------------------------------ HumanEval
@dataclass
class _HumanEvalRef:
    calls: list[dict]
    results: list[dict]
    error: str | None = None
    texts: list[bytes] = field(default_factory=list)  # each result's "out" as compact JSON text


def _humaneval_reference(ans: dict) -> _HumanEvalRef:
    """Record the calls the task's ``check(candidate)`` makes, against the canonical solution."""

    def compute():
        calls, results, end = [], [], {}

        def on_report(line: str):
            obj = _read_line(line)
            if obj is None:
                end["error"] = "malformed report"
                return None
            if "i" in obj:
                calls.append({"args": obj.get("args"), "kwargs": obj.get("kwargs")})
                results.append({"out": obj["out"]} if "out" in obj else {"raised": str(obj.get("raised"))})
                return REFERENCE_TIMEOUT_S
            end.update(obj)
            return 2.0

        files = {"solution.py": ans["prompt"] + ans.get("canonical_solution", ""), "test.py": ans["test"]}
        res, _ = _sandboxed(_CHILD, ["record", "solution.py", "test.py", ans["entry_point"]], files=files,
                            timeout_s=REFERENCE_TIMEOUT_S, memory_mb=HUMANEVAL_MEMORY_MB, max_disk_mb=CODE_DISK_MB,
                            on_report=on_report, first_report_s=REFERENCE_TIMEOUT_S, max_line_bytes=REPORT_LINE_BYTES)
        if end.get("done") is True and calls:
            texts = [dumps(r["out"]).encode() if "out" in r else b"" for r in results]
            return _HumanEvalRef(calls, results, texts=texts), True
        why = end.get("error") or ("the test never called the candidate" if end.get("done") else
                                   f"sandbox status {res.status}: {res.stderr[-300:]}")
        return _HumanEvalRef([], [], f"reference run failed: {why}"), res.status != "error"

    key = _reference_key("humaneval", ans["entry_point"], ans["prompt"], ans.get("canonical_solution"), ans["test"])
    return _cached(key, compute)


def _digest_of(res: dict) -> str:
    return res["digest"] if "digest" in res else digest(decode(res["out"]))[0]


def _has_opaque(e) -> bool:
    """True if the encoded value ``e`` holds an opaque value anywhere (iterative: no recursion)."""
    stack = [e]
    while stack:
        x = stack.pop()
        if type(x) is list:
            stack.extend(x)
        elif type(x) is dict:
            if "opaque" in x:
                return True
            stack.extend(x.values())
    return False


def _same_result(run: _Run, i: int, ref: _HumanEvalRef) -> bool:
    """Candidate result ``i`` identical to the reference's: the same exact encoding (big ones by
    digest), or the same exception type.  An opaque value is identical to nothing, wherever it is
    nested (two different iterators both encode as ``{"opaque": "builtins.list_iterator"}``).
    Compared on the kept text; only a digest needs the output decoded, one at a time."""
    a, b = run.results[i], ref.results[i]
    if a.kind == "raised" or "raised" in b:
        return a.kind == "raised" and "raised" in b and \
            run.result(i)["raised"].split(":")[0] == b["raised"].split(":")[0]
    if a.opaque or _has_opaque(b.get("out")):
        return False
    try:
        if a.kind == "digest" or "digest" in b:
            return _digest_of(run.result(i)) == _digest_of(b)
        return a.text == b'{"out":' + ref.texts[i] + b"}"
    except (ValueError, TypeError, RecursionError):
        return False  # not identical; the test's own assertions decide


def _grade_humaneval(ans: dict, program: str, code: str, timeout_s: float) -> CheckResult:
    ref = _humaneval_reference(ans)
    if ref.error:
        return CheckResult(False, code, ref.error)
    entry, n = ans["entry_point"], len(ref.calls)
    run = _outputs_run(program, entry, ref.calls, timeout_s=timeout_s, memory_mb=HUMANEVAL_MEMORY_MB,
                       keep_bytes=KEEP_REPORT_BYTES)
    if run.load_error:
        return CheckResult(False, code, f"failed at load; {run.load_error}")
    if run.failure:
        return CheckResult(False, code, f"failed at test; {run.failure}")
    cpu = run.over_cpu()
    if cpu:
        return CheckResult(False, code, f"failed at test; {cpu}")
    if all(_same_result(run, i, ref) for i in range(n)):
        return CheckResult(True, code, f"passed ({n} test calls, outputs identical to the reference)")
    # Outputs differ from the reference's: the task's own assertions decide (tolerances,
    # several valid answers), evaluated on the candidate's plain outputs in a separate run.
    verdict: dict = {}

    def on_report(line: str):
        verdict.update(_read_line(line) or {"passed": False, "error": "malformed report"})
        return 2.0

    # The kept texts joined as they are: no decoded copy of the outputs in this process.
    results = b"[" + b",".join(r.text for r in run.results) + b"]"
    del run
    files = {"prompt.py": ans["prompt"], "test.py": ans["test"],
             "calls.json": json.dumps({"entry": entry, "calls": ref.calls}), "results.json": results}
    res, _ = _sandboxed(_CHILD, ["replay", "prompt.py", "test.py", "calls.json", "results.json"], files=files,
                        timeout_s=max(timeout_s, 10.0), memory_mb=HUMANEVAL_MEMORY_MB, max_disk_mb=CODE_DISK_MB,
                        on_report=on_report, first_report_s=max(timeout_s, 10.0), max_line_bytes=REPORT_LINE_BYTES)
    if verdict.get("passed") is True:
        return CheckResult(True, code, f"passed ({n} test calls)")
    why = verdict.get("error") or f"sandbox status {res.status}: {res.stderr[-300:]}"
    return CheckResult(False, code, f"failed at test; {why}")


def grade(problem, completion: str, timeout_s: float = 10.0, *, truncated: bool = False) -> CheckResult:
    """Grade a code completion (``truncated`` is not used: code is judged by running it).

    The verdict is kept per (grader version, task, program text, time limit) in this process
    (:func:`_verdict_once`): grading the same program again reproduces the first verdict.
    """
    ans = problem.answer
    if not isinstance(ans, dict) or "entry_point" not in ans or "prompt" not in ans:
        return CheckResult(False, None, "problem.answer is not a code-task dict")
    program, code = build_code_program(ans["prompt"], completion, ans["entry_point"])
    why = refusal()
    if why is not None:
        return CheckResult(False, code, f"not graded: {why}")
    task_id = ans.get("task_id", problem.id)
    if ans.get("kind") != "evalplus" and "test" not in ans:
        return CheckResult(False, code, "problem.answer has no 'test'")

    def compute():
        _GRADING.sandbox_error = False
        if ans.get("kind") == "evalplus":
            r = _grade_evalplus(ans, task_id, program, code, timeout_s)
        else:
            r = _grade_humaneval(ans, program, code, timeout_s)
        return (r.correct, r.detail), not _GRADING.sandbox_error

    correct, detail = _verdict_once(_verdict_key(ans, task_id, program, timeout_s), compute)
    return CheckResult(correct, code, detail)
