"""``verispec serve`` against slow, huge and hostile clients, through the real server (a subprocess on a free
loopback port, the tiny transformers pair, raw sockets, real signals): nothing blocks the event loop, every
connection is under a deadline, SIGTERM ends the process whatever a client holds, every start-up failure
is one verispec line, and malformed bodies get a 400 before they are parsed (issues 39 and 40).

The timeouts are set short (1 s) so that each case takes seconds; the bounds asserted on elapsed times are
correctness bounds (a deadline that holds, an event loop that answers), generous against a loaded 2-core
machine, far below the unbounded waits they replace (/health waited 68.6 s; slow connections stayed open
for ever).
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.serve import save_tiny_pair

requests = pytest.importorskip("requests")

ROOT = Path(__file__).resolve().parents[1]
MAX_BODY = 32 * 1024 * 1024
#: The server's deadlines in these tests (seconds), and how much later than a deadline a close may come.
HEADER_S = IDLE_S = 1.0
BODY_S = 3.0          # a 32 MiB body must arrive within it on a loaded machine
BACKSTOP_S = 2.0
SLACK_S = 3.0
#: Seconds a stopped server's interpreter may take to exit (tearing down torch and transformers).
EXIT_S = 60.0


class Served:
    """``python -m verispec.serve`` on the tiny pair, port 0 (the URL read from its start line)."""

    def __init__(self, folder: Path, *extra: str) -> None:
        target, draft = save_tiny_pair(folder) if not (folder / "target").is_dir() else (folder / "target",
                                                                                          folder / "draft")
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "verispec.serve", "--target", str(target), "--draft", str(draft), "--dtype",
             "float64", "--batch-size", "2", "--port", "0", "--log-level", "warning",
             "--header-timeout", str(HEADER_S), "--body-timeout", str(BODY_S), "--idle-timeout", str(IDLE_S),
             *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        found = threading.Event()

        def drain() -> None:              # the pipe must never fill up and block the server
            for line in self.proc.stderr:
                self.lines.append(line)
                if re.search(r"verispec serve: http://127\.0\.0\.1:\d+/v1", line):
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.time() + 120
        while not found.wait(0.2):
            assert self.proc.poll() is None and time.time() < deadline, "".join(self.lines)[-3000:]
        self.port = int(re.search(r"127\.0\.0\.1:(\d+)/v1", "".join(self.lines)).group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        while True:
            try:
                if requests.get(self.url + "/health", timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            assert self.proc.poll() is None and time.time() < deadline, "".join(self.lines)[-3000:]
            time.sleep(0.1)

    def terminate(self) -> tuple[int, float, float]:
        """SIGTERM -> ``(exit status, seconds to the server's "stopped" line, seconds to the exit)``. The
        first is the server's shutdown; the rest is the interpreter's exit (module teardown: seconds on a
        loaded machine), bounded generously."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(EXIT_S)
        return code, self.stopped_after(), time.monotonic() - t0

    def stopped_after(self) -> float:
        time.sleep(0.2)                           # the drain thread reads the last lines
        found = re.search(r"stopped ([0-9.]+) s after the stop signal", "".join(self.lines))
        assert found, "".join(self.lines)[-3000:]
        return float(found.group(1))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = Served(tmp_path_factory.mktemp("pair"), "--shutdown-timeout", "2")
    yield server
    server.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_until_closed(sock: socket.socket, limit_s: float = 30.0) -> tuple[float, bytes]:
    """(seconds until the server closed the connection, what it sent)."""
    t0, data = time.monotonic(), b""
    sock.settimeout(0.2)
    while time.monotonic() - t0 < limit_s:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return time.monotonic() - t0, data


def status_and_error(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


# -- the event loop ---------------------------------------------------------------------------------------

def test_the_largest_body_is_refused_while_health_answers(served):
    """A prompt of nearly 32 MiB (the largest body taken) is refused with a 400 naming the context, and
    /health answers meanwhile: checking, parsing and tokenizing run off the event loop, and text longer
    than the context can hold is refused before it is tokenized."""
    prompt = "a" * (MAX_BODY - 1024)
    body = json.dumps({"prompt": prompt, "max_tokens": 4}).encode()
    got: dict = {}

    def post() -> None:
        t0 = time.monotonic()
        got["response"] = requests.post(served.url + "/v1/completions", data=body, timeout=120,
                                        headers={"Content-Type": "application/json"})
        got["seconds"] = time.monotonic() - t0

    worker = threading.Thread(target=post)
    worker.start()
    latencies = []
    while worker.is_alive():
        t0 = time.monotonic()
        assert requests.get(served.url + "/health", timeout=30).json()["status"] == "ok"
        latencies.append(time.monotonic() - t0)
        time.sleep(0.02)
    worker.join()
    r = got["response"]
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text[:500]
    assert "maximum context length" in r.json()["error"]["message"]
    print(f"\n{len(body)} bytes refused in {got['seconds']:.2f} s; /health max {max(latencies, default=0):.3f} s "
          f"over {len(latencies)} polls")
    assert latencies and max(latencies) < 2.0


# -- deadlines on connections ------------------------------------------------------------------------------

def test_a_partial_body_gets_408_and_the_connection_closes(served):
    sock = connect(served.port)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 50\r\n\r\n" + b'{"prompt": "ab')
    seconds, response = read_until_closed(sock)
    status, error = status_and_error(response)
    assert status == 408 and error["code"] == "request_timeout" and "body" in error["message"]
    assert BODY_S * 0.9 < seconds < BODY_S + SLACK_S
    print(f"\npartial body: 408 and closed after {seconds:.2f} s")


def test_a_body_declared_over_the_limit_is_refused_unread(served):
    sock = connect(served.port)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode())
    seconds, response = read_until_closed(sock)
    status, error = status_and_error(response)
    assert status == 413 and seconds < BODY_S, (seconds, response[:300])


def test_idle_and_silent_connections_are_closed(served):
    silent = connect(served.port)                 # connects, sends nothing
    seconds, response = read_until_closed(silent)
    assert status_and_error(response)[0] == 408 and HEADER_S * 0.9 < seconds < HEADER_S + SLACK_S
    kept = connect(served.port)                   # one request, then idle on a kept-alive connection
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    seconds, response = read_until_closed(kept)
    assert response.startswith(b"HTTP/1.1 200") and seconds < IDLE_S + SLACK_S


def test_slow_loris_connections_are_closed_and_the_server_keeps_serving(served):
    """120 connections sending a byte every 0.1 s: 40 dribble a request's headers, 40 a body the app reads,
    40 a body after a GET that no endpoint reads. Each is closed at its deadline (the head's, the app's
    body deadline with a 408, the connection's body deadline), while a normal request is answered."""
    sel = selectors.DefaultSelector()
    opened = {}
    heads = {"header": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
             "body": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{",
             "unread body": b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"}
    for i in range(120):
        kind = list(heads)[i % 3]
        sock = connect(served.port)
        sock.sendall(heads[kind])
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        opened[sock] = (kind, time.monotonic(), [b""])
    kept: dict[str, list[float]] = {kind: [] for kind in heads}
    answers: dict[str, set[bytes]] = {kind: set() for kind in heads}
    t0 = time.monotonic()
    last_drip = 0.0
    health = None
    while opened and time.monotonic() - t0 < 30:
        for key, _ in sel.select(0.05):
            sock = key.fileobj
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                chunk = b""
            if chunk:
                opened[sock][2][0] += chunk
                continue
            kind, started, data = opened.pop(sock)
            kept[kind].append(time.monotonic() - started)
            answers[kind].add(data[0].split(b"\r\n", 1)[0])
            sel.unregister(sock)
            sock.close()
        if time.monotonic() - last_drip > 0.1:
            last_drip = time.monotonic()
            for sock, (kind, _, _) in opened.items():
                try:
                    sock.send(b"X" if kind == "header" else b" ")
                except OSError:
                    pass
        if health is None and time.monotonic() - t0 > 0.5:
            health = requests.get(served.url + "/health", timeout=10).status_code
    for sock in opened:
        sock.close()
    print(f"\nslow-loris: kept at most {', '.join(f'{k} {max(v):.2f} s' for k, v in kept.items() if v)}; "
          f"answers {answers}")
    assert not opened, f"{len(opened)} connections still open after 30 s"
    assert health == 200
    assert max(kept["header"]) < HEADER_S + SLACK_S and answers["header"] == {b"HTTP/1.1 408 Request Timeout"}
    assert max(kept["body"]) < BODY_S + SLACK_S and answers["body"] == {b"HTTP/1.1 408 Request Timeout"}
    assert max(kept["unread body"]) < BODY_S + BACKSTOP_S + SLACK_S
    assert answers["unread body"] == {b"HTTP/1.1 200 OK"}      # answered, then closed at the body deadline


_BAD_HTTP = [
    # (what, bytes sent, status)
    ("binary garbage", b"\x00\x01\x02 garbage\r\n\r\n", 400),
    ("a request line without a version", b"GET /health\r\n\r\n", 400),
    ("a header without a colon", b"GET /health HTTP/1.1\r\nHost x\r\n\r\n", 400),
    ("Content-Length not a number", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
    ("two Content-Lengths", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
     b"Content-Length: 3\r\n\r\n{}", 400),
    ("Content-Length of 5,000 digits", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
     + b"9" * 5000 + b"\r\n\r\n", 400),                  # h11 refuses it
    ("a chunk size of 16^30", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"f" * 30 + b"\r\n{", 400),                       # h11 refuses it
    ("chunks beyond 32 MiB", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + (b"100000\r\n" + b" " * 0x100000 + b"\r\n") * 33, 413),
    ("headers over 16 KiB", b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: " + b"a" * 20_000, 431),
]


@pytest.mark.parametrize("what,data,status", _BAD_HTTP, ids=[c[0] for c in _BAD_HTTP])
def test_malformed_http_gets_an_error_body_and_the_connection_closes(served, what, data, status):
    sock = connect(served.port)
    try:
        sock.sendall(data)
    except OSError:                               # closed while sending: what was answered is in the buffer
        pass
    seconds, response = read_until_closed(sock)
    got, error = status_and_error(response)
    assert got == status and error["message"], (got, error)
    assert seconds < BODY_S + SLACK_S


# -- malformed and hostile bodies ----------------------------------------------------------------------------

_DEEP = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
_HOSTILE = [
    # (what, endpoint, body, param or None, a word of the message)
    ("100,000 nested arrays", "/v1/completions", _DEEP, None, "nests"),
    ("100,000 nested objects", "/v1/chat/completions", b'{"a": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001,
     None, "nests"),
    ("max_tokens of 5,000 digits", "/v1/completions", b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",
     None, "number"),
    ("a float of 5,000 digits", "/v1/completions", b'{"prompt": "hi", "temperature": 0.' + b"1" * 5000 + b"}",
     None, "number"),
    ("an exponent of 5,000 digits", "/v1/completions", b'{"prompt": "hi", "top_p": 1e' + b"1" * 5000 + b"}",
     None, "number"),
    ("seed beyond 64 bits", "/v1/completions", b'{"prompt": "hi", "seed": ' + b"9" * 40 + b"}", "seed", "seed"),
    ("top_k beyond 32 bits", "/v1/completions", b'{"prompt": "hi", "top_k": ' + b"9" * 40 + b"}", "top_k", "top_k"),
    ("n of 10^50", "/v1/completions", b'{"prompt": "hi", "n": 1' + b"0" * 50 + b"}", "n", "'n'"),
    ("temperature 1e400 (infinite)", "/v1/completions", b'{"prompt": "hi", "temperature": 1e400}', "temperature",
     "temperature"),
    ("NaN", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}', None, "NaN"),
    ("-Infinity", "/v1/completions", b'{"prompt": "hi", "max_tokens": -Infinity}', None, "Infinity"),
    ("a lone surrogate in the prompt", "/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt", "surrogate"),
    ("a lone low surrogate in a prompt list", "/v1/completions", b'{"prompt": ["ok", "\\udfff"]}', "prompt[1]",
     "surrogate"),
    ("a lone surrogate in a message", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages[0].content", "surrogate"),
    ("a lone surrogate in a stop string", "/v1/completions", b'{"prompt": "hi", "stop": ["\\ud800"]}', "stop[0]",
     "surrogate"),
    ("a lone surrogate in the rule", "/v1/completions",
     b'{"prompt": "hi", "verification": {"rule": "\\ud800"}}', "verification.rule", "surrogate"),
    ("a lone surrogate in a key", "/v1/completions", b'{"prompt": "hi", "\\ud800": 1}', None, "surrogate"),
    ("a lone surrogate in the model name", "/v1/completions", b'{"prompt": "hi", "model": "\\udc80"}', "model",
     "surrogate"),
    ("a lone surrogate to /tokenize", "/tokenize", b'{"prompt": "\\ud800"}', "prompt", "surrogate"),
    ("bytes that are not UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', None, "UTF-8"),
    ("UTF-16 text", "/v1/completions", '{"prompt": "hi"}'.encode("utf-16"), None, "UTF-8"),
    ("an array body", "/v1/completions", b"[1, 2]", None, "object"),
    ("two million values", "/v1/completions", b'{"prompt": [' + b"1," * 2_000_000 + b"1]}", None, "values"),
    ("a 30 MiB message", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "' + b"x" * (30 << 20) + b'"}]}', "messages", "context"),
    ("a 30 MiB prompt in a list", "/v1/completions", b'{"prompt": ["hi", "' + b"x" * (30 << 20) + b'"]}', "prompt",
     "prompt 1"),
    ("a 30 MiB text to /tokenize", "/tokenize", b'{"prompt": "' + b"x" * (30 << 20) + b'"}', "prompt", "context"),
    ("a 30 MiB message to /tokenize", "/tokenize",
     b'{"messages": [{"role": "user", "content": "' + b"x" * (30 << 20) + b'"}]}', "messages", "context"),
    ("two million ids to /detokenize", "/detokenize", b'{"tokens": [' + b"1," * 2_000_000 + b"1]}", None, "values"),
    ("brackets, commas, escaped quotes in a 2 MiB string", "/v1/completions",    # no structure: only too long
     b'{"prompt": "' + b'[{,\\"\\\\' * 300_000 + b'"}', "prompt", "context"),
    ("a 1 MiB model name", "/v1/completions", b'{"prompt": "hi", "model": "' + b"m" * (1 << 20) + b'"}', "model",
     "does not exist"),
]


@pytest.mark.parametrize("what,endpoint,body,param,word", _HOSTILE, ids=[c[0] for c in _HOSTILE])
def test_hostile_bodies_get_a_4xx_with_an_error_body(served, what, endpoint, body, param, word):
    r = requests.post(served.url + endpoint, data=body, timeout=60, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert word in error["message"] and error["param"] == param, error
    assert len(r.content) < 2000                  # a refusal quotes at most a bounded part of the request


def test_a_long_stream_adds_up_to_the_answer(monkeypatch):
    """Past :data:`verispec.serve.app.LONG_TEXT` tokens a stream's text is decoded off the event loop (here
    from 2 tokens on, in this process); its deltas still add up to the text the request gets unstreamed."""
    import verispec.serve.app as app_module
    from tests.helpers.serve import serve_tiny, tiny_served

    monkeypatch.setattr(app_module, "LONG_TEXT", 2)
    server = serve_tiny(tiny_served(rows=2))
    try:
        for prompt in ("hello", "zzz", "1 2 3", "print(", "xyz", "aaaa", "qq"):      # one whose answer is long
            body = {"prompt": prompt, "max_tokens": 40, "temperature": 0}
            whole = requests.post(server.url + "/v1/completions", json=body, timeout=300).json()["choices"][0]
            if whole["finish_reason"] == "length":
                break
        pieces = []
        with requests.post(server.url + "/v1/completions", json=dict(body, stream=True), stream=True,
                           timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    pieces.append(json.loads(line[6:])["choices"][0]["text"])
    finally:
        server.stop()
    assert whole["finish_reason"] == "length" and "".join(pieces) == whole["text"] and len(pieces) > 2


def test_the_server_serves_after_the_hostile_bodies(served):
    r = requests.post(served.url + "/v1/completions", json={"prompt": "ab", "max_tokens": 3, "temperature": 0},
                      timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert "Traceback" not in "".join(served.lines)


# -- SIGTERM ------------------------------------------------------------------------------------------------

def _held_stream(port: int) -> socket.socket:
    """A streaming request of 64 long choices whose client reads nothing: in flight for a long time."""
    body = json.dumps({"prompt": "ab", "n": 64, "max_tokens": 400, "temperature": 1, "stream": True}).encode()
    sock = connect(port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def test_sigterm_ends_within_the_deadline_whatever_the_clients_hold(tmp_path):
    """SIGTERM (--shutdown-timeout 3) while one client holds a request with part of its body, the body
    deadline far away, and another a long streaming request it does not read: the first is answered 503
    at once (it is not in flight), the second is cancelled at the deadline, and the server stops with
    status 0."""
    server = Served(tmp_path, "--shutdown-timeout", "3", "--body-timeout", "300")
    try:
        held = _held_stream(server.port)
        hung = connect(server.port)
        hung.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n" + b'{"prompt": "ab')
        time.sleep(1.0)                           # the app reads the half body; the engine decodes the stream
        assert requests.get(server.url + "/health", timeout=10).json()["running"] > 0
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        answered_after, response = read_until_closed(hung, 10)
        code = server.proc.wait(EXIT_S)
        exited, stopped = time.monotonic() - t0, server.stopped_after()
        print(f"\nSIGTERM: the half body answered {status_and_error(response)[0]} after {answered_after:.2f} s; "
              f"stopped after {stopped:.2f} s (--shutdown-timeout 3), exit {code} after {exited:.2f} s")
        assert status_and_error(response)[0] == 503 and answered_after < 2.0
        assert code == 0 and 2.9 < stopped < 3 + SLACK_S
        held.close()
        hung.close()
    finally:
        server.stop()


def test_a_second_signal_stops_at_once(tmp_path):
    server = Served(tmp_path, "--shutdown-timeout", "300", "--body-timeout", "300")
    try:
        held = _held_stream(server.port)
        time.sleep(1.0)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert server.proc.poll() is None         # the first waits for the request in flight (up to 300 s)
        code, stopped, exited = server.terminate()
        print(f"\nsecond SIGTERM: stopped {stopped:.2f} s after the first, exit {code}")
        assert code == 0 and stopped < 1 + SLACK_S
        held.close()
    finally:
        server.stop()
