"""Parent side of the sandbox: prepare a run, start the bootstrap, watch it, clean up.

See :mod:`verispec.tasks.sandbox` for the guarantees.  Nothing of the program runs in this
process and nothing is ever ``exec``'d here: the child is ``python -I -S -B bootstrap.py CFG``
(:mod:`.bootstrap`), which ``execve``\\s ``python -I -B MAIN ARGS`` once it is contained.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import bootstrap, cgroup, rootfs
from .watch import MAX_LINE_BYTES, MAX_REPORT_BYTES, drain, kill_run, watch

UID_BASE_ENV = "VERISPEC_SANDBOX_UID_BASE"
#: How many uids the per-run range holds, and where it starts unless ``$VERISPEC_SANDBOX_UID_BASE``
#: says otherwise.
UID_COUNT, DEFAULT_UID_BASE = 1 << 24, 1_900_000_000
#: Highest uid the range may reach: below 2**32 - 1 (``(uid_t) -1`` means "unchanged" to
#: ``setresuid``) and clear of the overflow uid 65534 at the bottom.
_UID_MAX = (1 << 32) - 2


def _uid_range(text: str | None) -> tuple[tuple[int, int], str]:
    """The per-run uid range for the value of ``$VERISPEC_SANDBOX_UID_BASE`` (``None``: unset),
    and why that value is refused ("" when it is fine; the default range is then returned)."""
    default = (DEFAULT_UID_BASE, DEFAULT_UID_BASE + UID_COUNT)
    if text is None:
        return default, ""
    lo, hi = 65536, _UID_MAX - UID_COUNT + 1
    try:
        base = int(text.strip(), 10)
    except ValueError:
        base = None
    if base is None or not lo <= base <= hi:
        return default, (f"{UID_BASE_ENV}={text!r} is not a valid uid base: it must be a whole number from "
                         f"{lo} to {hi} (the first of {UID_COUNT} uids given to sandbox runs); unset it to "
                         f"use {DEFAULT_UID_BASE}")
    return (base, base + UID_COUNT), ""


#: Started by root, each run gets a uid (and gid) of its own, drawn from this range and used by
#: no running process: runs cannot signal, trace or write each other's files.  A bad
#: ``$VERISPEC_SANDBOX_UID_BASE`` leaves the default range here and refuses every run
#: (:data:`UID_BASE_ERROR`, status ``"error"``), so :func:`refusal` names it.
SANDBOX_UID_RANGE, UID_BASE_ERROR = _uid_range(os.environ.get(UID_BASE_ENV))
#: Bytes of stdout/stderr kept in a :class:`SandboxResult` (head + tail when longer).
MAX_CAPTURE_BYTES = 1 << 20
UNSAFE_ENV, UNSAFE_FLAG = bootstrap.UNSAFE_ENV, bootstrap.UNSAFE_FLAG

_BOOTSTRAP = Path(bootstrap.__file__).resolve()
_HOOK = Path(__file__).resolve().with_name("audit_hook.py")
_HOOK_NAME = "_verispec_audit_hook.py"
_MEMORY_RE = re.compile(r"^(MemoryError\b|.*\bCannot allocate memory\b|.*std::bad_alloc)")

#: ``on_report(line) -> seconds | (seconds, request[, then]) | None``: called with each line the program
#: writes to the report channel; returns how many seconds the program has for its next line (or
#: to exit) -- with ``request`` (bytes), first sends it on the request channel, the seconds counting
#: from before its first byte is written (the write is inside them), and ``then()`` is called once it
#: has been written -- or ``None`` to stop the run now.
ReportHandler = Callable[[str], "float | tuple[float, bytes] | tuple[float, bytes, Callable[[], object]] | None"]


class SandboxRefused(ValueError):
    """Code cannot be run here with the guarantees the grader needs (see :func:`require_contained`)."""


@dataclass
class SandboxResult:
    status: str  # "passed" | "failed" | "timeout" | "memory" | "stopped" | "error"
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    #: What containment was actually in effect (filled in by the bootstrap), e.g.
    #: ``{"netns": True, "ipcns": True, "pidns": True, "mountns": True, "root_fs": "minimal",
    #: "cgroup": "v1", "cpu_quota": 1.0, "seccomp": "keyring+io_uring+af_unix+page_cache+foreign-abi",
    #: "uid": 1904711563, "audit_hook": False, "masked": [...], ...}``.
    isolation: dict = field(default_factory=dict)
    #: Why the parent stopped the run, when it did so for the report channel (e.g. a line over
    #: ``max_line_bytes``) or for its CPU time; empty otherwise.
    detail: str = ""
    #: CPU seconds (user + system) used by every process of the run together, from its cgroup;
    #: ``None`` where the cgroup gives no CPU accounting (``isolation["cpu_fallback"]`` says why).
    cpu_s: float | None = None


# -------------------------------------------------------------------------------- helpers
def _python_for_sandbox() -> str:
    return os.environ.get("VERISPEC_SANDBOX_PYTHON") or sys.executable


def _fresh_ids() -> tuple[int, int]:
    """A uid (= gid) of :data:`SANDBOX_UID_RANGE` that no running process has."""
    busy = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                busy.add(os.stat("/proc/" + d).st_uid)
            except OSError:
                pass
    lo, hi = SANDBOX_UID_RANGE
    while True:
        uid = lo + secrets.randbelow(hi - lo)
        if uid not in busy:
            return uid, uid


def is_sandbox_uid(uid: int) -> bool:
    """True for the uids runs are given (see :data:`SANDBOX_UID_RANGE`)."""
    return SANDBOX_UID_RANGE[0] <= uid < SANDBOX_UID_RANGE[1]


def _config_pipe(cfg: dict) -> int:
    """A pipe holding the bootstrap's configuration; returns its read end (the write end is closed)."""
    data = json.dumps(cfg).encode()
    r, w = os.pipe()
    try:
        if len(data) >= 1 << 16:
            fcntl.fcntl(w, 1031, len(data) + 1)  # F_SETPIPE_SZ
        view = memoryview(data)
        os.set_blocking(w, False)
        while view:
            view = view[os.write(w, view):]
    except OSError:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


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


