"""In-interpreter fallback guard, used only where the kernel namespaces are unavailable (and the
user opted in: see :data:`verispec.tasks.sandbox.UNSAFE_FLAG`).

Run as ``python -I -S -B audit_hook.py MAIN ARGS...`` in the run directory (the runner copies
this file there): it installs a :func:`sys.addaudithook` hook, then runs ``MAIN`` as ``__main__``.
``-S`` keeps every ``site-packages`` off ``sys.path`` (so the import system offers the standard
library and the run directory only, whatever the program does to this hook); ``exit`` and
``quit``, which ``site`` would have added, are put back as :func:`sys.exit`.
The hook refuses

* IPv4/IPv6 and Unix socket ``connect``/``bind``/``sendto``/``sendmsg``;
* ``ctypes``, starting other programs (``subprocess``, ``os.exec*``, ``os.posix_spawn``,
  ``os.system``, ``pty.spawn``) and importing ``_posixsubprocess`` (whose ``fork_exec`` raises
  no audit event of its own) or ``_ctypes``;
* writing, renaming, deleting, linking, truncating, ``chmod``/``chown``/``utime`` outside the
  run directory;
* reading a file or listing a directory outside the run directory and the interpreter's own
  standard library (its ``site-packages`` / ``dist-packages`` excluded), and opening any
  directory outside the run directory -- so a directory descriptor for ``dir_fd=`` relative
  writes cannot be had from ``os.open``.

An audit hook lives in the program's own interpreter: paths are checked, then used (a symbolic
link swapped in between wins), events the hook does not know pass, and native code gets around
all of it.  So it is recorded as ``isolation["audit_hook"] = True`` and never mistaken for the
kernel measures; what holds without it is the run's own uid, its root-owned read-only inputs and
its cgroup (see :mod:`verispec.tasks.sandbox`).
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
import sysconfig

_NET_FAMILIES = {socket.AF_INET, socket.AF_INET6, getattr(socket, "AF_UNIX", -1)}
_REFUSED = {"ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "subprocess.Popen", "os.system", "os.exec",
            "os.posix_spawn", "os.spawn", "pty.spawn"}
_REFUSED_IMPORTS = {"_posixsubprocess", "_ctypes", "ctypes"}
_PATH_EVENTS = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
                "os.chmod", "os.chown", "shutil.rmtree", "os.utime"}
_LIST_EVENTS = {"os.listdir", "os.scandir", "glob.glob", "os.walk"}
_HIDDEN = ("site-packages", "dist-packages")
_DEVICES = {"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full"}


def _readable_roots() -> list[str]:
    paths = sysconfig.get_paths()
    roots = {os.path.dirname(os.__file__), paths.get("stdlib", ""), paths.get("platstdlib", "")}
    roots.update(p for p in sys.path if os.path.basename(p) == "lib-dynload")
    return sorted({os.path.realpath(r) for r in roots if r})


def make_hook(work: str, readable: list[str] | None = None):
    real, sep = os.path.realpath, os.sep
    readable = list(readable or [])

    def under(p: str, top: str) -> bool:
        return p == top or p.startswith(top.rstrip(sep) + sep)

    def outside(path) -> bool:
        p = real(os.fsdecode(path))
        return not under(p, work) and p != os.devnull

    def unreadable(path) -> bool:
        p = real(os.fsdecode(path))
        if under(p, work) or p in _DEVICES or under(p, "/proc/self"):
            return False
        if any(part in _HIDDEN for part in p.split(sep)):
            return True
        return not any(under(p, r) for r in readable)

    def hook(event: str, args: tuple) -> None:
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            if getattr(args[0], "family", None) in _NET_FAMILIES:
                raise PermissionError("network access is disabled in the sandbox")
        elif event in _REFUSED:
            raise PermissionError(f"{event} is disabled in the sandbox")
        elif event == "import":
            if args and args[0] in _REFUSED_IMPORTS:
                raise PermissionError(f"importing {args[0]} is disabled in the sandbox")
        elif event == "open":
            path, mode, flags = args
            if not isinstance(path, (str, bytes)):
                return  # an already open descriptor
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & 3)
            if writing and outside(path):
                raise PermissionError(f"writing outside the sandbox directory is disabled: {path!r}")
            if os.path.isdir(path) and outside(path):
                raise PermissionError(f"opening a directory outside the sandbox directory is disabled: {path!r}")
            if unreadable(path):
                raise PermissionError(f"reading outside the sandbox directory is disabled: {path!r}")
        elif event in _PATH_EVENTS:
            for a in args[:2]:
                if isinstance(a, (str, bytes)) and outside(a):
                    raise PermissionError(f"{event} outside the sandbox directory is disabled")
        elif event in _LIST_EVENTS:
            a = args[0] if args else None
            if isinstance(a, (str, bytes)) and unreadable(a):
                raise PermissionError(f"listing outside the sandbox directory is disabled: {a!r}")

    return hook


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: audit_hook.py MAIN [ARGS...]")
    for name in _REFUSED_IMPORTS:
        sys.modules.pop(name, None)  # so importing it raises the "import" event again
    sys.addaudithook(make_hook(os.path.realpath(os.getcwd()), _readable_roots()))
    import builtins

    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, sys.exit)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
