"""``verispec serve`` as a process: its flags, its refusals, and SIGTERM (requests in flight finish, new ones
are refused, the process exits 0)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
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


# -- refusals before serving (issues 39 and 40) ---------------------------------------------------------------

def run_serve(capsys, *argv: str) -> tuple[int, str]:
    """``(exit status, stderr)`` of ``verispec serve ARGV`` in this process (argparse's errors arrive as
    ``SystemExit(2)``)."""
    from verispec.cli import main

    try:
        code = main(["serve", *argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def assert_one_error_line(code: int, err: str, needle: str) -> None:
    """Exit 2, no traceback, the last line ``verispec...: error: ...`` naming ``needle``."""
    assert code == 2, err
    assert "Traceback" not in err and "uvicorn" not in err.lower(), err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("verispec") and ": error:" in last and needle in last, (needle, err)


_BAD_FLAGS = [
    (["--port", "70000"], "--port must be an integer in [0, 65535], got '70000'"),
    (["--port", "-1"], "--port must be an integer in [0, 65535], got '-1'"),
    (["--port", "8e3"], "--port must be an integer"),
    (["--port", "9" * 5000], "--port must be an integer"),
    (["--host", ""], "--host is empty"),
    (["--host", "   "], "--host is empty"),
    (["--host", "999.1.1.1"], "not an IPv4 address"),
    (["--host", "no-such-host.invalid"], "not an address this machine can listen on"),
    (["--host", "192.0.2.1"], "not an address of this machine"),          # TEST-NET-1: never local
    (["--request-timeout", "nan"], "--request-timeout must be a number of seconds"),
    (["--request-timeout", "inf"], "--request-timeout must be a number of seconds"),
    (["--request-timeout", "-1"], "--request-timeout must be a number of seconds"),
    (["--header-timeout", "0"], "--header-timeout must be a number of seconds in (0"),
    (["--header-timeout", "1e9"], "--header-timeout must be a number of seconds"),
    (["--body-timeout", "1e400"], "--body-timeout must be a number of seconds"),
    (["--idle-timeout", "-5"], "--idle-timeout must be a number of seconds"),
    (["--shutdown-timeout", "soon"], "--shutdown-timeout must be a number of seconds"),
    (["--served-model-name", ""], "--served-model-name is empty"),
    (["--served-model-name", "m\udcff"], "--served-model-name is not valid UTF-8"),
    (["--host", "h\udcff"], "--host is not valid UTF-8"),
    (["--served-model-name", " "], "--served-model-name is empty"),
    (["--dtype", "f33"], "--dtype"),                                         # the embedded pair: llama.cpp
    (["--device", "cuda"], "--device"),
    (["--n-ctx", "0"], "--n-ctx"),
]


@pytest.mark.parametrize("flags,needle", _BAD_FLAGS, ids=[ascii(" ".join(f))[1:41] for f, _ in _BAD_FLAGS])
def test_bad_serve_flags_get_one_line_and_exit_2_before_any_model_loads(capsys, monkeypatch, flags, needle):
    import verispec.models

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded before the flags were refused")

    monkeypatch.setattr(verispec.models, "load_pair", no_loading)
    assert_one_error_line(*run_serve(capsys, "--port", "0", *flags), needle)


def test_a_port_in_use_is_one_line_through_the_command_line():
    """The whole command in a subprocess: the one line, exit 2, nothing of uvicorn's, in about a second (no
    model loads: the address is bound first)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        done = subprocess.run([sys.executable, "-m", "verispec.serve", "--port", str(port)], env=env,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"verispec: error: 127.0.0.1:{port} is already in use (another server listens there): stop it, or give "
        "another --port (0: any free port)"], done.stderr


def test_a_context_that_holds_no_request_is_refused(tmp_path):
    """``--n-ctx 8``: no chat turn fits with a token to generate and γ+1 of verification room."""
    from dataclasses import replace

    from tests.helpers.serve import tiny_served
    from verispec.serve.cli import check_context
    from verispec.serve.model import ServedModel
    from verispec.serve.protocol import Policy

    model = ServedModel(tiny_served(rows=1).target_rows)
    policy = Policy(context_length=512, vocab_size=99)
    check_context(model, policy)                                # the tiny pair's own context: fine
    with pytest.raises(ValueError, match=r"a context of 8 tokens \(--n-ctx\) holds no request: .* give --n-ctx \d+"):
        check_context(model, replace(policy, context_length=8))
