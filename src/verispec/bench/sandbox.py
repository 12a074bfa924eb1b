"""Run untrusted Python (model-generated code and its tests) in a contained child process.

``run_python(code)`` writes ``code`` to a fresh throwaway directory and runs it as
``python -I -B prog.py`` (isolated mode: no user site, no ``PYTHON*`` variables, no script
directory on ``sys.path``) with a scrubbed environment, then deletes the directory.  Nothing of
the program runs in the calling process, and nothing is ever ``exec``'d here.

Containment, in the order it is set up (a small trusted bootstrap -- ``_BOOTSTRAP`` below, run
with the same interpreter as ``python -I -S -B -c`` -- does the privileged steps, then ``execve``\\s
the program):

1. **Process group / session.** The bootstrap starts in a new session (``start_new_session``).
   On timeout the program (PID 1 of its PID namespace, see 2.) is ``SIGKILL``\\ed, then the
   whole process group; after a normal exit the group is killed too, before its leader is
   reaped (``pidfd``/``waitid(WNOWAIT)``, so the group id cannot have been reused), so
   stragglers cannot outlive a run.
2. **Namespaces** (Linux, via ``unshare(2)`` through ``os.unshare`` or ``ctypes``):

   * a new **network** namespace -- only a loopback interface that is *down*, so every
     ``connect``/``sendto`` (including to ``127.0.0.1`` listeners of the host) fails with
     ``ENETUNREACH``;
   * a new **PID** namespace -- the program is PID 1 of it, so when it exits or is killed the
     kernel kills every descendant, including ones that called ``setsid()`` to leave the
     process group; a fresh ``/proc`` is mounted, so it cannot see host processes;
   * a new **mount** namespace in which the whole tree is made read-only and ``nosuid``
     (``mount_setattr(AT_RECURSIVE)``, falling back to bind-remounting each mount point),
     except the run directory, which is bind-mounted read-write.  ``/tmp``,
     ``/dev/shm`` and the repository are therefore read-only inside; ``TMPDIR``/``HOME`` point
     at the run directory.

   As root these need no user namespace; as an ordinary user a user namespace is created first
   (``unshare -Urn`` style, mapping only the caller's own uid), where the kernel allows it.
3. **Unprivileged user.** When started as root (as in CI), the program runs as
   ``SANDBOX_UID``/``SANDBOX_GID`` (65534, "nobody") with no supplementary groups and
   ``PR_SET_NO_NEW_PRIVS``: ``RLIMIT_NPROC`` is ignored for root, so without this a fork bomb
   would be unbounded, and root could remount the tree read-write again.  Directories the
   interpreter lives in that ``nobody`` cannot traverse (e.g. a pyenv Python under a ``0700``
   ``/root``) are made reachable *inside the mount namespace only*: a ``tmpfs`` is mounted over
   the blocking directory and just the interpreter's prefix (and the venv) is bind-mounted back,
   which also hides everything else in that directory from the program.
4. **Resource limits** set just before ``execve``: ``RLIMIT_AS`` (``memory_mb``),
   ``RLIMIT_CPU`` (``ceil(timeout_s) + 1`` seconds), ``RLIMIT_FSIZE`` (``max_file_mb``; also
   caps the captured stdout/stderr, which go to files), ``RLIMIT_NPROC`` (``max_procs``
   processes/threads of the sandbox uid), ``RLIMIT_CORE`` = 0.  ``SIGXFSZ`` is ignored so an
   oversized write fails with ``OSError(EFBIG)`` rather than killing the program silently.
5. **Wall-clock timeout** enforced by the parent (``timeout_s``).

Fallbacks (each recorded in :attr:`SandboxResult.isolation`; :func:`sandbox_info` reports what
this machine supports).  If the network or mount namespace cannot be created (no
``CAP_SYS_ADMIN`` and no unprivileged user namespaces, e.g. a default Docker container, or a
non-Linux OS), the program runs under a Python **audit hook** installed before it starts that
refuses IPv4/IPv6 socket ``connect``/``bind``/``sendto``, ``ctypes`` loading, starting other
programs, and opening files for writing outside the run directory (and, as root, with an
interpreter ``nobody`` can reach without the mount trick, e.g. ``/usr/bin/python3.X``).  That is a much weaker, in-interpreter measure
(bypassable by a determined program); the kernel rlimits, the uid drop and the process-group
kill still apply, but without a PID namespace a descendant that calls ``setsid()`` can outlive
the run.  If started as root and the uid drop is impossible, the run fails with
status ``"error"`` rather than running as root.

Statuses: ``"passed"`` (exit code 0), ``"failed"`` (non-zero exit or killed by an unrelated
signal), ``"timeout"`` (wall-clock limit or ``RLIMIT_CPU``), ``"memory"`` (``MemoryError`` as
the last line of stderr, or ``SIGKILL`` not sent by us, i.e. the OOM killer), ``"error"`` (the
sandbox itself could not be set up).

Environment: ``VERISPEC_SANDBOX_UID`` / ``VERISPEC_SANDBOX_GID`` choose the unprivileged ids
(default 65534); ``VERISPEC_SANDBOX_PYTHON`` the interpreter (default ``sys.executable``, with
its venv's site-packages; ``-I`` keeps user site-packages and ``PYTHON*`` variables out).

Caveats: ``RLIMIT_NPROC`` counts *all* processes of the sandbox uid, so concurrent sandboxes
share the ``max_procs`` budget (a fork bomb in one can make a concurrent one fail to start with
status ``"error"``), and so do other processes of that uid on the machine; ``RLIMIT_AS`` limits
virtual memory, so programs that map much more than they touch (some numerical libraries) need
a larger ``memory_mb``.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SandboxResult", "run_python", "sandbox_info", "SANDBOX_UID", "SANDBOX_GID"]

#: The unprivileged user/group programs run as when the sandbox is started by root.
SANDBOX_UID = int(os.environ.get("VERISPEC_SANDBOX_UID", "65534"))
SANDBOX_GID = int(os.environ.get("VERISPEC_SANDBOX_GID", str(SANDBOX_UID)))
#: Bytes of stdout/stderr kept in a :class:`SandboxResult` (head + tail when longer).
MAX_CAPTURE_BYTES = 1 << 20
_SETUP_FAILED_RC = 121
_SETUP_MARK = "verispec-sandbox:"


@dataclass
class SandboxResult:
    status: str  # "passed" | "failed" | "timeout" | "memory" | "error"
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    #: What containment was actually in effect (filled in by the bootstrap), e.g.
    #: ``{"netns": True, "pidns": True, "mountns": True, "readonly": "mount_setattr",
    #: "uid": 65534, "audit_hook": False, ...}``.
    isolation: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# The bootstrap: trusted code that runs in the child before the untrusted program.
# --------------------------------------------------------------------------------------------
_BOOTSTRAP = r'''
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
info = {"root": os.geteuid() == 0, "userns": False, "netns": False, "mountns": False, "pidns": False,
        "proc": False, "readonly": None, "exposed": [], "uid": os.geteuid(), "no_new_privs": False,
        "audit_hook": False, "nproc_limit": None, "warnings": []}
INFO_FD = cfg["info_fd"]
NEWNS, NEWPID, NEWNET, NEWUSER = 0x00020000, 0x20000000, 0x40000000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.syscall.restype = ctypes.c_long
except Exception as e:  # non-glibc / non-Linux
    libc = None
    info["warnings"].append("no libc: %r" % (e,))

def die(msg):
    os.write(2, ("verispec-sandbox: " + msg + "\n").encode("utf-8", "replace"))
    os._exit(121)

def oserr(what):
    e = ctypes.get_errno()
    return OSError(e, "%s: %s" % (what, os.strerror(e)))

def b(s):
    return None if s is None else os.fsencode(s)

def unshare(flags):
    if hasattr(os, "unshare"):
        os.unshare(flags)
    elif libc is None or not hasattr(libc, "unshare"):
        raise OSError(38, "unshare is not available")
    elif libc.unshare(ctypes.c_int(flags)) != 0:
        raise oserr("unshare")

def mount(src, tgt, fstype, flags, data=None):
    if libc.mount(b(src), b(tgt), b(fstype), flags, b(data)) != 0:
        raise oserr("mount %s" % tgt)

def mount_setattr(path, recursive, set_, clr):
    attr = (ctypes.c_uint64 * 4)(set_, clr, 0, 0)
    r = libc.syscall(ctypes.c_long(442), ctypes.c_int(-100), b(path),
                     ctypes.c_uint(0x8000 if recursive else 0), ctypes.byref(attr), ctypes.c_size_t(32))
    if r != 0:
        raise oserr("mount_setattr %s" % path)

def write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)

uid, gid = os.getuid(), os.getgid()
root = os.geteuid() == 0
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

# ---- namespaces ----
if cfg["namespaces"] and libc is not None:
    if root:
        try:
            unshare(NEWNS | NEWNET | NEWPID)
            info.update(netns=True, mountns=True, pidns=True)
        except OSError:
            for flag, key in ((NEWNET, "netns"), (NEWNS, "mountns"), (NEWPID, "pidns")):
                try:
                    unshare(flag)
                    info[key] = True
                except OSError as e:
                    info["warnings"].append("%s: %s" % (key, e))
    else:
        for flags in (NEWUSER | NEWNS | NEWNET | NEWPID, NEWUSER | NEWNET | NEWNS, NEWUSER | NEWNET):
            try:
                unshare(flags)
            except OSError as e:
                info["warnings"].append("userns %#x: %s" % (flags, e))
                continue
            try:
                write_file("/proc/self/setgroups", "deny")
                write_file("/proc/self/uid_map", "%d %d 1" % (uid, uid))
                write_file("/proc/self/gid_map", "%d %d 1" % (gid, gid))
            except OSError as e:
                die("user namespace maps: %s" % e)
            info.update(userns=True, netns=True, mountns=bool(flags & NEWNS), pidns=bool(flags & NEWPID))
            break

# ---- fork: with a new PID namespace the child is its PID 1 ----
pid = os.fork()
if pid:
    # Tell the parent the child's pid: on timeout it kills the child (PID 1 of the new namespace,
    # which takes every process in it down) and lets this relay reap it, instead of killing the
    # relay first and leaving the namespace to die asynchronously.
    try:
        os.write(INFO_FD, (json.dumps({"pid1": pid}) + "\n").encode())
    except OSError:
        pass
    os.close(INFO_FD)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(121)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status))

work = cfg["work"]
try:
    if info["mountns"]:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        if root and cfg["expose"]:
            # Make directories the sandbox uid cannot traverse (e.g. /root holding a pyenv Python)
            # reachable: tmpfs over the blocking directory, bind the needed subtrees back.
            fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in cfg["expose"]}
            for _ in range(8):
                todo = None
                for p in fds:
                    parts = p.strip("/").split("/")
                    cur = "/"
                    for part in parts:
                        if not (os.stat(cur).st_mode & 0o001):
                            todo = cur
                            break
                        cur = os.path.join(cur, part)
                    if todo:
                        break
                if not todo:
                    break
                mount("tmpfs", todo, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
                for p, fd in fds.items():
                    if p.startswith(todo.rstrip("/") + "/"):
                        os.makedirs(p, mode=0o755, exist_ok=True)
                        mount("/proc/self/fd/%d" % fd, p, None, MS_BIND | MS_REC)
                info["exposed"].append(todo)
            for fd in fds.values():
                os.close(fd)
        if info["pidns"]:
            try:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                info["proc"] = True
            except OSError as e:
                info["warnings"].append(str(e))
        mount(work, work, None, MS_BIND | MS_REC)
        try:
            # MOUNT_ATTR_RDONLY/NOSUID have the same values as MS_RDONLY/NOSUID.  Not nodev:
            # /dev/null etc. must keep working (the sandbox uid cannot mknod anyway).
            mount_setattr("/", True, MS_RDONLY | MS_NOSUID, 0)
            mount_setattr(work, False, 0, MS_RDONLY)
            info["readonly"] = "mount_setattr"
        except OSError as e:
            info["warnings"].append(str(e))
            # Older kernels: bind-remount every mount point read-only, deepest last.
            mps = []
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    mp = line.split()[4].encode().decode("unicode_escape")
                    mps.append(mp)
            bad = 0
            for mp in mps:
                if mp == work:
                    continue
                try:
                    mount(None, mp, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
                except OSError:
                    bad += 1
            try:
                mount(None, work, None, MS_BIND | MS_REMOUNT | MS_NOSUID)
            except OSError as e:
                info["warnings"].append(str(e))
            info["readonly"] = "remount" if not bad else "remount-partial"
    os.chdir(work)
except OSError as e:
    die("mount setup failed: %s" % e)

# ---- drop privileges ----
if root:
    try:
        os.setgroups([])
        if hasattr(os, "setresuid"):
            os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        else:
            os.setgid(cfg["gid"])
            os.setuid(cfg["uid"])
    except OSError as e:
        die("cannot drop privileges to uid %s: %s" % (cfg["uid"], e))
    if os.getuid() == 0 or os.geteuid() == 0:
        die("still root after setresuid")
    info["uid"] = os.getuid()
if libc is not None:
    try:
        if libc.prctl(38, 1, 0, 0, 0) == 0:  # PR_SET_NO_NEW_PRIVS
            info["no_new_privs"] = True
    except Exception:
        pass

# ---- resource limits ----
def lim(res, value):
    try:
        soft, hard = resource.getrlimit(res)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(res, (value, value))
    except (ValueError, OSError) as e:
        info["warnings"].append("rlimit %s: %s" % (res, e))

lim(resource.RLIMIT_AS, cfg["memory_bytes"])
cpu = cfg["cpu_s"]
try:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
except (ValueError, OSError) as e:
    info["warnings"].append("rlimit cpu: %s" % e)
lim(resource.RLIMIT_FSIZE, cfg["fsize_bytes"])
nproc = cfg["max_procs"]
if not root and not info["userns"]:
    # RLIMIT_NPROC counts every process of this uid: leave room for the ones already running.
    mine = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat("/proc/" + d).st_uid == uid:
                    mine += len(os.listdir("/proc/%s/task" % d))
            except OSError:
                pass
    nproc += mine
lim(resource.RLIMIT_NPROC, nproc)
info["nproc_limit"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]

python = cfg["python"]
if root and not info["mountns"]:
    python = cfg["python_fallback"]  # nothing was made reachable for the sandbox uid
    if not python:
        die("no Python interpreter is readable by uid %s without a mount namespace "
            "(set VERISPEC_SANDBOX_PYTHON)" % cfg["uid"])
info["python"] = python
argv = [python, "-I", "-B"]
if not info["netns"] or not info["mountns"]:
    argv += ["-c", cfg["hook"], "prog.py"]
    info["audit_hook"] = True
else:
    argv += ["prog.py"]
try:
    os.write(INFO_FD, (json.dumps(info) + "\n").encode())
except OSError:
    pass
finally:
    os.close(INFO_FD)
try:
    os.execve(python, argv, cfg["env"])
except OSError as e:
    hint = ""
    if e.errno == 11:
        hint = " (RLIMIT_NPROC: uid %d already runs too many processes; see VERISPEC_SANDBOX_UID)" % os.getuid()
    die("cannot execute %s: %s%s" % (python, e, hint))
'''

# In-interpreter fallback when the kernel measures are unavailable (see module docstring).
_AUDIT_HOOK = r'''
import sys, os
_work = os.path.realpath(os.getcwd())
def _hook(event, args, _work=_work, _real=os.path.realpath, _sep=os.sep):
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
        sock = args[0]
        if getattr(sock, "family", None) in (2, 10):
            raise PermissionError("network access is disabled in the sandbox")
    elif event in ("ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "subprocess.Popen", "os.system",
                   "os.exec", "os.posix_spawn", "os.spawn", "pty.spawn"):
        raise PermissionError("%s is disabled in the sandbox" % event)
    elif event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & 3)
        if writing and isinstance(path, (str, bytes)):
            p = _real(os.fsdecode(path))
            if p != _work and not p.startswith(_work + _sep) and p not in ("/dev/null",):
                raise PermissionError("writing outside the sandbox directory is disabled: %s" % p)
    elif event in ("os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
                   "os.truncate", "os.chmod", "os.chown", "shutil.rmtree", "os.utime"):
        for a in args[:2]:
            if isinstance(a, (str, bytes)):
                p = _real(os.fsdecode(a))
                if p != _work and not p.startswith(_work + _sep):
                    raise PermissionError("%s outside the sandbox directory is disabled" % event)
sys.addaudithook(_hook)
del _hook
import runpy
sys.argv = ["prog.py"]
runpy.run_path("prog.py", run_name="__main__")
'''


def _python_for_sandbox() -> str:
    return os.environ.get("VERISPEC_SANDBOX_PYTHON") or sys.executable


def _expose_paths(python: str) -> list[str]:
    """Directories the sandbox uid must be able to read for ``python`` to start."""
    paths = set()
    if python == sys.executable:
        for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
            paths.add(os.path.realpath(p))
    paths.add(os.path.dirname(os.path.realpath(python)))
    paths.add(os.path.dirname(os.path.abspath(python)))
    paths = sorted(p for p in paths if os.path.isdir(p) and p != "/")
    # keep only outermost
    out: list[str] = []
    for p in paths:
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
    """An interpreter the sandbox uid can run without the mount-namespace exposure trick."""
    ver = "python%d.%d" % sys.version_info[:2]
    for cand in (python, os.path.realpath(python), f"/usr/local/bin/{ver}", f"/usr/bin/{ver}",
                 "/usr/local/bin/python3", "/usr/bin/python3"):
        if os.path.exists(cand) and _others_can_use(cand):
            return cand
    return None


def _read_capped(path: Path, cap: int = MAX_CAPTURE_BYTES) -> str:
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


def _wait_exit_nowait(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until ``proc`` has exited WITHOUT reaping it (so its pgid stays reserved). True if exited."""
    deadline = time.monotonic() + timeout
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:
            pidfd = None
    try:
        if pidfd is not None:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if poller.poll(max(1, int(left * 1000))):
                    return True
        while True:  # fallback: poll waitid(WNOWAIT)
            try:
                r = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
            except ChildProcessError:
                return True
            if r is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _read_available(fd: int, chunks: list[bytes]) -> list[bytes]:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return chunks


