"""``verispec serve``: an OpenAI-compatible HTTP API over verispec's own engine, any verification rule per
request (docs/serve.md).

Layers, each testable alone: :mod:`.protocol` (requests checked into :class:`~.protocol.Decode` s, OpenAI's
error bodies), :mod:`.scheduler` (the engine threads: continuous batching on a
:class:`~verispec.engine.session.BatchSession`, one-at-a-time decoding for what batches cannot run,
scoring), :mod:`.responses` (response bodies and stream deltas), :mod:`.metrics` (Prometheus text),
:mod:`.model` (the served target's text side), :mod:`.app` (the FastAPI endpoints), :mod:`.cli` (the
``serve`` subcommand). Importing this package imports none of them (the command line
registers the subcommands without loading torch or FastAPI).
"""

__all__ = ["APIError", "Decode", "Policy", "create_app"]


def __getattr__(name: str):
    if name in ("APIError", "Decode", "Policy"):
        from verispec.serve import protocol

        return getattr(protocol, name)
    if name == "create_app":        # FastAPI is imported only when an app is built
        from verispec.serve.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
