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
    # round 5 (issue 39): settings a run cannot honour, in sweep files
    (tmp / "quantum.toml").write_text('device = "quantum"\n')
    (tmp / "cuda.toml").write_text('device = "cuda"\n')
    (tmp / "half.toml").write_text('dtype = "float16"\n')
    (tmp / "inf.toml").write_text("check_timeout_s = inf\n")
    (tmp / "e400.toml").write_text("check_timeout_s = 1e400\n")
    (tmp / "nan.toml").write_text("check_timeout_s = nan\n")
    (tmp / "inf.yaml").write_text("check_timeout_s: .inf\n")
    (tmp / "e400.yaml").write_text("check_timeout_s: 1.0e+400\n")
    (tmp / "forever.toml").write_text("check_timeout_s = 1e9\n")
    (tmp / "nctx.toml").write_text("n_ctx = 0\n")
    (tmp / "seed.toml").write_text("seed = -1\n")
    (tmp / "many.toml").write_text("n_samples = 1000000000\n")
    (tmp / "shots.toml").write_text("few_shot = 1000\n")
    (tmp / "notarget.toml").write_text('target = ""\n')
    (tmp / "threads.toml").write_text("n_threads = 0\n")
    (tmp / "emptyrule.toml").write_text('rules = ["lossless", ""]\n')
    # issue 40: hostile sweep files
    (tmp / "bomb.yaml").write_text(BOMB_YAML)
    (tmp / "loop.yaml").write_text("rules: &a [lossless, *a]\n")
    (tmp / "deep.yaml").write_text("rules: " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp / "deep.toml").write_text("rules = " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp / "wide.yaml").write_text("rules: [" + ", ".join(["x"] * 120_000) + "]\n")
    (tmp / "huge.toml").write_text("# padding\n" * 200_000)
    (tmp / "longkey.toml").write_text("k" * 100_000 + " = 1\n")
    (tmp / "longvalue.toml").write_text('limit = "' + "x" * 100_000 + '"\n')


