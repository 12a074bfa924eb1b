"""Shared by the serve and lm-eval tests: a live ``verispec serve`` app on a loopback port (uvicorn in a
thread) and tiny random transformers pairs (in memory or saved as model directories)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model  # noqa: E402


@dataclass
class TinyServed:
    target: Any         # HFBackend (single sequence)
    draft: Any
    target_rows: Any    # HFBatchBackend
    draft_rows: Any


def tiny_served(rows: int = 4) -> TinyServed:
    """The tiny float64 pair of tests/conftest.py (99-token character vocabulary, a ChatML template) with
    batched backends of ``rows`` rows over the same models."""
    from verispec.models.batch import HFBatchBackend
    from verispec.models.hf import HFBackend

    tok = tiny_char_tokenizer()
    target = HFBackend(tiny_hf_model("qwen2", vocab_width=128, hidden=32, seed=1, init_range=0.2), tokenizer=tok)
    draft = HFBackend(tiny_hf_model("llama", vocab_width=len(tok), hidden=16, seed=2, init_range=0.2), tokenizer=tok)
    return TinyServed(target, draft, HFBatchBackend(target, batch_size=rows), HFBatchBackend(draft, batch_size=rows))


def save_tiny_pair(folder: Path) -> tuple[Path, Path]:
    """The tiny pair as two model directories (config, weights, tokenizer): what ``--target/--draft`` load."""
    tok = tiny_char_tokenizer()
    out = []
    for name, model in (("target", tiny_hf_model("qwen2", vocab_width=128, hidden=32, seed=1, init_range=0.2)),
                        ("draft", tiny_hf_model("llama", vocab_width=len(tok), hidden=16, seed=2, init_range=0.2))):
        path = folder / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        out.append(path)
    return out[0], out[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """``app`` served by uvicorn on 127.0.0.1 in a daemon thread until :meth:`stop`."""

    def __init__(self, app) -> None:
        import uvicorn

        self.app = app
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    timeout_keep_alive=30))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state(self):
        return self.app.state.verispec

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


def serve_tiny(pair: TinyServed, *, single: bool = True, request_timeout: float | None = 120.0, **policy_kw):
    """A live server over ``pair`` (its own scheduler; ``single``: the single-sequence pair for what batches
    cannot run)."""
    from verispec.serve.app import create_app
    from verispec.serve.model import ServedModel
    from verispec.serve.protocol import Policy
    from verispec.serve.scheduler import Scheduler

    max_waiting = policy_kw.pop("max_waiting", 256)
    scheduler = Scheduler(pair.target_rows, pair.draft_rows, max_waiting=max_waiting,
                          single=(lambda: (pair.target, pair.draft)) if single else None)
    policy = Policy(context_length=pair.target_rows.context_length, vocab_size=pair.target.tokenizer_size,
                    **policy_kw)
    app = create_app(scheduler, ServedModel(pair.target_rows), policy, request_timeout=request_timeout)
    return LiveServer(app)
