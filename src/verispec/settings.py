"""Settings shared by the bench and diagnose configurations: which model pair, which problems.

:class:`ModelSettings` is what :func:`verispec.models.load_pair` reads and :class:`DataSettings` what
:func:`verispec.tasks.datasets.load_problems` reads; ``BenchConfig`` and ``DiagnoseConfig`` inherit
both (with their own defaults for ``datasets`` and ``limit``), and the command-line flags of
:mod:`verispec.flags` fill them under the same names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verispec.params import check_number, shown

#: The longest draft (γ) a command accepts: far beyond any useful length (3-8 on CPU), and the cost
#: model measures every length up to it.
MAX_GAMMA = 64
#: Sanity bounds of numeric settings: far beyond any real use, and below where a value would overflow a C
#: integer or a timer, allocate for ever, or spawn threads by the million.
MAX_N_CTX = 1 << 21          # tokens of context (the longest-context models hold 1M)
MAX_THREADS = 4096           # CPU threads of one process
MAX_SEED = (1 << 63) - 1     # torch / numpy generators take 64-bit seeds
MAX_BATCH_ROWS = 4096        # rows decoded together
MAX_WORKERS = 4096           # Ray workers
MAX_GPUS_PER_WORKER = 64.0
#: Seconds one answer check (or one test execution) may take: finite, since the checkers and the sandbox
#: turn it into timers and resource limits (``inf`` overflowed there and failed correct answers).
MAX_CHECK_TIMEOUT_S = 3600.0
MAX_SAMPLES = 100_000        # samples per problem
MAX_FEW_SHOT = 64            # worked examples in a prompt
MAX_PROBLEMS = 10**9         # --limit / --offset

#: ``--target`` / ``--draft`` values that mean the embedded pair (llama.cpp)
_EMBEDDED_WORDS = ("embedded", "default")


def is_gguf_source(source: object) -> bool:
    """Whether a model source runs on llama.cpp: the embedded pair (None, ``embedded``) or a ``.gguf`` file."""
    if source is None:
        return True
    text = str(source).strip().lower()
    return text in _EMBEDDED_WORDS or text.endswith(".gguf")


def check_model_settings(models: "ModelSettings", *, need_draft: bool = True) -> None:
    """Refuse model settings no backend can use, before anything loads (``ValueError``, one line): an empty
    ``--target`` / ``--draft`` (an unset shell variable would silently select the embedded model),
    ``n_ctx`` / ``n_threads`` out of range, a device torch cannot parse, and ``--device`` / ``--dtype`` on a
    pair that llama.cpp runs (they apply to transformers models only, and would be ignored)."""
    for flag, source in (("--target", models.target), ("--draft", models.draft)):
        if source is not None and (not isinstance(source, str) or not source.strip()):
            raise ValueError(f"{flag} is empty: give a .gguf path, a Hugging Face id or a model directory, or drop "
                             f"{flag} for the embedded model")
    check_number(models.n_ctx, "--n-ctx (n_ctx)", kind=int, lo=1, hi=MAX_N_CTX, unit="tokens")
    if models.n_threads is not None:
        check_number(models.n_threads, "--n-threads (n_threads)", kind=int, lo=1, hi=MAX_THREADS)
    for flag, value in (("--device", models.device), ("--dtype", models.dtype)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{flag} is {'empty' if isinstance(value, str) else shown(value)}: give a name such as "
                             f"{'cpu or cuda' if flag == '--device' else 'float32 or bfloat16'}, or drop {flag}")
    import torch

    try:
        torch.device(models.device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {shown(models.device)} is not a torch device: use cpu, cuda, cuda:1, mps, ... "
                         "(transformers models only)") from None
    ngram = isinstance(models.draft, str) and models.draft.strip().lower() == "ngram"   # prompt lookup, no model
    sources = [models.target] + ([models.draft] if need_draft and not ngram else [])
    if all(is_gguf_source(s) for s in sources):
        pair = "the embedded pair" if all(s is None or str(s).strip().lower() in _EMBEDDED_WORDS
                                          for s in sources) else "GGUF models"
        if models.device.strip().lower() != "cpu":
            raise ValueError(f"--device {shown(models.device)} applies to transformers models; {pair} run on "
                             "llama.cpp on this CPU: drop --device (device) or give transformers models")
        if models.dtype is not None:
            raise ValueError(f"--dtype {shown(models.dtype)} applies to transformers models; {pair} keep the "
                             "quantisation of their .gguf files: drop --dtype (dtype) or give transformers models")


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
    if is_gguf_source(models.target or None):
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
        if self.workers is not None:
            check_number(self.workers, "--workers", kind=int, lo=1, hi=MAX_WORKERS)
        if self.threads_per_worker is not None:
            check_number(self.threads_per_worker, "--threads-per-worker", kind=int, lo=1, hi=MAX_THREADS)
        check_number(self.gpus_per_worker, "--gpus-per-worker (gpus_per_worker)", lo=0.0, hi=MAX_GPUS_PER_WORKER)
        if self.ray_address is not None and not str(self.ray_address).strip():
            raise ValueError("--ray-address is empty: give host:port (`ray start --head` prints it) or auto, or drop "
                             "it to run in this process")
        if not self.distributed and (self.threads_per_worker is not None or self.gpus_per_worker):
            raise ValueError("threads/GPUs per worker apply to Ray workers: give --workers N or --ray-address")
        if self.batch_size is not None:
            check_number(self.batch_size, "--batch-size", kind=int, lo=1, hi=MAX_BATCH_ROWS)
        if self.batch_invariant and self.batch_size is None:
            raise ValueError("--batch-invariant applies to --batch-size N (one sequence at a time is already "
                             "invariant): give --batch-size or drop --batch-invariant")
        if self.batch_size is not None and self.distributed:
            raise ValueError("--batch-size decodes batches in this process; it does not combine with Ray workers "
                             "(drop --workers / --ray-address, or --batch-size)")


#: Field names of each part, for code that copies them (flags -> config, config -> corpus key).
MODEL_FIELDS = tuple(ModelSettings.__dataclass_fields__)
DATA_FIELDS = tuple(DataSettings.__dataclass_fields__)