#: A "billion laughs" sweep (issue 40): 700 bytes whose aliases expand to 9^8 values; its error line was 254 MB.
BOMB_YAML = "rules:\n" + "".join(
    f"  - &l{k} [{', '.join(['lol'] * 9 if k == 0 else [f'*l{k - 1}'] * 9)}]\n" for k in range(8))


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
    ("generate: n-ctx 0", ["generate", "--prompt", "hi", "--n-ctx", "0"], ["--n-ctx must be an integer in [1, "]),
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
    ("bench: negative offset", ["bench", "--dry-run", "--offset", "-1", *_Q], ["--offset must be an integer in [0, "]),
    ("bench: zero timeout", ["bench", "--dry-run", "--check-timeout", "0", *_Q], ["--check-timeout must be"]),
    ("bench: zero batch", ["bench", "--dry-run", "--batch-size", "0", *_Q],
     ["--batch-size must be an integer in [1, 4096]"]),
    ("bench: zero workers", ["bench", "--dry-run", "--workers", "0", *_Q],
     ["--workers must be an integer in [1, 4096]"]),
    ("bench: empty --rules", ["bench", "--dry-run", "--rules", "", *_Q], ["--rules '' names no rule"]),
    ("bench: stray ';' in --sampling", ["bench", "--dry-run", "--sampling", "temperature=0;", *_Q],
     ["empty sampling setting", "stray ';'"]),
    ("bench: empty --out", ["bench", "--dry-run", "--out", "", *_Q], ["out is empty"]),
    ("bench: budget beyond context", ["bench", "--dry-run", "--max-new-tokens", "5000", *_Q],
     ["cannot fit in the 4096-token context"]),
    ("bench: nan timeout", ["bench", "--dry-run", "--check-timeout", "nan", *_Q], ["--check-timeout must be"]),
    ("bench: threads, no workers", ["bench", "--dry-run", "--threads-per-worker", "2", *_Q],
     ["--workers N or --ray-address"]),
    ("bench: negative GPUs", ["bench", "--dry-run", "--workers", "1", "--gpus-per-worker", "-1", *_Q],
     ["--gpus-per-worker must be a number in [0, 64]"]),
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
    # ---- round 5 (issue 39): the items of the issue
    ("calibrate: g-max 100", ["calibrate", "--g-max", "100"], ["--g-max must be an integer in [1, 64]", "100"]),
    ("lm-eval: rule, no draft", ["lm-eval", "--draft-source", "none", "--rule", "lenience:ell=0.5", "--", "--tasks",
                                 "gsm8k"], ["--draft-source none", "cannot apply", "--baseline"]),
    ("sweep: device quantum", ["bench", "--sweep", "{tmp}/quantum.toml", "--dry-run"],
     ["quantum.toml", "--device 'quantum' is not a torch device"]),
    ("sweep: cuda on the GGUF pair", ["bench", "--sweep", "{tmp}/cuda.toml", "--dry-run"],
     ["--device 'cuda' applies to transformers models", "the embedded pair", "drop --device"]),
    ("sweep: dtype on the GGUF pair", ["bench", "--sweep", "{tmp}/half.toml", "--dry-run"],
     ["--dtype 'float16' applies to transformers models"]),
    ("generate: --device on GGUF", ["generate", "--prompt", "hi", "--device", "cuda:0"], ["applies to transformers"]),
    ("generate: --dtype on GGUF", ["generate", "--prompt", "hi", "--dtype", "bfloat16", "--target", "{tmp}/cut.gguf",
                                   "--draft", "{tmp}/cut.gguf"], ["--dtype 'bfloat16' applies", "GGUF models"]),
    ("bench: timeout inf", ["bench", "--dry-run", "--check-timeout", "inf", *_Q],
     ["--check-timeout must be a number of seconds in (0, 3600]", "'inf'"]),
    ("bench: timeout 1e400", ["bench", "--dry-run", "--check-timeout", "1e400", *_Q], ["--check-timeout", "'1e400'"]),
    ("bench: timeout 1e9", ["bench", "--dry-run", "--check-timeout", "1e9", *_Q], ["(0, 3600]"]),
    ("bench: timeout -1", ["bench", "--dry-run", "--check-timeout", "-1", *_Q], ["(0, 3600]"]),
    ("bench: timeout word", ["bench", "--dry-run", "--check-timeout", "ten", *_Q], ["(0, 3600]", "'ten'"]),
    ("sweep: timeout inf", ["bench", "--sweep", "{tmp}/inf.toml", "--dry-run"],
     ["inf.toml: check_timeout_s (--check-timeout) must be a number of seconds in (0, 3600]", "inf"]),
    ("sweep: timeout 1e400", ["bench", "--sweep", "{tmp}/e400.toml", "--dry-run"], ["e400.toml", "(0, 3600]"]),
    ("sweep: timeout nan", ["bench", "--sweep", "{tmp}/nan.toml", "--dry-run"], ["nan.toml", "(0, 3600]"]),
    ("sweep: YAML timeout .inf", ["bench", "--sweep", "{tmp}/inf.yaml", "--dry-run"], ["inf.yaml", "(0, 3600]"]),
    ("sweep: YAML timeout 1e400", ["bench", "--sweep", "{tmp}/e400.yaml", "--dry-run"], ["e400.yaml", "(0, 3600]"]),
    ("sweep: timeout 1e9", ["bench", "--sweep", "{tmp}/forever.toml", "--dry-run"], ["(0, 3600]"]),
    ("bench: GPUs nan", ["bench", "--dry-run", "--workers", "1", "--gpus-per-worker", "nan", *_Q],
     ["--gpus-per-worker must be a number in [0, 64]", "'nan'"]),
    ("bench: GPUs inf", ["bench", "--dry-run", "--workers", "1", "--gpus-per-worker", "inf", *_Q], ["[0, 64]"]),
    ("bench: GPUs 1000", ["bench", "--dry-run", "--workers", "1", "--gpus-per-worker", "1000", *_Q], ["[0, 64]"]),
    ("generate: empty --stop", ["generate", "--prompt", "hi", "--stop", ""], ["--stop is empty", "drop --stop"]),
    # ---- the same classes on every other flag: NaN, infinities, out of range, wrong type, empty text
    ("generate: gamma nan", ["generate", "--prompt", "hi", "--gamma", "nan"], ["γ must be an integer"]),
    ("generate: gamma 1e400", ["generate", "--prompt", "hi", "--gamma", "1e400"], ["γ must be an integer"]),
    ("generate: gamma 5000 digits", ["generate", "--prompt", "hi", "--gamma", "9" * 5000], ["γ must be an integer"]),
    ("generate: gamma 2.5", ["generate", "--prompt", "hi", "--gamma", "2.5"], ["γ must be an integer", "'2.5'"]),
    ("generate: draft-stop nan", ["generate", "--prompt", "hi", "--draft-stop", "nan"], ["[0, 1) or auto"]),
    ("generate: draft-stop inf", ["generate", "--prompt", "hi", "--draft-stop=-inf"], ["[0, 1) or auto"]),
    ("generate: n-ctx 1e400", ["generate", "--prompt", "hi", "--n-ctx", "1e400"], ["--n-ctx must be an integer"]),
    ("generate: n-ctx huge", ["generate", "--prompt", "hi", "--n-ctx", "99999999"], ["--n-ctx", "[1, 2097152]"]),
    ("generate: n-threads 100000", ["generate", "--prompt", "hi", "--n-threads", "100000"], ["[1, 4096]"]),
    ("generate: n-threads nan", ["generate", "--prompt", "hi", "--n-threads", "nan"], ["--n-threads", "'nan'"]),
    ("generate: max-new-tokens inf", ["generate", "--prompt", "hi", "--max-new-tokens", "inf"], ["--max-new-tokens"]),
    ("generate: max-new-tokens 2.5", ["generate", "--prompt", "hi", "--max-new-tokens", "2.5"], ["an integer"]),
    ("generate: seed -1", ["generate", "--prompt", "hi", "--seed", "-1"], ["--seed must be an integer in [0, "]),
    ("generate: seed 2^64", ["generate", "--prompt", "hi", "--seed", str(2 ** 64)], ["--seed"]),
    ("generate: seed 1e3", ["generate", "--prompt", "hi", "--seed", "1e3"], ["--seed", "'1e3'"]),
    ("generate: draft-vocab -5", ["generate", "--prompt", "hi", "--draft-vocab", "-5"], ["--draft-vocab"]),
    ("generate: draft-vocab nan", ["generate", "--prompt", "hi", "--draft-vocab", "nan"], ["--draft-vocab"]),
    ("generate: draft-vocab empty", ["generate", "--prompt", "hi", "--draft-vocab", ""], ["--draft-vocab is empty"]),
    ("generate: empty --prompt", ["generate", "--prompt", " "], ["--prompt is empty"]),
    ("generate: empty --rule", ["generate", "--prompt", "hi", "--rule", ""], ["--rule is empty"]),
    ("generate: empty --target", ["generate", "--prompt", "hi", "--target", ""], ["--target is empty"]),
    ("generate: empty --draft", ["generate", "--prompt", "hi", "--draft", ""], ["--draft is empty"]),
    ("generate: empty --device", ["generate", "--prompt", "hi", "--device", ""], ["--device is empty"]),
    ("generate: empty --dtype", ["generate", "--prompt", "hi", "--dtype", ""], ["--dtype is empty"]),
    ("generate: empty --sampling", ["generate", "--prompt", "hi", "--sampling", ""], ["--sampling is empty"]),
    ("generate: empty --tree", ["generate", "--prompt", "hi", "--tree", ""], ["--tree is empty"]),
    ("generate: empty --draft-head", ["generate", "--prompt", "hi", "--draft-head", ""], ["--draft-head is empty"]),
    ("generate: empty corpus", ["generate", "--prompt", "hi", "--draft-vocab-corpus", ""], ["is empty"]),
    ("calibrate: g-max nan", ["calibrate", "--g-max", "nan"], ["--g-max"]),
    ("calibrate: g-max -1", ["calibrate", "--g-max", "-1"], ["--g-max"]),
    ("calibrate: device on GGUF", ["calibrate", "--device", "cuda"], ["applies to transformers models"]),
    ("bench: limit 0", ["bench", "--dry-run", "--limit", "0", *_Q], ["--limit must be an integer in [1, "]),
    ("bench: limit nan", ["bench", "--dry-run", "--limit", "nan", *_Q], ["--limit", "'nan'"]),
    ("bench: n-samples 0", ["bench", "--dry-run", "--n-samples", "0", *_Q], ["--n-samples"]),
    ("bench: n-samples 1e9", ["bench", "--dry-run", "--n-samples", "1000000000", *_Q], ["[1, 100000]"]),
    ("bench: few-shot -1", ["bench", "--dry-run", "--few-shot", "-1", *_Q],
     ["--few-shot must be an integer in [0, 64]"]),
    ("bench: few-shot 1000", ["bench", "--dry-run", "--few-shot", "1000", *_Q], ["[0, 64]"]),
    ("bench: offset 1.5", ["bench", "--dry-run", "--offset", "1.5", *_Q], ["--offset", "'1.5'"]),
    ("bench: workers 1e9", ["bench", "--dry-run", "--workers", "1000000000", *_Q], ["--workers", "[1, 4096]"]),
    ("bench: threads/worker nan", ["bench", "--dry-run", "--threads-per-worker", "nan", *_Q], ["--threads-per-worker"]),
    ("bench: batch 100000", ["bench", "--dry-run", "--batch-size", "100000", *_Q], ["--batch-size", "[1, 4096]"]),
    ("bench: empty --sweep", ["bench", "--dry-run", "--sweep", "", *_Q], ["--sweep is empty"]),
    ("bench: empty --dataset", ["bench", "--dry-run", "--dataset", ""], ["--dataset is empty"]),
    ("bench: empty --data-dir", ["bench", "--dry-run", "--data-dir", "", *_Q], ["--data-dir is empty"]),
    ("bench: empty --question-field", ["bench", "--dry-run", "--dataset", "{tmp}/q.jsonl", "--question-field", ""],
     ["--question-field is empty"]),
    ("bench: empty --ray-address", ["bench", "--dry-run", "--ray-address", "", *_Q], ["--ray-address is empty"]),
    ("bench: seed -3", ["bench", "--dry-run", "--seed", "-3", *_Q], ["--seed"]),
    ("sweep: n_ctx 0", ["bench", "--sweep", "{tmp}/nctx.toml", "--dry-run"], ["n_ctx", "[1, 2097152]"]),
    ("sweep: seed -1", ["bench", "--sweep", "{tmp}/seed.toml", "--dry-run"], ["seed must be an integer in [0, "]),
    ("sweep: n_samples 1e9", ["bench", "--sweep", "{tmp}/many.toml", "--dry-run"], ["n_samples", "[1, 100000]"]),
    ("sweep: few_shot 1000", ["bench", "--sweep", "{tmp}/shots.toml", "--dry-run"], ["few_shot", "[0, 64]"]),
    ("sweep: empty target", ["bench", "--sweep", "{tmp}/notarget.toml", "--dry-run"], ["--target is empty"]),
    ("sweep: n_threads 0", ["bench", "--sweep", "{tmp}/threads.toml", "--dry-run"], ["n_threads", "[1, 4096]"]),
    ("sweep: empty rule", ["bench", "--sweep", "{tmp}/emptyrule.toml", "--dry-run"], ["rules holds an empty string"]),
    ("diagnose: limit 0", ["diagnose", "--limit", "0"], ["--limit"]),
    ("diagnose: gamma 0", ["diagnose", "--gamma", "0"], ["--gamma must be >= 1"]),
    ("diagnose: empty --bench", ["diagnose", "--bench", ""], ["--bench is empty"]),
    ("diagnose: device on GGUF", ["diagnose", "--device", "quantum"], ["not a torch device"]),
    ("report: empty dir", ["report", ""], ["the bench directory is empty"]),
    ("regrade: empty dir", ["regrade", ""], ["the bench directory is empty"]),
    ("lm-eval: gamma 2.5", ["lm-eval", "--gamma", "2.5", "--", "--tasks", "gsm8k"], ["γ must be an integer"]),
    ("lm-eval: seed -1", ["lm-eval", "--seed", "-1", "--", "--tasks", "gsm8k"], ["--seed"]),
    ("lm-eval: batch 0", ["lm-eval", "--batch-size", "0", "--", "--tasks", "gsm8k"], ["--batch-size"]),
    ("lm-eval: empty rule", ["lm-eval", "--rule", "", "--", "--tasks", "gsm8k"], ["--rule is empty"]),
    ("lm-eval: gamma, baseline", ["lm-eval", "--baseline", "--gamma", "3", "--", "--tasks", "gsm8k"],
     ["--baseline decodes the target alone", "--gamma", "would be ignored"]),
    ("lm-eval: tree, no draft", ["lm-eval", "--draft-source", "none", "--tree", "2,1", "--", "--tasks", "gsm8k"],
     ["--tree", "would be ignored"]),
    ("lm-eval: device on GGUF", ["lm-eval", "--device", "quantum", "--", "--tasks", "gsm8k"], ["not a torch device"]),
    ("lm-eval: n-ctx nan", ["lm-eval", "--n-ctx", "nan", "--", "--tasks", "gsm8k"], ["--n-ctx"]),
    # ---- issue 40: hostile sweep files
    ("sweep: YAML alias bomb", ["bench", "--sweep", "{tmp}/bomb.yaml", "--dry-run"],
     ["bomb.yaml", "expand to more than 100000 values"]),
    ("sweep: YAML alias loop", ["bench", "--sweep", "{tmp}/loop.yaml", "--dry-run"], ["refers to the collection"]),
    ("sweep: YAML 5000 deep", ["bench", "--sweep", "{tmp}/deep.yaml", "--dry-run"], ["nested more than 32 levels"]),
    ("sweep: TOML 5000 deep", ["bench", "--sweep", "{tmp}/deep.toml", "--dry-run"], ["nested more than 32 levels"]),
    ("sweep: 120000 values", ["bench", "--sweep", "{tmp}/wide.yaml", "--dry-run"], ["more than 100000 values"]),
    ("sweep: 2 MB file", ["bench", "--sweep", "{tmp}/huge.toml", "--dry-run"], ["bytes is far more than a sweep"]),
    ("sweep: 100 kB key", ["bench", "--sweep", "{tmp}/longkey.toml", "--dry-run"], ["unknown sweep key 'kkkk"]),
    ("sweep: 100 kB value", ["bench", "--sweep", "{tmp}/longvalue.toml", "--dry-run"], ["limit must be an integer"]),
]

