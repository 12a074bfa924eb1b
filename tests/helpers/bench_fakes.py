"""Fake model pairs and small datasets for bench tests: a digit LM a GSM8K-style checker grades, a slow
wrapper to kill mid-generation, and a bench config over a written dataset."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.helpers.fake_lm import FakeLM
from verispec.bench import runner


class DigitLM(FakeLM):
    """Emits digits, so a GSM8K-style checker grades its (random) answers; chat prompt = hashed text."""

    def __init__(self, seed: int, scale: float = 1.0) -> None:
        super().__init__(vocab=10, seed=seed, alphabet="0123456789", scale=scale)

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        return [sum(map(ord, user_message)) % 10, len(user_message) % 10]


def fake_models(cfg, need_draft):
    return DigitLM(1), (DigitLM(2) if need_draft else None), 10


def write_dataset(path: Path, n: int) -> Path:
    rows = [{"question": f"What is {i} + {i % 3}?", "answer": str((2 * i + i % 3) % 10), "id": f"q{i}"}
            for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def config(tmp_path: Path, **kw) -> runner.BenchConfig:
    data = write_dataset(tmp_path / "digits.jsonl", kw.pop("n_rows", 12))
    base = dict(datasets=[str(data)], question_field="question", answer_field="answer", id_field="id", checker="gsm8k",
                rules=["lenience:ell=0.5", "speccascade:p_base=0.3", "lossless"], samplings=["temperature=1"],
                gammas=[3], limit=None, max_new_tokens=1, n_samples=2, out=str(tmp_path / "out"))
    base.update(kw)
    return runner.BenchConfig(**base)


class SlowLM:
    """Wraps a FakeLM so a generation takes long enough to be killed in the middle."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def forward(self, tokens, *, all_logits=True):
        time.sleep(0.01)
        return self._inner.forward(tokens, all_logits=all_logits)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def batched_fake_models(cfg, need_draft, batch_size=None):
    """The fake pair as batched backends (one fake model per row: exact, so outputs equal one at a time)."""
    from verispec.models import RowsOfBackends

    if batch_size is None:
        return fake_models(cfg, need_draft)
    return (RowsOfBackends([DigitLM(1) for _ in range(batch_size)]),
            RowsOfBackends([DigitLM(2) for _ in range(batch_size)]) if need_draft else None, 10)
