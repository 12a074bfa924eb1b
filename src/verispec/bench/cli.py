"""`verispec bench` and `verispec report`: argument parsing over :mod:`verispec.bench.runner`."""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

from verispec.bench import runner
from verispec.bench.datasets import CHECKERS


def add_parsers(sub, add_model_args, add_decoding_args) -> None:
    p = sub.add_parser(
        "bench",
        help="run rules beside their true baselines on benchmarks (resumable); no arguments: the main job",
        description="Every lossy rule is paired with its true baseline (target-only sampling with the rule's "
        "truncation) and with lossless SD as the speed reference. Re-running the same command on the same "
        f"--out resumes. With no arguments: {runner.DEFAULT_DATASET}, first {runner.DEFAULT_LIMIT} problems, "
        f"rules {', '.join(runner.DEFAULT_RULES)}, {runner.DEFAULT_SAMPLING}, γ=5, "
        f"{runner.DEFAULT_MAX_NEW_TOKENS} new tokens, on the embedded pair.",
    )
    add_dataset_args(p, "dataset name or path (repeatable or comma-separated)")
    p.add_argument("--few-shot", type=int, default=0)
    p.add_argument("--rules", default=None, help="rule specs, comma-separated (e.g. lenience:ell=0.5,ceiling:kappa=2,base=we)")
    p.add_argument("--limit", type=int, default=None, help=f"problems per dataset (default {runner.DEFAULT_LIMIT})")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--n-samples", type=int, default=1, help="samples per problem")
    p.add_argument("--out", default=runner.DEFAULT_OUT, help="result directory (SQLite store, report, plots)")
    p.add_argument("--sweep", default=None, help="TOML/YAML file with the grid (keys as the long flags)")
    p.add_argument("--no-baselines", action="store_true", help="do not pair lossy rules with their true baselines")
    p.add_argument("--no-lossless-ref", action="store_true", help="do not run lossless SD as the speed reference")
    p.add_argument("--no-target-only", action="store_true", help="do not run plain target-only sampling")
    p.add_argument("--check-timeout", type=float, default=10.0, help="seconds per answer check / test execution")
    p.add_argument("--dry-run", action="store_true", help="print the planned runs and exit")
    p.add_argument("--no-progress", action="store_true")
    add_model_args(p)
    add_decoding_args(p)
    p.set_defaults(func=cmd_bench, sampling=None, gamma=None, max_new_tokens=None)

    p = sub.add_parser("report", help="Markdown report and plots of a bench directory")
    p.add_argument("dir", help="bench output directory (or a results.sqlite file)")
    p.add_argument("--out", default=None, help="where to write the report (default: the bench directory)")
    p.set_defaults(func=cmd_report)


def add_dataset_args(p, dataset_help: str) -> None:
    """The dataset-source flags shared by `bench` and `diagnose`."""
    p.add_argument("--dataset", action="append", default=None, help=dataset_help)
    p.add_argument("--data-dir", default=None, help="folder with the offline datasets (default: $VERISPEC_DATA or ../shared/data)")
    p.add_argument("--question-field", default=None)
    p.add_argument("--answer-field", default=None)
    p.add_argument("--id-field", default=None)
    p.add_argument("--checker", default=None, choices=list(CHECKERS))
    p.add_argument("--on-bad-row", default="skip", choices=["skip", "error"])


def dataset_list(values: list[str]) -> list[str]:
    """``--dataset`` values, each possibly comma-separated, as one list."""
    return [d.strip() for item in values for d in item.split(",") if d.strip()]


def config_from_args(args) -> runner.BenchConfig:
    cfg = runner.load_sweep(args.sweep) if args.sweep else runner.BenchConfig()
    if args.dataset:
        cfg.datasets = dataset_list(args.dataset)
    if args.rules is not None:
        cfg.rules = runner.split_rule_list(args.rules)
    if args.sampling is not None:
        cfg.samplings = [s.strip() for s in args.sampling.split(";")]
    if args.gamma is not None:
        cfg.gammas = [args.gamma]
    if args.max_new_tokens is not None:
        cfg.max_new_tokens = args.max_new_tokens
    if args.limit is not None:
        cfg.limit = args.limit
    simple = {
        "offset": args.offset, "n_samples": args.n_samples, "out": args.out, "data_dir": args.data_dir,
        "question_field": args.question_field, "answer_field": args.answer_field, "id_field": args.id_field,
        "checker": args.checker, "on_bad_row": args.on_bad_row, "few_shot": args.few_shot, "seed": args.seed,
        "draft": args.draft, "target": args.target, "check_timeout_s": args.check_timeout,
        "n_threads": args.n_threads, "n_ctx": args.n_ctx, "device": args.device, "dtype": args.dtype,
    }
    defaults = {f.name: f.default for f in fields(runner.BenchConfig)}
    for name, value in simple.items():
        # A flag left at its default does not override a sweep file's setting.
        if not (args.sweep and value == _FLAG_DEFAULTS.get(name, defaults.get(name))):
            setattr(cfg, name, value)
    cfg.baselines = cfg.baselines and not args.no_baselines
    cfg.lossless_ref = cfg.lossless_ref and not args.no_lossless_ref
    cfg.target_only = cfg.target_only and not args.no_target_only
    cfg.validate()
    return cfg


_FLAG_DEFAULTS = {"out": runner.DEFAULT_OUT, "check_timeout_s": 10.0, "seed": 0, "n_samples": 1, "offset": 0}


def cmd_bench(args) -> int:
    cfg = config_from_args(args)
    if args.dry_run:
        plan = runner.plan_runs(cfg, runner.model_label(cfg.draft, "draft"), runner.model_label(cfg.target, "target"))
        print(runner.describe_plan(plan))
        return 0
    out, report = runner.run_bench(cfg, progress=not args.no_progress)
    if report is not None:
        print(Path(report.markdown_path).read_text())
        print(f"report: {report.markdown_path}; plots: {', '.join(str(p) for p in report.plot_paths)}", file=sys.stderr)
    return 0


def cmd_report(args) -> int:
    from verispec.bench.report import build_report

    src = Path(args.dir)
    if not src.exists():
        raise FileNotFoundError(f"no bench results at {src}")
    out = Path(args.out) if args.out else (src if src.is_dir() else src.parent)
    report = build_report(src, out)
    print(Path(report.markdown_path).read_text())
    print(f"report: {report.markdown_path}; plots: {', '.join(str(p) for p in report.plot_paths)}", file=sys.stderr)
    return 0
