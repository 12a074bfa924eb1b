"""``verispec serve``: argparse wiring (:func:`add_serve_parser` registers the subcommand on ``verispec``'s
subparsers) and the command.

``verispec serve`` (no flags: the embedded pair on 127.0.0.1:8000; also ``python -m verispec.serve``) loads
the pair as batched backends of ``--batch-size`` rows, starts the engine threads and serves the
OpenAI-compatible API with uvicorn. SIGTERM (or Ctrl-C) stops accepting connections, answers 503 to new
requests on open ones, finishes the requests in flight, and exits (status 0 for SIGTERM).

``verispec lm-eval`` is :func:`verispec.integrations.lm_eval.add_lm_eval_parser`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from verispec import flags


def _gamma(text: str) -> int | str:
    return flags.gamma_value(text, True)


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
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default="verispec", help="the model id clients ask for")
    add_decoding_defaults(p)
    p.add_argument("--allowed-rules", type=_rule_names, default=None,
                   help="comma-separated rule names requests may choose (default: every rule)")
    p.add_argument("--batched-only", action="store_true",
                   help="refuse what batches cannot run (prompt lookup, trees, gamma auto, raw-distribution rules) "
                   "instead of loading a single-sequence copy of the models for them")
    p.add_argument("--no-baseline", action="store_true", help="refuse true-baseline requests")
    p.add_argument("--max-tokens", type=flags.positive_int("--max-tokens"), default=4096,
                   help="most tokens one choice may generate")
    p.add_argument("--max-n", type=flags.positive_int("--max-n"), default=64, help="most choices per request")
    p.add_argument("--max-waiting", type=flags.positive_int("--max-waiting"), default=256,
                   help="choices that may wait for a row; beyond: 429 with Retry-After")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may take (0: no limit); beyond: 408")
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

    if args.lookup:
        raise ValueError("--lookup: prompt lookup is chosen per request in serve (verification.draft 'ngram')")
    if args.request_timeout < 0:
        raise ValueError(f"--request-timeout must be >= 0 seconds (0: no limit), got {args.request_timeout}")
    ngram = is_ngram_draft(args.draft)
    target, draft, _ = load_pair(args, batch_size=args.batch_size, batch_invariant=args.batch_invariant)
    single = None if args.batched_only else (lambda: load_pair(args)[:2])
    sources = ("none",) + (("ngram",) if not args.batched_only else ()) + (("model",) if draft is not None else ())
    policy = make_policy(Policy, args, target, sources, default_draft="ngram" if ngram else "model")
    scheduler = Scheduler(target, draft, single=single, max_waiting=args.max_waiting, n_threads=args.n_threads)
    app = create_app(scheduler, ServedModel(target), policy, request_timeout=args.request_timeout or None)
    return app, scheduler


def make_policy(policy_cls, args, target, sources: tuple[str, ...], default_draft: str):
    from verispec.models.base import tokenizer_size
    from verispec.serve.protocol import decode_of

    batched_only = getattr(args, "batched_only", False)
    policy = policy_cls(model_name=getattr(args, "served_model_name", "verispec"), rule=args.rule, gamma=args.gamma,
                        draft=default_draft, tree=args.tree, allowed_rules=getattr(args, "allowed_rules", None),
                        draft_sources=sources, allow_auto=not batched_only, allow_trees=not batched_only,
                        allow_baseline=not getattr(args, "no_baseline", False),
                        max_tokens=getattr(args, "max_tokens", 4096), max_n=getattr(args, "max_n", 64),
                        context_length=int(target.context_length), vocab_size=tokenizer_size(target))
    try:        # the defaults must make a valid request
        decode_of({}, policy, 1, [], 0)
    except Exception as exc:
        raise ValueError(f"the server's defaults (--rule/--gamma/--tree/--draft) are not a valid request: "
                         f"{getattr(exc, 'message', exc)}") from None
    return policy


def cmd_serve(args) -> int:
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app, scheduler = build_server(args)
    state = app.state.verispec

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:      # SIGTERM / SIGINT: refuse new requests, finish the rest
            state.draining = True
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and self._captured_signals[-1:] == [sig]:
                self._captured_signals.pop()            # a graceful stop: exit 0 (uvicorn would re-raise it)

    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
    print(f"verispec serve: http://{args.host}:{args.port}/v1  model {args.served_model_name!r}, rule "
          f"{args.rule}, {scheduler.slots} rows", file=sys.stderr, flush=True)
    server.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m verispec.serve [flags]``: ``verispec serve`` without the main CLI."""
    from verispec.commands import run_command
    from verispec.runtime import tune_process

    tune_process()
    ap = argparse.ArgumentParser(prog="python -m verispec.serve")
    sub = ap.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    return run_command(ap.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)]))
