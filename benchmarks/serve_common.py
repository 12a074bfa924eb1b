"""Shared by the serve benchmarks: ``verispec serve`` (the embedded pair unless flags say otherwise) in this
process, on a free loopback port, until stopped."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def serve_args(flags: list[str]):
    """Parsed ``verispec serve`` flags."""
    import argparse

    from verispec.serve.cli import add_serve_parser

    ap = argparse.ArgumentParser()
    add_serve_parser(ap.add_subparsers(dest="command"))
    return ap.parse_args(["serve", *flags])


class Served:
    """``verispec serve <flags>`` in a thread: ``url``, ``app``, ``scheduler``, ``stop()``."""

    def __init__(self, flags: list[str]) -> None:
        import uvicorn

        from verispec.serve.cli import build_server

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.args = serve_args([*flags, "--port", str(self.port), "--log-level", "warning"])
        self.app, self.scheduler = build_server(self.args)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(120)
