"""Parent side of a running sandbox: its deadlines and channels, then killing all of it.

:func:`watch` waits for the run to end while it keeps the wall-clock limit and the report
channel's per-line deadlines, reads report lines within bounds (:data:`MAX_REPORT_BYTES` in all,
``max_line_bytes`` per line, refused before anything parses them) and writes requests without
ever blocking; :func:`kill_run` kills PID 1 of the run, its process group and its cgroup, then
reaps the relay.  See :mod:`verispec.tasks.sandbox` for the guarantees.

A request's deadline starts *before* its first byte is written, and the write must finish within
it: a program that shrinks its request pipe (``F_SETPIPE_SZ``) and reads a large request slowly
computes on the request's own clock, never before it starts (issue 34, item 3).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable

from . import cgroup

#: Bytes the program may send on the report channel before the run is stopped.
MAX_REPORT_BYTES = 256 << 20
#: Default longest report line (bytes); a longer one stops the run (status ``"failed"``).
MAX_LINE_BYTES = 16 << 20
#: Seconds allowed for the sandbox's own start-up on top of the first report deadline.
STARTUP_GRACE_S = 5.0

_log = logging.getLogger("verispec.sandbox")


def wait_exit_nowait(pid: int, pidfd: int | None, timeout: float) -> bool:
    """Wait until ``pid`` has exited WITHOUT reaping it (its pgid stays reserved)."""
    deadline = time.monotonic() + timeout
    if pidfd is not None:
        left = max(0.0, deadline - time.monotonic())
        return bool(select.select([pidfd], [], [], left)[0])
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def drain(fd: int) -> bytes:
    out = bytearray()
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


def watch(proc, timeout_s, info_r, info_buf, rep_r, req_w, on_report, first_report_s, max_line_bytes) -> str:
    """Wait for the run to end; returns ``"exited"``, ``"timeout"``, ``"stopped"`` or ``"overflow"``.

    ``on_report(line)`` returns ``seconds``, ``(seconds, request)`` or ``(seconds, request, then)``
    (see :data:`.runner.ReportHandler`), or ``None`` to stop.  The ``seconds`` count from the
    moment ``on_report`` returns, so they cover writing ``request`` as well; ``then()`` is called
    once all of ``request`` has been written (at once if it is empty), and never if the run ends
    first -- the caller finishes what it left pending; the time it takes moves the line deadline
    on (it is the parent's work, not the program's).
    """
    t_end = time.monotonic() + timeout_s
    t_line = None
    if rep_r is not None and first_report_s is not None:
        t_line = time.monotonic() + first_report_s + STARTUP_GRACE_S
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    fds = [f for f in (info_r, rep_r, pidfd) if f is not None]
    pending = bytearray()
    outgoing = bytearray()
    written = queued = 0  # request bytes written so far / handed to us so far
    # ``(queued bytes, callback)``: run each once the request bytes up to that count are written
    after_written: list[tuple[int, Callable[[], None]]] = []
    total = 0
    try:
        while True:
            now = time.monotonic()
            deadline = t_end if t_line is None else min(t_end, t_line)
            if now >= deadline:
                return "timeout"
            wait = min(deadline - now, 0.05 if pidfd is None else deadline - now)
            wlist = [req_w] if outgoing else []
            ready, writable, _ = select.select(fds, wlist, [], wait) if fds or wlist else ([], [], [])
            if writable:
                try:
                    n = os.write(req_w, outgoing[: 1 << 16])
                except BlockingIOError:
                    n = 0
                except OSError:  # the program closed its end: nothing more can reach it
                    n = len(outgoing)
                del outgoing[:n]
                written += n
                if after_written and after_written[0][0] <= written:
                    t0 = time.monotonic()
                    while after_written and after_written[0][0] <= written:
                        after_written.pop(0)[1]()
                    if t_line is not None:  # the parent's own work is on no clock of the program's
                        t_line += time.monotonic() - t0
            if info_r in ready:
                chunk = os.read(info_r, 65536)
                if chunk and len(info_buf) < 1 << 20:
                    info_buf += chunk
                elif not chunk:
                    fds.remove(info_r)
            if rep_r is not None and rep_r in ready:
                chunk = os.read(rep_r, 1 << 20)
                if not chunk:
                    fds.remove(rep_r)
                total += len(chunk)
                if total > MAX_REPORT_BYTES:
                    return "overflow"
                pending += chunk
                start = 0
                while (nl := pending.find(b"\n", start)) >= 0:
                    line = bytes(pending[start:nl])
                    start = nl + 1
                    if len(line) > max_line_bytes:
                        return "overflow"
                    allowed = on_report(line.decode("utf-8", "replace"))
                    if allowed is None:
                        return "stopped"
                    # The clock starts now, before the request's first byte is written; the
                    # write (non-blocking, below) has to finish within the same deadline.
                    t_line = time.monotonic() + (allowed[0] if isinstance(allowed, tuple) else allowed)
                    if isinstance(allowed, tuple):
                        request, then = allowed[1], (allowed[2] if len(allowed) > 2 else None)
                        outgoing += request or b""
                        queued += len(request or b"")
                        if then is not None:
                            if queued <= written:
                                t0 = time.monotonic()
                                then()
                                t_line += time.monotonic() - t0
                            else:
                                after_written.append((queued, then))
                del pending[:start]
                if len(pending) > max_line_bytes:
                    return "overflow"  # a line this long is refused before it is complete
            if pidfd in ready or (pidfd is None and wait_exit_nowait(proc.pid, None, 0)):
                if rep_r is not None and rep_r in fds:
                    # Let the report pipe drain: a descendant may still hold it, but the
                    # deadlines above still apply to it.
                    if select.select([rep_r], [], [], 0)[0]:
                        continue
                return "exited"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def kill_run(proc: subprocess.Popen, info: dict, group: cgroup.RunCgroup | None) -> None:
    """Kill everything of the run, then reap the relay.

    PID 1 of the run's PID namespace is killed first (the kernel then kills every process in
    it, including ones that left the process group with ``setsid()``); the relay has not
    reaped it yet, so its pid cannot have been reused.  Then the process group, whose leader
    (the relay) is still unreaped, so the group id is still ours; then every process left in
    the run's cgroup (:meth:`.cgroup.RunCgroup.kill_all`): without a PID namespace that is what
    catches a background interpreter started with ``setsid()`` or a double fork.
    """
    pid1 = info.get("pid1")
    relay_alive = not wait_exit_nowait(proc.pid, None, 0)
    if relay_alive and info.get("pidns") and isinstance(pid1, int) and pid1 > 1:
        try:
            os.kill(pid1, signal.SIGKILL)
        except OSError:
            pass
        wait_exit_nowait(proc.pid, None, 10)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - cannot happen after SIGKILL
        proc.kill()
        proc.wait()
    if group is not None and not group.kill_all():
        _log.warning("sandbox: processes of a run survived the cgroup kill: %s", group.pids())
