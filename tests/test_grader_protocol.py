"""The code grader's protocol gives a program nothing to learn from and nothing to stretch
(issue 34, items 1, 3, 4 and 6): each row here is an attack run as real sandboxed code.

* **Learning from being stopped** (item 1).  The harness gives the program the strongest
  cross-run memory there is -- a file holding the last input it was answering in each earlier
  grading (what a page-cache channel carried) -- and the program flips its answer on those
  inputs.  When a run was killed at its first wrong output, that input *was* a wrong one, and the
  program was credited after as many gradings as it had wrong inputs.  Now every input is
  answered and the verdict is decided at the end, so the memory only ever holds the last input;
  and a second grading of the same text in a process reproduces the first (the verdict cache).
  Nor does the time the grader spends judging an answer show in the wait for the next input, and
  a program that ends right after a wrong last answer is judged on it all the same.
* **The request clock** (item 3).  A program shrinks its request pipe to one page and reads a
  large input slowly, doing the input's work while the grader's write is still pending; the
  input's clock now starts before its first byte is written.
* **CPU** (item 4, the grader's side).  A run is credited only within one core's worth of CPU.
* **Memory** (item 6).  Result lines within every bound of ``code_child.loads_line``, as many as
  the kept-bytes bound admits, cost the grader less than ``CHANNEL_MEMORY``; a forged line of
  other than ASCII is refused.
"""

from __future__ import annotations

import sys
import time
import tracemalloc

import pytest

from tests.helpers.grading import CORRECT_HE0, fenced, needs_data, problem
from verispec.tasks.checkers import check, coding
from verispec.tasks.datasets import Problem

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")

#: The grader's memory bound while it reads one sample's report lines (tests/test_grader_channel.py).
CHANNEL_MEMORY = 48 << 20


def _evalplus(task_id: str, entry: str, prompt: str, canonical: str, inputs: list, *, split: int = 1) -> Problem:
    ans = {"kind": "evalplus", "flavour": "humaneval", "task_id": task_id, "entry_point": entry, "prompt": prompt,
           "canonical_solution": canonical, "base_input": inputs[:split], "plus_input": inputs[split:], "atol": 0}
    return Problem(dataset="t", id=task_id, prompt="", answer=ans, checker="code", meta={})


@pytest.fixture
def fresh_verdicts(monkeypatch):
    """No verdict kept from another test (the cache is per process)."""
    monkeypatch.setattr(coding, "_VERDICTS", {})


class _Memory:
    """A perfect cross-run channel, kept by the harness: after each candidate run, the last
    ``AT <key>`` line the program wrote to its stderr is added to ``memory.txt``, which every
    later run finds in its directory.  Counts the candidate runs."""

    def __init__(self, run_module):
        self.run_module = run_module
        self.keys: list[str] = []
        self.runs = 0

    def __call__(self, path, args=(), **kwargs):
        candidate = args and args[0] == "outputs" and "AT " in str(kwargs.get("files", {}).get("solution.py"))
        if candidate:
            kwargs["files"] = dict(kwargs["files"], **{"memory.txt": "\n".join(self.keys)})
            self.runs += 1
        res = self.run_module(path, args, **kwargs)
        if candidate:
            seen = [ln[3:] for ln in res.stderr.splitlines() if ln.startswith("AT ")]
            if seen:
                self.keys.append(seen[-1])
        return res


#: Wrong on 3 of 8 inputs (n = 3, 5, 7 among 0..7); remembers where it was when a run ended.
_LEARNER = """
import os
try:
    _FLIP = set(open("memory.txt").read().split())
except OSError:
    _FLIP = set()
def is_even(n):
    os.write(2, f"AT {n}\\n".encode())
    guess = n % 2 == 0 or n in (3, 5, 7)
    return (not guess) if str(n) in _FLIP else guess
"""


def _parity_problem() -> Problem:
    return _evalplus("T/parity", "is_even", 'def is_even(n):\n    """True for even n."""\n',
                     "    return n % 2 == 0\n", [[i] for i in range(8)], split=4)


def test_a_run_is_never_stopped_at_a_wrong_output_so_nothing_is_learned(monkeypatch, fresh_verdicts):
    """Graded 6 times (verdicts not kept between gradings): the old protocol credited the learner
    on the 4th grading (each stop taught it one of its 3 wrong inputs); now it never is."""
    memory = _Memory(coding.run_module)
    monkeypatch.setattr(coding, "run_module", memory)
    p = _parity_problem()
    verdicts = []
    for _ in range(6):
        coding._VERDICTS.clear()
        verdicts.append(check(p, fenced(_LEARNER)))
    assert memory.runs == 6
    assert not any(v.correct for v in verdicts), [v.detail for v in verdicts]
    # every run answered all 8 inputs: the memory holds only the last input, never a wrong one
    assert set(memory.keys) == {"7"}, memory.keys
    assert "input #3 of 8" in verdicts[0].detail and "wrong on 3 of the 8" in verdicts[0].detail, verdicts[0].detail


