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

from verispec.settings import MAX_GAMMA, ClusterSettings, ModelSettings
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
    ap.add_argument("--target", default=d.target,
                    help="target model: .gguf path, HF id or directory (default: embedded Qwen2.5-Coder-1.5B)")
    ap.add_argument("--draft", default=d.draft,
                    help="draft model: .gguf path, HF id or directory (default: embedded Qwen2.5-Coder-0.5B), "
                    "or ngram: prompt-lookup drafting without a draft model")
    ap.add_argument("--lookup", action="store_true", default=d.lookup,
                    help="prompt-lookup drafting beside the draft model: draft the n-gram continuation when the "
                    "text's suffix occurred before, the draft model otherwise (chains)")
    ap.add_argument("--n-threads", type=positive_int("--n-threads"), default=d.n_threads,
                    help="llama.cpp threads (default: all cores)")
    ap.add_argument("--n-ctx", type=positive_int("--n-ctx"), default=d.n_ctx,
                    help="context length for llama.cpp models")
    ap.add_argument("--device", default=d.device, help="device for transformers models (cpu, cuda, ...)")
    ap.add_argument("--dtype", default=d.dtype,
                    help="dtype for transformers models (float32, bfloat16, float16, float64)")


def add_draft_vocab_flags(ap: argparse.ArgumentParser) -> None:
    """``--draft-vocab`` and ``--draft-vocab-corpus``: a draft computing only its most frequent output tokens
    (:mod:`verispec.models.draft_vocab`)."""
    from verispec.models.draft_vocab import parse_size

    def size(text: str) -> int | None:
        try:
            return parse_size(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    ap.add_argument("--draft-vocab", type=size, default=None,
                    help="the draft drafts from its N most frequent output tokens only (e.g. 32768 or 32k; auto: "
                    "32768; full: all): a cheaper draft forward (transformers: only those rows of its output "
                    "layer; llama.cpp: a GGUF cut to them, written once to the cache); lossless rules stay exact")
    ap.add_argument("--draft-vocab-corpus", action="append", default=None,
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
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"γ must be an integer >= 1{' or auto' if allow_auto else ''}, "
                                         f"got {text!r}") from None
    if value > MAX_GAMMA:   # below 1: checked by the command, with its own message
        raise argparse.ArgumentTypeError(f"γ = {value} drafts far more than any target accepts in one call: give at "
                                         f"most {MAX_GAMMA} (3-8 is usual on CPUs){' or auto' if allow_auto else ''}")
    return value


def positive_int(what: str):
    """An argparse type: an integer >= 1 (``what`` names it in the error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer >= 1, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{what} must be an integer >= 1, got {value}")
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
                    help="sampling pipeline, e.g. temperature=0.7,top_p=0.8,top_k=20 (temperature=0: greedy)")
    auto = " or auto (chosen per step by the machine's cost model; `verispec calibrate`)" if allow_auto_gamma else ""
    ap.add_argument("--gamma", type=lambda t: gamma_value(t, allow_auto_gamma), default=5,
                    help=f"draft tokens per target call γ: an integer >= 1{auto}")
    ap.add_argument("--tree", default=None,
                    help="draft a tree instead of a chain of γ tokens: 4,2,2,1 (top-k candidates per depth), "
                    "iid:4,2 or wor:4,2 (sampled children), dynamic:top_k=10,depth=5,nodes=60 (EAGLE-2); "
                    "bench: several separated by ';', chain:5 for the chain of γ 5")
    ap.add_argument("--max-new-tokens", type=positive_int("--max-new-tokens"), default=256)
    ap.add_argument("--seed", type=int, default=0)


def add_dataset_flags(ap: argparse.ArgumentParser, dataset_help: str) -> None:
    """The dataset-source flags shared by ``bench`` and ``diagnose`` (their own ``--limit``/``--offset``
    carry their own defaults)."""
    ap.add_argument("--dataset", action="append", default=None, help=dataset_help)
    ap.add_argument("--data-dir", default=None,
                    help="folder with the offline datasets "
                    "(default: $VERISPEC_DATA, else ~/.local/share/verispec/data)")
    ap.add_argument("--question-field", default=None)
    ap.add_argument("--answer-field", default=None)
    ap.add_argument("--id-field", default=None)
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
    g.add_argument("--workers", type=positive_int("--workers"), default=None,
                   help="start a local Ray cluster with N workers (with --ray-address: N workers on that cluster; "
                   "default there: as many as its CPUs / GPUs hold)")
    g.add_argument("--ray-address", default=None,
                   help="join a running Ray cluster (`ray start --head` prints it; auto: this machine's cluster)")
    g.add_argument("--threads-per-worker", type=positive_int("--threads-per-worker"), default=None,
                   help="CPU threads of each worker: its llama.cpp n_threads and torch threads, and the CPUs Ray "
                   "reserves for it (default: --n-threads, else the CPUs divided among --workers, else 1)")
    g.add_argument("--batch-size", type=positive_int("--batch-size"), default=None,
                   help="decode N samples of a run together in this process (continuous batching on batched "
                   "backends; chains only: no --tree, --lookup or --gamma auto)")
    g.add_argument("--batch-invariant", action="store_true",
                   help="with --batch-size: compute each row alone (one model call per row), so every output is "
                   "bitwise that of --batch-size 1 whatever the batch; costs the batching speed-up "
                   "(docs/reproducibility.md)")
    g.add_argument("--gpus-per-worker", type=float, default=0.0,
                   help="GPUs Ray reserves for each worker (fractions share a GPU); the worker sees only those")


def cluster_from_args(args) -> ClusterSettings:
    cluster = ClusterSettings(workers=args.workers, ray_address=args.ray_address,
                              threads_per_worker=args.threads_per_worker, gpus_per_worker=args.gpus_per_worker,
                              batch_size=getattr(args, "batch_size", None),
                              batch_invariant=bool(getattr(args, "batch_invariant", False)))
    cluster.validate()
    return cluster
