"""Settings shared by the bench and diagnose configurations: which model pair, which problems.

:class:`ModelSettings` is what :func:`verispec.models.load_pair` reads and :class:`DataSettings` what
:func:`verispec.bench.datasets.load_problems` reads; ``BenchConfig`` and ``DiagnoseConfig`` inherit
both (with their own defaults for ``datasets`` and ``limit``), and the command-line flags of
:mod:`verispec.flags` fill them under the same names.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelSettings:
    """The target/draft pair: ``.gguf`` path, HF id or directory (``None``: the embedded pair), and
    backend options (``n_threads``, ``n_ctx`` for llama.cpp; ``device``, ``dtype`` for transformers)."""

    draft: str | None = None
    target: str | None = None
    n_threads: int | None = None
    n_ctx: int = 4096
    device: str = "cpu"
    dtype: str | None = None
    lookup: bool = False      # prompt lookup beside the draft model (draft "ngram": lookup alone)


@dataclass
class DataSettings:
    """Which problems: dataset names or JSONL paths, a slice of each (``offset``, ``limit``; ``None``:
    all) and, for custom JSONL, the field mapping and checker; ``on_bad_row`` is ``skip`` or ``error``."""

    datasets: list[str] = field(default_factory=list)
    limit: int | None = None
    offset: int = 0
    data_dir: str | None = None
    question_field: str | None = None
    answer_field: str | None = None
    id_field: str | None = None
    checker: str | None = None
    on_bad_row: str = "skip"


#: Field names of each part, for code that copies them (flags -> config, config -> corpus key).
MODEL_FIELDS = tuple(ModelSettings.__dataclass_fields__)
DATA_FIELDS = tuple(DataSettings.__dataclass_fields__)
