"""Child side of the sandbox: the trusted setup that runs before the untrusted program.

Started by :mod:`.runner` as ``python -I -S -B bootstrap.py FD`` (no site, no user paths: it
imports nothing but the standard library, so it is run by path, never imported by the program);
its configuration (JSON) is read from the pipe ``FD``, never from the command line, which any
local user can read in ``/proc``.  It creates the namespaces, waits until the parent has moved it into the run's
cgroup, forks the program's process (PID 1 of the new PID namespace; this process stays behind
as a relay that reaps it and exits with its status), builds the minimal root, drops privileges,
installs the seccomp filter and the rlimits, and finally ``execve``\\s ``python -I -B MAIN ARGS``
in the run directory.  Without the namespaces it refuses to go on unless the caller opted in
(``cfg["allow_unsafe"]``), has a cgroup and is root (see :mod:`verispec.tasks.sandbox`).

What it achieved is written as one JSON line to the info pipe (``cfg["info_fd"]``); a setup
failure is a line ``verispec-sandbox: ...`` on stderr and exit status :data:`SETUP_FAILED_RC`.
The parent documents the guarantees (see :mod:`verispec.tasks.sandbox`).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import shutil
import signal
import struct
import sys
import time

SETUP_FAILED_RC = 121
SETUP_MARK = "verispec-sandbox:"
#: Where the run directory appears inside the minimal root.
INSIDE_WORK = "/sandbox"
#: Files and directories the run directory (and ``/dev/shm``) may hold.
MAX_INODES = 65536

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
ST_NOEXEC = 8
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_PDEATHSIG = 38, 22, 2, 1

# Per architecture: the audit arch the kernel reports for native calls and the numbers of the
# syscalls the filter looks at (:func:`seccomp_program` says what it does with each).  Calls of
# any other ABI (i386 via int 0x80, x32) are refused wholesale: their numbers differ and Python
# never uses them.
_KEYRING = {
    "x86_64": (0xC000003E, (248, 249, 250)),  # add_key, request_key, keyctl
    "aarch64": (0xC00000B7, (217, 218, 219)),
}
_IO_URING = (425, 426, 427)  # io_uring_setup, _enter, _register (the same on every architecture)
_PROCESS_MADVISE, _CACHESTAT = 440, 451
_NR = {
    "x86_64": {"socket": 41, "socketpair": 53, "mincore": 27, "madvise": 28, "readahead": 187,
               "fadvise64": 221, "remap_file_pages": 216, "sync_file_range": 277, "preadv2": 327,
               "pwritev2": 328, "io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209,
               "io_cancel": 210, "io_pgetevents": 333},
    "aarch64": {"socket": 198, "socketpair": 199, "mincore": 232, "madvise": 233, "readahead": 213,
                "fadvise64": 223, "remap_file_pages": 234, "sync_file_range": 84, "preadv2": 286,
                "pwritev2": 287, "io_setup": 0, "io_destroy": 1, "io_getevents": 4, "io_submit": 2,
                "io_cancel": 3, "io_pgetevents": 292},
}
#: System V IPC and POSIX message queues: refused where the run has no IPC namespace of its own
#: (their objects outlive the run and would reach a later one).
_HOST_IPC = {
    "x86_64": (29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71, *range(240, 246)),
    "aarch64": tuple(range(180, 198)),
}
#: Syscalls refused outright besides the keyrings and io_uring: every way to drop, probe or
#: load page-cache pages of a file the run can only read (see :func:`seccomp_program`).
_PAGE_CACHE_CALLS = ("mincore", "readahead", "fadvise64", "remap_file_pages", "sync_file_range", "io_setup",
                     "io_destroy", "io_getevents", "io_submit", "io_cancel", "io_pgetevents")
_SOCKET = {m: nr["socket"] for m, nr in _NR.items()}
AF_UNIX = 1
SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK = 1, 5, 0xF
MADV_COLD, MADV_PAGEOUT, MADV_COLLAPSE = 20, 21, 25
_X32_BIT = 0x40000000
#: What the filter refuses, as reported in ``isolation["seccomp"]``.
SECCOMP_SUMMARY = "keyring+io_uring+af_unix+page_cache+foreign-abi"
#: Why a run without namespaces is refused, and how to opt in (the CLI flag sets the variable).
UNSAFE_ENV = "VERISPEC_SANDBOX_UNSAFE_NO_NAMESPACES"
UNSAFE_FLAG = "--unsafe-sandbox-without-namespaces"
REFUSAL = (
    "refusing to run code without kernel namespaces ({why}): the program could read every "
    "world-readable file on this machine, benchmark datasets with their solutions and tests "
    f"included, so its grade could be forged. Run where unprivileged user namespaces or root are "
    f"available, or accept that risk with {UNSAFE_FLAG} (environment: {UNSAFE_ENV}=1)"
)

_libc = None


def _die(msg: str) -> None:
    os.write(2, f"{SETUP_MARK} {msg}\n".encode("utf-8", "replace"))
    os._exit(SETUP_FAILED_RC)


def _libc_or_none():
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
            lib.unshare.argtypes = [ctypes.c_int]
            lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
            _libc = lib
        except (OSError, AttributeError):
            return None
    return _libc


def _oserr(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def _b(s):
    return None if s is None else os.fsencode(s)


def unshare(flags: int) -> None:
    lib = _libc_or_none()
    if lib is None:
        raise OSError(38, "unshare is not available (no libc)")
    if lib.unshare(flags) != 0:
        raise _oserr("unshare")


def mount(src, tgt, fstype, flags, data=None) -> None:
    if _libc.mount(_b(src), _b(tgt), _b(fstype), flags, _b(data)) != 0:
        raise _oserr(f"mount {tgt}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- namespaces
def enter_namespaces(cfg: dict, info: dict) -> None:
    """New network, IPC, mount and PID namespaces (as root directly, else inside a user ns)."""
    wanted = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
    names = ((CLONE_NEWNET, "netns"), (CLONE_NEWIPC, "ipcns"), (CLONE_NEWNS, "mountns"), (CLONE_NEWPID, "pidns"))
    if os.geteuid() == 0:
        try:
            unshare(wanted)
            info.update({k: True for _, k in names})
            return
        except OSError:
            pass
        for flag, key in names:
            try:
                unshare(flag)
                info[key] = True
            except OSError as e:
                info["warnings"].append(f"{key}: {e}")
        return
    uid, gid = os.getuid(), os.getgid()
    for flags in (CLONE_NEWUSER | wanted, CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC,
                  CLONE_NEWUSER | CLONE_NEWNET):
        try:
            unshare(flags)
        except OSError as e:
            info["warnings"].append(f"userns {flags:#x}: {e}")
            continue
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as e:
            _die(f"user namespace maps: {e}")
        info["userns"] = True
        info.update({k: bool(flags & f) for f, k in names})
        return


def relay(pid: int, info_fd: int) -> None:
    """The bootstrap's own process after the fork: report PID 1, reap it, exit like it."""
    try:
        os.write(info_fd, (json.dumps({"pid1": pid}) + "\n").encode())
    except OSError:
        pass
    os.close(info_fd)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(SETUP_FAILED_RC)
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


