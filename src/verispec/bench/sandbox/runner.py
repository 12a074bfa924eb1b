"""Parent side of the sandbox: prepare a run, start the bootstrap, watch it, clean up.

See :mod:`verispec.bench.sandbox` for the guarantees.  Nothing of the program runs in this
process and nothing is ever ``exec``'d here: the child is ``python -I -S -B bootstrap.py CFG``
(:mod:`.bootstrap`), which ``execve``\\s ``python -I -B MAIN ARGS`` once it is contained.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import bootstrap, cgroup

#: The unprivileged user/group programs run as when the sandbox is started by root.
SANDBOX_UID = int(os.environ.get("VERISPEC_SANDBOX_UID", "65534"))
SANDBOX_GID = int(os.environ.get("VERISPEC_SANDBOX_GID", str(SANDBOX_UID)))
#: Bytes of stdout/stderr kept in a :class:`SandboxResult` (head + tail when longer).
MAX_CAPTURE_BYTES = 1 << 20
#: Bytes the program may send on the report channel before the run is stopped.
MAX_REPORT_BYTES = 256 << 20
#: Seconds allowed for the sandbox's own start-up on top of the first report deadline.
STARTUP_GRACE_S = 5.0

_BOOTSTRAP = Path(bootstrap.__file__).resolve()
_HOOK = Path(__file__).resolve().with_name("audit_hook.py")
_HOOK_NAME = "_verispec_audit_hook.py"
_MEMORY_RE = re.compile(r"^(MemoryError\b|.*\bCannot allocate memory\b|.*std::bad_alloc)")

#: ``on_report(line) -> seconds``: called with each line the program writes to the report
#: channel; returns how many seconds the program has for its next line (or to exit), or
#: ``None`` to stop the run now.
ReportHandler = Callable[[str], "float | None"]


@dataclass
class SandboxResult:
    status: str  # "passed" | "failed" | "timeout" | "memory" | "stopped" | "error"
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    #: What containment was actually in effect (filled in by the bootstrap), e.g.
    #: ``{"netns": True, "ipcns": True, "pidns": True, "mountns": True, "root_fs": "minimal",
    #: "cgroup": "v1", "seccomp": "keyring+foreign-abi", "uid": 65534, "audit_hook": False, ...}``.
    isolation: dict = field(default_factory=dict)


# -------------------------------------------------------------------------------- helpers
def _python_for_sandbox() -> str:
    return os.environ.get("VERISPEC_SANDBOX_PYTHON") or sys.executable


def _expose_paths(python: str) -> list[str]:
    """Directories the interpreter needs inside the minimal root (its prefixes), outermost only."""
    paths = set()
    if python == sys.executable:
        for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
            paths.add(os.path.realpath(p))
    for exe in (os.path.abspath(python), os.path.realpath(python)):
        bindir = os.path.dirname(exe)
        paths.add(os.path.dirname(bindir) if os.path.basename(bindir) == "bin" else bindir)
    out: list[str] = []
    for p in sorted(p for p in paths if os.path.isdir(p) and p != "/"):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def _others_can_use(path: str) -> bool:
    """True if a stranger uid could execute ``path`` (every ancestor searchable by "others")."""
    try:
        real = os.path.realpath(path)
        if not os.stat(real).st_mode & 0o001:
            return False
        cur = "/"
        for part in Path(real).parent.parts[1:]:
            cur = os.path.join(cur, part)
            if not os.stat(cur).st_mode & 0o001:
                return False
        return True
    except OSError:
        return False


def _fallback_python(python: str) -> str | None:
    """An interpreter the sandbox uid can run without the minimal root (no mount namespace)."""
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for cand in (python, os.path.realpath(python), f"/usr/local/bin/{ver}", f"/usr/bin/{ver}",
                 "/usr/local/bin/python3", "/usr/bin/python3"):
        if os.path.exists(cand) and _others_can_use(cand):
            return cand
    return None


def _read_capped(path: Path, cap: int) -> str:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if size <= cap:
                data = f.read()
            else:
                head = f.read(cap // 2)
                f.seek(size - cap // 2)
                tail = f.read()
                data = head + b"\n...[%d bytes truncated]...\n" % (size - len(head) - len(tail)) + tail
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def _parse_info(data: bytes) -> dict:
    info: dict = {}
    for line in data.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            info.update(obj)
    return info


def remove_tree(top: str) -> None:
    """Delete ``top`` whatever is inside: iterative (no recursion limit), never follows links,
    and independent of depth (every subdirectory is first moved up to ``top`` itself, so no
    path ever gets long).  Best effort: never raises."""
    counter = 0
    pending = [top]
    try:
        while pending:
            d = pending[-1]
            try:
                fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except FileNotFoundError:
                pending.pop()
                continue
            except OSError:
                try:
                    os.unlink(d)  # not a directory (or a link to one)
                except OSError:
                    pass
                pending.pop()
                continue
            moved = False
            try:
                try:
                    os.chmod(fd, 0o700)  # a program may leave read-only directories behind
                except OSError:
                    pass
                with os.scandir(fd) as it:
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
                for name, is_dir in entries:
                    if is_dir:
                        counter += 1
                        dest = os.path.join(top, f".rm-{counter}")
                        os.rename(name, dest, src_dir_fd=fd)
                        pending.append(dest)
                        moved = True
                    else:
                        try:
                            os.unlink(name, dir_fd=fd)
                        except FileNotFoundError:
                            pass
            finally:
                os.close(fd)
            if not moved:  # empty now
                pending.pop()
                if d != top:
                    os.rmdir(d)
        os.rmdir(top)
    except OSError:
        pass


def _wait_exit_nowait(pid: int, pidfd: int | None, timeout: float) -> bool:
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


# -------------------------------------------------------------------------------- the run
def run_python(code: str, **kwargs) -> SandboxResult:
    """Run ``code`` (the source of a program) as ``prog.py`` in the sandbox; see :func:`run_module`."""
    files = dict(kwargs.pop("files", None) or {})
    if "prog.py" in files:
        raise ValueError("'prog.py' is the program itself; pass other file names in files=")
    files["prog.py"] = code
    return _run("prog.py", files=files, **kwargs)


def run_module(path: str | os.PathLike, args: Sequence[str] = (), **kwargs) -> SandboxResult:
    """Run the Python module file ``path`` (copied into the run directory under its own name) as
    ``python -I -B NAME ARGS``.  Keyword arguments as for :func:`_run`."""
    path = Path(path)
    files = dict(kwargs.pop("files", None) or {})
    if path.name in files:
        raise ValueError(f"{path.name!r} is the program itself; pass other file names in files=")
    files[path.name] = path.read_bytes()
    return _run(path.name, args=list(args), files=files, **kwargs)


def _run(
    main: str,
    *,
    args: Sequence[str] = (),
    timeout_s: float = 10,
    memory_mb: int = 1024,
    max_procs: int = 64,
    max_file_mb: int = 16,
    max_disk_mb: int = 64,
    max_open_files: int = 256,
    namespaces: bool = True,
    files: dict[str, bytes | str] | None = None,
    max_output_bytes: int = MAX_CAPTURE_BYTES,
    on_report: ReportHandler | None = None,
    first_report_s: float | None = None,
) -> SandboxResult:
    """Run ``main`` (a file among ``files``) in the sandbox.

    ``files``: the run directory's initial contents (plain names).  Limits: ``timeout_s`` wall
    clock for the whole run, ``memory_mb`` for the run as a whole (cgroup) and per process
    (``RLIMIT_AS``), ``max_procs`` processes, ``max_file_mb`` per written file and for stdout /
    stderr each, ``max_disk_mb`` for the run directory and ``/dev/shm`` each, ``max_open_files``
    descriptors per process.  ``max_output_bytes`` of stdout/stderr are kept (head + tail).

    Report channel: with ``on_report``, the program finds a write-only pipe at the descriptor
    named by ``$VERISPEC_REPORT_FD``; each line it writes there is passed to ``on_report``,
    whose return value is the deadline (seconds from now) for the next line, or ``None`` to
    stop the run (status ``"stopped"``).  ``first_report_s`` is the deadline for the first line
    (start-up time is added).  A missed deadline ends the run with status ``"timeout"``: time
    limits are kept from outside, whatever the program does to its own clocks and signals.

    Never raises for anything the program does; setup problems give ``status="error"``.  Limits
    that are not positive numbers are a caller's mistake: ``ValueError``.
    """
    limits = {"timeout_s": timeout_s, "memory_mb": memory_mb, "max_procs": max_procs, "max_file_mb": max_file_mb,
              "max_disk_mb": max_disk_mb, "max_open_files": max_open_files, "max_output_bytes": max_output_bytes}
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
            raise ValueError(f"sandbox limit {name} must be a positive number, got {value!r}")
    if first_report_s is not None and not first_report_s > 0:
        raise ValueError(f"first_report_s must be positive, got {first_report_s!r}")
    t0 = time.monotonic()
    python = _python_for_sandbox()
    is_root = os.geteuid() == 0
    linux = sys.platform.startswith("linux")
    namespaces = bool(namespaces) and linux
    try:
        base = tempfile.mkdtemp(prefix="verispec-sbx-")
    except OSError as e:
        return SandboxResult("error", None, "", f"{bootstrap.SETUP_MARK} cannot create a run directory: {e}", 0.0)
    group = None
    info: dict = {}
    try:
        os.chmod(base, 0o711)
        # ``root``: mount point of the minimal root; ``work`` (made by the bootstrap, only when
        # there is no mount namespace): the run directory on the host.
        inputs, work, newroot = (os.path.join(base, d) for d in ("in", "work", "root"))
        for d in (inputs, newroot):
            os.mkdir(d, 0o700)
        # Input files go to ``in``; the bootstrap copies them into the run directory (the run's
        # own tmpfs, or ``work`` on the host when there is no mount namespace).  The audit hook
        # is among them: it is used only if the namespaces cannot be created.
        files = dict(files or {}, **{_HOOK_NAME: _HOOK.read_bytes()})
        for name, data in files.items():
            if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
                raise ValueError(f"bad sandbox input file name {name!r}")
            with open(os.path.join(inputs, name), "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else bytes(data))
        memory_bytes = int(memory_mb) << 20
        group, why_no_cgroup = cgroup.create(memory_bytes, int(max_procs)) if linux else (None, "not Linux")
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        info_r, info_w = os.pipe()
        rep_r, rep_w = os.pipe() if on_report else (None, None)
        go_r, go_w = os.pipe() if group else (None, None)
        pass_fds = [fd for fd in (info_w, rep_w, go_r) if fd is not None]
        if rep_w is not None:
            env["VERISPEC_REPORT_FD"] = str(rep_w)
        cfg = {
            "info_fd": info_w,
            "inputs": inputs,
            "work": work,
            "newroot": newroot,
            "python": python,
            "argv": [main, *map(str, args)],
            "hook_name": _HOOK_NAME,
            "uid": SANDBOX_UID,
            "gid": SANDBOX_GID,
            "orig_uid": os.getuid(),
            "namespaces": namespaces,
            "expose": _expose_paths(python),
            "python_fallback": _fallback_python(python) if is_root else python,
            "memory_bytes": memory_bytes,
            "cpu_s": int(math.ceil(timeout_s)) + 1,
            "fsize_bytes": int(max_file_mb) << 20,
            "disk_bytes": int(max_disk_mb) << 20,
            "nofile": int(max_open_files),
            "max_procs": int(max_procs),
            "nproc_rlimit": group is None,
            "cgroup_kind": group.kind if group else None,
            "cgroup_go_fd": go_r,
            "env": env,
        }
        out_path, err_path = Path(base) / "stdout", Path(base) / "stderr"
        outcome = "exited"
        info_buf = bytearray()
        try:
            with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
                proc = None
                try:
                    proc = subprocess.Popen(
                        [sys.executable, "-I", "-S", "-B", str(_BOOTSTRAP), json.dumps(cfg)],
                        cwd=base,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out_f,
                        stderr=err_f,
                        pass_fds=pass_fds,
                        start_new_session=True,
                    )
                finally:
                    for fd in pass_fds:
                        os.close(fd)
                    if go_w is not None:
                        _attach(group, proc, go_w)
                try:
                    outcome = _watch(proc, timeout_s, info_r, info_buf, rep_r, on_report, first_report_s)
                finally:
                    _kill_run(proc, _parse_info(bytes(info_buf)))
            rc = proc.returncode
        finally:
            info.update(_parse_info(bytes(info_buf) + _drain(info_r)))
            os.close(info_r)
            if rep_r is not None:
                os.close(rep_r)
        if group is None:
            info["cgroup"] = None
            info["cgroup_fallback"] = f"per-process RLIMIT_AS and per-uid RLIMIT_NPROC ({why_no_cgroup})"
        duration = time.monotonic() - t0
        stdout, stderr = _read_capped(out_path, max_output_bytes), _read_capped(err_path, max_output_bytes)
        oom = group.oom_killed() if group else False
    except Exception as e:  # setup failure in the parent (e.g. cannot create files / spawn)
        return SandboxResult("error", None, "", f"{bootstrap.SETUP_MARK} {type(e).__name__}: {e}",
                             time.monotonic() - t0, info)
    finally:
        if group is not None:
            group.remove()
        remove_tree(base)
    _warn_if_degraded(info)
    return SandboxResult(_status(outcome, rc, stderr, duration, oom, cfg["cpu_s"]), rc, stdout, stderr, duration, info)


_log = logging.getLogger("verispec.sandbox")
_WARNED: set[str] = set()


def _warn_if_degraded(info: dict) -> None:
    """Say once per process, on the ``verispec.sandbox`` logger, which weaker fallback is in use."""
    notes = []
    if "cgroup_fallback" in info:
        notes.append("no cgroup: memory capped per process only, processes per uid (" + info["cgroup_fallback"] + ")")
    if info.get("audit_hook"):
        notes.append("no namespaces: no minimal root, IPC or PID isolation; programs run under the "
                     "in-interpreter audit hook only (" + "; ".join(info.get("warnings", [])) + ")")
    if "pid1" in info and info.get("seccomp") is None:
        notes.append("no seccomp filter: keyring calls are not denied")
    for note in notes:
        if note not in _WARNED:
            _WARNED.add(note)
            _log.warning("sandbox degraded: %s", note)


def _attach(group: cgroup.RunCgroup, proc: subprocess.Popen | None, go_w: int) -> None:
    """Move the bootstrap into the run's cgroup, then tell it whether that worked (it waits)."""
    answer = b"1"
    if proc is None:
        answer = b"0the bootstrap did not start"
    else:
        for procs in group.procs:
            try:
                with open(procs, "w") as f:
                    f.write(str(proc.pid))
            except OSError as e:
                answer = b"0" + f"{procs}: {e}".encode()
                break
    try:
        os.write(go_w, answer)
    except OSError:
        pass  # the bootstrap is gone already
    finally:
        os.close(go_w)