def test_a_second_grading_of_the_same_text_reproduces_the_first(monkeypatch, fresh_verdicts):
    """The verdict cache: same task, same program text, same time limit -> the first verdict,
    without running the program again; another text runs."""
    memory = _Memory(coding.run_module)
    monkeypatch.setattr(coding, "run_module", memory)
    p = _parity_problem()
    first = [check(p, fenced(_LEARNER)) for _ in range(4)]
    assert memory.runs == 1 and len({(v.correct, v.detail) for v in first}) == 1, [v.detail for v in first]
    assert not first[0].correct
    right = "def is_even(n):  # AT the harness counts this run\n    return n % 2 == 0\n"
    assert check(p, fenced(right)).correct and memory.runs == 2
    assert check(p, fenced(right), timeout_s=11).correct and memory.runs == 3  # another limit: graded again


def test_a_grading_the_sandbox_could_not_run_is_not_kept(monkeypatch, fresh_verdicts):
    from verispec.tasks.sandbox import SandboxResult

    calls = []

    def broken(path, args=(), **kwargs):
        calls.append(args[0])
        return SandboxResult("error", None, "", "cannot set up", 0.0)

    p = _parity_problem()
    assert coding._evalplus_reference(p.answer, p.id).error is None  # the reference runs for real, cached
    monkeypatch.setattr(coding, "run_module", broken)
    for _ in range(2):
        assert not check(p, fenced(_LEARNER)).correct
    assert calls == ["outputs", "outputs"]  # the second grading ran again


def test_an_output_is_judged_even_when_the_program_ends_right_after_it(fresh_verdicts):
    """Output #i is judged once input #i + 1 is written, the last one once the end message is
    (or after the run, whatever ended it): a program wrong only on its last input that exits
    before reading the end message is judged on it all the same."""
    quitter = """
import os, threading, time
def is_even(n):
    if n == 7:
        threading.Thread(target=lambda: (time.sleep(0.05), os._exit(0))).start()
        return True
    return n % 2 == 0
"""
    r = check(_parity_problem(), fenced(quitter))
    assert not r.correct and "input #7 of 8; wrong output" in r.detail, r.detail


#: Writes to its stderr how long it waited for each input after answering the one before.
_TIMER = """
import os, time
_last = [None]
def is_even(n):
    if _last[0] is not None:
        os.write(2, f"WAITED {n} {time.monotonic() - _last[0]:.3f}\\n".encode())
    answer = n % 2 == 0 or n == 3
    _last[0] = time.monotonic()
    return answer
"""


def test_the_time_spent_judging_is_not_in_the_delay_before_the_next_input(monkeypatch, fresh_verdicts):
    """Judging a wrong output made slow on purpose (1.5 s, past the 1.25 s per-input limit): the
    program waits no longer for the next input, and the judging is on no clock of the program's."""
    waited = {}

    def recording(path, args=(), **kwargs):
        res = run_module(path, args, **kwargs)
        for ln in res.stderr.splitlines():
            if ln.startswith("WAITED "):
                _, n, dt = ln.split()
                waited[int(n)] = float(dt)
        return res

    def slow_when_wrong(*args):
        same = same_output(*args)
        if not same:
            time.sleep(1.5)
        return same

    run_module, same_output = coding.run_module, coding.same_output
    monkeypatch.setattr(coding, "run_module", recording)
    monkeypatch.setattr(coding, "same_output", slow_when_wrong)
    r = check(_parity_problem(), fenced(_TIMER))
    assert not r.correct and "input #3 of 8; wrong output" in r.detail, r.detail
    assert sorted(waited) == list(range(1, 8)), waited
    assert waited[4] < 1.0, waited  # the judging of #3 (1.5 s) came after input #4 was written


@needs_data
def test_a_wrong_solution_answers_every_input(fresh_verdicts):
    """HumanEval+/0 with <= for < is wrong on a few of its 1,006 inputs: every input is answered,
    the verdict names the first wrong one and how many there were."""
    p = problem("humaneval_plus", "HumanEval/0")
    r = check(p, fenced(CORRECT_HE0.replace("< threshold", "<= threshold")))
    n = len(p.answer["base_input"]) + len(p.answer["plus_input"])
    assert not r.correct and f"of the {n} inputs answered" in r.detail, r.detail


