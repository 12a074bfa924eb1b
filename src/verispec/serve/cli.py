"""``verispec serve``: argparse wiring (:func:`add_serve_parser` registers the subcommand on ``verispec``'s
subparsers) and the command.

``verispec serve`` (no flags: the embedded pair on 127.0.0.1:8000; also ``python -m verispec.serve``) binds
its address first (a port in use, an address not of this machine: one error line, exit 2, before any model
loads), loads the pair as batched backends of ``--batch-size`` rows, starts the engine threads and serves
the OpenAI-compatible API with uvicorn, every connection under head, body and idle deadlines
(:mod:`verispec.serve.connection`). SIGTERM (or Ctrl-C) stops accepting connections, answers 503 to new
requests on open ones, finishes the requests in flight for up to ``--shutdown-timeout`` seconds, then
cancels them, and exits (status 0 for SIGTERM); a second signal stops at once, and whatever still runs
:data:`HARD_STOP_S` seconds past the deadline is ended with the process (status 1).

``verispec lm-eval`` is :func:`verispec.integrations.lm_eval.add_lm_eval_parser`.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from typing import Any

from verispec import flags
from verispec.serve.spec_metrics import LEVELS as SPEC_METRICS_LEVELS

#: Seconds past ``--shutdown-timeout`` after which a stopping server ends its process, whatever still runs
#: (an engine step, a tokenization, a thread that does not stop).
HARD_STOP_S = 5.0
#: Longest timeout a flag takes (a week: beyond it, a timer's arithmetic is the only effect).
MAX_TIMEOUT_S = 7 * 86400.0


def _gamma(text: str) -> int | str:
    return flags.gamma_value(text, True)


def _seconds(what: str, zero: bool = False):
    """An argparse type: seconds, finite, > 0 (>= 0 with ``zero``), at most a week."""
    return flags.number(what, lo=0.0, lo_open=not zero, hi=MAX_TIMEOUT_S, unit="seconds")


def _rule_names(text: str) -> frozenset[str]:
    from verispec.rules import REGISTRY

    names = frozenset(x.strip().split(":", 1)[0] for x in text.split(",") if x.strip())
    unknown = sorted(names - set(REGISTRY))
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"--allowed-rules takes comma-separated rule names (`verispec rules`); "
                                         f"unknown: {', '.join(unknown) or '(none given)'}")
    return names


def add_decoding_defaults(p: argparse.ArgumentParser) -> None:
    """The per-request defaults and the batch."""
    p.add_argument("--rule", default="lossless", help="verification rule of requests that name none")
    p.add_argument("--gamma", type=_gamma, default=5, help="draft tokens per step (an integer, or auto)")
    p.add_argument("--tree", default=None, help="draft tree of requests that name neither a tree nor gamma")
    p.add_argument("--batch-size", type=flags.positive_int("--batch-size"), default=8,
                   help="rows decoded together (continuous batching)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="compute each row alone (one model call per row): every output is that of one request at "
                   "a time, bitwise, at the cost of the batching speed-up")


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP API over verispec's engine (any rule per "
                              "request); docs/serve.md")
    p.add_argument("--host", default="127.0.0.1", type=flags.text("--host", "an address to listen on (127.0.0.1: "
                   "this machine only; 0.0.0.0: every interface)"), help="address to bind (default: loopback only; "
                   "0.0.0.0: every interface)")
    p.add_argument("--port", type=flags.number("--port", kind=int, lo=0, hi=65535), default=8000,
                   help="port to bind (0: any free port; the URL is printed)")
    p.add_argument("--served-model-name", default="verispec", type=flags.text("--served-model-name", "the model "
                   "id clients ask for, e.g. verispec"), help="the model id clients ask for")
    add_decoding_defaults(p)
    p.add_argument("--allowed-rules", type=_rule_names, default=None,
                   help="comma-separated rule names requests may choose (default: every rule)")
    p.add_argument("--batched-only", action="store_true",
                   help="refuse what batches cannot run (prompt lookup, trees, gamma auto, raw-distribution rules) "
                   "instead of decoding them one at a time on the same models")
    p.add_argument("--per-request-spec-decode-metrics", choices=list(SPEC_METRICS_LEVELS), default="none",
                   help="vLLM's per-request metrics.speculative_decoding on every single-choice response (on the "
                   "final usage chunk when streamed): summary, or detailed with the per-step arrays")
    p.add_argument("--no-baseline", action="store_true", help="refuse true-baseline requests")
    p.add_argument("--max-tokens", type=flags.positive_int("--max-tokens"), default=4096,
                   help="most tokens one choice may generate")
    p.add_argument("--max-n", type=flags.positive_int("--max-n"), default=64, help="most choices per request")
    p.add_argument("--max-waiting", type=flags.positive_int("--max-waiting"), default=256,
                   help="choices that may wait for a row; beyond: 429 with Retry-After")
    p.add_argument("--request-timeout", type=_seconds("--request-timeout", zero=True), default=600.0,
                   help="seconds a request may take (0: no limit); beyond: 408")
    p.add_argument("--header-timeout", type=_seconds("--header-timeout"), default=10.0,
                   help="seconds a request's line and headers may take to arrive; beyond: 408, connection closed")
    p.add_argument("--body-timeout", type=_seconds("--body-timeout"), default=60.0,
                   help="seconds a request's body may take to arrive, and a client may leave its response unread; "
                   "beyond: 408 (or the connection is cut), connection closed")
    p.add_argument("--idle-timeout", type=_seconds("--idle-timeout"), default=5.0,
                   help="seconds a kept-alive connection may stay idle between requests")
    p.add_argument("--shutdown-timeout", type=_seconds("--shutdown-timeout", zero=True), default=30.0,
                   help="seconds SIGTERM waits for the requests in flight before cancelling them (0: cancel at once)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    flags.add_model_flags(p)
    p.set_defaults(func=cmd_serve)
    return p


def build_server(args) -> tuple[Any, Any]:
    """``(app, scheduler)`` from parsed ``serve`` flags: loads the pair (batched), the policy, the engine."""
    from verispec.models import is_ngram_draft, load_pair
    from verispec.serve.app import create_app
    from verispec.serve.model import ServedModel
    from verispec.serve.protocol import Policy
    from verispec.serve.scheduler import Scheduler
    from verispec.settings import check_model_settings

    if args.lookup:
        raise ValueError("--lookup: prompt lookup is chosen per request in serve (verification.draft 'ngram')")
    check_model_settings(args)
    ngram = is_ngram_draft(args.draft)
    target, draft, _ = load_pair(args, batch_size=args.batch_size, batch_invariant=args.batch_invariant)
    single = None if args.batched_only else (lambda: load_pair(args)[:2])
    sources = ("none",) + (("ngram",) if not args.batched_only else ()) + (("model",) if draft is not None else ())
    policy = make_policy(Policy, args, target, sources, default_draft="ngram" if ngram else "model")
    model = ServedModel(target)
    check_context(model, policy)
    scheduler = Scheduler(target, draft, single=single, max_waiting=args.max_waiting, n_threads=args.n_threads)
    app = create_app(scheduler, model, policy, request_timeout=args.request_timeout or None,
                     body_timeout=getattr(args, "body_timeout", 60.0))
    return app, scheduler


def check_context(model, policy) -> None:
    """Refuse a context too short for any chat request (``--n-ctx 8``): the smallest chat turn, one token to
    generate and the default decoding's verification room must fit."""
    from verispec.serve.protocol import decode_of

    room = decode_of({}, policy, 1, [], 0).verify_room
    try:
        turn = len(model.chat([{"role": "user", "content": "hi"}]))
    except ValueError:          # no chat template: completions only, a one-token prompt
        turn = 1
    need = turn + 1 + room
    if policy.context_length < need:
        raise ValueError(f"a context of {policy.context_length} tokens (--n-ctx) holds no request: the smallest chat "
                         f"turn takes {turn} tokens here, plus 1 to generate and {room} of verification room (the "
                         f"default gamma + 1): give --n-ctx {need} or more (4096 is usual)")


