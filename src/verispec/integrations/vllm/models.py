"""Model specs of verispec (embedded pair, ``.gguf`` files, directories, hub ids) as vLLM model directories.

vLLM loads Hugging Face directories. The embedded default pair and any ``.gguf`` file are dequantised once by
transformers (as verispec's transformers backend loads them, ``gguf_file=``) and saved as float32 safetensors
with their tokenizer under ``<verispec cache>/hf/<gguf name>/`` (a marker file is written last, so an
interrupted export is redone). Directories and hub ids pass through unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from verispec.models import is_ngram_draft
from verispec.models.embedded import EMBEDDED_MODELS, default_cache_dir

_EMBEDDED = ("", "embedded", "default")
_DONE = "verispec-export.done"


def embedded_gguf(role: str) -> Path:
    """The assembled GGUF of the embedded ``role``: from the chunk packages when installed, else a copy already
    assembled in the verispec cache (e.g. by the main ``.venv``)."""
    from verispec.models.embedded import embedded_available, embedded_model_path

    if embedded_available(role):
        return embedded_model_path(role)
    cached = default_cache_dir() / EMBEDDED_MODELS[role].filename
    if cached.is_file():
        return cached
    raise FileNotFoundError(f"the embedded {role} model is neither installed (pip install 'verispec[embedded]') nor "
                            f"assembled in {default_cache_dir()}; run the main .venv once (bash scripts/setup.sh) or "
                            "pass a model directory")


def check_models(cfg) -> None:
    """What :func:`vllm_model` would refuse about a bench config's models, found without loading or exporting
    them (the vLLM executor's check, run by the dry run and the real run alike): the embedded pair is fine
    when exported, installed, or assembled in the cache (the chunk packages need not be installed in
    ``.venv-vllm``); ``.gguf`` files must exist and be GGUF; directories must hold a ``config.json``; hub ids
    are not looked up."""
    from verispec.models.gguf_check import check_gguf

    roles = [("target", cfg.target)]
    if (cfg.rules or cfg.lossless_ref) and not is_ngram_draft(cfg.draft):
        roles.append(("draft", cfg.draft))
    for role, spec in roles:
        if spec is None or str(spec).strip().lower() in _EMBEDDED:
            from verispec.models.embedded import embedded_available

            exported = default_cache_dir() / "hf" / Path(EMBEDDED_MODELS[role].filename).stem / _DONE
            if not (exported.is_file() or embedded_available(role)):
                embedded_gguf(role)          # the assembled copy in the cache, or the error saying what to do
            continue
        path = Path(spec).expanduser()
        if str(spec).lower().endswith(".gguf"):
            if not path.is_file():
                raise FileNotFoundError(f"{role} model file not found: {path}")
            check_gguf(path)
        elif path.is_dir() and not (path / "config.json").is_file():
            raise FileNotFoundError(f"{role} model directory {path} has no config.json: vLLM loads transformers "
                                    "model directories (config.json, weights, tokenizer files)")
        elif not path.exists() and str(spec).startswith((".", "/", "~")):
            raise FileNotFoundError(f"{role} model directory not found: {path}")


def vllm_model(spec: str | os.PathLike | None, role: str, *, cache_dir: str | os.PathLike | None = None) -> str:
    """A directory or hub id vLLM can load for verispec's model spec ``spec`` of ``role`` ("target"/"draft")."""
    if is_ngram_draft(spec):
        raise ValueError("'ngram' is prompt lookup, not a model: use speculative_config={'method': 'ngram', ...}")
    if spec is None or str(spec).strip().lower() in _EMBEDDED:
        gguf = embedded_gguf(role)
    elif str(spec).lower().endswith(".gguf"):
        gguf = Path(spec).expanduser()
        if not gguf.is_file():
            raise FileNotFoundError(f"{role} model file not found: {gguf}")
    else:
        return str(spec)
    return str(export_gguf(gguf, cache_dir=cache_dir))


def export_gguf(gguf: Path, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """Dequantise ``gguf`` to ``<cache>/hf/<stem>/`` (float32 safetensors + tokenizer); reused when present."""
    out = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "hf" / gguf.stem
    if (out / _DONE).is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # the weights are plain float32 tensors now; transformers still marks the model as GGUF-quantised and
    # refuses to save it, so drop that mark (the saved config must not name a quantisation either)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / _DONE).write_text(str(gguf) + "\n")
    return out