# ---------------------------------------------------------------------------- minimal root
def _bind(src: str, dst: str) -> None:
    """Bind ``src`` at ``dst`` read-only, nosuid, nodev."""
    mount(src, dst, None, MS_BIND | MS_REC)
    # A bind remount must keep the flags the kernel locked on the source (inside a user
    # namespace it refuses to drop them), so noexec is read back and kept.
    noexec = MS_NOEXEC if os.statvfs(src).f_flag & ST_NOEXEC else 0
    mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | noexec)


def _inside(path: str, tops) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


def _resolve(path: str, links: list, depth: int = 0) -> str:
    """The real path of ``path`` on the host, appending each symbolic link met on the way as
    ``(link path, its target)`` to ``links`` (so the same chain can be rebuilt in the new root)."""
    if depth > 40:
        raise OSError(40, f"too many levels of symbolic links: {path}")
    parts = [p for p in path.split("/") if p]
    cur = "/"
    for i, part in enumerate(parts):
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            links.append((nxt, target))
            rest = os.path.join(os.path.normpath(os.path.join(cur, target)), *parts[i + 1:])
            return _resolve(rest, links, depth + 1)
        cur = nxt
    return cur


def _expose(path: str, new: str, bound: list, is_dir: bool) -> None:
    """Make host ``path`` visible at the same path under ``new``: symbolic links on the way are
    recreated, the real file or directory is bound read-only (unless a bound directory holds it)."""
    links: list = []
    real = _resolve(path, links)
    for link, target in links:
        if not _inside(link, bound) and not os.path.lexists(new + link):
            os.makedirs(os.path.dirname(new + link), mode=0o755, exist_ok=True)
            os.symlink(target, new + link)
    if _inside(real, bound):
        return
    dst = new + real
    if is_dir:
        os.makedirs(dst, mode=0o755, exist_ok=True)
        bound.append(real)
    else:
        os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
        open(dst, "w").close()
    _bind(real, dst)


