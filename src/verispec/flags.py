"""Command-line flags shared by ``generate``, ``bench`` and ``diagnose``, in one place.

Each group fills the settings of the same name (:class:`~verispec.settings.ModelSettings`,
:class:`~verispec.settings.DataSettings`), so a flag, a sweep-file key and a config field are spelled
alike. Parsers built after :func:`track_explicit` remember which flags were *given* (not merely left
at their default): a sweep file is overridden by exactly the flags on the command line, including a
flag given at its default value.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from verispec.params import check_number, shown
from verispec.settings import (
    MAX_BATCH_ROWS,
    MAX_GAMMA,
    MAX_GPUS_PER_WORKER,
    MAX_N_CTX,
    MAX_SEED,
    MAX_THREADS,
    MAX_WORKERS,
    ClusterSettings,
    ModelSettings,
)
from verispec.tasks.checkers import CHECKERS

_EXPLICIT = "_explicit_flags"


def _tracking(base: type[argparse.Action]) -> type[argparse.Action]:
    class Tracked(base):  # type: ignore[misc, valid-type]
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            given = getattr(namespace, _EXPLICIT, None)
            if given is None:
                given = set()
                setattr(namespace, _EXPLICIT, given)   # copied to the parent namespace by subparsers
            given.add(self.dest)

    Tracked.__name__ = f"Tracked{base.__name__}"
    return Tracked


_TRACKED = {
    "store": _tracking(argparse._StoreAction),
    "store_true": _tracking(argparse._StoreTrueAction),
    "store_false": _tracking(argparse._StoreFalseAction),
    "append": _tracking(argparse._AppendAction),
}


def track_explicit(parser: argparse.ArgumentParser) -> None:
    """Make the arguments added to ``parser`` from now on record their ``dest`` when given (see
    :func:`explicit`)."""
    for name, action in _TRACKED.items():
        parser.register("action", name, action)
    parser.register("action", None, _TRACKED["store"])


def explicit(args: argparse.Namespace) -> frozenset[str]:
    """The ``dest`` of every tracked flag given on the command line."""
    return frozenset(getattr(args, _EXPLICIT, ()))


def add_model_flags(ap: argparse.ArgumentParser) -> None:
    d = ModelSettings()
    model = "a .gguf path, a Hugging Face id or a model directory"
    ap.add_argument("--target", default=d.target, type=text("--target", model, path=True),
                    help="target model: .gguf path, HF id or directory (default: embedded Qwen2.5-Coder-1.5B)")
    ap.add_argument("--draft", default=d.draft, type=text("--draft", f"{model}, or ngram", path=True),
                    help="draft model: .gguf path, HF id or directory (default: embedded Qwen2.5-Coder-0.5B), "
                    "or ngram: prompt-lookup drafting without a draft model")
    ap.add_argument("--lookup", action="store_true", default=d.lookup,
                    help="prompt-lookup drafting beside the draft model: draft the n-gram continuation when the "
                    "text's suffix occurred before, the draft model otherwise (chains)")
    ap.add_argument("--n-threads", type=positive_int("--n-threads", MAX_THREADS), default=d.n_threads,
                    help="llama.cpp threads (default: $VERISPEC_THREADS, else all cores)")
    ap.add_argument("--n-ctx", type=positive_int("--n-ctx", MAX_N_CTX), default=d.n_ctx,
                    help="context length for llama.cpp models")
    ap.add_argument("--device", default=d.device, type=text("--device", "a torch device such as cpu or cuda"),
                    help="device for transformers models (cpu, cuda, ...)")
    ap.add_argument("--dtype", default=d.dtype, type=text("--dtype", "a dtype such as float32 or bfloat16"),
                    help="dtype for transformers models (float32, bfloat16, float16, float64)")


def add_draft_vocab_flags(ap: argparse.ArgumentParser) -> None:
    """``--draft-vocab`` and ``--draft-vocab-corpus``: a draft computing only its most frequent output tokens
    (:mod:`verispec.models.draft_vocab`)."""
    from verispec.models.draft_vocab import parse_size

    def size(value: str) -> int | None:
        if not value.strip():
            raise argparse.ArgumentTypeError("--draft-vocab is empty: give a number of tokens (e.g. 32768 or 32k), "
                                             "auto or full")
        try:
            return parse_size(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(shown(str(exc), 300)) from None

    ap.add_argument("--draft-vocab", type=size, default=None,
                    help="the draft drafts from its N most frequent output tokens only (e.g. 32768 or 32k; auto: "
                    "32768; full: all): a cheaper draft forward (transformers: only those rows of its output "
                    "layer; llama.cpp: a GGUF cut to them, written once to the cache); lossless rules stay exact")
    ap.add_argument("--draft-vocab-corpus", action="append", default=None,
                    type=text("--draft-vocab-corpus", "a text, code or JSONL file", path=True),
                    help="text, code or JSONL file whose token counts rank the draft's vocabulary (repeatable; "
                    "default: the Python standard library's sources, read locally)")


def gamma_value(text: str, allow_auto: bool) -> int | str:
    """``--gamma``: an integer in ``1..MAX_GAMMA``, or ``auto`` where the command allows it."""
    if text.strip().lower() == "auto":
        if allow_auto:
            return "auto"
        raise argparse.ArgumentTypeError("'auto' is available in `verispec generate` and `verispec bench`; "
                                         "this command needs a fixed γ")
    try:
        value = int(text) if len(text) < 100 else None
    except ValueError:
        value = None
    if value is None:
        raise argparse.ArgumentTypeError(f"γ must be an integer >= 1{' or auto' if allow_auto else ''}, "
                                         f"got {shown(text)}")
    if value > MAX_GAMMA:   # below 1: checked by the command, with its own message
        raise argparse.ArgumentTypeError(f"γ = {value} drafts far more than any target accepts in one call: give at "
                                         f"most {MAX_GAMMA} (3-8 is usual on CPUs){' or auto' if allow_auto else ''}")
    return value


def number(what: str, **bounds):
    """An argparse type: a finite number within ``bounds`` (:func:`verispec.params.check_number`: ``kind``,
    ``lo``, ``hi``, ``lo_open``, ``hi_open``, ``unit``); NaN, infinities, ``1e400`` and words are refused with
    ``what`` named."""
    def parse(value: str) -> int | float:
        try:
            return check_number(value, what, **bounds)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def positive_int(what: str, hi: int | None = None):
    """An argparse type: an integer >= 1, at most ``hi`` (``what`` names it in the error)."""
    return number(what, kind=int, lo=1, hi=hi)


def seed_value(what: str = "--seed"):
    """An argparse type: a seed, an integer in ``0..2^63-1`` (what torch's and numpy's generators take)."""
    return number(what, kind=int, lo=0, hi=MAX_SEED)


def text(what: str, meaning: str = "", *, path: bool = False):
    """An argparse type: non-empty UTF-8 text (an empty value, e.g. an unset shell variable, would mean nothing
    or silently the default). ``meaning`` completes "give ..." in the error. ``path``: a file or folder name,
    which may hold any bytes but NUL (so it is not checked for UTF-8)."""
    def parse(value: str) -> str:
        if not path:
            check_utf8(value, what)
        if not value.strip():
            raise argparse.ArgumentTypeError(f"{what} is empty: give {meaning or 'a value'}, or drop {what}")
        return value
    return parse


def utf8_text(what: str):
    """An argparse type: text that is valid UTF-8 (bytes that were not UTF-8 arrive as lone surrogates)."""
    def parse(text: str) -> str:
        check_utf8(text, what)
        return text
    return parse


def check_utf8(text: str, what: str) -> str:
    """Refuse text holding bytes that were not UTF-8 (Python keeps them as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"{bad!r}"
        raise argparse.ArgumentTypeError(f"{what} is not valid UTF-8 text ({byte} at character {e.start + 1}); "
                                         "pass UTF-8 text (check the terminal's or the file's encoding)") from None
    return text


def add_decoding_flags(ap: argparse.ArgumentParser, *, allow_auto_gamma: bool = False) -> None:
    """``--sampling``, ``--gamma``, ``--max-new-tokens``, ``--seed`` with the defaults of ``generate``
    (``bench`` and ``diagnose`` reset the first three to ``None``: their configs hold the defaults)."""
    ap.add_argument("--sampling", default="temperature=1",
                    type=text("--sampling", "a sampling pipeline such as temperature=0.7,top_p=0.8"),
                    help="sampling pipeline, e.g. temperature=0.7,top_p=0.8,top_k=20 (temperature=0: greedy)")
    auto = " or auto (chosen per step by the machine's cost model; `verispec calibrate`)" if allow_auto_gamma else ""
    ap.add_argument("--gamma", type=lambda t: gamma_value(t, allow_auto_gamma), default=5,
                    help=f"draft tokens per target call γ: an integer >= 1{auto}")
    ap.add_argument("--tree", default=None, type=text("--tree", "a tree spec such as 4,2,2,1"),
                    help="draft a tree instead of a chain of γ tokens: 4,2,2,1 (top-k candidates per depth), "
                    "iid:4,2 or wor:4,2 (sampled children), dynamic:top_k=10,depth=5,nodes=60 (EAGLE-2); "
                    "bench: several separated by ';', chain:5 for the chain of γ 5")
    ap.add_argument("--max-new-tokens", type=positive_int("--max-new-tokens", MAX_N_CTX), default=256)
    ap.add_argument("--seed", type=seed_value(), default=0)


def add_dataset_flags(ap: argparse.ArgumentParser, dataset_help: str) -> None:
    """The dataset-source flags shared by ``bench`` and ``diagnose`` (their own ``--limit``/``--offset``
    carry their own defaults)."""
    ap.add_argument("--dataset", action="append", default=None, help=dataset_help,
                    type=text("--dataset", "a dataset name or a JSONL path", path=True))
    ap.add_argument("--data-dir", default=None,
                    type=text("--data-dir", "the folder of the offline datasets", path=True),
                    help="folder with the offline datasets "
                    "(default: $VERISPEC_DATA, else ~/.local/share/verispec/data)")
    ap.add_argument("--question-field", default=None, type=text("--question-field", "a field name of the rows"))
    ap.add_argument("--answer-field", default=None, type=text("--answer-field", "a field name of the rows"))
    ap.add_argument("--id-field", default=None, type=text("--id-field", "a field name of the rows"))
    ap.add_argument("--checker", default=None, choices=list(CHECKERS))
    ap.add_argument("--on-bad-row", default="skip", choices=["skip", "error"])


def dataset_list(values: Iterable[str]) -> list[str]:
    """``--dataset`` values, each possibly comma-separated, as one list."""
    return [d.strip() for item in values for d in item.split(",") if d.strip()]


def add_cluster_flags(ap) -> None:
    """``--workers``, ``--ray-address``, ``--threads-per-worker``, ``--gpus-per-worker``
    (:class:`~verispec.settings.ClusterSettings`; no result depends on them)."""
    g = ap.add_argument_group("Ray workers", "generate the work on Ray workers, each holding one model pair; "
                              "the store, the resumption and the results are those of a run in this process")
    g.add_argument("--workers", type=positive_int("--workers", MAX_WORKERS), default=None,
                   help="start a local Ray cluster with N workers (with --ray-address: N workers on that cluster; "
                   "default there: as many as its CPUs / GPUs hold)")
    g.add_argument("--ray-address", default=None, type=text("--ray-address", "host:port or auto"),
                   help="join a running Ray cluster (`ray start --head` prints it; auto: this machine's cluster)")
    g.add_argument("--threads-per-worker", type=positive_int("--threads-per-worker", MAX_THREADS), default=None,
                   help="CPU threads of each worker: its llama.cpp n_threads and torch threads, and the CPUs Ray "
                   "reserves for it (default: --n-threads, else the CPUs divided among --workers, else 1)")
    g.add_argument("--batch-size", type=positive_int("--batch-size", MAX_BATCH_ROWS), default=None,
                   help="decode N samples of a run together in this process (continuous batching on batched "
                   "backends; chains only: no --tree, --lookup or --gamma auto)")
    g.add_argument("--batch-invariant", action="store_true",
                   help="with --batch-size: compute each row alone (one model call per row), so every output is "
                   "bitwise that of --batch-size 1 whatever the batch; costs the batching speed-up "
                   "(docs/reproducibility.md)")
    g.add_argument("--gpus-per-worker", type=number("--gpus-per-worker", lo=0.0, hi=MAX_GPUS_PER_WORKER), default=0.0,
                   help="GPUs Ray reserves for each worker (fractions share a GPU); the worker sees only those")


def cluster_from_args(args) -> ClusterSettings:
    cluster = ClusterSettings(workers=args.workers, ray_address=args.ray_address,
                              threads_per_worker=args.threads_per_worker, gpus_per_worker=args.gpus_per_worker,
                              batch_size=getattr(args, "batch_size", None),
                              batch_invariant=bool(getattr(args, "batch_invariant", False)))
    cluster.validate()
    return cluster
