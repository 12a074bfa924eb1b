"""``verispec serve`` throughput: 8 concurrent clients against 1, and the server's overhead per token against
calling the engine directly, on the embedded pair (or --target/--draft), ratios measured in one run.

For each mode (SD with --rule, and target-only rows):

- one client: the requests one after another through the openai client -> tokens/s;
- ``--clients`` clients at once, each sending its share of the same requests -> tokens/s; the ratio is the
  batching gain (continuous batching on the batched backends); ``--rounds`` alternated rounds, the median
  ratio printed (a shared machine's load drifts between phases);
- overhead: each request again, alternately through the server (one client) and through the engine directly
  (:class:`~verispec.engine.session.BatchSession` on the same batched backends, one row), greedy so both decode
  the same tokens: seconds per token of the server over the engine's, minus 1; on a shared machine this
  ratio drifts with the load, so the server's own time outside its engine steps (request wall minus the
  steps that decoded it: HTTP, JSON, scheduling, threads) is printed too, as a share of the steps' time.

    .venv/bin/python benchmarks/serve_throughput.py --requests 8 --max-tokens 48
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_common import Served  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a hash map is in two sentences.",
    "Write a function that checks whether a string is a palindrome.",
    "List three uses of the Linux command grep.",
    "Write a Python class for a stack with push and pop.",
    "What does the HTTP status code 429 mean?",
    "Write a SQL query that counts the rows of a table named users.",
    "Write a function that merges two sorted lists.",
    "Explain recursion to a beginner.",
    "Write a bash loop that prints the numbers 1 to 5.",
    "What is the difference between a list and a tuple in Python?",
    "Write a function that reverses the words of a sentence.",
    "What is a race condition?",
    "Write a Python function that flattens a nested list.",
    "Explain big-O notation in one paragraph.",
    "Write a function that returns the maximum of a list without max().",
]


def extra_for(mode: str, args) -> dict:
    if mode == "sd":
        return {"verification": {"rule": args.rule, "gamma": args.gamma}}
    return {"verification": {"draft": "none"}}


def run_clients(client, prompts: list[str], clients: int, max_tokens: int, extra: dict) -> tuple[int, float]:
    """All ``prompts`` sent by ``clients`` threads (each its share, one after another) -> (tokens, seconds)."""
    tokens = [0] * clients
    errors: list = []

    def work(c: int) -> None:
        try:
            for p in prompts[c::clients]:
                out = client.chat.completions.create(model="verispec", messages=[{"role": "user", "content": p}],
                                                     max_tokens=max_tokens, temperature=0, extra_body=extra)
                tokens[c] += out.usage.completion_tokens
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(tokens), time.perf_counter() - t0


def overhead(served: Served, client, prompts: list[str], max_tokens: int, mode: str, args
             ) -> tuple[float, float, float]:
    """Median seconds per token through the server (one client), through the engine directly, and the
    server's seconds per token outside its engine steps (request wall minus the time of the batched steps
    that decoded it: the HTTP, JSON, scheduling and thread layers, free of the machine's drift)."""
    from verispec.engine.session import BatchSession, RowRequest
    from verispec.sampling import SamplingConfig

    sched, greedy = served.scheduler, SamplingConfig.parse("temperature=0")
    target = sched.target_rows
    stepped = [0.0]
    step = sched.session.step

    def timed_step():
        t0 = time.perf_counter()
        try:
            return step()
        finally:
            stepped[0] += time.perf_counter() - t0

    sched.session.step = timed_step
    server_s, engine_s, outside_s = [], [], []
    for p in prompts:
        ids = target.chat_prompt(p)
        stepped[0] = 0.0
        t0 = time.perf_counter()
        out = client.chat.completions.create(model="verispec", messages=[{"role": "user", "content": p}],
                                             max_tokens=max_tokens, temperature=0, extra_body=extra_for(mode, args))
        wall = time.perf_counter() - t0
        server_s.append(wall / out.usage.completion_tokens)
        outside_s.append((wall - stepped[0]) / out.usage.completion_tokens)
        while sched.running:                       # the engine thread is idle: the backends are free
            time.sleep(0.01)
        session = BatchSession(target, sched.draft_rows if mode == "sd" else None, batch_size=sched.slots)
        t0 = time.perf_counter()
        h = session.admit(RowRequest(ids, max_tokens, greedy, rule=args.rule if mode == "sd" else None,
                                     gamma=args.gamma))
        session.run()
        engine_s.append((time.perf_counter() - t0) / h.result.stats.new_tokens)
        if h.result.stats.new_tokens != out.usage.completion_tokens:
            print(f"  (note: {h.result.stats.new_tokens} engine tokens vs {out.usage.completion_tokens} served)")
    sched.session.step = step
    return statistics.median(server_s), statistics.median(engine_s), statistics.median(outside_s)


def main() -> int:
    from verispec.runtime import tune_process

    tune_process()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rule", default="lossless")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--modes", default="sd,target")
    ap.add_argument("--overhead-requests", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="alternated 1-client / N-client rounds")
    ap.add_argument("--batch-invariant", action="store_true")
    ap.add_argument("serve_flags", nargs="*", help="more `verispec serve` flags (after --), e.g. --target X")
    args = ap.parse_args()
    flags = ["--batch-size", str(args.clients), "--n-ctx", "512", *args.serve_flags] + \
        (["--batch-invariant"] if args.batch_invariant else [])
    served = Served(flags)
    client = __import__("openai").OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=3600)
    prompts = (PROMPTS * (args.requests // len(PROMPTS) + 1))[: args.requests]
    try:
        run_clients(client, prompts[:1], 1, 8, {})          # warm-up
        for mode in args.modes.split(","):
            extra = extra_for(mode, args)
            label = f"SD {args.rule} γ={args.gamma}" if mode == "sd" else "target-only"
            ratios = []
            for r in range(args.rounds):       # alternated rounds: the machine's drift hits both sides alike
                n1, s1 = run_clients(client, prompts, 1, args.max_tokens, extra)
                n8, s8 = run_clients(client, prompts, args.clients, args.max_tokens, extra)
                ratios.append((n8 / s8) / (n1 / s1))
                print(f"{label}, round {r + 1}: 1 client {n1 / s1:.2f} tokens/s ({n1} tokens, {s1:.1f} s); "
                      f"{args.clients} clients {n8 / s8:.2f} tokens/s ({n8} tokens, {s8:.1f} s): {ratios[-1]:.2f}x",
                      flush=True)
            print(f"{label}: {args.clients} clients vs 1, median of {args.rounds} rounds: "
                  f"{statistics.median(ratios):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in ratios)})", flush=True)
            srv, eng, out = overhead(served, client, prompts[: args.overhead_requests], args.max_tokens, mode, args)
            print(f"{label}: per token, server {1e3 * srv:.1f} ms vs engine directly {1e3 * eng:.1f} ms: "
                  f"{100 * (srv / eng - 1):+.1f}% (median of {args.overhead_requests} requests, alternated); "
                  f"outside the engine's steps {1e3 * out:.2f} ms = {100 * out / (srv - out):.2f}% of the steps' time",
                  flush=True)
    finally:
        served.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
