"""``verispec serve``'s memory after start and after a mixed load (batched chains, a draft tree, prompt lookup:
the last two decoded on the single-sequence thread), and the time from a non-streaming client's disconnect to
its row's release (issue 38).

    .venv/bin/python benchmarks/serve_memory.py                      # the embedded pair, 8 rows
    .venv/bin/python benchmarks/serve_memory.py --second-copy        # as before: a second copy for the single thread

Prints the process's RSS (and its anonymous / file-backed parts) after start and after the load, and, for a
long non-streaming request whose connection is closed mid-decoding, the milliseconds and engine steps from the
close to the row's release beside the mean step time.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time

from serve_common import Served


def rss() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile of this process in GB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024 ** 2
    return out


def show(label: str, r: dict[str, float]) -> None:
    print(f"{label:<28} RSS {r['VmRSS']:.2f} GB (anonymous {r['RssAnon']:.2f}, file-backed {r['RssFile']:.2f})",
          flush=True)


def post(url: str, body: dict) -> dict:
    import requests

    r = requests.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def mixed_load(url: str, max_tokens: int) -> None:
    bodies = [
        {"prompt": "def fib(n):", "temperature": 0},                                              # chain
        {"prompt": "def add(a, b):", "temperature": 0, "verification": {"rule": "lenience:ell=0.5", "gamma": 3}},
        {"prompt": "class Stack:", "temperature": 0, "verification": {"tree": "2,2,1"}},              # tree
        {"prompt": "x = 1\ny = 2\nx = 1\ny =", "temperature": 0, "verification": {"draft": "ngram"}},  # lookup
    ]
    threads = [threading.Thread(target=post, args=(url, b | {"max_tokens": max_tokens})) for b in bodies * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def disconnect_to_release(served: Served) -> tuple[float, int, float]:
    """(ms, engine steps) from closing a decoding non-streaming request's connection to its row's release,
    and the mean engine step (ms) while it decoded."""
    sched = served.scheduler
    ended: list[tuple[object, int, float]] = []         # appended on the engine thread, read here: locked
    lock = threading.Lock()
    inner = sched.on_finish

    def on_finish(job) -> None:
        with lock:
            ended.append((job, sched.steps, time.perf_counter()))
        inner(job)

    sched.on_finish = on_finish
    body = json.dumps({"prompt": "def quicksort(xs):", "max_tokens": 1000, "temperature": 0}).encode()
    s = socket.create_connection(("127.0.0.1", served.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    while sched.running == 0:
        time.sleep(0.01)
    s0, t0 = sched.steps, time.perf_counter()
    while sched.steps < s0 + 6:
        time.sleep(0.005)
    step_ms = (time.perf_counter() - t0) / (sched.steps - s0) * 1000
    steps_at_close, t_close = sched.steps, time.perf_counter()
    s.close()
    while True:
        with lock:
            if ended:
                job, steps_at_end, t_end = ended[-1]
                break
        time.sleep(0.001)
    sched.on_finish = inner
    assert job.state == "cancelled", job.state
    return (t_end - t_close) * 1000, steps_at_end - steps_at_close, step_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--second-copy", action="store_true",
                    help="load a second copy of the pair for the single-sequence thread (the behaviour before)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--disconnects", type=int, default=3)
    ap.add_argument("serve_flags", nargs="*", help="verispec serve flags (after --)")
    args = ap.parse_args()
    served = Served(["--batch-size", "8", *args.serve_flags])
    try:
        show("after start", rss())
        if args.second_copy:
            served.scheduler._single = served.scheduler._single_factory()
        mixed_load(served.url, args.max_tokens)
        show("after chain + tree + lookup", rss())
        runs = [disconnect_to_release(served) for _ in range(args.disconnects)]
        for ms, steps, step_ms in runs:
            print(f"non-streaming disconnect -> row released: {ms:.1f} ms, {steps} step(s) later "
                  f"(a step took {step_ms:.1f} ms)", flush=True)
        print(f"median {statistics.median(r[0] for r in runs):.1f} ms", flush=True)
        show("at the end", rss())
    finally:
        served.stop()


if __name__ == "__main__":
    main()
