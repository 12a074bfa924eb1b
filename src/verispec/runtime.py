"""Process-level tuning for the CPU path, applied by entry points (CLI, tests, benchmarks), not on import.

OpenMP. llama.cpp and torch share one OpenMP runtime (libgomp). By default its worker threads spin
for a long time at every barrier; llama.cpp hits a barrier after each graph op, and on a small or
shared CPU two pools spinning against each other (torch's and llama.cpp's, or draft's and target's)
slowed a 1.5B-model forward from ~100 ms to 300–3000 ms in our measurements. A short spin keeps the
barriers fast while letting idle threads yield. It only takes effect before libgomp is loaded (i.e.
before ``import torch``); explicit user settings win.

Allocator. Every SD step allocates probability rows of the whole vocabulary (0.6 MB per row for
151,936 tokens) and frees them a step later. glibc serves blocks that large with ``mmap`` and returns
them with ``munmap``, so each new row is fresh memory and every page of it faults on first touch:
1,600–1,800 page faults per γ = 5 step on the embedded pair, which made the sampling pipelines and
the rule take ~22 ms of a ~200 ms step on a 2-core VM. Raising glibc's mmap threshold to 32 MiB
(``mallopt(M_MMAP_THRESHOLD)``, with the heap trimmed only beyond 128 MiB) keeps such blocks in
the heap and reuses them (``benchmarks/step_profile.py`` prints the faults per step). Explicit
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` settings win; other C libraries are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from verispec.params import check_number
from verispec.settings import MAX_THREADS

#: Spins before an idle OpenMP thread sleeps (libgomp's default is far larger).
GOMP_SPINCOUNT = "10000"
#: glibc: blocks at least this large are mmapped (and unmapped when freed)
MMAP_THRESHOLD = 32 << 20
#: glibc: free memory at the top of the heap beyond this is returned to the system
TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameter numbers


def env_threads() -> int | None:
    """``$VERISPEC_THREADS``: llama.cpp's thread count, an integer in 1..4096; None where unset or empty. ``0``, a
    negative count, ``nan`` or a word is refused (``ValueError`` naming the variable): clamping it to one
    thread, as before, ran a machine's worth of work on one core without a word."""
    raw = os.environ.get("VERISPEC_THREADS", "")
    if not raw.strip():      # empty is unset, as llama.cpp's backend reads it
        return None
    try:
        return int(check_number(raw, "VERISPEC_THREADS", kind=int, lo=1, hi=MAX_THREADS))
    except ValueError as exc:
        raise ValueError(f"{exc}: set it to a number of threads (e.g. 4) or unset it for all cores") from None


def check_environment() -> None:
    """Refuse verispec's environment variables holding values that mean nothing (one ``ValueError`` naming
    the variable), before a command starts: ``VERISPEC_THREADS`` (:func:`env_threads`), and
    ``VERISPEC_CACHE`` / ``VERISPEC_DATA`` naming a file rather than a folder. (The sandbox's variables are
    checked by the sandbox.)"""
    env_threads()
    for name, what in (("VERISPEC_CACHE", "the cache folder"), ("VERISPEC_DATA", "the offline datasets' folder")):
        value = os.environ.get(name)
        if value and os.path.isfile(os.path.expanduser(value)):
            raise ValueError(f"{name}={value[:200]} is a file; it names {what}: point it at a folder or unset it")


def tune_process() -> None:
    """Short OpenMP spins (before ``import torch``) and glibc's allocator keeping vocabulary-sized rows."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
    tune_malloc()


def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds (see the module); False where not glibc or set by the user."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only: musl has no such parameters  # noqa: B018
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else what ``platform`` knows): part of what a measurement
    cached on this machine is valid for."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
