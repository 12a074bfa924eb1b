"""Output folders and files of the commands (bench, report, diagnose): checked before work starts,
written so that a failure leaves the old file or none, never a half-written one.

* :func:`check_out_dir` says, without creating anything, whether ``--out`` can be used (a dry run
  refuses what the run would); :func:`ensure_out_dir` creates it and proves it writable.
* :func:`atomic_path` yields a temporary path beside the target and renames it into place only when the
  block succeeds (a full disk leaves no 0-byte PNG behind); :func:`write_text_atomic` uses it.
* :func:`os_error_text` turns an ``OSError`` into one line naming the path, the cause and what to do.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["check_out_dir", "ensure_out_dir", "atomic_path", "write_text_atomic", "os_error_text", "OutputError"]


class OutputError(ValueError):
    """An output folder or file that cannot be written (a ``ValueError``: the CLI prints it, exit 2)."""


_HINTS = {
    errno.ENOSPC: "the disk is full: free some space",
    errno.EDQUOT: "the disk quota is used up: free some space",
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.EACCES: "permission denied: choose a folder you can write",
    errno.EPERM: "permission denied: choose a folder you can write",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a file of that name is in the way",
    errno.ENAMETOOLONG: "the name is too long",
}


def os_error_text(exc: OSError, action: str = "write") -> str:
    """``cannot write /x/report.md: the disk is full: free some space [Errno 28 ...]``-style line."""
    where = exc.filename if exc.filename is not None else "the output"
    hint = _HINTS.get(exc.errno or -1, exc.strerror or type(exc).__name__)
    return f"cannot {action} {where}: {hint} ({exc.strerror or exc})"


def check_out_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Refuse an output folder that cannot be used, creating nothing: a file in its place, or a folder
    (or its nearest existing parent) that is not writable."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputError(f"{flag} {p} is a file, not a folder: give a folder (it is created if missing)")
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise OutputError(f"{flag} {p}: {probe} is a file, not a folder")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if _read_only(probe) else "is not writable by this user"
        raise OutputError(f"{flag} {p}: {probe} {why}; choose a writable folder")
    return p


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def ensure_out_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Create the output folder if missing and prove it writable (a file is created and removed)."""
    p = check_out_dir(path, flag)
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".verispec-probe-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"{flag} {p}: " + os_error_text(exc, "write in")) from None
    return p


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` if the block succeeds, else remove it
    (and turn an ``OSError`` into an :class:`OutputError` naming ``path``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        if exc.filename in (None, str(tmp), os.fspath(tmp)):
            exc.filename = str(path)
        raise OutputError(os_error_text(exc)) from None
    except BaseException:
        _remove(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
