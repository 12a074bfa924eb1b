"""Careless input through every command: a clear one-line error (what is wrong, what to do), exit
status 2, nothing lost, no hang (issue 23, section 3).

The sweep is table-driven and runs in this process (``verispec.cli.main``; argparse's own errors
arrive as ``SystemExit(2)``). Models are fakes or synthetic files wherever the check happens before a
model is needed; read-only and full file systems are small tmpfs mounts (skipped where mounting is not
allowed). One llama.cpp case runs in a subprocess: if its guard broke, llama.cpp would abort the process.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.bench_fakes import config, fake_models
from verispec.bench import runner
from verispec.bench.store import ResultStore
from verispec.cli import main
from verispec.commands import error_text

DATA = "/work/shared/data"   # not read: only named in arguments that fail before any file is opened


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``(exit status, stdout, stderr)`` of ``verispec ARGV`` in this process."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:        # argparse: usage line + "verispec CMD: error: ..."
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_clear_error(code: int, err: str, *needles: str) -> str:
    """Exit 2, no traceback, the last line is one ``verispec...: error:`` line holding every needle."""
    assert code == 2, err
    assert "Traceback" not in err, err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("verispec") and ": error:" in last, err
    for needle in needles:
        assert needle in last, (needle, last)
    return last


# --------------------------------------------------------------------------------------------------
# Synthetic GGUF files (header + one F32 tensor of 64 values)


def gguf_bytes(n_values: int = 64) -> bytes:
    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1)
    head += string("general.architecture") + struct.pack("<I", 8) + string("llama")
    head += string("w") + struct.pack("<I", 1) + struct.pack("<Q", n_values) + struct.pack("<IQ", 0, 0)
    head += b"\0" * (-len(head) % 32)
    return head + b"\1" * (4 * n_values)


def test_gguf_check_reads_a_whole_file_and_says_why_others_fail(tmp_path):
    from verispec.models.gguf_check import GGUFError, gguf_info

    whole = tmp_path / "m.gguf"
    whole.write_bytes(gguf_bytes())
    info = gguf_info(whole)
    assert (info.version, info.n_tensors, info.architecture, info.needed_size) == (3, 1, "llama", whole.stat().st_size)
    cases = {
        "empty.gguf": (b"", "is empty (0 bytes)"),
        "text.gguf": (b"hello world, not a model\n", "is not a GGUF model file: it starts with b'hell'"),
        "header.gguf": (gguf_bytes()[:40], "end inside the GGUF header"),
        "data.gguf": (gguf_bytes()[:-100], "its tensors need"),
        "version.gguf": (b"GGUF" + struct.pack("<I", 99) + gguf_bytes()[8:], "GGUF version 99"),
    }
    for name, (blob, says) in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(GGUFError, match="re-download") as err:
            gguf_info(tmp_path / name)
        assert says in str(err.value) and name in str(err.value)


# --------------------------------------------------------------------------------------------------
# The table: (case, argv, what the error line must say). ``{tmp}`` is a fresh folder per case with
# the files made by ``_files``.


def _files(tmp: Path) -> None:
    (tmp / "afile").write_text("I am a file\n")
    (tmp / "empty.sqlite").write_bytes(b"")
    (tmp / "fake.gguf").write_bytes(b"GGUF" + b"\xff" * 20)
    (tmp / "cut.gguf").write_bytes(gguf_bytes()[:-10])
    (tmp / "text.gguf").write_text("not a model\n")
    hf = tmp / "hfdir"
    hf.mkdir()
    (hf / "config.json").write_text("{not json")
    (tmp / "three.toml").write_text('limit = "three"\n')
    (tmp / "gamma.toml").write_text('gamma = ["x"]\n')
    (tmp / "rules.toml").write_text("rules = 5\n")
    (tmp / "samples.toml").write_text("n_samples = 1.5\n")
    (tmp / "flag.toml").write_text('baselines = "yes"\n')
    (tmp / "broken.toml").write_text("limit = = 3\n")
    (tmp / "broken.yaml").write_text("rules: [lossless\n")
    (tmp / "latin1.toml").write_bytes(b'rules = ["caf\xe9"]\n')
    (tmp / "grid.txt").write_text("limit = 3\n")
    (tmp / "list.yaml").write_text("- lossless\n- greedy\n")
    (tmp / "key.toml").write_text("rulez = ['lossless']\n")
    (tmp / "q.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "2", "id": "a"}) + "\n")
    (tmp / "bad.jsonl").write_bytes(b'{"question": "caf\xe9?", "answer": "1", "id": "a"}\n')
    (tmp / "blank.jsonl").write_text("\n\n")


_Q = ["--dataset", "{tmp}/q.jsonl", "--question-field", "question", "--answer-field", "answer", "--checker", "gsm8k"]

CASES = [
    # demo / rules
    ("demo: empty --rules", ["demo", "--rules", ""], ["names no rule", "drop --rules"]),
    ("demo: only separators", ["demo", "--rules", " ; ;"], ["names no rule"]),
    ("demo: unknown rule", ["demo", "--rules", "lossles"], ["unknown rule"]),
    # generate: refused before any model is loaded
    ("generate: gamma 100000", ["generate", "--prompt", "hi", "--gamma", "100000"], ["at most 64"]),
    ("generate: gamma 0", ["generate", "--prompt", "hi", "--gamma", "0", "--no-cost-model"], ["--gamma must be >= 1"]),
    ("generate: gamma word", ["generate", "--prompt", "hi", "--gamma", "five"], ["γ must be an integer"]),
    ("generate: --baseline --lookup", ["generate", "--prompt", "hi", "--baseline", "--lookup"],
     ["--lookup", "would be ignored", "drop it or --baseline"]),
    ("generate: --baseline --tree --gamma",
     ["generate", "--prompt", "hi", "--baseline", "--tree", "2,1", "--gamma", "3"],
     ["--tree, --gamma", "drop them"]),
    ("generate: --baseline --draft", ["generate", "--prompt", "hi", "--baseline", "--draft", "x.gguf"], ["--draft"]),
    ("generate: non-UTF-8 prompt", ["generate", "--prompt", "hi\udcff"], ["--prompt", "not valid UTF-8", "0xff"]),
    ("generate: non-UTF-8 stop", ["generate", "--prompt", "hi", "--stop", "\udce9"], ["--stop", "0xe9"]),
    ("generate: n-ctx 0", ["generate", "--prompt", "hi", "--n-ctx", "0"], ["--n-ctx must be an integer >= 1"]),
    ("generate: n-threads -1", ["generate", "--prompt", "hi", "--n-threads", "-1"], ["--n-threads"]),
    ("generate: max-new-tokens 0", ["generate", "--prompt", "hi", "--max-new-tokens", "0"], ["--max-new-tokens"]),
    ("generate: draft-stop 2", ["generate", "--prompt", "hi", "--draft-stop", "2"], ["[0, 1) or auto"]),
    ("generate: bad sampling", ["generate", "--prompt", "hi", "--sampling", "temprature=1"], ["unknown key"]),
    ("generate: head and lookup", ["generate", "--prompt", "hi", "--draft-head", "h", "--lookup"], ["drop one"]),
    # generate: model files, checked before llama.cpp / transformers load them
    ("generate: fake .gguf", ["generate", "--prompt", "hi", "--baseline", "--target", "{tmp}/fake.gguf"],
     ["fake.gguf", "GGUF version", "re-download"]),
    ("generate: truncated .gguf", ["generate", "--prompt", "hi", "--baseline", "--target", "{tmp}/cut.gguf"],
     ["cut.gguf is cut short", "tensors need"]),
    ("generate: text as .gguf", ["generate", "--prompt", "hi", "--baseline", "--target", "{tmp}/text.gguf"],
     ["not a GGUF model file"]),
    ("generate: missing .gguf", ["generate", "--prompt", "hi", "--baseline", "--target", "{tmp}/none.gguf"],
     ["model file not found"]),
    ("generate: not a model file", ["generate", "--prompt", "hi", "--baseline", "--target", "{tmp}/afile"],
     ["is a file but not a .gguf"]),
    ("generate: bad --dtype", ["generate", "--prompt", "hi", "--baseline", "--target", "{tmp}/hfdir", "--dtype", "f33"],
     ["--dtype 'f33'", "float32"]),
    ("generate: no CUDA", ["generate", "--prompt", "hi", "--baseline", "--target", "{tmp}/hfdir", "--device", "cuda"],
     ["--device cuda"]),
    ("generate: bad --device",
     ["generate", "--prompt", "hi", "--baseline", "--target", "{tmp}/hfdir", "--device", "gpu9"],
     ["not a torch device"]),
    ("calibrate: g-max 0", ["calibrate", "--g-max", "0"], ["--g-max"]),
    # bench: sweep files
    ("sweep: limit = 'three'", ["bench", "--sweep", "{tmp}/three.toml", "--dry-run"],
     ["three.toml: limit must be an integer", "'three'"]),
    ("sweep: gamma word", ["bench", "--sweep", "{tmp}/gamma.toml", "--dry-run"], ["gammas must be a list of integers"]),
    ("sweep: rules not strings", ["bench", "--sweep", "{tmp}/rules.toml", "--dry-run"], ["rules must be a list"]),
    ("sweep: n_samples float", ["bench", "--sweep", "{tmp}/samples.toml", "--dry-run"],
     ["n_samples must be an integer"]),
    ("sweep: bool as text", ["bench", "--sweep", "{tmp}/flag.toml", "--dry-run"], ["baselines must be true or false"]),
    ("sweep: broken TOML", ["bench", "--sweep", "{tmp}/broken.toml", "--dry-run"], ["not valid TOML"]),
    ("sweep: broken YAML", ["bench", "--sweep", "{tmp}/broken.yaml", "--dry-run"], ["not valid YAML"]),
    ("sweep: not UTF-8", ["bench", "--sweep", "{tmp}/latin1.toml", "--dry-run"], ["not UTF-8", "0xe9"]),
    ("sweep: wrong suffix", ["bench", "--sweep", "{tmp}/grid.txt", "--dry-run"], [".toml, .yaml or .yml"]),
    ("sweep: missing", ["bench", "--sweep", "{tmp}/none.toml", "--dry-run"], ["sweep file not found"]),
    # bench: the dry run refuses what the run refuses
    ("dry run: unknown dataset", ["bench", "--dry-run", "--dataset", "nosuchset"], ["neither a known dataset"]),
    ("dry run: missing data dir", ["bench", "--dry-run", "--dataset", "gsm8k", "--data-dir", "{tmp}/nodata"],
     ["--data-dir", "nodata is not a folder"]),
    ("dry run: batch + tree", ["bench", "--dry-run", "--batch-size", "2", "--tree", "2,1", "--rules", "lossless", *_Q],
     ["does not combine with --tree"]),
    ("dry run: batch + lookup", ["bench", "--dry-run", "--batch-size", "2", "--lookup", *_Q], ["--lookup"]),
    ("dry run: batch + raw rule", ["bench", "--dry-run", "--batch-size", "2", "--rules", "fuzzy:T=0.2,on=raw", *_Q],
     ["fuzzy", "read the raw distributions"]),
    ("dry run: invariant alone", ["bench", "--dry-run", "--batch-invariant", *_Q], ["--batch-invariant applies to"]),
    ("dry run: batch + workers", ["bench", "--dry-run", "--batch-size", "2", "--workers", "2", *_Q],
     ["does not combine with Ray workers"]),
    ("dry run: --out is a file", ["bench", "--dry-run", "--out", "{tmp}/afile", *_Q], ["is a file, not a folder"]),
    ("dry run: fake target", ["bench", "--dry-run", "--target", "{tmp}/fake.gguf", *_Q], ["GGUF version"]),
    ("dry run: bad HF dir", ["bench", "--dry-run", "--target", "{tmp}/hfdir", *_Q], ["config.json is not valid JSON"]),
    ("dry run: bad rows, error", ["bench", "--dry-run", "--dataset", "{tmp}/bad.jsonl", "--question-field", "question",
                                 "--answer-field", "answer", "--on-bad-row", "error"],
     ["bad.jsonl:1", "not UTF-8 text", "0xe9"]),
    ("dry run: no usable row", ["bench", "--dry-run", "--dataset", "{tmp}/blank.jsonl", "--question-field", "q",
                                "--answer-field", "a"], ["no usable problems"]),
    ("dry run: Ray refused", ["bench", "--dry-run", "--ray-address", "127.0.0.1:1", *_Q],
     ["no Ray cluster at 127.0.0.1:1", "ray start --head"]),
    ("dry run: Ray address", ["bench", "--dry-run", "--ray-address", "headnode", *_Q], ["is not host:port"]),
    ("bench: Ray refused", ["bench", "--ray-address", "127.0.0.1:1", "--out", "{tmp}/never", *_Q],
     ["no Ray cluster at 127.0.0.1:1"]),
    ("bench: --out is a file", ["bench", "--out", "{tmp}/afile", *_Q], ["is a file, not a folder"]),
    ("bench: negative offset", ["bench", "--dry-run", "--offset", "-1", *_Q], ["offset must be >= 0"]),
    ("bench: zero timeout", ["bench", "--dry-run", "--check-timeout", "0", *_Q], ["check_timeout_s must be"]),
    ("bench: zero batch", ["bench", "--dry-run", "--batch-size", "0", *_Q], ["--batch-size must be an integer >= 1"]),
    ("bench: zero workers", ["bench", "--dry-run", "--workers", "0", *_Q], ["--workers must be an integer >= 1"]),
    ("bench: empty --rules", ["bench", "--dry-run", "--rules", "", *_Q], ["--rules '' names no rule"]),
    ("bench: stray ';' in --sampling", ["bench", "--dry-run", "--sampling", "temperature=0;", *_Q],
     ["empty sampling setting", "stray ';'"]),
    ("bench: empty --out", ["bench", "--dry-run", "--out", "", *_Q], ["out is empty"]),
    ("bench: budget beyond context", ["bench", "--dry-run", "--max-new-tokens", "5000", *_Q],
     ["cannot fit in the 4096-token context"]),
    ("bench: nan timeout", ["bench", "--dry-run", "--check-timeout", "nan", *_Q], ["check_timeout_s must be"]),
    ("bench: threads, no workers", ["bench", "--dry-run", "--threads-per-worker", "2", *_Q],
     ["--workers N or --ray-address"]),
    ("bench: negative GPUs", ["bench", "--dry-run", "--workers", "1", "--gpus-per-worker", "-1", *_Q],
     ["gpus_per_worker must be >= 0"]),
    ("bench: few-shot, not GSM8K", ["bench", "--dry-run", "--few-shot", "2", "--dataset", "{tmp}/q.jsonl",
                                    "--question-field", "question", "--answer-field", "answer", "--checker", "math"],
     ["few_shot is only supported"]),
    ("sweep: a list", ["bench", "--dry-run", "--sweep", "{tmp}/list.yaml"], ["must be a mapping"]),
    ("sweep: unknown key", ["bench", "--dry-run", "--sweep", "{tmp}/key.toml"], ["unknown sweep key 'rulez'"]),
    ("generate: budget beyond context", ["generate", "--prompt", "hi", "--max-new-tokens", "5000"], ["cannot fit"]),
    ("diagnose: empty --rules", ["diagnose", "--rules", ""], ["names no rule"]),
    ("diagnose: --out is a file", ["diagnose", "--out", "{tmp}/afile"], ["is a file, not a folder"]),
    ("diagnose: --bench, no store", ["diagnose", "--bench", "{tmp}/hfdir"], ["--bench", "no result store"]),
    ("diagnose: --bench missing", ["diagnose", "--bench", "{tmp}/none"], ["--bench", "does not exist"]),
    ("diagnose: budget", ["diagnose", "--max-new-tokens", "9000"], ["cannot fit"]),
    # report / regrade
    ("report: folder, no store", ["report", "{tmp}/hfdir"], ["no result store", "hfdir"]),
    ("report: zero-byte store", ["report", "{tmp}/empty.sqlite"], ["is empty (0 bytes)", "left as it is"]),
    ("report: not a store", ["report", "{tmp}/afile"], ["afile is not a usable result store", "move the file aside"]),
    ("report: missing", ["report", "{tmp}/nothing"], ["no bench results"]),
    ("report: --out is a file", ["report", "{tmp}/empty.sqlite", "--out", "{tmp}/afile"], ["is a file, not a folder"]),
    ("regrade: zero-byte store", ["regrade", "{tmp}/empty.sqlite"], ["is empty (0 bytes)"]),
    ("regrade --write: zero-byte", ["regrade", "{tmp}/empty.sqlite", "--write"], ["is empty (0 bytes)"]),
    ("diagnose: gamma 1000", ["diagnose", "--gamma", "1000"], ["at most 64"]),
    ("diagnose: gamma auto", ["diagnose", "--gamma", "auto"], ["needs a fixed γ"]),
]


@pytest.mark.parametrize("name, argv, needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_clear_line_and_exit_2(name, argv, needles, tmp_path, capsys):
    if name == "generate: no CUDA":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA GPU")
    _files(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    t0 = time.monotonic()
    code, _, err = run_cli(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert_clear_error(code, err, *needles)
    assert time.monotonic() - t0 < 60   # no hang (the Ray cases answer in well under a second)
    # nothing lost or rewritten: every input file is as it was, nothing new beside them
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "never").exists()


def test_the_sweep_counts():
    """Every case of the table is a distinct kind of bad input (the report's count reads this)."""
    assert len({c[0] for c in CASES}) == len(CASES) >= 80


# --------------------------------------------------------------------------------------------------
# Non-UTF-8 data: named by file and line, and --on-bad-row skip skips it


def test_non_utf8_rows_are_skipped_or_named(tmp_path, capsys):
    data = tmp_path / "mixed.jsonl"
    data.write_bytes(b'\xef\xbb\xbf{"question": "ok?", "answer": "1", "id": "a"}\n'    # a byte-order mark first
                     b'{"question": "caf\xe9?", "answer": "2", "id": "b"}\n'
                     b'{"question": "fine?", "answer": "3", "id": "c"}\n')
    argv = ["bench", "--dry-run", "--dataset", str(data), "--question-field", "question", "--answer-field", "answer",
            "--checker", "gsm8k", "--rules", "lossless"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "skipped malformed row 2: not UTF-8 text: byte 0xe9 at column 18" in err
    assert "2 problems" in err or "over 2 problems" in err
    code, _, err = run_cli(capsys, *argv, "--on-bad-row", "error")
    assert_clear_error(code, err, f"{data}:2", "0xe9")
    gz = tmp_path / "arr.json"
    gz.write_bytes(b'[{"question": "x", "answer": "1"},\n {"question": "\xff", "answer": "2"}]')
    from verispec.tasks.datasets import load_dataset

    with pytest.raises(ValueError, match=r"arr.json:2: not UTF-8 text: byte 0xff at line 2"):
        load_dataset(str(gz), question_field="question", answer_field="answer", on_bad_row="error")


# --------------------------------------------------------------------------------------------------
# Ray: a bounded wait, naming the address


@contextmanager
def _server(reply: bytes | None):
    """A local TCP server that accepts and answers ``reply`` (None: says nothing)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conns.append(conn)
            if reply is not None:
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        srv.close()
        for c in conns:
            c.close()


def test_ray_address_that_never_answers_fails_within_the_bound():
    from verispec.cluster import RayConnectError, check_ray_address, join_ray

    with _server(None) as silent:   # accepts, never speaks gRPC: Ray's client would retry for ever
        t0 = time.monotonic()
        with pytest.raises(RayConnectError, match=f"{silent} accepts connections but does not answer as a Ray"):
            check_ray_address(silent, timeout_s=0.3)
        assert time.monotonic() - t0 < 5

    class HangingRay:      # a gRPC peer that is not a Ray cluster: ray.init would hang
        def init(self, **kw):
            time.sleep(3600)

    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    with _server(settings) as grpc_like:
        t0 = time.monotonic()
        with pytest.raises(RayConnectError, match=f"could not join the Ray cluster at {grpc_like} within 0.5 s"):
            join_ray(HangingRay(), grpc_like, timeout_s=0.5)
        assert time.monotonic() - t0 < 5

    class FailingRay:
        def init(self, **kw):
            raise ConnectionError("Failed to connect to Ray cluster")

    with _server(settings) as grpc_like:
        with pytest.raises(RayConnectError, match="could not join .* Failed to connect"):
            join_ray(FailingRay(), grpc_like, timeout_s=5)


# --------------------------------------------------------------------------------------------------
# verify() on tensors without values


def test_verify_refuses_meta_tensors():
    import torch

    import verispec.rules as R

    p, q = torch.empty(1, 3, 5, device="meta"), torch.empty(1, 2, 5, device="meta")
    x = torch.zeros(1, 2, dtype=torch.long)
    for spec in ("lossless", "lenience:ell=0.5", "speccascade:p_base=0.3"):
        with pytest.raises(ValueError, match="'meta' device .* move it to a real device"):
            R.get(spec).verify(p, q, x)
    with pytest.raises(ValueError, match="'meta' device"):
        R.get("lenience:ell=0.5").induced(torch.empty(5, device="meta"), torch.full((5,), 0.2))


# --------------------------------------------------------------------------------------------------
# Embedded model damaged after its stamp


def test_embedded_file_damaged_after_its_stamp_is_rebuilt(tmp_path, monkeypatch):
    import os

    from tests.helpers.embedded_parts import fake_embedded_parts
    from verispec.models import embedded as emb

    blobs = [os.urandom(5000), os.urandom(7000)]
    digest = fake_embedded_parts(tmp_path, monkeypatch, blobs)
    cache = tmp_path / "cache"
    path = emb.embedded_model_path("draft", cache_dir=cache, progress=False, expected_sha256=digest)
    mtime = path.stat().st_mtime_ns
    with open(path, "r+b") as fh:     # same size, damaged content, modification time restored
        fh.seek(3000)
        fh.write(b"\0" * 64)
    os.utime(path, ns=(mtime, mtime))
    assert path.read_bytes() != b"".join(blobs)
    assert emb.embedded_model_path("draft", cache_dir=cache, progress=False, expected_sha256=digest) == path
    assert path.read_bytes() == b"".join(blobs)       # found wrong by its hash and rebuilt from the parts


# --------------------------------------------------------------------------------------------------
# llama.cpp: a context below 256 tokens aborted the process (GGML_ASSERT n_outputs_max)


@pytest.mark.embedded
def test_small_context_does_not_abort_llama_cpp(embedded_pair_paths):
    code = ("from verispec.models.llama import LlamaBackend\n"
            f"be = LlamaBackend({str(embedded_pair_paths.draft)!r}, n_ctx=64)\n"
            "ids = be.chat_prompt('hi')\n"
            "assert be.context_length == 64 and be.forward(ids).shape[0] == len(ids)\n"
            "print('ok', len(ids))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-2000:]


# --------------------------------------------------------------------------------------------------
# Read-only and full file systems (small tmpfs mounts; root only)


@contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True)


def _stored_keys(store_path: Path) -> list[tuple]:
    with ResultStore(store_path, readonly=True) as st:
        return sorted((k.run_id, s.problem_id, s.sample_idx) for k, _ in st.runs() for s in st.samples(k.run_id))


def test_read_only_store_is_reported_and_regraded_without_writing(tmp_path, capsys):
    mnt = tmp_path / "ro"
    with tmpfs(mnt, "4m"):
        cfg = config(tmp_path, n_rows=3, n_samples=1, out=str(mnt / "bench"))
        runner.run_bench(cfg, progress=False, load_models=fake_models, log=lambda m: None, report=False)
        keys = _stored_keys(mnt / "bench" / runner.STORE_NAME)
        remount(mnt, "ro")
        code, out, err = run_cli(capsys, "report", mnt / "bench")
        assert code == 0, err
        assert "# verispec bench report" in out and "not writable: the report was printed, not saved" in err
        code, out, err = run_cli(capsys, "report", mnt / "bench", "--out", tmp_path / "rep")
        assert code == 0 and (tmp_path / "rep" / "report.md").is_file()
        assert (tmp_path / "rep" / "frontier.png").is_file()
        code, out, err = run_cli(capsys, "regrade", mnt / "bench")
        assert code == 0, err
        assert "0 of 15 verdicts changed" in out
        code, _, err = run_cli(capsys, "regrade", mnt / "bench", "--write")
        assert_clear_error(code, err, "read-only file system")
        code, _, err = run_cli(capsys, "bench", "--out", mnt / "other", "--dataset", cfg.datasets[0],
                               "--question-field", "question", "--answer-field", "answer", "--checker", "gsm8k")
        assert_clear_error(code, err, "read-only file system", "choose a writable folder")
        assert _stored_keys(mnt / "bench" / runner.STORE_NAME) == keys


def test_full_disk_while_storing_loses_nothing_and_resumes(tmp_path):
    mnt = tmp_path / "small"
    with tmpfs(mnt, "320k"):
        cfg = config(tmp_path, n_rows=40, n_samples=1, max_new_tokens=2, out=str(mnt / "bench"))
        with pytest.raises((ValueError, OSError)) as err:
            runner.run_bench(cfg, progress=False, load_models=fake_models, log=lambda m: None, report=False)
        code, text = error_text(err.value)
        assert code == 2 and ("full" in text) and str(mnt) in text, text
        assert "resume" in text or "free some space" in text
        stored = _stored_keys(mnt / "bench" / runner.STORE_NAME)
        assert 0 < len(stored) < 40 * 5
        assert not list(mnt.rglob("*.tmp"))
        remount(mnt, "size=16m")
        runner.run_bench(cfg, progress=False, load_models=fake_models, log=lambda m: None, report=False)
        after = _stored_keys(mnt / "bench" / runner.STORE_NAME)
        assert set(stored) <= set(after) and len(after) == len(set(after)) == 40 * 5


def test_full_disk_while_plotting_leaves_no_partial_png(tmp_path, capsys):
    cfg = config(tmp_path, n_rows=4, n_samples=1)
    out, _ = runner.run_bench(cfg, progress=False, load_models=fake_models, log=lambda m: None, report=False)
    mnt = tmp_path / "tiny"
    with tmpfs(mnt, "24k"):
        code, _, err = run_cli(capsys, "report", out, "--out", mnt)
        assert_clear_error(code, err, "the disk is full")
        left = [p for p in mnt.iterdir()]
        assert all(p.suffix in (".md", ".json", ".png") for p in left), left   # no temporary files
        assert all(p.stat().st_size > 0 for p in left), left                  # no 0-byte PNG


def test_store_write_errors_name_the_cause():
    from verispec.bench.store import write_error

    path = Path("/x/results.sqlite")
    for msg, says in (("database or disk is full", "is full"), ("attempt to write a readonly database", "read-only"),
                      ("database is locked", "stayed locked"), ("disk I/O error", "the disk failed")):
        text = str(write_error(path, sqlite3.OperationalError(msg)))
        assert says in text and str(path) in text
        assert "resume" in text or says == "read-only"


def test_code_grading_is_refused_before_any_work_where_the_sandbox_cannot_hold_it(tmp_path, monkeypatch, capsys):
    """A bench (and its dry run) of a code dataset stops at once with the sandbox's reason; a dataset graded
    without running code is not affected."""
    from verispec import cli
    from verispec.tasks.sandbox import UNSAFE_FLAG
    from verispec.tasks.sandbox import runner as sandbox_runner

    monkeypatch.setattr(sandbox_runner, "refusal", lambda: f"no namespaces here: pass {UNSAFE_FLAG} to grade anyway")
    out = tmp_path / "b"
    assert cli.main(["bench", "--dry-run", "--dataset", "humaneval", "--limit", "1", "--out", str(out)]) == 2
    assert UNSAFE_FLAG in capsys.readouterr().err and not out.exists()
    assert cli.main(["bench", "--dry-run", "--dataset", "gsm8k", "--limit", "1", "--out", str(out)]) == 0


def test_the_vllm_engine_where_vllm_is_not_installed_is_one_clear_line(tmp_path, capsys):
    import importlib.util

    from verispec import cli

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: tests/vllm covers --engine vllm")
    assert cli.main(["bench", "--engine", "vllm", "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert "scripts/setup_vllm.sh" in capsys.readouterr().err
    assert cli.main(["bench", "--vllm-option", "dtype=float32", "--dry-run", "--out", str(tmp_path / "o")]) == 2
