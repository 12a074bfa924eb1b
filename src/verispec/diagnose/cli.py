"""`verispec diagnose`: argument parsing over :mod:`verispec.diagnose.run`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from verispec import flags
from verispec.diagnose.run import DEFAULT_DIAGNOSE_RULES, DiagnoseConfig, run_diagnose
from verispec.rules import split_specs
from verispec.settings import DATA_FIELDS, MAX_PROBLEMS, MODEL_FIELDS

AccuracyGaps = Callable[[str], Mapping[str, float]]


def add_parser(sub, accuracy_gaps: AccuracyGaps | None = None) -> None:
    """The ``diagnose`` command; ``accuracy_gaps`` reads a bench directory for ``--bench`` (the bench
    layer sits above this one, so the top-level CLI passes it)."""
    p = sub.add_parser(
        "diagnose",
        help="per-token distortion of every rule (TV/KL to its true baseline, overshoot, ceiling, tail leak) "
        "on real positions",
        description="Records (p, q) at every drafted position of lossless generations on benchmark prompts, then "
        "measures each rule's induced distribution against its true baseline. Writes diagnostics.json, "
        "diagnostics.md and PNG figures to --out.",
    )
    defaults = DiagnoseConfig()
    flags.add_dataset_flags(p, "dataset name or path (repeatable or comma-separated); default gsm8k,math500")
    p.add_argument("--rules", default=None,
                   help=f"rule specs, comma-separated (default: {len(DEFAULT_DIAGNOSE_RULES)} specs over every family)")
    p.add_argument("--limit", type=flags.positive_int("--limit", MAX_PROBLEMS), default=defaults.limit,
                   help="problems per dataset")
    p.add_argument("--offset", type=flags.number("--offset", kind=int, lo=0, hi=MAX_PROBLEMS), default=defaults.offset)
    p.add_argument("--out", default=defaults.out, type=flags.text("--out", "the folder for the outputs", path=True))
    p.add_argument("--bench", dest="bench_dir", default=None,
                   type=flags.text("--bench", "a bench output directory", path=True),
                   help="a bench directory: report the rank correlation of distortion and accuracy gap")
    p.add_argument("--recollect", action="store_true", help="record the corpus again even if corpus.npz matches")
    p.add_argument("--no-progress", action="store_true")
    flags.add_model_flags(p)
    flags.add_decoding_flags(p)
    flags.add_cluster_flags(p)
    p.set_defaults(func=lambda args: cmd_diagnose(args, accuracy_gaps), sampling=None, max_new_tokens=None)


def config_from_args(args) -> DiagnoseConfig:
    cfg = DiagnoseConfig()
    if args.dataset:
        cfg.datasets = flags.dataset_list(args.dataset)
    if args.rules is not None:
        cfg.rules = split_specs(args.rules)
        if not cfg.rules:
            raise ValueError(f"--rules {args.rules!r} names no rule: give rule specs, comma-separated "
                             "(`verispec rules` lists them), or drop --rules for the default set")
    if args.sampling is not None:
        cfg.sampling = args.sampling
    if args.max_new_tokens is not None:
        cfg.max_new_tokens = args.max_new_tokens
    for name in DATA_FIELDS + MODEL_FIELDS + ("bench_dir", "recollect", "gamma", "seed", "out", "tree"):
        if name != "datasets":
            setattr(cfg, name, getattr(args, name))
    return cfg


def cmd_diagnose(args, accuracy_gaps: AccuracyGaps | None = None) -> int:
    from verispec.diagnose.summary import diagnostics_markdown
    from verispec.outputs import check_out_dir
    from verispec.settings import check_model_settings, check_token_budget

    cfg, cluster, pool = config_from_args(args), flags.cluster_from_args(args), None
    # before the corpus is recorded (minutes): what would fail only at the end
    check_out_dir(cfg.out)
    if cfg.gamma < 1:
        raise ValueError(f"--gamma must be >= 1, got {cfg.gamma}")
    check_model_settings(cfg)
    check_token_budget(cfg, cfg.max_new_tokens)
    if cfg.bench_dir and accuracy_gaps is not None:
        try:
            accuracy_gaps(cfg.bench_dir)   # a folder without a readable store fails now, not after the corpus
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"--bench {cfg.bench_dir}: {exc}") from None
    if cluster.distributed:   # the corpus is recorded on Ray workers, one prompt per unit
        from verispec.cluster import WorkerPool

        pool = WorkerPool(cluster, n_threads=cfg.n_threads, log=lambda m: print(f"diagnose: {m}", file=sys.stderr))
    result = run_diagnose(cfg, progress=not args.no_progress, accuracy_gaps=accuracy_gaps, pool=pool,
                          batch_size=cluster.batch_size, batch_invariant=cluster.batch_invariant)
    print(diagnostics_markdown(result["summary"]))
    if "tree_form" in result:
        from verispec.diagnose.tree_form import tree_form_markdown

        print("\n" + tree_form_markdown(result["tree_form"]))
    if "correlation" in result:
        c = result["correlation"]
        print(f"\nSpearman rank correlation (mean TV vs accuracy gap, {c.get('n')} rules): "
              f"rho = {c.get('rho')}, p = {c.get('p_value')}")
    plots = ", ".join(result["plots"])
    print(f"\n{result['n_positions']} positions; outputs in {result['out']}: {plots}", file=sys.stderr)
    return 0
