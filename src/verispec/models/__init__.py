"""Model backends: llama.cpp (GGUF) and transformers, behind one :class:`Backend` protocol.

``load_backend(source, role=...)`` picks the backend from where the model is (a path, a hub id, or none for
the embedded pair); heavy dependencies (llama-cpp-python, transformers) are imported only when a backend of
that kind is built.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import Backend, check_compatible
from .batch import BatchBackend, HFBatchBackend, LlamaBatchBackend, RowsOfBackends
from .embedded import EMBEDDED_MODELS, EmbeddedModel, default_cache_dir, embedded_model_path

if TYPE_CHECKING:
    from .hf import HFBackend
    from .llama import LlamaBackend

__all__ = [
    "Backend",
    "check_compatible",
    "load_backend",
    "load_pair",
    "check_model_sources",
    "backend_label",
    "LlamaBackend",
    "HFBackend",
    "BatchBackend",
    "HFBatchBackend",
    "LlamaBatchBackend",
    "RowsOfBackends",
    "EMBEDDED_MODELS",
    "EmbeddedModel",
    "embedded_model_path",
    "default_cache_dir",
]

ROLES = ("draft", "target")
_EMBEDDED_ALIASES = ("", "embedded", "default")
#: ``--draft`` value for drafting by prompt lookup alone (no draft model).
NGRAM_DRAFT = "ngram"


def is_ngram_draft(source: object) -> bool:
    """Whether a draft source asks for prompt-lookup (n-gram) drafting instead of a draft model."""
    return isinstance(source, str) and source.strip().lower() == NGRAM_DRAFT


def load_backend(
    source: str | os.PathLike | None,
    *,
    role: str,
    n_threads: int | None = None,
    n_ctx: int = 4096,
    device: str = "cpu",
    dtype: Any = None,
    batch_size: int | None = None,
    batch_invariant: bool = False,
) -> Backend:
    """Build a backend from ``source``, where the model is.

    - ``None`` (or ``"embedded"``): the embedded default GGUF of ``role`` ("draft" or "target"),
      assembled on first use, run by :class:`LlamaBackend`.
    - a path ending in ``.gguf``: :class:`LlamaBackend` (``FileNotFoundError`` naming the path if missing).
    - an existing directory or a hub id: :class:`HFBackend` (``device``/``dtype`` apply).

    ``n_threads``/``n_ctx`` apply to llama.cpp backends. ``batch_size``: a batched backend of that many
    rows instead (:class:`LlamaBatchBackend` with ``n_ctx`` per row, or :class:`HFBatchBackend`);
    ``batch_invariant``: rows whose numerics do not depend on the batch (one model call per row: a
    :class:`LlamaBatchBackend` with ``invariant=True``, or :class:`RowsOfBackends` of transformers
    backends sharing one model).
    """
    kind, where = _classify(source, role)
    if kind == "embedded":
        return _llama(embedded_model_path(role), n_ctx=n_ctx, n_threads=n_threads, batch_size=batch_size,
                      invariant=batch_invariant)
    if kind == "gguf":
        return _llama(where, n_ctx=n_ctx, n_threads=n_threads, batch_size=batch_size, invariant=batch_invariant)
    from .hf import HFBackend

    single = HFBackend(where, device=device, dtype=dtype)
    if batch_size is None:
        return single
    if batch_invariant:    # one model, one cache per row, one model call per row
        return RowsOfBackends([single] + [HFBackend(single.model, tokenizer=single.tokenizer, device=single.device,
                                                    linear_layout=single.linear_layout, row_plan=single.row_plan)
                                          for _ in range(batch_size - 1)])
    return HFBatchBackend(single, batch_size=batch_size)


def _classify(source: str | os.PathLike | None, role: str) -> tuple[str, Any]:
    """``("embedded", None)``, ``("gguf", path)`` or ``("hf", directory or hub id)``; errors name what is wrong."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if is_ngram_draft(source):
        raise ValueError("'ngram' is prompt-lookup drafting, not a model: it has no backend (use load_pair)")
    if source is None or (isinstance(source, str) and source.strip().lower() in _EMBEDDED_ALIASES):
        return "embedded", None
    text = os.fspath(source)
    path = Path(text).expanduser()
    if text.lower().endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"{role} model file not found: {path}")
        return "gguf", path
    if path.is_file():
        raise ValueError(
            f"{role} model {text!r} is a file but not a .gguf; pass a .gguf file, a model directory or a hub id"
        )
    if not path.is_dir() and (text.startswith((".", "/", "~")) or text.count("/") > 1):
        raise FileNotFoundError(f"{role} model directory not found: {path}")
    return "hf", str(path) if path.is_dir() else text


