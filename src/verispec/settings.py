"""Settings shared by the bench and diagnose configurations: which model pair, which problems.

:class:`ModelSettings` is what :func:`verispec.models.load_pair` reads and :class:`DataSettings` what
:func:`verispec.tasks.datasets.load_problems` reads; ``BenchConfig`` and ``DiagnoseConfig`` inherit
both (with their own defaults for ``datasets`` and ``limit``), and the command-line flags of
:mod:`verispec.flags` fill them under the same names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The longest draft (γ) a command accepts: far beyond any useful length (3-8 on CPU), and the cost
#: model measures every length up to it.
MAX_GAMMA = 64


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


def check_token_budget(models: ModelSettings, max_new_tokens: int) -> None:
    """Refuse ``max_new_tokens`` that cannot fit in a llama.cpp context of ``n_ctx`` tokens (the prompt
    needs room too); transformers models have their own context length, checked when a prompt comes."""
    target = (models.target or "").strip().lower()
    if target in ("", "embedded", "default") or target.endswith(".gguf"):
        if max_new_tokens >= models.n_ctx:
            raise ValueError(f"max_new_tokens={max_new_tokens} cannot fit in the {models.n_ctx}-token context "
                             "(--n-ctx), which also holds the prompt: raise --n-ctx or lower --max-new-tokens")


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


@dataclass
class ClusterSettings:
    """Where the samples are generated, not what they are (no result depends on it): in this process
    (the default), or by ``workers`` Ray actors, each holding one model pair on ``threads_per_worker``
    CPU threads (llama.cpp ``n_threads``, torch threads) and ``gpus_per_worker`` GPUs, on a local
    Ray cluster or, with ``ray_address`` (``auto`` or ``host:port``), on a running one. ``batch_size``:
    in this process, decode the samples of a run ``batch_size`` rows at a time (continuous batching on
    batched backends; the law of every sample is unchanged, its exact tokens may differ by the float
    round-off of batched model calls); ``batch_invariant``: each row computed alone (one model call per
    row), so its tokens are those of batch size 1 whatever the batch (``docs/reproducibility.md``)."""

    workers: int | None = None          # None: in-process, or with ray_address as many as the cluster holds
    ray_address: str | None = None
    threads_per_worker: int | None = None   # None: the CPUs divided among the workers
    gpus_per_worker: float = 0.0
    batch_size: int | None = None           # None: one sequence at a time
    batch_invariant: bool = False           # batched rows computed one model call per row

    @property
    def distributed(self) -> bool:
        return self.workers is not None or self.ray_address is not None

    def validate(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.threads_per_worker is not None and self.threads_per_worker < 1:
            raise ValueError(f"threads_per_worker must be >= 1, got {self.threads_per_worker}")
        if self.gpus_per_worker < 0:
            raise ValueError(f"gpus_per_worker must be >= 0, got {self.gpus_per_worker}")
        if not self.distributed and (self.threads_per_worker is not None or self.gpus_per_worker):
            raise ValueError("threads/GPUs per worker apply to Ray workers: give --workers N or --ray-address")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.batch_invariant and self.batch_size is None:
            raise ValueError("--batch-invariant applies to --batch-size N (one sequence at a time is already "
                             "invariant): give --batch-size or drop --batch-invariant")
        if self.batch_size is not None and self.distributed:
            raise ValueError("--batch-size decodes batches in this process; it does not combine with Ray workers "
                             "(drop --workers / --ray-address, or --batch-size)")


#: Field names of each part, for code that copies them (flags -> config, config -> corpus key).
MODEL_FIELDS = tuple(ModelSettings.__dataclass_fields__)
DATA_FIELDS = tuple(DataSettings.__dataclass_fields__)