def build_minimal_root(cfg: dict, info: dict) -> str:
    """Assemble the program's whole file system on a tmpfs and switch to it; returns the run dir.

    Visible inside (``cfg["root"]``, from :func:`.rootfs.plan`): the interpreter binary, its
    standard library and ``lib-dynload`` (every ``site-packages`` / ``dist-packages`` in them,
    and the standard library's ``test`` and ``ensurepip``, hidden under an empty read-only
    tmpfs), the shared libraries they load (file by file), ``/etc/ld.so.cache`` and the C.UTF-8
    locale; ``/dev/null``, ``zero``, ``full``, ``random``, ``urandom``; a fresh ``/proc``; a
    size-limited ``/dev/shm``; and the run directory ``/sandbox`` -- a size-limited tmpfs holding
    copies of the input files (root's, read-only).  Nothing else of the host exists there.  The
    tmpfs mounts live only in this mount namespace, so they vanish with the run whatever the
    program left in them.
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    new = cfg["newroot"]
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    os.umask(0o022)
    plan = cfg["root"]
    bound: list[str] = []
    for d in plan["dirs"]:
        _expose(d, new, bound, is_dir=True)
    for f in plan["files"]:
        _expose(f, new, bound, is_dir=False)
    for m in plan["masks"]:
        mount("tmpfs", new + m, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=1,mode=0555")
    info["masked"] = list(plan["masks"])
    os.mkdir(new + "/dev")
    for node in ("null", "zero", "full", "random", "urandom"):
        if os.path.exists("/dev/" + node):
            open(new + "/dev/" + node, "w").close()
            # no remount: a device node's mount flags do not matter (its own mode does)
            mount("/dev/" + node, new + "/dev/" + node, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, new + "/dev/" + name)
    # bytes and inodes: empty files cost kernel memory too
    quota = "size=%d,nr_inodes=%d" % (cfg["disk_bytes"], MAX_INODES)  # noqa: UP031 (%d: options stay numeric)
    os.mkdir(new + "/dev/shm")
    mount("tmpfs", new + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777," + quota)
    os.mkdir(new + "/proc")
    if info["pidns"]:
        mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        info["proc"] = True
    work = new + INSIDE_WORK
    os.mkdir(work)
    # root's, sticky, writable by the run's group: the program may add files but not replace inputs
    mode = "mode=1770,uid=0,gid=%d" % cfg["gid"] if os.geteuid() == 0 else "mode=0700"  # noqa: UP031
    mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, mode + "," + quota)
    copy_inputs(cfg, work)
    mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    # switch_root: move the new tree over "/" and chroot into it (pivot_root is refused when
    # "/" is an initramfs, which some VMs boot from).
    os.chdir(new)
    mount(new, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir(INSIDE_WORK)
    info["root_fs"] = "minimal"
    info["disk_limit_mb"] = cfg["disk_bytes"] >> 20
    return INSIDE_WORK


def copy_inputs(cfg: dict, work: str) -> None:
    """Copy the input files into the run directory: root's (when we are root) and read-only."""
    for name in sorted(os.listdir(cfg["inputs"])):
        dst = os.path.join(work, name)
        shutil.copyfile(os.path.join(cfg["inputs"], name), dst)
        os.chmod(dst, 0o444)