def _landlock_read(python: str | None) -> dict | None:
    """What a run without a mount namespace may read (Landlock, see :func:`.bootstrap.landlock`):
    ``{"read": paths, "list": dirs}`` -- the paths the minimal root would show for ``python``
    (its binary, shared libraries and standard library), with each masked directory
    (``site-packages``, ``test``, ``ensurepip``) left out: a directory holding one may only be
    listed (the import system lists the standard library), and its other entries are allowed
    one by one."""
    if not python:
        return None
    try:
        root = rootfs.plan(python)
    except rootfs.RootPlanError:
        return None
    rootfs.warm_page_cache(root)  # what the run may read: nothing cold to leave warm for a later run
    read, listed = list(root.files), []

    def holds_mask(d: str) -> bool:
        return any(m.startswith(d.rstrip("/") + "/") for m in root.masks)

    for top in root.dirs:
        if not holds_mask(top):
            read.append(top)
            continue
        for parent, dirs, files in os.walk(top):
            listed.append(parent)
            read += [os.path.join(parent, f) for f in files]
            subs = [os.path.join(parent, d) for d in dirs if os.path.join(parent, d) not in root.masks]
            read += [d for d in subs if not holds_mask(d)]
            dirs[:] = [os.path.basename(d) for d in subs if holds_mask(d)]
    return {"read": read, "list": listed}


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


_SWEPT: list[bool] = []
_SWEEP_LOCK = threading.Lock()
_RUN_DIR_RE = re.compile(r"^verispec-sbx-(\d+)-")


