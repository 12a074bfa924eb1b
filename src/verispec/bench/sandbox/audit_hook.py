"""In-interpreter fallback guard, used only where the kernel namespaces are unavailable.

Run as ``python -I -B audit_hook.py MAIN ARGS...`` in the run directory (the runner copies this
file there): it installs a :func:`sys.addaudithook` hook that refuses IPv4/IPv6 and Unix socket
``connect``/``bind``/``sendto``, ``ctypes``, starting other programs, and writing, renaming or
deleting outside the run directory -- then runs ``MAIN`` as ``__main__``.  An audit hook lives
in the program's own interpreter, so a determined program can get around it; it is recorded as
``isolation["audit_hook"] = True`` so nobody mistakes it for the kernel measures.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys

_NET_FAMILIES = {socket.AF_INET, socket.AF_INET6, getattr(socket, "AF_UNIX", -1)}
_REFUSED = {"ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "subprocess.Popen", "os.system", "os.exec",
            "os.posix_spawn", "os.spawn", "pty.spawn"}
_PATH_EVENTS = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
                "os.chmod", "os.chown", "shutil.rmtree", "os.utime"}


def make_hook(work: str):
    real, sep = os.path.realpath, os.sep

    def outside(path) -> bool:
        p = real(os.fsdecode(path))
        return p != work and not p.startswith(work + sep) and p != os.devnull

    def hook(event: str, args: tuple) -> None:
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            if getattr(args[0], "family", None) in _NET_FAMILIES:
                raise PermissionError("network access is disabled in the sandbox")
        elif event in _REFUSED:
            raise PermissionError(f"{event} is disabled in the sandbox")
        elif event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & 3)
            if writing and isinstance(path, (str, bytes)) and outside(path):
                raise PermissionError(f"writing outside the sandbox directory is disabled: {path!r}")
        elif event in _PATH_EVENTS:
            for a in args[:2]:
                if isinstance(a, (str, bytes)) and outside(a):
                    raise PermissionError(f"{event} outside the sandbox directory is disabled")

    return hook


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: audit_hook.py MAIN [ARGS...]")
    sys.addaudithook(make_hook(os.path.realpath(os.getcwd())))
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