# ------------------------------------------------------------------------------ the request clock
_BIG = 200_000  # bytes of padding in each input: 49 pipe pages of 4 KiB
#: Shrinks the request pipe to one page, takes it over (dup2) and reads each input through a
#: thread that does the input's 2.5 s of work after its first page, while the grader's write of
#: the rest is still pending; the function then answers at once.
_SLOW_READER = """
import fcntl, os, re, threading, time
_REQ = int(os.environ["VERISPEC_REQUEST_FD"])
_real = os.dup(_REQ)
fcntl.fcntl(_real, 1031, 4096)  # F_SETPIPE_SZ: one page
_r, _w = os.pipe()
os.dup2(_r, _REQ)  # the child now reads what the pump forwards
_ready = {}
def _pump():
    buf = b""
    while True:
        chunk = os.read(_real, 4096)
        if not chunk:
            os.close(_w)
            return
        if not buf:
            m = re.search(rb'"args":\\[(\\d+)', chunk)
            if m:
                n = int(m.group(1))
                time.sleep(2.5)  # the input's work, on no clock if the clock waits for the write
                _ready[n] = n * n
        buf += chunk
        while b"\\n" in buf:
            line, _, buf = buf.partition(b"\\n")
            view = memoryview(line + b"\\n")
            while view:
                view = view[os.write(_w, view):]
threading.Thread(target=_pump, daemon=True).start()
def square(n, pad):
    if n in _ready:
        return _ready.pop(n)
    time.sleep(2.5)
    return n * n
"""


def _square_problem() -> Problem:
    return _evalplus("T/square", "square", 'def square(n, pad):\n    """n squared."""\n',
                     "    return n * n\n", [[3, "x" * _BIG], [5, "y" * _BIG]])


def test_an_inputs_clock_starts_before_its_first_byte_is_written(fresh_verdicts):
    """The slow reader was credited with 2.5 s of work per input against a 1 s limit (the clock
    started once the write was done); now it times out on its first input.  Controls: an honest
    fast solution passes with the same large inputs; an honest 2.5 s one times out."""
    p = _square_problem()
    assert check(p, fenced("def square(n, pad):\n    return n * n\n")).correct
    r = check(p, fenced(_SLOW_READER))
    assert not r.correct and "timeout" in r.detail and "input #0" in r.detail, r.detail
    slow = "import time\ndef square(n, pad):\n    time.sleep(2.5)\n    return n * n\n"
    r = check(p, fenced(slow))
    assert not r.correct and "timeout" in r.detail, r.detail


# ------------------------------------------------------------------------------ CPU
def test_more_than_one_core_of_cpu_is_never_credited():
    """The grader's rule on the CPU seconds of a run (the sandbox's own count, else rusage)."""
    run = coding._Run(cpu_s=3.0, duration_s=2.5)
    assert run.over_cpu() is None  # within one core + slack
    run = coding._Run(cpu_s=7.0, duration_s=3.0)
    assert "more than one core" in run.over_cpu()
    assert coding._Run(cpu_s=None, duration_s=1.0).over_cpu() is None  # nothing known: the sandbox's quota


@needs_data
def test_busy_background_processes_get_no_more_than_one_core(monkeypatch, fresh_verdicts):
    """A correct solution that forks 4 busy processes at import and takes 0.4 s per call: either
    the run is held to one core's worth of CPU (the sandbox's quota) or it is not credited."""
    seen = []

    def measured(*args, **kwargs):
        res, cpu = sandboxed(*args, **kwargs)
        seen.append((args[1][0], res.duration_s, cpu))
        return res, cpu

    sandboxed = coding._sandboxed
    monkeypatch.setattr(coding, "_sandboxed", measured)
    p = problem("humaneval", "HumanEval/0")
    check(p, fenced(CORRECT_HE0))  # the reference's runs are cached, the correct answer measured
    seen.clear()
    hog = """
import os, time
for _ in range(4):
    if os.fork() == 0:
        while True:
            pass
def has_close_elements(numbers, threshold):
    time.sleep(0.4)
    s = sorted(numbers)
    return any(b - a < threshold for a, b in zip(s, s[1:]))
"""
    r = check(p, fenced(hog))
    (mode, wall, cpu), = [s for s in seen if s[0] == "outputs"]
    assert cpu is not None, "no CPU count for the run (neither the sandbox's nor rusage)"
    if r.correct:
        assert cpu <= wall + coding.CPU_SLACK_S, (cpu, wall, r.detail)
    else:
        assert "CPU" in r.detail or "core" in r.detail, r.detail