def make_policy(policy_cls, args, target, sources: tuple[str, ...], default_draft: str):
    from verispec.models.base import tokenizer_size
    from verispec.serve.protocol import decode_of

    batched_only = getattr(args, "batched_only", False)
    policy = policy_cls(model_name=getattr(args, "served_model_name", "verispec"), rule=args.rule, gamma=args.gamma,
                        draft=default_draft, tree=args.tree, allowed_rules=getattr(args, "allowed_rules", None),
                        draft_sources=sources, allow_auto=not batched_only, allow_trees=not batched_only,
                        allow_baseline=not getattr(args, "no_baseline", False),
                        max_tokens=getattr(args, "max_tokens", 4096), max_n=getattr(args, "max_n", 64),
                        spec_decode_metrics=getattr(args, "per_request_spec_decode_metrics", "none"),
                        context_length=int(target.context_length), vocab_size=tokenizer_size(target))
    try:        # the defaults must make a valid request
        decode_of({}, policy, 1, [], 0)
    except Exception as exc:
        raise ValueError(f"the server's defaults (--rule/--gamma/--tree/--draft) are not a valid request: "
                         f"{getattr(exc, 'message', exc)}") from None
    return policy


def cmd_serve(args) -> int:
    import uvicorn

    from verispec.serve.connection import MAX_HEAD, bind, every_interface, protocol_factory, url_of

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = bind(args.host, args.port)          # before the models load: a bad address fails at once
    try:
        app, scheduler = build_server(args)
    except BaseException:
        sock.close()
        raise
    state = app.state.verispec
    hard_stop = _HardStop()

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            """SIGTERM / SIGINT: refuse new requests, finish the rest within --shutdown-timeout; a second
            signal stops at once. SIGTERM ends with status 0 (uvicorn would re-raise it), Ctrl-C as an
            interrupt."""
            state.draining = True
            if self.should_exit:
                self.force_exit = True
            hard_stop.arm((0 if self.force_exit else args.shutdown_timeout) + HARD_STOP_S)
            self.should_exit = True
            if sig != signal.SIGTERM:
                self._captured_signals.append(sig)

    config = uvicorn.Config(app, http=protocol_factory(args.header_timeout, args.body_timeout),
                            timeout_keep_alive=args.idle_timeout, timeout_graceful_shutdown=args.shutdown_timeout,
                            h11_max_incomplete_event_size=MAX_HEAD, log_level=args.log_level)
    every = (" - on every interface: reachable from other machines (--host 127.0.0.1: this one only)"
             if every_interface(sock) else "")
    print(f"verispec serve: {url_of(sock)}/v1  model {args.served_model_name!r}, rule {args.rule}, "
          f"{scheduler.slots} rows{every}", file=sys.stderr, flush=True)
    try:
        Server(config).run(sockets=[sock])      # Ctrl-C ends it with KeyboardInterrupt (uvicorn re-raises it)
    finally:
        # After a second signal uvicorn skips the app's shutdown: no engine step may still run when the
        # interpreter exits (torch aborts the process then). The requests' tasks are cancelled by now.
        scheduler.stop(HARD_STOP_S)
        if hard_stop.signalled is not None:
            print(f"verispec serve: stopped {time.monotonic() - hard_stop.signalled:.2f} s after the stop signal",
                  file=sys.stderr, flush=True)
    return 0


