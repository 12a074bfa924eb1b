"""Process-level tuning for the CPU path, applied by entry points (CLI, tests, benchmarks), not on import.

llama.cpp and torch share one OpenMP runtime (libgomp). By default its worker threads spin for a long
time at every barrier; llama.cpp hits a barrier after each graph op, and on a small or shared CPU two
pools spinning against each other (torch's and llama.cpp's, or draft's and target's) slowed a
1.5B-model forward from ~100 ms to 300–3000 ms in our measurements. A short spin keeps the
barriers fast while letting idle threads yield. It only takes effect before libgomp is loaded (i.e.
before ``import torch``); explicit user settings win.
"""

from __future__ import annotations

import os

#: Spins before an idle OpenMP thread sleeps (libgomp's default is far larger).
GOMP_SPINCOUNT = "10000"


def tune_openmp() -> None:
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
