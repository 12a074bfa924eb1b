"""``verispec serve`` (the embedded pair, its default deadlines) against slow, huge and hostile clients: the
figures of issue 40's closing note.

    .venv/bin/python benchmarks/serve_hostile.py

Prints: the time to refuse the largest body taken (a 32 MiB prompt) and /health's latency meanwhile; the same
for a prompt just under the character bound (tokenized, off the event loop, then refused for the context);
how long 120 slow-loris connections are kept (60 dribbling headers, 60 holding a 50-byte body after 16
bytes) and /health meanwhile; the time from SIGTERM to the server's stop and to the process's exit while a
client holds half a body. Takes about 2 minutes after the models load (the body deadline is 60 s).
"""

from __future__ import annotations

import json
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
MAX_BODY = 32 * 1024 * 1024


def start() -> tuple[subprocess.Popen, list[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "verispec.serve", "--port", "0", "--log-level", "warning"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    while not any("verispec serve: http" in line for line in lines):
        if proc.poll() is not None:
            raise SystemExit("".join(lines))
        time.sleep(0.2)
    url = "http://" + re.search(r"(127\.0\.0\.1:\d+)/v1", "".join(lines)).group(1)
    while True:
        try:
            if requests.get(url + "/health", timeout=5).ok:
                return proc, lines, url
        except requests.ConnectionError:
            time.sleep(0.2)


def refused_with_health(url: str, body: bytes, label: str) -> None:
    got: dict = {}

    def post() -> None:
        t0 = time.monotonic()
        got["r"] = requests.post(url + "/v1/completions", data=body, timeout=600,
                                 headers={"Content-Type": "application/json"})
        got["s"] = time.monotonic() - t0

    worker = threading.Thread(target=post)
    worker.start()
    latencies = []
    while worker.is_alive():
        t0 = time.monotonic()
        requests.get(url + "/health", timeout=600)
        latencies.append(time.monotonic() - t0)
        time.sleep(0.02)
    worker.join()
    latencies.sort()
    r = got["r"]
    print(f"{label}: {len(body)} bytes -> {r.status_code} in {got['s']:.2f} s ({r.json()['error']['message'][:100]}"
          f"...); /health max {latencies[-1] * 1000:.0f} ms, median {latencies[len(latencies) // 2] * 1000:.0f} ms "
          f"over {len(latencies)} polls", flush=True)


def slow_loris(url: str, port: int) -> None:
    sel = selectors.DefaultSelector()
    opened = {}
    half_body = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n" + b'{"prompt": "abcd'
    for i in range(120):
        sock = socket.create_connection(("127.0.0.1", port))
        if i % 2:
            sock.sendall(half_body)
            kind = "partial body"
        else:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            kind = "dribbled headers"
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        opened[sock] = (kind, time.monotonic(), b"")
    kept: dict[str, list[float]] = {}
    answers: dict[str, set[bytes]] = {}
    health = []
    t0 = drip = time.monotonic()
    while opened and time.monotonic() - t0 < 180:
        for key, _ in sel.select(0.1):
            sock = key.fileobj
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                chunk = b""
            kind, started, data = opened[sock]
            if chunk:
                opened[sock] = (kind, started, data + chunk)
                continue
            del opened[sock]
            sel.unregister(sock)
            sock.close()
            kept.setdefault(kind, []).append(time.monotonic() - started)
            answers.setdefault(kind, set()).add(data.split(b"\r\n")[0])
        if time.monotonic() - drip > 1:
            drip = time.monotonic()
            for sock, (kind, _, _) in opened.items():
                if kind == "dribbled headers":
                    try:
                        sock.send(b"X")
                    except OSError:
                        pass
            t1 = time.monotonic()
            requests.get(url + "/health", timeout=60)
            health.append(time.monotonic() - t1)
    for kind, seconds in kept.items():
        print(f"slow-loris, {kind}: {len(seconds)} closed, kept {min(seconds):.1f}-{max(seconds):.1f} s, answered "
              f"{sorted(answers[kind])}", flush=True)
    print(f"still open after {time.monotonic() - t0:.0f} s: {len(opened)}; /health meanwhile: max "
          f"{max(health) * 1000:.0f} ms", flush=True)


def main() -> None:
    t0 = time.monotonic()
    proc, lines, url = start()
    port = int(url.rsplit(":", 1)[1])
    print(f"up in {time.monotonic() - t0:.1f} s at {url}", flush=True)
    refused_with_health(url, json.dumps({"prompt": "a" * (MAX_BODY - 1024), "max_tokens": 4}).encode(),
                        "the largest body (a 32 MiB prompt)")
    text = "The quick brown fox. " * (4096 * 128 // 21)       # the embedded target: 4096 tokens of <= 128 chars
    refused_with_health(url, json.dumps({"prompt": text, "max_tokens": 4}).encode(),
                        "a prompt just under the character bound (tokenized)")
    slow_loris(url, port)
    hung = socket.create_connection(("127.0.0.1", port))
    hung.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n" + b'{"prompt": "abcd')
    time.sleep(0.5)
    t1 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(120)
    exited = time.monotonic() - t1
    time.sleep(0.3)
    stopped = re.search(r"stopped ([0-9.]+) s", "".join(lines))
    hung.settimeout(5)
    answer = hung.recv(200).split(b"\r\n")[0]
    print(f"SIGTERM while a client holds half a body: it is answered {answer.decode()!r}; the server stopped "
          f"{stopped.group(1) if stopped else '?'} s after the signal, the process exited with {code} after "
          f"{exited:.2f} s; a traceback in its output: {'Traceback' in ''.join(lines)}", flush=True)


if __name__ == "__main__":
    main()
