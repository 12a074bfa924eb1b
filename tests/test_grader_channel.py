"""Report lines that attack the grader itself (issue 23, section 2): part of the attack suite of
``tests/test_grader_attacks.py``.

The grader is a process outside any cgroup: whatever a candidate writes on its report channel
is read there.  Each row of ``CHANNEL`` is a line (or a stream) a candidate writes when it is
called; graded through ``checkers.check`` under ``tracemalloc``, it must score wrong within
:data:`CHANNEL_MEMORY` bytes of the grader's memory and :data:`CHANNEL_SECONDS` seconds.  Beside
them, the most expensive lines the grader still admits must stay within the same bounds.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from dataclasses import dataclass

import pytest

from tests.helpers.grading import CORRECT_HE0, HE0, fenced, needs_data, problem
from verispec.tasks.checkers import check

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")


#: Grader memory (tracemalloc peak) and time allowed while it reads a hostile report channel.
CHANNEL_MEMORY = 48 << 20
CHANNEL_SECONDS = 30.0

_FORGE = """
import json, os, time
def has_close_elements(numbers, threshold):
    fd = int(os.environ['VERISPEC_REPORT_FD'])
    view = memoryview(LINE)
    while view:
        view = view[os.write(fd, view):]
    time.sleep(30)
"""


@dataclass(frozen=True)
class Channel:
    name: str
    line: str  # a Python expression for the bytes written (``P`` = 2**61 - 1)


CHANNEL = [
    Channel("16 MiB line of nested empty lists (+828 MiB in the old grader)",
            "b'{\"i\":0,\"t\":0.0,\"out\":[' + b','.join([b'[]'] * (16 * 2**20 // 3)) + b']}\\n'"),
    Channel("a set of 40,000 integers that all hash to 0 (quadratic decoding)",
            "(json.dumps({'i': 0, 't': 0.0, 'out': {'set': [k * (2**61 - 1) for k in range(1, 40001)]}}) + "
            "'\\n').encode()"),
    Channel("a dict whose 40,000 keys all hash to 0",
            "(json.dumps({'i': 0, 't': 0.0, 'out': {'dict': [[k * (2**61 - 1), 0] for k in range(1, 40001)]}}) + "
            "'\\n').encode()"),
    Channel("64 MiB with no newline", "b'[' * (64 << 20)"),
    Channel("nesting 200,000 deep", "b'{\"i\":0,\"out\":' + b'[' * 200000 + b']' * 200000 + b'}\\n'"),
    Channel("an integer of 100,000 decimal digits (quadratic int())",
            "b'{\"i\":0,\"t\":0.0,\"out\":' + b'7' * 100000 + b'}\\n'"),
    Channel("a million short lines", "b'{\"i\":0,\"out\":true}\\n' * 1000000"),
]


@needs_data
@pytest.mark.parametrize("attack", CHANNEL, ids=[a.name for a in CHANNEL])
@pytest.mark.parametrize("dataset,pid", HE0)
def test_hostile_report_lines_leave_the_grader_bounded(attack, dataset, pid):
    p = problem(dataset, pid)
    check(p, fenced(CORRECT_HE0))  # reference runs cached: only the attack is measured
    code = _FORGE.replace("LINE", attack.line)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        r = check(p, fenced(code), timeout_s=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    dt = time.monotonic() - t0
    assert not r.correct, r.detail
    assert peak < CHANNEL_MEMORY, f"grader peak {peak >> 20} MiB"
    assert dt < CHANNEL_SECONDS, dt


#: The most expensive lines the grader still reads (just inside every bound of
#: ``code_child.loads_line``): parsing, decoding and comparing one stays within CHANNEL_MEMORY.
def _largest_admitted():
    from verispec.tasks.checkers import code_child as cc

    n, c = cc.MAX_ITEMS - 20, cc.MAX_CONTAINERS // 2 - 20
    return {
        "2-character strings": [chr(65 + i % 26) + chr(97 + i // 26 % 26) for i in range(n)],
        "floats": [i + 0.5 for i in range(n)],
        "set of ints": {"set": list(range(n))},
        "one-element tagged sets": [{"set": [i]} for i in range(c)],
        "empty tagged dicts": [{"dict": []} for _ in range(c)],
        "one long string": "x" * (cc.MAX_LINE_CHARS - 100),
        "equal set elements (a list given to set())": [7] * n,
    }


@pytest.mark.parametrize("case", list(_largest_admitted()))
def test_the_largest_admitted_lines_cost_bounded_memory(case):
    import json

    from verispec.tasks.checkers.code_child import decode, line_problem, loads_line
    from verispec.tasks.checkers.code_compare import same_output

    line = json.dumps({"i": 0, "t": 0.0, "out": _largest_admitted()[case]}, separators=(",", ":"))
    assert line_problem(line) is None  # admitted: this is the worst the grader has to read
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        value = decode(loads_line(line)["out"])
        assert same_output("humaneval", "f", 0, value, value, [])
        same_output("mbpp", "similar_elements", 0, value, value, [])  # set-equality oracle (unhashables: False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < CHANNEL_MEMORY, f"{peak >> 20} MiB"
    assert time.monotonic() - t0 < CHANNEL_SECONDS


def test_channel_attack_count():
    """The report-channel attacks the suite holds (the others: tests/test_grader_attacks.py)."""
    assert len(CHANNEL) == 7
