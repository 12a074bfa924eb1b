"""Child side of the sandbox: the trusted setup that runs before the untrusted program.

Started by :mod:`.runner` as ``python -I -S -B bootstrap.py CONFIG_JSON`` (no site, no user
paths: it imports nothing but the standard library, so it is run by path, never imported by the
program).  It creates the namespaces, waits until the parent has moved it into the run's
cgroup, forks the program's process (PID 1 of the new PID namespace; this process stays behind
as a relay that reaps it and exits with its status), builds the minimal root, drops privileges,
installs the seccomp filter and the rlimits, and finally ``execve``\\s ``python -I -B MAIN ARGS``
in the run directory.

What it achieved is written as one JSON line to the info pipe (``cfg["info_fd"]``); a setup
failure is a line ``verispec-sandbox: ...`` on stderr and exit status :data:`SETUP_FAILED_RC`.
The parent documents the guarantees (see :mod:`verispec.bench.sandbox`).
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
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2

# Keyring syscalls (add_key, request_key, keyctl) per architecture, with the audit arch the
# kernel reports for native calls.  Calls of any other ABI (i386 via int 0x80, x32) are refused
# wholesale: their numbers differ and Python never uses them.
_KEYRING = {
    "x86_64": (0xC000003E, (248, 249, 250)),
    "aarch64": (0xC00000B7, (217, 218, 219)),
}
_X32_BIT = 0x40000000

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


def build_minimal_root(cfg: dict, info: dict) -> str:
    """Assemble the program's whole file system on a tmpfs and switch to it; returns the run dir.

    Visible inside: the OS's ``/usr`` (with ``/bin``, ``/lib*``, ``/sbin`` as on the host),
    the interpreter's prefixes (``cfg["expose"]``), a few device nodes, a fresh ``/proc``, a
    size-limited ``/dev/shm`` and the run directory ``/sandbox`` -- itself a size-limited tmpfs
    holding copies of the input files.  Everything else of the host (repositories, datasets,
    result stores, ``/tmp`` with other runs and Unix sockets, ``/etc``, ``/root``, ``/home``)
    does not exist there.  The tmpfs mounts live only in this mount namespace, so they vanish
    with the run whatever the program left in them.
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    new = cfg["newroot"]
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    os.umask(0o022)
    bound = []
    for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        src, dst = "/" + name, new + "/" + name
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            os.mkdir(dst)
            _bind(src, dst)
            bound.append(src)
    for path in cfg["expose"]:
        if any(path == b or path.startswith(b + "/") for b in bound):
            continue  # already visible (e.g. a system Python under /usr)
        dst = new + path
        os.makedirs(dst, mode=0o755, exist_ok=True)
        _bind(path, dst)
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
    mode = "mode=0700" + (",uid=%d,gid=%d" % (cfg["uid"], cfg["gid"]) if os.geteuid() == 0 else "")  # noqa: UP031
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
    for name in sorted(os.listdir(cfg["inputs"])):
        dst = os.path.join(work, name)
        shutil.copyfile(os.path.join(cfg["inputs"], name), dst)
        if os.geteuid() == 0:
            os.chown(dst, cfg["uid"], cfg["gid"])


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


def seccomp_program(machine: str) -> bytes | None:
    """Classic-BPF filter: refuse keyring syscalls and foreign ABIs with EPERM, allow the rest."""
    if machine not in _KEYRING:
        return None
    arch, denied = _KEYRING[machine]
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM

    def op(code, jt, jf, k):
        return struct.pack("HBBI", code, jt, jf, k)

    n = len(denied)
    prog = [op(ld_w_abs, 0, 0, 4),  # seccomp_data.arch
            op(jeq_k, 1, 0, arch),
            op(ret_k, 0, 0, deny),
            op(ld_w_abs, 0, 0, 0)]  # seccomp_data.nr
    if machine == "x86_64":
        prog.append(op(jge_k, n + 1, 0, _X32_BIT))  # to the final deny
    for i, nr in enumerate(denied):
        prog.append(op(jeq_k, n - i, 0, nr))
    prog += [op(ret_k, 0, 0, allow), op(ret_k, 0, 0, deny)]
    return b"".join(prog)


def lock_down(info: dict) -> None:
    """``PR_SET_NO_NEW_PRIVS`` and the seccomp filter (both survive ``execve``)."""
    lib = _libc_or_none()
    if lib is None:
        info["warnings"].append("no libc: no_new_privs and seccomp not set")
        return
    if lib.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) == 0:
        info["no_new_privs"] = True
    code = seccomp_program(platform.machine())
    if code is None:
        info["warnings"].append(f"seccomp: no filter for {platform.machine()}")
        return
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxP", len(code) // 8, ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fbuf), 0, 0) == 0:
        info["seccomp"] = "keyring+foreign-abi"
    else:
        info["warnings"].append(f"seccomp: {os.strerror(ctypes.get_errno())}")


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
def main() -> None:
    t0 = time.perf_counter()
    cfg = json.loads(sys.argv[1])
    root = os.geteuid() == 0
    info = {"root": root, "userns": False, "netns": False, "ipcns": False, "mountns": False, "pidns": False,
            "proc": False, "root_fs": "host", "uid": os.geteuid(), "no_new_privs": False, "seccomp": None,
            "audit_hook": False, "nproc_limit": None, "cgroup": cfg["cgroup_kind"], "warnings": []}
    info_fd = cfg["info_fd"]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg["namespaces"] and _libc_or_none() is not None:
        enter_namespaces(cfg, info)
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
            work = cfg["work"]
            os.mkdir(work, 0o700)
            if root:
                os.chown(work, cfg["uid"], cfg["gid"])
            copy_inputs(cfg, work)
            os.chdir(work)
    except OSError as e:
        _die(f"file system setup failed: {e}")
    if root:
        drop_privileges(cfg, info)
    lock_down(info)
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
        argv.append(cfg["hook_name"])
        info["audit_hook"] = True
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
            hint = f" (RLIMIT_NPROC: uid {os.getuid()} already runs too many processes; see VERISPEC_SANDBOX_UID)"
        _die(f"cannot execute {python}: {e}{hint}")


if __name__ == "__main__":
    main()
