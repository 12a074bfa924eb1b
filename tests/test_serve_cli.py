"""``verispec serve`` as a process: its flags, its refusals, and SIGTERM (requests in flight finish, new ones
are refused, the process exits 0)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.serve import free_port, save_tiny_pair

requests = pytest.importorskip("requests")

ROOT = Path(__file__).resolve().parents[1]


def parser() -> argparse.ArgumentParser:
    from verispec.integrations.lm_eval import add_lm_eval_parser
    from verispec.serve.cli import add_serve_parser

    ap = argparse.ArgumentParser(prog="verispec")
    sub = ap.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    add_lm_eval_parser(sub)
    return ap


def test_flags_and_their_refusals(capsys):
    args = parser().parse_args(["serve", "--port", "9", "--rule", "lenience:ell=0.5", "--gamma", "auto",
                                "--allowed-rules", "lossless,lenience", "--batch-size", "2"])
    assert (args.port, args.rule, args.gamma, args.allowed_rules, args.batch_size) == \
        (9, "lenience:ell=0.5", "auto", frozenset({"lossless", "lenience"}), 2)
    assert args.target is None and args.draft is None and args.host == "127.0.0.1"
    for bad in (["serve", "--allowed-rules", "nope"], ["serve", "--gamma", "0x"], ["serve", "--batch-size", "0"]):
        with pytest.raises(SystemExit):
            parser().parse_args(bad)
    assert "--allowed-rules" in capsys.readouterr().err
    args = parser().parse_args(["lm-eval", "--rule", "lossless", "--baseline", "--", "--tasks", "gsm8k"])
    assert args.baseline and args.lm_eval_args[-2:] == ["--tasks", "gsm8k"]


def test_defaults_that_are_no_valid_request_are_refused_before_serving(tmp_path):
    from verispec.serve.cli import build_server

    target, draft = save_tiny_pair(tmp_path)
    for flags, match in ((["--rule", "nope"], "unknown rule"), (["--rule", "lenience:ell=0.5", "--tree", "iid:2,2"],
                                                                 "tree"), (["--lookup"], "per request")):
        args = parser().parse_args(["serve", "--target", str(target), "--draft", str(draft), "--dtype", "float64",
                                    "--batch-size", "1", *flags])
        with pytest.raises(ValueError, match=match):
            build_server(args)


def test_sigterm_finishes_requests_in_flight_and_refuses_new_ones(tmp_path):
    target, draft = save_tiny_pair(tmp_path)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "verispec.serve", "--target", str(target), "--draft",
                             str(draft), "--dtype", "float64", "--batch-size", "1", "--port", str(port),
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = deadline = time.time()
        deadline += 120
        while True:
            try:
                if requests.get(url + "/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        got: dict = {}
        started = threading.Event()

        def long_stream():
            body = {"prompt": "zzz", "max_tokens": 120, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}, "verification": {"gamma": 3}}
            lines = []
            with requests.post(url + "/v1/completions", json=body, stream=True, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith(b"data: "):
                        lines.append(line[6:])
                        started.set()
            got["lines"] = lines

        t_up = time.time() - t0
        t = threading.Thread(target=long_stream)
        t.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        try:
            refused = requests.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
            assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"
        except requests.ConnectionError:
            pass                                        # the listening socket is closed: refused as well
        t.join(120)
        assert proc.wait(60) == 0
        print(f"up in {t_up:.1f} s, stopped {time.time() - t0 - t_up:.1f} s later")
        lines = got["lines"]
        assert lines[-1] == b"[DONE]"
        usage = json.loads(lines[-2])["usage"]
        assert usage["completion_tokens"] == 120                    # the request in flight ran to its end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