#: The longest error line any case of the table may print (user data is quoted in excerpts).
MAX_LINE = 600


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
    last = assert_clear_error(code, err, *needles)
    assert len(last.encode()) <= MAX_LINE, (len(last), last[:300])
    assert time.monotonic() - t0 < 60   # no hang (the Ray cases answer in well under a second)
    # nothing lost or rewritten: every input file is as it was, nothing new beside them
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "never").exists()


# --------------------------------------------------------------------------------------------------
# The environment: (case, variables, what the error line must say). Each runs `verispec rules`, which has
# nothing to refuse itself: the line comes from the check of the environment, before the command.

ENV_CASES = [
    ("VERISPEC_THREADS=0", {"VERISPEC_THREADS": "0"}, ["VERISPEC_THREADS must be an integer in [1, 4096]", "'0'"]),
    ("VERISPEC_THREADS=-2", {"VERISPEC_THREADS": "-2"}, ["VERISPEC_THREADS", "'-2'", "unset it"]),
    ("VERISPEC_THREADS=nan", {"VERISPEC_THREADS": "nan"}, ["VERISPEC_THREADS", "'nan'"]),
    ("VERISPEC_THREADS=inf", {"VERISPEC_THREADS": "inf"}, ["VERISPEC_THREADS", "'inf'"]),
    ("VERISPEC_THREADS=1e400", {"VERISPEC_THREADS": "1e400"}, ["VERISPEC_THREADS"]),
    ("VERISPEC_THREADS=2.5", {"VERISPEC_THREADS": "2.5"}, ["VERISPEC_THREADS", "'2.5'"]),
    ("VERISPEC_THREADS=four", {"VERISPEC_THREADS": "four"}, ["VERISPEC_THREADS", "'four'"]),
    ("VERISPEC_THREADS=100000", {"VERISPEC_THREADS": "100000"}, ["VERISPEC_THREADS", "[1, 4096]"]),
    ("VERISPEC_THREADS=5000 digits", {"VERISPEC_THREADS": "7" * 5000}, ["VERISPEC_THREADS"]),
    ("VERISPEC_CACHE=a file", {"VERISPEC_CACHE": "{tmp}/afile"}, ["VERISPEC_CACHE=", "is a file", "folder"]),
    ("VERISPEC_DATA=a file", {"VERISPEC_DATA": "{tmp}/afile"}, ["VERISPEC_DATA=", "is a file"]),
    ("VERISPEC_DEBUG=0 keeps one line", {"VERISPEC_DEBUG": "0", "VERISPEC_THREADS": "0"}, ["VERISPEC_THREADS"]),
]