# ------------------------------------------------------------------------------ memory
#: Values whose report lines are the costliest the grader admits per byte of text (cf.
#: tests/test_grader_channel.py), sized so that HumanEval/0's 7 calls stay within KEEP_REPORT_BYTES
#: (True) or pass it on the third call (False).  Kept decoded (before issue 34) the first two
#: cost the grader a 69 and a 79 MiB peak; kept as text, 19 and 22 MiB.
_COSTLY = {
    "one-element sets": ("[{i} for i in range(30000)]", True),
    "3-character strings": ("[chr(65 + i % 26) + chr(97 + i // 26 % 26) + str(i % 7) for i in range(160000)]", True),
    "4 MiB strings": ('"x" * (4 * 2**20 - 200)', False),
}


@needs_data
@pytest.mark.parametrize("shape", list(_COSTLY))
def test_a_samples_kept_result_lines_cost_bounded_memory(shape, fresh_verdicts):
    """Issue 34 item 6: seven such lines cost the grader +159 MiB when it kept them decoded."""
    p = problem("humaneval", "HumanEval/0")
    check(p, fenced(CORRECT_HE0))  # reference cached: only the candidate is measured
    value, all_kept = _COSTLY[shape]
    code = f"def has_close_elements(numbers, threshold):\n    return {value}\n"
    tracemalloc.start()
    try:
        r = check(p, fenced(code))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not r.correct, r.detail
    assert ("larger than" not in r.detail) is all_kept, r.detail
    print(f"{shape}: grader peak {peak / 2**20:.1f} MiB")
    assert peak < CHANNEL_MEMORY, f"grader peak {peak >> 20} MiB"


@needs_data
def test_a_forged_line_of_other_than_ascii_is_refused(fresh_verdicts):
    """The child writes ASCII only; a line with raw astral characters (12 characters each once
    written out again as JSON) is a forgery, refused before it is parsed."""
    forge = """
import json, os
def has_close_elements(numbers, threshold):
    line = json.dumps({"i": 0, "t": 0.0, "out": "\U0001F600" * 100000}, ensure_ascii=False) + "\\n"
    os.write(int(os.environ["VERISPEC_REPORT_FD"]), line.encode())
    os._exit(0)
"""
    r = check(problem("humaneval", "HumanEval/0"), fenced(forge))
    assert not r.correct and "not ASCII" in r.detail, r.detail


def test_the_cpu_count_without_the_sandboxs_own_takes_in_every_process(tmp_path, monkeypatch):
    """Where the sandbox gives no CPU count (no cgroup CPU accounting), the run's CPU is this
    process's reaped children's: two children burning 0.6 s of CPU each are counted."""
    import dataclasses

    prog = tmp_path / "burn.py"
    prog.write_text("import os, time\n"
                    "def burn():\n"
                    "    t = time.process_time()\n"
                    "    while time.process_time() - t < 0.6:\n"
                    "        pass\n"
                    "for _ in range(2):\n"
                    "    if os.fork() == 0:\n"
                    "        burn()\n"
                    "        os._exit(0)\n"
                    "for _ in range(2):\n"
                    "    os.wait()\n")
    own = []

    def without_count(*args, **kwargs):
        res = run_module(*args, **kwargs)
        own.append(res.cpu_s)
        return dataclasses.replace(res, cpu_s=None)

    run_module = coding.run_module
    monkeypatch.setattr(coding, "run_module", without_count)
    res, cpu = coding._sandboxed(prog, timeout_s=30)
    assert res.status == "passed", res
    assert cpu is not None and 1.1 < cpu < 1.2 + res.duration_s, (cpu, own, res.duration_s)
    if own[0] is not None:  # the sandbox's own count, where there is one, agrees
        assert abs(cpu - own[0]) < 0.5, (cpu, own)


def test_a_failing_reference_is_named_not_a_checker_error(fresh_verdicts):
    """A reference run that fails (here: the canonical solution raises on an input) gives the
    verdict "reference solution failed: ...", never a checker error (the gold run's Mbpp/161 under
    load: the error text had landed in the reference's sizes, and summing them raised TypeError)."""
    p = _evalplus("T/refails", "inverse", 'def inverse(n):\n    """1 // n."""\n', "    return 1 // n\n", [[1], [0]])
    r = check(p, fenced("def inverse(n):\n    return 1\n"))
    assert not r.correct and r.detail.startswith("reference solution failed: input #1: ZeroDivisionError"), r.detail
