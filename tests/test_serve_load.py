"""Load: 32 concurrent streaming clients against one server (4 rows), some leaving mid-stream, 10% sending
malformed requests. No crash, no lost or cross-wired answer: every completed stream equals the answer the
same request got alone (greedy and seeded sampling, lossless and lossy rules, target-only: a row's tokens do
not depend on its neighbours; the tiny float64 model's batched rows are its single-sequence numerics to
round-off). Prints p50 / p99 latency and tokens/s against one client (a report, not an assertion)."""

from __future__ import annotations

import json
import random
import statistics
import threading
import time

import pytest

from tests.helpers.serve import serve_tiny, tiny_served

requests = pytest.importorskip("requests")

#: (prompt, request fields): greedy and seeded sampling, lossless, lossy, baseline and target-only rows
SPECS = [
    ("def add(a, b):", {"temperature": 0}),
    ("Once upon", {"temperature": 0, "verification": {"rule": "lenience:ell=0.5", "gamma": 3}}),
    ("x = [1, 2", {"temperature": 0.9, "seed": 7}),
    ("The answer", {"temperature": 0.9, "seed": 8, "verification": {"rule": "speccascade:p_base=0.3", "gamma": 2}}),
    ("Hello", {"temperature": 0, "verification": {"draft": "none"}}),
    ("import os", {"temperature": 0.7, "seed": 9, "baseline": True, "verification": {"rule": "typical:eps=0.3"}}),
    ("abcabc", {"temperature": 0, "verification": {"rule": "block", "gamma": 4}}),
    ("Q: why?", {"temperature": 1.0, "seed": 10, "top_k": 20}),
]
MALFORMED = ['{"prompt": "hi", "max_tokens": -3}', "{broken", '{"prompt": "hi", "verification": {"rule": "zzz"}}']


def stream_text(url: str, body: dict, leave_after: int | None = None) -> tuple[str | None, int]:
    """The streamed text (None if the client left after ``leave_after`` chunks) and the usage's tokens."""
    text, tokens, chunks = "", 0, 0
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: "):]
            if data == b"[DONE]":
                return text, tokens
            obj = json.loads(data)
            assert "error" not in obj, obj
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
            for c in obj["choices"]:
                text += c["text"]
            chunks += 1
            if leave_after is not None and chunks >= leave_after:
                return None, 0
    raise AssertionError("the stream ended without [DONE]")


def test_32_concurrent_streaming_clients_with_disconnects_and_malformed_requests():
    pair = tiny_served(rows=4)
    server = serve_tiny(pair)
    url = server.url
    try:
        body = lambda i: {"prompt": SPECS[i][0], "max_tokens": 16, "stream": True,
                          "stream_options": {"include_usage": True}, **SPECS[i][1]}
        alone, one_s, one_tokens = {}, 0.0, 0
        for i in range(len(SPECS)):                     # each request alone: the reference answers
            t0 = time.perf_counter()
            alone[i], tokens = stream_text(url, body(i))
            one_s += time.perf_counter() - t0
            one_tokens += tokens
        rng = random.Random(0)
        plan = []                                       # (kind, spec index, leave after k chunks)
        for c in range(32):
            if c % 10 == 9:
                plan.append(("malformed", c % len(MALFORMED), None))
            elif c % 4 == 1:
                plan.append(("leave", c % len(SPECS), rng.randint(1, 4)))
            else:
                plan.append(("full", c % len(SPECS), None))
        results: list = [None] * len(plan)

        def client(c: int) -> None:
            kind, i, k = plan[c]
            t0 = time.perf_counter()
            try:
                if kind == "malformed":
                    r = requests.post(url + "/v1/completions", data=MALFORMED[i], timeout=60,
                                      headers={"Content-Type": "application/json"})
                    results[c] = (r.status_code, r.json())
                else:
                    text, tokens = stream_text(url, body(i), k)
                    results[c] = (text, tokens, time.perf_counter() - t0)
            except Exception as exc:   # recorded: the assertions below name it
                results[c] = exc

        threads = [threading.Thread(target=client, args=(c,)) for c in range(len(plan))]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        wall = time.perf_counter() - t0

        assert server.thread.is_alive() and requests.get(url + "/health").json()["status"] == "ok"
        errors = [r for r in results if isinstance(r, Exception)]
        assert not errors, errors
        latencies, tokens = [], 0
        for (kind, i, _), res in zip(plan, results):
            if kind == "malformed":
                status, err = res
                assert status == 400 and set(err["error"]) == {"message", "type", "param", "code"}
            elif kind == "full":
                text, n, seconds = res
                assert text == alone[i], (i, text, alone[i])        # not lost, not cross-wired
                latencies.append(seconds)
                tokens += n
            else:
                assert res[0] is None
        deadline = time.time() + 10                     # the rows of the clients that left are free again
        while (server.state.scheduler.running or server.state.scheduler.waiting) and time.time() < deadline:
            time.sleep(0.05)
        assert server.state.scheduler.running == 0 and server.state.scheduler.waiting == 0
        latencies.sort()
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(f"\n32 clients ({len(latencies)} complete, {sum(k == 'leave' for k, *_ in plan)} left, "
              f"{sum(k == 'malformed' for k, *_ in plan)} malformed): p50 {statistics.median(latencies):.2f} s, "
              f"p99 {p99:.2f} s; {tokens / wall:.1f} tokens/s vs {one_tokens / one_s:.1f} tokens/s with one client")
    finally:
        server.stop()