def check_model_sources(settings: Any, need_draft: bool = True) -> None:
    """What :func:`load_pair` would refuse about the model files, found without loading them (for dry
    runs): missing files, damaged or foreign ``.gguf`` files, model directories without a readable
    ``config.json``, embedded models whose packages are missing. Hub ids are not looked up."""
    from .embedded import part_paths
    from .gguf_check import check_gguf

    roles = [("target", settings.target)]
    if need_draft and not is_ngram_draft(settings.draft):
        roles.append(("draft", settings.draft))
    for role, source in roles:
        kind, where = _classify(source, role)
        if kind == "embedded":
            part_paths(role)
        elif kind == "gguf":
            check_gguf(where)
        elif Path(where).is_dir():
            config = Path(where) / "config.json"
            try:
                data = json.loads(config.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise FileNotFoundError(f"{role} model directory {where} has no config.json: it must hold a "
                                        "transformers model (config.json, weights, tokenizer files)") from None
            except (ValueError, OSError) as exc:
                raise ValueError(f"{role} model directory {where}: config.json is not valid JSON ({exc}); restore it "
                                 "from the model's publisher") from None
            if not isinstance(data, dict) or "model_type" not in data:
                raise ValueError(f"{role} model directory {where}: config.json names no model_type; restore it from "
                                 "the model's publisher")


def backend_label(backend: Any) -> str:
    """How a (batched) backend computes: ``"llama.cpp"``, ``"transformers float32 cpu"``, or the class
    name of any other backend (what the bench records beside each sample)."""
    single = getattr(backend, "single", None) or backend
    name = type(single).__name__
    if name == "LlamaBackend":
        return "llama.cpp"
    if name == "HFBackend":
        return f"transformers {str(single.dtype).removeprefix('torch.')} {single.device}"
    return name


def _llama(path, *, n_ctx: int, n_threads: int | None, batch_size: int | None, invariant: bool = False):
    if batch_size is not None:
        return LlamaBatchBackend(path, batch_size=batch_size, n_ctx=n_ctx, n_threads=n_threads, invariant=invariant)
    from .llama import LlamaBackend

    return LlamaBackend(path, n_ctx=n_ctx, n_threads=n_threads)


def load_pair(settings: Any, need_draft: bool = True, batch_size: int | None = None,
              batch_invariant: bool = False) -> tuple[Backend, Backend | None, int | None]:
    """``(target, draft or None, shared vocabulary width or None)`` from any object with ``target``,
    ``draft``, ``n_threads``, ``n_ctx``, ``device`` and ``dtype`` (a
    :class:`~verispec.settings.ModelSettings`, a bench/diagnose config or parsed CLI flags).
    Without ``need_draft`` only the target is loaded; with ``draft = "ngram"`` (prompt lookup, no
    draft model) the draft is None too. ``batch_size``: batched backends of that many rows
    (:mod:`verispec.models.batch`), with ``batch_invariant`` rows whose numerics do not depend on the batch."""
    kw = dict(n_threads=settings.n_threads, n_ctx=settings.n_ctx, device=settings.device, dtype=settings.dtype,
              batch_size=batch_size, batch_invariant=batch_invariant)
    target = load_backend(settings.target, role="target", **kw)
    if not need_draft or is_ngram_draft(settings.draft):
        return target, None, None
    draft = load_backend(settings.draft, role="draft", **kw)
    return target, draft, check_compatible(target, draft)


def __getattr__(name: str):
    if name == "LlamaBackend":
        from .llama import LlamaBackend

        return LlamaBackend
    if name == "HFBackend":
        from .hf import HFBackend

        return HFBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