def make_host_work_dir(cfg: dict) -> str:
    """The run directory on the host (no mount namespace): root's, mode 1770, group = the run's
    own gid, so only this run's uid can enter it and it cannot replace the inputs."""
    work = cfg["work"]
    os.mkdir(work, 0o700)
    if os.geteuid() == 0:
        os.chown(work, 0, cfg["gid"])
        os.chmod(work, 0o1770)
    copy_inputs(cfg, work)
    return work


# ---------------------------------------------------------------------------- privileges
def drop_privileges(cfg: dict, info: dict) -> None:
    try:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    except OSError as e:
        _die(f"cannot drop privileges to uid {cfg['uid']}: {e}")
    if os.getuid() == 0 or os.geteuid() == 0:
        _die("still root after setresuid")
    info["uid"] = os.getuid()


def seccomp_program(machine: str, network: bool = True, ipc: bool = True) -> bytes | None:
    """Classic-BPF filter; every refusal is ``EPERM``, everything else is allowed.

    * the kernel keyrings (``add_key``, ``request_key``, ``keyctl``): per uid, they would carry
      data between runs; ``io_uring_*``: its operations (sockets, reads) bypass seccomp;
    * ``socket(AF_UNIX, ...)``: a pathname Unix socket anywhere visible would be a door out; and
      ``socketpair(AF_UNIX, ...)`` of any type but ``SOCK_STREAM`` / ``SOCK_SEQPACKET`` (a
      datagram pair can ``sendto``/``connect`` any visible socket path; a stream or seqpacket
      pair is connected to itself for life: ``connect`` gives ``EISCONN``, an address on a send
      is refused or ignored).  Stream pairs stay: ``asyncio`` and ``multiprocessing.Pipe()``
      need them.  With ``network=False`` (no network namespace) ``socket`` is refused for every
      family, and with ``ipc=False`` (no IPC namespace) every System V IPC and POSIX message
      queue call;
    * the page cache of files the run can only read (the standard library and the libraries
      bound into its root are the host's own files, shared with every later run): dropping
      pages (``fadvise64``, ``madvise`` ``MADV_PAGEOUT`` / ``MADV_COLD``, ``process_madvise``;
      ``MADV_COLLAPSE``, which rebuilds a file's cached pages as one huge page),
      probing them without I/O (``preadv2`` / ``pwritev2`` with any flag -- ``RWF_NOWAIT``
      answers "not cached" with ``EAGAIN``, ``RWF_DONTCACHE`` drops what it read --, native
      AIO ``io_*`` with the same flags, ``mincore``, ``cachestat``) and loading them
      (``readahead``), plus ``remap_file_pages`` and ``sync_file_range``, which Python never
      calls.  ``preadv2`` without flags (``os.preadv``) and every other ``madvise`` stay.
    * syscalls of a foreign ABI (their numbers differ).
    """
    if machine not in _KEYRING:
        return None
    arch, keyring = _KEYRING[machine]
    nr = _NR[machine]
    denied = (*keyring, *_IO_URING, _PROCESS_MADVISE, _CACHESTAT, *(nr[c] for c in _PAGE_CACHE_CALLS))
    if not ipc:
        denied += _HOST_IPC[machine]
    ld_w_abs, jeq_k, jge_k, alu_and_k, ret_k = 0x20, 0x15, 0x35, 0x54, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM

    def arg(i: int) -> tuple:  # the low 32 bits of args[i] (little-endian; the kernel reads an int)
        return (ld_w_abs, 0, 0, 16 + 8 * i)

    # Instructions (code, jt, jf, k) whose jump targets may be labels (str), resolved below;
    # ("label", name) marks a position and ("ret", name) returns allow/deny.
    prog: list = [(ld_w_abs, 0, 0, 4),  # seccomp_data.arch
                  (jeq_k, 1, 0, arch),
                  ("ret", "deny"),
                  (ld_w_abs, 0, 0, 0)]  # seccomp_data.nr
    if machine == "x86_64":
        prog.append((jge_k, "deny", 0, _X32_BIT))
    prog += [(jeq_k, "deny", 0, n) for n in denied]
    prog += [(jeq_k, "socket", 0, nr["socket"]),
             (jeq_k, "socketpair", 0, nr["socketpair"]),
             (jeq_k, "rwflags", 0, nr["preadv2"]),
             (jeq_k, "rwflags", 0, nr["pwritev2"]),
             (jeq_k, "madvise", "allow", nr["madvise"]),
             ("label", "madvise"), arg(2),
             (jeq_k, "deny", 0, MADV_COLD),
             (jeq_k, "deny", 0, MADV_PAGEOUT),
             (jeq_k, "deny", "allow", MADV_COLLAPSE),
             ("label", "rwflags"), arg(5),  # preadv2(fd, iov, vlen, pos_l, pos_h, flags)
             (jeq_k, "allow", "deny", 0),
             ("label", "socketpair"), arg(0),
             (jeq_k, 0, "allow", AF_UNIX),
             arg(1), (alu_and_k, 0, 0, SOCK_TYPE_MASK),  # the type without SOCK_NONBLOCK/CLOEXEC
             (jeq_k, "allow", 0, SOCK_STREAM),
             (jeq_k, "allow", "deny", SOCK_SEQPACKET),
             ("label", "socket")]
    if network:
        prog += [arg(0), (jeq_k, "deny", "allow", AF_UNIX)]
    else:
        prog += [("ret", "deny")]
    prog += [("label", "allow"), ("ret", "allow"), ("label", "deny"), ("ret", "deny")]
    labels, pc = {}, 0
    for ins in prog:
        if ins[0] == "label":
            labels[ins[1]] = pc
        else:
            pc += 1
    out, pc = [], 0
    for ins in prog:
        if ins[0] == "label":
            continue
        if ins[0] == "ret":
            out.append(struct.pack("HBBI", ret_k, 0, 0, allow if ins[1] == "allow" else deny))
        else:
            code, jt, jf, k = ins
            jt = labels[jt] - pc - 1 if isinstance(jt, str) else jt
            jf = labels[jf] - pc - 1 if isinstance(jf, str) else jf
            if not (0 <= jt < 256 and 0 <= jf < 256):
                raise ValueError("seccomp jump out of range")
            out.append(struct.pack("HBBI", code, jt, jf, k))
        pc += 1
    return b"".join(out)