class _HardStop:
    """Ends the process if it still runs at a deadline set by a stop signal: the graceful shutdown has its own
    (uvicorn's ``timeout_graceful_shutdown``), but what runs past it (an engine step, a tokenization, a
    thread that does not stop) must not hold the process for ever."""

    def __init__(self) -> None:
        self._timer: threading.Timer | None = None
        self._at = math.inf
        self.signalled: float | None = None          # time.monotonic() of the first stop signal

    def arm(self, seconds: float) -> None:
        """End the process in ``seconds`` (or at the deadline already set, if sooner). Called from signal
        handlers, which run on the main thread only: no race."""
        at = time.monotonic() + seconds
        if self.signalled is None:
            self.signalled = at - seconds
        if at >= self._at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = threading.Timer(seconds, self._fire, (seconds,))
        self._timer.daemon = True
        self._timer.start()

    @staticmethod
    def _fire(seconds: float) -> None:
        print(f"verispec serve: still running {seconds:g} s after the stop signal: exiting now", file=sys.stderr,
              flush=True)
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    """``python -m verispec.serve [flags]``: ``verispec serve`` without the main CLI."""
    from verispec.commands import run_command
    from verispec.runtime import tune_process

    tune_process()
    ap = argparse.ArgumentParser(prog="python -m verispec.serve")
    sub = ap.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    return run_command(ap.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)]))