def _status(outcome: str, rc: int | None, stderr: str, duration: float, oom: bool, cpu_s: int) -> str:
    last = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if outcome in ("timeout", "stopped"):
        return outcome
    if outcome == "overflow":
        return "failed"
    if rc == 0:
        return "passed"
    if rc == bootstrap.SETUP_FAILED_RC and bootstrap.SETUP_MARK in stderr:
        return "error"
    if oom:
        return "memory"
    if rc == -signal.SIGXCPU:
        return "timeout"
    if rc == -signal.SIGKILL:  # not sent by us: RLIMIT_CPU's hard limit or the OOM killer
        return "timeout" if duration >= cpu_s else "memory"
    if _MEMORY_RE.match(last.strip()):
        return "memory"
    return "failed"


def _drain(fd: int) -> bytes:
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


def _watch(proc, timeout_s, info_r, info_buf, rep_r, on_report, first_report_s) -> str:
    """Wait for the run to end; returns ``"exited"``, ``"timeout"``, ``"stopped"`` or ``"overflow"``."""
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
    total = 0
    try:
        while True:
            now = time.monotonic()
            deadline = t_end if t_line is None else min(t_end, t_line)
            if now >= deadline:
                return "timeout"
            wait = min(deadline - now, 0.05 if pidfd is None else deadline - now)
            ready = select.select(fds, [], [], wait)[0] if fds else []
            if info_r in ready:
                chunk = os.read(info_r, 65536)
                if chunk:
                    info_buf += chunk
                else:
                    fds.remove(info_r)
            if rep_r is not None and rep_r in ready:
                chunk = os.read(rep_r, 1 << 20)
                if not chunk:
                    fds.remove(rep_r)
                total += len(chunk)
                if total > MAX_REPORT_BYTES:
                    return "overflow"
                pending += chunk
                while b"\n" in pending:
                    line, _, rest = pending.partition(b"\n")
                    pending = bytearray(rest)
                    allowed = on_report(line.decode("utf-8", "replace"))
                    if allowed is None:
                        return "stopped"
                    t_line = time.monotonic() + allowed
            if pidfd in ready or (pidfd is None and _wait_exit_nowait(proc.pid, None, 0)):
                if rep_r is not None and rep_r in fds:
                    # Let the report pipe drain: a descendant may still hold it, but the
                    # deadlines above still apply to it.
                    if select.select([rep_r], [], [], 0)[0]:
                        continue
                return "exited"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _kill_run(proc: subprocess.Popen, info: dict) -> None:
    """Kill everything of the run, then reap the relay.

    PID 1 of the run's PID namespace is killed first (the kernel then kills every process in
    it, including ones that left the process group with ``setsid()``); the relay has not
    reaped it yet, so its pid cannot have been reused.  Then the process group, whose leader
    (the relay) is still unreaped, so the group id is still ours.
    """
    pid1 = info.get("pid1")
    relay_alive = not _wait_exit_nowait(proc.pid, None, 0)
    if relay_alive and info.get("pidns") and isinstance(pid1, int) and pid1 > 1:
        try:
            os.kill(pid1, signal.SIGKILL)
        except OSError:
            pass
        _wait_exit_nowait(proc.pid, None, 10)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - cannot happen after SIGKILL
        proc.kill()
        proc.wait()


_INFO_CACHE: dict | None = None
_INFO_LOCK = threading.Lock()


def sandbox_info(refresh: bool = False) -> dict:
    """Run a trivial program once and report the containment in effect on this machine (cached)."""
    global _INFO_CACHE
    with _INFO_LOCK:
        if _INFO_CACHE is None or refresh:
            r = run_python("print('ok')", timeout_s=30)
            _INFO_CACHE = dict(r.isolation, status=r.status, stderr=r.stderr[-2000:])
        return dict(_INFO_CACHE)