def lock_down(info: dict) -> None:
    """``PR_SET_NO_NEW_PRIVS`` and the seccomp filter (both survive ``execve``)."""
    lib = _libc_or_none()
    if lib is None:
        info["warnings"].append("no libc: no_new_privs and seccomp not set")
        return
    if lib.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) == 0:
        info["no_new_privs"] = True
    code = seccomp_program(platform.machine(), network=info["netns"], ipc=info["ipcns"])
    if code is None:
        info["warnings"].append(f"seccomp: no filter for {platform.machine()}")
        return
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxP", len(code) // 8, ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fbuf), 0, 0) == 0:
        info["seccomp"] = (SECCOMP_SUMMARY + ("" if info["netns"] else "+all_sockets")
                           + ("" if info["ipcns"] else "+host_ipc"))
    else:
        info["warnings"].append(f"seccomp: {os.strerror(ctypes.get_errno())}")


# Landlock (kernel >= 5.13): file system (and, ABI >= 4, TCP; ABI >= 6, abstract sockets and
# signals) access rights a process gives up for itself and its children, kernel-enforced.
_LL_CREATE, _LL_ADD_RULE, _LL_RESTRICT = 444, 445, 446  # the same on every architecture
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_FS_V1 = (1 << 13) - 1  # execute ... make_sym
_LL_REFER, _LL_TRUNCATE, _LL_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_LL_FILE_RIGHTS = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV
O_PATH = getattr(os, "O_PATH", 0o10000000)


def _landlock_fs_rights(abi: int) -> int:
    rights = _LL_FS_V1
    if abi >= 2:
        rights |= _LL_REFER
    if abi >= 3:
        rights |= _LL_TRUNCATE
    if abi >= 5:
        rights |= _LL_IOCTL_DEV
    return rights


