"""The vLLM plug-in's tests: they need vLLM (``bash scripts/setup_vllm.sh`` builds ``.venv-vllm``; run them with
``.venv-vllm/bin/python -m pytest -q tests/vllm``). Without an importable vLLM every test of this directory is
skipped with the reason; the test modules import vLLM only inside fixtures and tests, so they still collect."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

try:
    import vllm  # noqa: F401

    VLLM_MISSING = None
except Exception as exc:  # ImportError, or a vLLM build that fails to load on this machine
    VLLM_MISSING = (f"vLLM is not importable here ({type(exc).__name__}: {exc}); run tests/vllm with .venv-vllm "
                    "(bash scripts/setup_vllm.sh)")


def pytest_collection_modifyitems(config, items):
    if VLLM_MISSING is None:
        return
    skip = pytest.mark.skip(reason=VLLM_MISSING)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


# -- tiny random models and shared engines (session-wide: each vLLM engine takes ~50 s to start here) --------

import os  # noqa: E402
from dataclasses import dataclass  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")          # GiB of KV cache per engine
GAMMA = 2                                                     # drafted tokens per step in the test engines
ENGINE_KW = dict(dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=256, seed=0,
                 per_request_spec_decode_metrics="detailed")


@dataclass
class TinyModels:
    """Two tiny random Qwen2 models (target 2 layers, draft 1) over the 99-token character vocabulary, saved as
    HF directories, and the same weights loaded in transformers (the oracle for the laws)."""

    target_dir: str
    draft_dir: str
    target: object
    draft: object
    tokenizer: object


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    from tests.helpers.tiny_hf import tiny_char_tokenizer
    from tests.vllm.laws import tiny_target_and_draft

    tok = tiny_char_tokenizer()
    root = tmp_path_factory.mktemp("vllm_models")
    models = {}
    for name, model in zip(("target", "draft"), tiny_target_and_draft()):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        models[name] = model
    return TinyModels(str(root / "target"), str(root / "draft"), models["target"], models["draft"], tok)


def _shutdown(llm) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # the engine may already be gone; nothing else to release
        pass


def _draft_model_engine(tiny_models, draft_sample_method: str):
    from verispec.integrations.vllm import make_llm

    return make_llm(tiny_models.target_dir, rule="lossless", speculative_config={
        "method": "draft_model", "model": tiny_models.draft_dir, "num_speculative_tokens": GAMMA,
        "draft_sample_method": draft_sample_method}, **ENGINE_KW)


@pytest.fixture(scope="session")
def sd_engine(tiny_models):
    """Draft-model speculative decoding with probabilistic drafts (q reaches the sampler), γ = GAMMA."""
    llm = _draft_model_engine(tiny_models, "probabilistic")
    yield llm
    _shutdown(llm)


@pytest.fixture(scope="session")
def greedy_draft_engine(tiny_models):
    """Draft-model speculative decoding with greedy drafts: each draft is a point mass (as ngram's)."""
    llm = _draft_model_engine(tiny_models, "greedy")
    yield llm
    _shutdown(llm)


@pytest.fixture(scope="session")
def target_engine(tiny_models):
    """The target alone (no speculative decoding): target-only runs and true baselines."""
    from verispec.integrations.vllm import make_target_llm

    llm = make_target_llm(tiny_models.target_dir, **ENGINE_KW)   # the SD engines' options, as the bench passes them
    yield llm
    _shutdown(llm)