def _parse_info(chunks: list[bytes]) -> dict:
    info: dict = {}
    for line in b"".join(chunks).splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            info.update(obj)
    return info


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _rmtree(path: str) -> None:
    def onerror(func, p, exc):  # a program may leave read-only dirs behind
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


_MEMORY_RE = re.compile(r"^(MemoryError\b|.*\bCannot allocate memory\b|.*std::bad_alloc)")


def run_python(
    code: str,
    *,
    timeout_s: float = 10,
    memory_mb: int = 1024,
    max_procs: int = 64,
    max_file_mb: int = 16,
    namespaces: bool = True,
    files: dict[str, bytes | str] | None = None,
    max_output_bytes: int = MAX_CAPTURE_BYTES,
) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox described in the module docstring.

    ``files`` are extra input files written into the run directory beside ``prog.py`` (plain
    names only).  ``max_output_bytes`` caps how much of stdout/stderr is kept (head + tail); the
    program itself can write at most ``max_file_mb`` to each.  ``namespaces=False`` skips the
    kernel namespaces (network/PID/mount), leaving the uid drop, rlimits, process-group kill and
    the audit-hook fallback -- only for diagnosing the sandbox.  Never raises for anything the
    program does; setup problems give ``status="error"``.
    """
    t0 = time.monotonic()
    python = _python_for_sandbox()
    is_root = os.geteuid() == 0
    base = tempfile.mkdtemp(prefix="verispec-sbx-")
    info: dict = {}
    try:
        os.chmod(base, 0o711)
        work = os.path.join(base, "work")
        os.mkdir(work, 0o700)
        with open(os.path.join(work, "prog.py"), "w", encoding="utf-8") as f:
            f.write(code)
        for fname, data in (files or {}).items():
            if not fname or "/" in fname or fname in (".", "..", "prog.py"):
                raise ValueError(f"bad sandbox input file name {fname!r}")
            with open(os.path.join(work, fname), "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
        if is_root:
            os.chown(work, SANDBOX_UID, SANDBOX_GID)
            os.chown(os.path.join(work, "prog.py"), SANDBOX_UID, SANDBOX_GID)
        work = os.path.realpath(work)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": work,
            "TMPDIR": work,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        info_r, info_w = os.pipe()
        os.set_blocking(info_r, False)
        chunks: list[bytes] = []
        cfg = {
            "info_fd": info_w,
            "work": work,
            "python": python,
            "uid": SANDBOX_UID,
            "gid": SANDBOX_GID,
            "namespaces": bool(namespaces) and sys.platform.startswith("linux"),
            "expose": _expose_paths(python) if is_root else [],
            "python_fallback": _fallback_python(python) if is_root else python,
            "memory_bytes": int(memory_mb) * 1024 * 1024,
            "cpu_s": int(math.ceil(timeout_s)) + 1,
            "fsize_bytes": int(max_file_mb) * 1024 * 1024,
            "max_procs": int(max_procs),
            "env": env,
            "hook": _AUDIT_HOOK,
        }
        out_path, err_path = Path(base) / "stdout", Path(base) / "stderr"
        timed_out = False
        try:
            with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
                try:
                    proc = subprocess.Popen(
                        [sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP, json.dumps(cfg)],
                        cwd=work,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out_f,
                        stderr=err_f,
                        pass_fds=(info_w,),
                        start_new_session=True,
                    )
                finally:
                    os.close(info_w)
                try:
                    exited = _wait_exit_nowait(proc, timeout_s)
                    if not exited:
                        timed_out = True
                        info = _parse_info(_read_available(info_r, chunks))
                        pid1 = info.get("pid1")
                        if info.get("pidns") and isinstance(pid1, int) and pid1 > 1:
                            # The relay has not reaped pid1 yet (it only does so once pid1 is dead),
                            # so this pid cannot have been reused.  Killing PID 1 of the namespace
                            # kills all of it; the relay returns once everything in it is gone.
                            try:
                                os.kill(pid1, signal.SIGKILL)
                            except OSError:
                                pass
                            _wait_exit_nowait(proc, 10)
                    _killpg(proc.pid)  # the leader is not reaped yet, so the pgid is still ours
                finally:
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:  # pragma: no cover - cannot happen after SIGKILL
                        proc.kill()
                        proc.wait()
            rc = proc.returncode
        finally:
            info = _parse_info(_read_available(info_r, chunks))
            os.close(info_r)
        duration = time.monotonic() - t0
        stdout, stderr = _read_capped(out_path, max_output_bytes), _read_capped(err_path, max_output_bytes)
    except Exception as e:  # setup failure in the parent (e.g. cannot create files / spawn)
        _rmtree(base)
        return SandboxResult("error", None, "", f"{_SETUP_MARK} {type(e).__name__}: {e}", time.monotonic() - t0)
    finally:
        if os.path.exists(base):
            _rmtree(base)

    last = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if timed_out:
        status = "timeout"
    elif rc == 0:
        status = "passed"
    elif rc == _SETUP_FAILED_RC and _SETUP_MARK in stderr:
        status = "error"
    elif rc in (-signal.SIGXCPU,):
        status = "timeout"
    elif rc == -signal.SIGKILL:
        status = "memory"  # we did not send it: the OOM killer (or RLIMIT_CPU's hard limit)
        if duration >= cfg["cpu_s"]:
            status = "timeout"
    elif _MEMORY_RE.match(last.strip()):
        status = "memory"
    else:
        status = "failed"
    return SandboxResult(status, rc, stdout, stderr, duration, info)


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