def landlock(cfg: dict, info: dict, work: str) -> None:
    """Without a mount namespace: give up, for the program, every file system right but reading
    (and executing) the paths of ``cfg["landlock_read"]["read"]`` -- the interpreter, its shared
    libraries and its standard library, without ``site-packages`` --, listing the directories of
    ``cfg["landlock_read"]["list"]``, the devices of :data:`_LL_DEVICES`, and everything in the run directory
    ``work``; and, where the kernel's Landlock ABI has them, TCP bind/connect, abstract Unix
    sockets and signals outside the run.  Kernel-enforced: the program cannot undo it as it can
    the audit hook.  ``info["landlock"]`` is the ABI used, or ``None`` (with a warning) where the
    kernel has no Landlock."""
    info["landlock"] = None
    lib = _libc_or_none()
    plan = cfg.get("landlock_read")
    if lib is None or not plan:
        info["warnings"].append("landlock: " + ("no libc" if lib is None else "no paths planned for this interpreter"))
        return
    lib.syscall.restype = ctypes.c_long
    abi = lib.syscall(_LL_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        info["warnings"].append(f"landlock: not available in this kernel ({os.strerror(ctypes.get_errno())})")
        return
    fs = _landlock_fs_rights(abi)
    fields = [fs]
    if abi >= 4:
        fields.append(1 | 2)  # handled_access_net: bind_tcp | connect_tcp (no rule: both refused)
    if abi >= 6:
        fields.append(1 | 2)  # scoped: abstract Unix sockets | signals (this run's own only)
    attr = ctypes.create_string_buffer(struct.pack(f"{len(fields)}Q", *fields))
    ruleset = lib.syscall(_LL_CREATE, attr, ctypes.c_size_t(len(attr.raw)), ctypes.c_uint32(0))
    if ruleset < 0:
        info["warnings"].append(f"landlock: cannot create a ruleset ({os.strerror(ctypes.get_errno())})")
        return
    try:
        rules = [*((p, "read") for p in plan["read"]), *((p, "list") for p in plan["list"]), (work, "all"),
                 *((d, "device") for d in _LL_DEVICES)]
        for path, rights in rules:
            try:
                fd = os.open(path, O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not there on this host: nothing to allow
            try:
                is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
                allowed = {"read": _LL_EXECUTE | _LL_READ_FILE | _LL_READ_DIR, "list": _LL_READ_DIR, "all": fs,
                           "device": _LL_READ_FILE | _LL_WRITE_FILE}[rights] & fs
                if not is_dir:
                    allowed &= _LL_FILE_RIGHTS
                rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd))
                if lib.syscall(_LL_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), rule, ctypes.c_uint32(0)) != 0:
                    _die(f"landlock: cannot allow {path}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if lib.syscall(_LL_RESTRICT, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            _die(f"landlock: cannot restrict the program: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    info["landlock"] = abi


_LL_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def set_limits(cfg: dict, info: dict) -> None:
    def lim(res, value):
        try:
            _, hard = resource.getrlimit(res)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError) as e:
            info["warnings"].append(f"rlimit {res}: {e}")

    lim(resource.RLIMIT_AS, cfg["memory_bytes"])
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    except (ValueError, OSError) as e:
        info["warnings"].append(f"rlimit cpu: {e}")
    lim(resource.RLIMIT_FSIZE, cfg["fsize_bytes"])
    lim(resource.RLIMIT_NOFILE, cfg["nofile"])
    info["nofile_limit"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if cfg["nproc_rlimit"]:
        # Only without a pids cgroup: RLIMIT_NPROC counts every process of the uid, so leave
        # room for the ones already running (concurrent runs share this budget).
        nproc = cfg["max_procs"]
        if os.getuid() == cfg["orig_uid"] and not info["userns"]:
            nproc += _count_own_tasks(os.getuid())
        lim(resource.RLIMIT_NPROC, nproc)
        info["nproc_limit"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]


def _count_own_tasks(uid: int) -> int:
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat("/proc/" + d).st_uid == uid:
                    n += len(os.listdir(f"/proc/{d}/task"))
            except OSError:
                pass
    return n


# ---------------------------------------------------------------------------- main
def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (a grader killed mid-run leaves nothing running:
    the relay dies with the grader, PID 1 of the run with the relay, the run with its PID 1)."""
    lib = _libc_or_none()
    if lib is not None:
        lib.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, None, 0, 0)


def read_config(fd: int) -> dict:
    """The run's configuration, JSON, from the pipe ``fd`` (read to its end, then closed)."""
    data = bytearray()
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return json.loads(data)


def refuse_unless_contained(cfg: dict, info: dict) -> None:
    """No network, mount or PID namespace: refuse unless the caller opted in, and even then
    unless the run has its own cgroup (so every process of it can be killed) and we are root
    (so it runs as a uid of its own, not as the caller)."""
    missing = [k for k in ("netns", "mountns", "pidns") if not info[k]]
    if not missing:
        return
    why = "namespaces=False" if not cfg["namespaces"] else "no " + ", ".join(missing)
    if not cfg["allow_unsafe"]:
        _die(REFUSAL.format(why=why))
    if cfg["cgroup_kind"] is None:
        _die(f"refusing to run code without namespaces ({why}) and without a cgroup: its processes could "
             "outlive the run (give this user write access to a cgroup hierarchy, or run as root)")
    if os.geteuid() != 0:
        _die(f"refusing to run code without namespaces ({why}) as the calling user: only root can give "
             "the run a uid of its own")
    info["unsafe_opt_in"] = True


def main() -> None:
    t0 = time.perf_counter()
    cfg = read_config(int(sys.argv[1]))
    die_with_parent()
    if os.getppid() != cfg["parent_pid"]:
        _die("the grader is gone")
    root = os.geteuid() == 0
    info = {"root": root, "userns": False, "netns": False, "ipcns": False, "mountns": False, "pidns": False,
            "proc": False, "root_fs": "host", "uid": os.geteuid(), "no_new_privs": False, "seccomp": None,
            "audit_hook": False, "nproc_limit": None, "cgroup": cfg["cgroup_kind"], "warnings": []}
    info_fd = cfg["info_fd"]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg["namespaces"] and _libc_or_none() is not None:
        enter_namespaces(cfg, info)
    refuse_unless_contained(cfg, info)
    if cfg["cgroup_go_fd"] is not None:
        # The parent moves this process into the run's cgroup while it starts up (a move
        # takes milliseconds) and then says whether that worked; nothing is forked before.
        answer = os.read(cfg["cgroup_go_fd"], 4096)
        os.close(cfg["cgroup_go_fd"])
        if not answer.startswith(b"1"):
            _die(f"cannot join the run's cgroup: {answer[1:].decode(errors='replace') or 'no answer'}")
    pid = os.fork()
    if pid:
        relay(pid, info_fd)
    try:
        if info["mountns"]:
            work = build_minimal_root(cfg, info)
        else:
            work = make_host_work_dir(cfg)
            os.chdir(work)
    except OSError as e:
        _die(f"file system setup failed: {e}")
    if root:
        drop_privileges(cfg, info)
    die_with_parent()  # after the uid change, which clears it; the relay is this process's parent
    lock_down(info)
    if not info["mountns"]:
        landlock(cfg, info, work)
    set_limits(cfg, info)
    python = cfg["python"]
    if root and not info["mountns"]:
        python = cfg["python_fallback"]  # the sandbox uid must reach it without the minimal root
        if not python:
            _die(f"no Python interpreter is usable by uid {cfg['uid']} without a mount namespace "
                 "(set VERISPEC_SANDBOX_PYTHON)")
    info["python"] = python
    info["setup_s"] = round(time.perf_counter() - t0, 4)
    argv = [python, "-I", "-B"]
    if not info["netns"] or not info["mountns"]:
        # -S: no site, so no site-packages (the grader's own environment holds the answers) and no
        # .pth file's code; the import system sees the standard library and the run directory only.
        argv += ["-S", cfg["hook_name"]]
        info["audit_hook"] = True
        info["site_packages"] = False
    argv += cfg["argv"]
    env = dict(cfg["env"], HOME=work, TMPDIR=work)
    try:
        os.write(info_fd, (json.dumps(info) + "\n").encode())
    except OSError:
        pass
    os.close(info_fd)
    try:
        os.execve(python, argv, env)
    except OSError as e:
        hint = ""
        if e.errno == 11:
            hint = f" (RLIMIT_NPROC: uid {os.getuid()} already runs too many processes)"
        _die(f"cannot execute {python}: {e}{hint}")


if __name__ == "__main__":
    main()