def _sweep_once() -> None:
    """Once per process: remove the run directories and cgroups of graders that died mid-run
    (named after their pid: those of live processes are left alone)."""
    with _SWEEP_LOCK:
        if _SWEPT:
            return
        _SWEPT.append(True)
    top = tempfile.gettempdir()
    try:
        names = os.listdir(top)
    except OSError:
        names = []
    for name in names:
        m = _RUN_DIR_RE.match(name)
        if m and not cgroup.pid_alive(int(m.group(1))):
            remove_tree(os.path.join(top, name))
    if sys.platform.startswith("linux"):
        removed = cgroup.sweep_stale()
        if removed:
            _log.info("sandbox: removed %d cgroups left by graders that died mid-run", len(removed))


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
    max_line_bytes: int = MAX_LINE_BYTES,
    cpu_limit_s: float | None = None,
) -> SandboxResult:
    """Run ``main`` (a file among ``files``) in the sandbox.

    ``files``: the run directory's initial contents (plain names).  Limits: ``timeout_s`` wall
    clock for the whole run, ``memory_mb`` for the run as a whole (cgroup) and per process
    (``RLIMIT_AS``), ``max_procs`` processes, ``max_file_mb`` per written file and for stdout /
    stderr each, ``max_disk_mb`` for the run directory and ``/dev/shm`` each, ``max_open_files``
    descriptors per process.  ``max_output_bytes`` of stdout/stderr are kept (head + tail).

    CPU: the run as a whole gets one core's worth (a cgroup CPU quota), and ``cpu_limit_s``
    (default ``timeout_s``) CPU seconds over all its processes together: past it the run is
    killed, status ``"timeout"`` with :attr:`SandboxResult.detail` saying so.  The CPU seconds it
    used are :attr:`SandboxResult.cpu_s`.  Without a cpu cgroup controller (or CPU accounting)
    each process still has ``RLIMIT_CPU``, and ``isolation["cpu_fallback"]`` says what is missing.

    Report channel: with ``on_report``, the program finds a write-only pipe at the descriptor
    named by ``$VERISPEC_REPORT_FD``; each line it writes there is passed to ``on_report``,
    whose return value is the deadline (seconds from now) for the next line, or ``None`` to
    stop the run (status ``"stopped"``).  ``first_report_s`` is the deadline for the first line
    (start-up time is added).  A missed deadline ends the run with status ``"timeout"``: time
    limits are kept from outside, whatever the program does to its own clocks and signals.  A
    line longer than ``max_line_bytes`` (or more than :data:`MAX_REPORT_BYTES` in all) ends the
    run with status ``"failed"`` before anything parses it.

    Request channel (with ``on_report``): a read-only pipe at ``$VERISPEC_REQUEST_FD``.  When
    ``on_report`` returns ``(seconds, request[, then])``, ``request`` is written there -- without ever
    blocking this process -- and the ``seconds`` count from before its first byte is written: a program
    that reads slowly (a one-page pipe) spends its own time, then its run times out.  ``then()`` runs once
    the request is written (the grader judges the previous answer there, out of the program's sight).  So a
    program can be given its inputs one at a time, each only after the previous answer.

    Without kernel namespaces (none here, or ``namespaces=False``) the run is refused (status
    ``"error"``, naming :data:`UNSAFE_FLAG`) unless ``$VERISPEC_SANDBOX_UNSAFE_NO_NAMESPACES``
    is ``1``; see the package docstring for what that fallback does.

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
    if not (isinstance(max_line_bytes, int) and max_line_bytes > 0):
        raise ValueError(f"max_line_bytes must be a positive int, got {max_line_bytes!r}")
    if cpu_limit_s is None:
        cpu_limit_s = timeout_s
    if isinstance(cpu_limit_s, bool) or not isinstance(cpu_limit_s, (int, float)) or not cpu_limit_s > 0:
        raise ValueError(f"sandbox limit cpu_limit_s must be a positive number, got {cpu_limit_s!r}")
    if UID_BASE_ERROR and os.geteuid() == 0:
        return SandboxResult("error", None, "", f"{bootstrap.SETUP_MARK} {UID_BASE_ERROR}", 0.0)
    t0 = time.monotonic()
    python = _python_for_sandbox()
    is_root = os.geteuid() == 0
    linux = sys.platform.startswith("linux")
    namespaces = bool(namespaces) and linux
    _sweep_once()
    try:
        base = tempfile.mkdtemp(prefix=f"verispec-sbx-{os.getpid()}-")
    except OSError as e:
        return SandboxResult("error", None, "", f"{bootstrap.SETUP_MARK} cannot create a run directory: {e}", 0.0)
    group = None
    info: dict = {}
    opened: list[int] = []
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
        plan = rootfs.plan(python) if namespaces else None
        if plan is not None:
            rootfs.warm_page_cache(plan)
        memory_bytes = int(memory_mb) << 20
        group, why_no_cgroup = cgroup.create(memory_bytes, int(max_procs)) if linux else (None, "not Linux")
        uid, gid = _fresh_ids() if is_root else (os.getuid(), os.getgid())
        fallback = _fallback_python(python) if is_root else python
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }

        def pipe():
            r, w = os.pipe()
            opened.extend((r, w))
            return r, w

        info_r, info_w = pipe()
        rep_r, rep_w = pipe() if on_report else (None, None)
        req_r, req_w = pipe() if on_report else (None, None)
        go_r, go_w = pipe() if group else (None, None)
        if rep_w is not None:
            env["VERISPEC_REPORT_FD"] = str(rep_w)
            env["VERISPEC_REQUEST_FD"] = str(req_r)
            os.set_blocking(req_w, False)
        cfg = {
            "info_fd": info_w,
            "inputs": inputs,
            "work": work,
            "newroot": newroot,
            "python": plan.python if plan else python,
            "root": plan.as_config() if plan else None,
            "argv": [main, *map(str, args)],
            "hook_name": _HOOK_NAME,
            "uid": uid,
            "gid": gid,
            "orig_uid": os.getuid(),
            "namespaces": namespaces,
            "allow_unsafe": os.environ.get(UNSAFE_ENV) == "1",
            "python_fallback": fallback,
            "landlock_read": _landlock_read(fallback) if os.environ.get(UNSAFE_ENV) == "1" else None,
            "memory_bytes": memory_bytes,
            "cpu_s": int(math.ceil(timeout_s)) + 1,
            "fsize_bytes": int(max_file_mb) << 20,
            "disk_bytes": int(max_disk_mb) << 20,
            "nofile": int(max_open_files),
            "max_procs": int(max_procs),
            "nproc_rlimit": group is None,
            "cgroup_kind": group.kind if group else None,
            "cgroup_go_fd": go_r,
            "parent_pid": os.getpid(),
            "env": env,
        }
        cfg_r = _config_pipe(cfg)
        opened.append(cfg_r)
        child_fds = [fd for fd in (cfg_r, info_w, rep_w, req_r, go_r) if fd is not None]
        out_path, err_path = Path(base) / "stdout", Path(base) / "stderr"
        outcome = "exited"
        info_buf = bytearray()
        out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        opened += [out_fd, err_fd]
        proc = None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(_BOOTSTRAP), str(cfg_r)],
                cwd=base,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_fd,
                stderr=err_fd,
                pass_fds=child_fds,
                start_new_session=True,
            )
        finally:
            for fd in [*child_fds, out_fd, err_fd]:
                os.close(fd)
                opened.remove(fd)
            if go_w is not None:
                opened.remove(go_w)
                _attach(group, proc, go_w)
        budget = _CpuBudget(group, float(cpu_limit_s)) if group is not None and proc is not None else None
        try:
            outcome = watch(proc, timeout_s, info_r, info_buf, rep_r, req_w, on_report, first_report_s,
                             max_line_bytes)
        finally:
            if budget is not None:
                budget.stop()  # before kill_run: one killer of the group at a time
            kill_run(proc, _parse_info(bytes(info_buf)), group)
        rc = proc.returncode
        info.update(_parse_info(bytes(info_buf) + drain(info_r)))
        if group is None:
            info["cgroup"] = None
            info["cgroup_fallback"] = f"per-process RLIMIT_AS and per-uid RLIMIT_NPROC ({why_no_cgroup})"
        info["cpu_quota"] = group.cpu_quota if group else None
        cpu_used = group.cpu_seconds() if group else None
        if group is None or group.cpu_missing:
            info["cpu_fallback"] = ("per-process RLIMIT_CPU only: "
                                    + (group.cpu_missing if group else f"no cgroup ({why_no_cgroup})"))
        if budget is not None and budget.exceeded:
            outcome = "cpu"
        duration = time.monotonic() - t0
        stdout, stderr = _read_capped(out_path, max_output_bytes), _read_capped(err_path, max_output_bytes)
        oom = group.oom_killed() if group else False
    except Exception as e:  # setup failure in the parent (e.g. cannot create files / spawn)
        return SandboxResult("error", None, "", f"{bootstrap.SETUP_MARK} {type(e).__name__}: {e}",
                             time.monotonic() - t0, info)
    finally:
        for fd in opened:
            try:
                os.close(fd)
            except OSError:
                pass
        if group is not None:
            group.remove()
        remove_tree(base)
    _warn_if_degraded(info)
    detail = {"overflow": f"report channel overflow: a line over {max_line_bytes} bytes or over "
                          f"{MAX_REPORT_BYTES} bytes in all",
              "cpu": f"CPU time limit exceeded: {cpu_limit_s:g} s over every process of the run together"
              }.get(outcome, "")
    return SandboxResult(_status(outcome, rc, stderr, duration, oom, cfg["cpu_s"]), rc, stdout, stderr, duration, info,
                         detail, None if cpu_used is None else round(cpu_used, 4))


_log = logging.getLogger("verispec.sandbox")
_WARNED: set[str] = set()


def _warn_if_degraded(info: dict) -> None:
    """Say once per process, on the ``verispec.sandbox`` logger, which weaker fallback is in use."""
    notes = []
    if "cgroup_fallback" in info:
        notes.append("no cgroup: memory capped per process only, processes per uid (" + info["cgroup_fallback"] + ")")
    if info.get("audit_hook") and info.get("landlock"):
        notes.append(f"no namespaces ({UNSAFE_FLAG}): no minimal root, IPC or PID isolation; Landlock (ABI "
                     f"{info['landlock']}) holds programs to the standard library and their run directory, the "
                     "rest is the in-interpreter audit hook, which a program can disable ("
                     + "; ".join(info.get("warnings", [])) + ")")
    elif info.get("audit_hook"):
        notes.append(f"no namespaces ({UNSAFE_FLAG}): no minimal root, IPC or PID isolation; programs can "
                     "read every world-readable file and run under the in-interpreter audit hook only ("
                     + "; ".join(info.get("warnings", [])) + ")")
    if "cpu_fallback" in info and "cgroup_fallback" not in info:
        notes.append("no CPU quota or CPU time over the whole run: " + info["cpu_fallback"])
    if "pid1" in info and info.get("seccomp") is None:
        notes.append("no seccomp filter: keyring, io_uring, AF_UNIX socket and page-cache calls are not denied")
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


class _CpuBudget:
    """Kills the run once its processes together have used ``limit_s`` CPU seconds (read from the
    run's cgroup every :data:`CPU_POLL_S`); a thread of its own, which alone sets ``exceeded``
    and alone kills the group until :meth:`stop` has joined it."""

    def __init__(self, group: cgroup.RunCgroup, limit_s: float):
        self.group, self.limit_s, self.exceeded = group, limit_s, False
        self._done = threading.Event()
        self._thread = None
        if group.cpu_seconds() is not None:
            self._thread = threading.Thread(target=self._watch, name="verispec-sandbox-cpu", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(CPU_POLL_S):
            used = self.group.cpu_seconds()
            if used is not None and used > self.limit_s:
                self.exceeded = True
                self.group.kill_all()
                return

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


#: How often a run's CPU time is read from its cgroup: with the one-core quota, it overshoots
#: its CPU limit by at most about this much.
CPU_POLL_S = 0.05


def _status(outcome: str, rc: int | None, stderr: str, duration: float, oom: bool, cpu_s: int) -> str:
    last = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if outcome in ("timeout", "stopped"):
        return outcome
    if outcome == "cpu":
        return "timeout"
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


_INFO_CACHE: dict[bool, dict] = {}
_INFO_LOCK = threading.Lock()


def sandbox_info(refresh: bool = False) -> dict:
    """Run a trivial program once and report the containment in effect on this machine (cached
    per value of the opt-in ``$VERISPEC_SANDBOX_UNSAFE_NO_NAMESPACES``)."""
    key = os.environ.get(UNSAFE_ENV) == "1"
    with _INFO_LOCK:
        if key in _INFO_CACHE and not refresh:
            return dict(_INFO_CACHE[key])
        r = run_python("print('ok')", timeout_s=30)
        info = dict(r.isolation, status=r.status, stderr=r.stderr[-2000:])
        if r.status == "passed" or UNSAFE_FLAG in r.stderr:  # lasting answers; anything else is retried
            _INFO_CACHE[key] = info
        return dict(info)


def refusal() -> str | None:
    """Why code cannot be run (graded) here, or ``None`` when it can: the sandbox's own refusal
    (no namespaces without the opt-in, see :data:`UNSAFE_FLAG`) or any other setup failure."""
    info = sandbox_info()
    if info["status"] == "passed":
        return None
    lines = [ln for ln in info.get("stderr", "").splitlines() if bootstrap.SETUP_MARK in ln]
    return (lines[-1].split(bootstrap.SETUP_MARK, 1)[1].strip() if lines else
            f"the code sandbox does not work here (status {info['status']}): {info.get('stderr', '')[-300:]}")


def require_contained() -> None:
    """Raise :class:`SandboxRefused` (its message says why and what to do) unless code can be
    run here; meant for entry points that grade code, before they start."""
    why = refusal()
    if why is not None:
        raise SandboxRefused(why)