@pytest.mark.parametrize("name, env, needles", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_bad_environment_gets_one_clear_line_and_exit_2(name, env, needles, tmp_path, monkeypatch, capsys):
    _files(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value.replace("{tmp}", str(tmp_path)))
    code, out, err = run_cli(capsys, "rules")
    last = assert_clear_error(code, err, *needles)
    assert len(last.encode()) <= MAX_LINE and out == ""


def test_good_environment_values_pass(monkeypatch, capsys):
    """An empty VERISPEC_THREADS is unset (as llama.cpp's backend reads it); a count in range is taken."""
    from verispec.runtime import env_threads

    for value, expected in (("", None), ("  ", None), ("4", 4), (" 12 ", 12), ("4096", 4096)):
        monkeypatch.setenv("VERISPEC_THREADS", value)
        assert env_threads() == expected
        code, out, _ = run_cli(capsys, "rules")
        assert code == 0 and "lossless" in out


def test_the_sweep_counts():
    """Every case of the table is a distinct kind of bad input (the report's count reads this)."""
    assert len({c[0] for c in CASES}) == len(CASES) >= 175
    assert len({c[0] for c in ENV_CASES}) == len(ENV_CASES) >= 10


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


# --------------------------------------------------------------------------------------------------
# Round 5 (issues 39, 40): bounded error lines, the YAML bomb, --draft-vocab, --g-max


def test_the_yaml_bomb_is_refused_unexpanded_in_one_short_line(tmp_path, capsys):
    """700 bytes of nested aliases (9^8 values) made a 254 MB error line: the node graph is counted, each node
    once, before any value is built. The CPU bound is one of correctness (nothing is expanded), not speed."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB_YAML)
    assert len(BOMB_YAML) < 1000
    t0 = time.process_time()
    code, _, err = run_cli(capsys, "bench", "--sweep", bomb, "--dry-run")
    assert time.process_time() - t0 < 5
    last = assert_clear_error(code, err, "expand to more than 100000 values")
    print(f"sweep bomb: {len(BOMB_YAML)}-byte file, error line {len(last.encode())} bytes")
    assert len(last.encode()) < 400


def test_values_quoted_in_errors_are_excerpts():
    """``shown`` walks a few levels and items of any value (a 9^8 structure sharing one list costs microseconds)
    and cuts the text; ``check_field_types`` and ``bounded`` use it."""
    from verispec.commands import bounded
    from verispec.params import SHOWN_CHARS, shown

    nested: list = ["lol"] * 9
    for _ in range(8):
        nested = [nested] * 9
    t0 = time.process_time()
    text = shown(nested)
    assert time.process_time() - t0 < 1 and len(text) <= SHOWN_CHARS and text.startswith("[[[")
    assert len(shown("x" * 10**6)) == SHOWN_CHARS
    cfg = runner.BenchConfig(rules=nested)
    with pytest.raises(ValueError, match="rules must be a list of strings") as err:
        cfg.validate()
    assert len(str(err.value)) < 300
    line = bounded("y" * 10**6)
    assert len(line) < 2100 and line.endswith("(998000 more characters)")
    assert bounded("two\nlines") == "two lines"


def test_check_number_refuses_every_kind_of_bad_number():
    from verispec.params import check_number

    bad = ["nan", "inf", "-inf", "1e400", "", "  ", "ten", "0x10", "9" * 5000, float("nan"), float("inf"), True,
           None, [3], "3.5", 3.5]
    for value in bad:
        with pytest.raises(ValueError, match=r"n must be an integer in \[1, 10\], got"):
            check_number(value, "n", kind=int, lo=1, hi=10)
    assert check_number(" 7 ", "n", kind=int, lo=1, hi=10) == 7 and check_number(10, "n", kind=int, lo=1, hi=10) == 10
    for value in ("0", 0, -1e-9, "10.000001", float("nan"), "1e400", False):
        with pytest.raises(ValueError, match=r"t must be a number of seconds in \(0, 10\], got"):
            check_number(value, "t", lo=0.0, hi=10.0, lo_open=True, unit="seconds")
    assert check_number("2.5", "t", lo=0.0, hi=10.0, lo_open=True) == 2.5


def test_draft_vocab_beyond_the_vocabulary_is_refused():
    from types import SimpleNamespace

    from tests.helpers.fake_lm import FakeLM
    from verispec.cli import _reduced_draft

    draft = FakeLM(vocab=40, seed=0)
    args = SimpleNamespace(draft_vocab=10_000_000, draft_vocab_corpus=None)
    with pytest.raises(ValueError, match="--draft-vocab 10000000 is beyond the draft's vocabulary of 40 tokens: "
                                         "give at most 40, or full"):
        _reduced_draft(args, draft)


def test_calibration_is_bounded_and_says_how_far_it_got(monkeypatch):
    """``--g-max`` is capped at γ's own maximum (the time grows with its square: 100 ran past any limit without a
    word), and the measurement reports each stage, and within a long round every PROGRESS_EVERY_S."""
    from tests.helpers.fake_lm import FakeLM
    from verispec.engine import calibrate
    from verispec.engine.calibrate import measure_profile

    target, draft = FakeLM(vocab=12, seed=1), FakeLM(vocab=12, seed=2)
    for g_max in (0, 65, 100, 2.5, True):
        with pytest.raises(ValueError, match=r"g_max must be an integer in \[1, 64\]"):
            measure_profile(target, draft, [0, 1], g_max=g_max)
    heard: list[str] = []
    measure_profile(target, draft, [0, 1], g_max=3, repeats=2, progress=heard.append)
    assert heard[0] == "timing forwards: round 1 of 2, target blocks of 1..4 tokens"
    assert heard[1].startswith("timing forwards: round 2 of 2") and "s so far" in heard[1]
    assert heard[2].startswith("timing the engine's own work")
    monkeypatch.setattr(calibrate, "PROGRESS_EVERY_S", 0.0)
    heard.clear()
    measure_profile(target, draft, [0, 1], g_max=3, repeats=1, progress=heard.append)
    calls = [line for line in heard if " calls (" in line]
    assert [c.split(", ")[1].split(" (")[0] for c in calls] == [f"{i} of 6 calls" for i in range(1, 7)]


def test_regrade_refuses_a_stored_infinite_check_timeout(tmp_path, capsys):
    """A bench stored before the check of --check-timeout may hold ``Infinity`` in its config.json: regrade
    refuses it (it failed correct answers inside the checkers) unless --check-timeout is given."""
    cfg = config(tmp_path, n_rows=2, n_samples=1)
    out, _ = runner.run_bench(cfg, progress=False, load_models=fake_models, log=lambda m: None, report=False)
    stored = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**stored, "check_timeout_s": float("inf")}))
    code, _, err = run_cli(capsys, "regrade", out)
    assert_clear_error(code, err, "config.json", "pass --check-timeout",
                       "its check_timeout_s must be a number of seconds in (0, 3600], got inf")
    code, out_text, err = run_cli(capsys, "regrade", out, "--check-timeout", "5")
    assert code == 0 and "0 of 10 verdicts changed" in out_text, err
    code, _, err = run_cli(capsys, "regrade", out, "--check-timeout", "inf")
    assert_clear_error(code, err, "--check-timeout must be a number of seconds in (0, 3600]")
    from verispec.bench.regrade import regrade  # the library call checks it too

    with pytest.raises(ValueError, match=r"stored check_timeout_s must be a number of seconds in \(0, 3600\]"):
        regrade(out)
    assert regrade(out, timeout_s=5).changed == 0
