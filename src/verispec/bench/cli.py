"""`verispec bench` and `verispec report`: argument parsing over :mod:`verispec.bench.runner`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from verispec import flags
from verispec.bench import runner
from verispec.params import check_number, shown
from verispec.rules import split_specs
from verispec.settings import (
    DATA_FIELDS,
    MAX_CHECK_TIMEOUT_S,
    MAX_FEW_SHOT,
    MAX_PROBLEMS,
    MAX_SAMPLES,
    MODEL_FIELDS,
)
from verispec.tasks.sandbox import UNSAFE_ENV, UNSAFE_FLAG


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="run rules beside their true baselines on benchmarks (resumable); no arguments: the main job",
        description="Every lossy rule is paired with its true baseline (target-only sampling with the rule's "
        "truncation) and with lossless SD as the speed reference. Re-running the same command on the same "
        f"--out resumes. With no arguments: {runner.DEFAULT_DATASET}, first {runner.DEFAULT_LIMIT} problems, "
        f"rules {', '.join(runner.DEFAULT_RULES)}, {runner.DEFAULT_SAMPLING}, γ=5, "
        f"{runner.DEFAULT_MAX_NEW_TOKENS} new tokens, on the embedded pair.",
    )
    flags.track_explicit(p)  # a sweep file is overridden by exactly the flags given
    flags.add_dataset_flags(p, "dataset name or path (repeatable or comma-separated)")
    p.add_argument("--few-shot", type=flags.number("--few-shot", kind=int, lo=0, hi=MAX_FEW_SHOT), default=0)
    p.add_argument("--rules", default=None,
                   help="rule specs, comma-separated (e.g. lenience:ell=0.5,ceiling:kappa=2,base=we)")
    p.add_argument("--limit", type=flags.positive_int("--limit", MAX_PROBLEMS), default=None,
                   help=f"problems per dataset (default {runner.DEFAULT_LIMIT})")
    p.add_argument("--offset", type=flags.number("--offset", kind=int, lo=0, hi=MAX_PROBLEMS), default=0)
    p.add_argument("--n-samples", type=flags.positive_int("--n-samples", MAX_SAMPLES), default=1,
                   help="samples per problem")
    p.add_argument("--out", default=runner.DEFAULT_OUT,
                   type=flags.text("--out", "the folder for the results", path=True),
                   help="result directory (SQLite store, report, plots)")
    p.add_argument("--sweep", default=None, type=flags.text("--sweep", "a .toml or .yaml sweep file", path=True),
                   help="TOML/YAML file with the grid (keys as the long flags)")
    p.add_argument("--no-baselines", action="store_true", help="do not pair lossy rules with their true baselines")
    p.add_argument("--no-lossless-ref", action="store_true", help="do not run lossless SD as the speed reference")
    p.add_argument("--no-target-only", action="store_true", help="do not run plain target-only sampling")
    p.add_argument("--check-timeout", default=10.0, type=_check_timeout_flag(),
                   help="seconds per answer check / test execution")
    p.add_argument("--dry-run", action="store_true",
                   help="make every check the run makes (datasets loaded, model files, output folder, Ray address) "
                   "and print the planned runs; nothing is decoded or written")
    p.add_argument("--no-progress", action="store_true")
    _add_unsafe_sandbox_flag(p)
    flags.add_model_flags(p)
    flags.add_decoding_flags(p, allow_auto_gamma=True)
    flags.add_cluster_flags(p)
    g = p.add_argument_group("engine", "which engine generates the samples (the store and the report are the same)")
    g.add_argument("--engine", choices=("verispec", "vllm"), default="verispec",
                   help="vllm: generate through vLLM with verispec's rules in its rejection sampler (docs/vllm.md; "
                   "run from .venv-vllm, made by scripts/setup_vllm.sh); chains of a fixed γ; --batch-size is then "
                   "the requests per generate call (default 64)")
    g.add_argument("--vllm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of vllm.LLM for every engine, repeatable (value read as JSON if it parses): "
                   "tensor_parallel_size=2, pipeline_parallel_size=2, distributed_executor_backend=ray, "
                   "gpu_memory_utilization=0.45, dtype=bfloat16, ...")
    p.set_defaults(func=cmd_bench, sampling=None, gamma=None, max_new_tokens=None, tree=None)

    p = sub.add_parser("report", help="Markdown report and plots of a bench directory")
    p.add_argument("dir", help="bench output directory (or a results.sqlite file)",
                   type=flags.text("the bench directory", "a bench output directory", path=True))
    p.add_argument("--out", default=None, type=flags.text("--out", "the folder for the report", path=True),
                   help="where to write the report (default: the bench directory)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("regrade", help="re-check every stored sample of a bench directory with today's checkers",
                       description="Grades each stored output again (nothing is generated) and lists, per run, the "
                       "verdicts that changed. Without --write the store is only read (an older schema is still "
                       "migrated, with a backup).")
    p.add_argument("dir", help="bench output directory (or a results.sqlite file)",
                   type=flags.text("the bench directory", "a bench output directory", path=True))
    p.add_argument("--write", action="store_true",
                   help="store the new verdicts (the replaced one is kept in the sample's meta) and rewrite the report")
    p.add_argument("--data-dir", default=None,
                   type=flags.text("--data-dir", "the folder of the offline datasets", path=True),
                   help="folder with the offline datasets (default: as the bench used)")
    p.add_argument("--check-timeout", default=None, type=_check_timeout_flag(),
                   help="seconds per answer check / test execution (default: the bench's own --check-timeout)")
    _add_unsafe_sandbox_flag(p)
    p.set_defaults(func=cmd_regrade)


def _check_timeout_flag():
    return flags.number("--check-timeout", lo=0.0, lo_open=True, hi=MAX_CHECK_TIMEOUT_S, unit="seconds")


def _add_unsafe_sandbox_flag(p) -> None:
    p.add_argument(UNSAFE_FLAG, action="store_true", dest="unsafe_sandbox",
                   help="grade code even where the sandbox has no namespaces (a container without them): the graded "
                   "program can then read every world-readable file, datasets included, so its grade can be forged. "
                   "Needs root and a cgroup (docs/bench.md)")


def _allow_unsafe_sandbox(args) -> None:
    if getattr(args, "unsafe_sandbox", False):
        os.environ[UNSAFE_ENV] = "1"


#: Config fields set from the flag of the same name (``check_timeout_s`` from ``--check-timeout``).
_SIMPLE_FIELDS = tuple(f for f in DATA_FIELDS + MODEL_FIELDS if f not in ("datasets", "limit")) + (
    "n_samples", "out", "few_shot", "seed", "check_timeout_s")
_FLAG_DEST = {"check_timeout_s": "check_timeout"}


def config_from_args(args) -> runner.BenchConfig:
    """The bench config of parsed flags: a sweep file (``--sweep``) or the defaults, then every flag
    given on the command line (without a sweep, every flag: its default is the config's)."""
    cfg = runner.load_sweep(args.sweep) if args.sweep else runner.BenchConfig()
    given = flags.explicit(args)

    def applies(dest: str) -> bool:
        return not args.sweep or dest in given

    if args.dataset:
        cfg.datasets = flags.dataset_list(args.dataset)
    if args.rules is not None:
        cfg.rules = split_specs(args.rules)
        if not cfg.rules:
            raise ValueError(f"--rules {args.rules!r} names no rule: give rule specs, comma-separated "
                             "(`verispec rules` lists them), or drop --rules for the default set")
    if args.sampling is not None:
        cfg.samplings = [s.strip() for s in args.sampling.split(";")]
    if args.gamma is not None:
        cfg.gammas = [args.gamma]
    if args.tree is not None:
        cfg.trees = [t.strip() for t in args.tree.split(";") if t.strip()]
    if args.max_new_tokens is not None:
        cfg.max_new_tokens = args.max_new_tokens
    if args.limit is not None:
        cfg.limit = args.limit
    for name in _SIMPLE_FIELDS:
        dest = _FLAG_DEST.get(name, name)
        if applies(dest):
            setattr(cfg, name, getattr(args, dest))
    cfg.baselines = cfg.baselines and not args.no_baselines
    cfg.lossless_ref = cfg.lossless_ref and not args.no_lossless_ref
    cfg.target_only = cfg.target_only and not args.no_target_only
    cfg.validate()
    return cfg


def accuracy_gaps(bench_dir: str) -> dict[str, float]:
    """Mean accuracy gap (method − true baseline) per rule spec over the datasets of a bench directory
    (what ``verispec diagnose --bench`` correlates with distortion)."""
    from verispec.bench.rows import collect_rows

    by_rule: dict[str, list[float]] = {}
    for row in collect_rows(bench_dir):
        if row.role == "method" and row.vs_baseline is not None:
            by_rule.setdefault(row.rule, []).append(row.vs_baseline.diff)
    return {rule: sum(v) / len(v) for rule, v in by_rule.items()}


def vllm_executor(args, cfg: runner.BenchConfig, cluster):
    """The :class:`~verispec.integrations.vllm.executor.VllmExecutor` of ``--engine vllm`` (checked: vLLM
    installed, the rules runnable on its proposer, no verispec-side scaling flags), or None."""
    if args.engine != "vllm":
        if args.vllm_option:
            raise ValueError("--vllm-option applies to --engine vllm only")
        return None
    import importlib.util
    import json

    if importlib.util.find_spec("vllm") is None:
        raise ValueError("--engine vllm: vLLM is not installed in this environment; run `bash scripts/setup_vllm.sh` "
                         "and use .venv-vllm/bin/verispec (docs/vllm.md)")
    if cluster.distributed or cluster.batch_invariant:
        raise ValueError("--engine vllm scales with vLLM's own options (--vllm-option tensor_parallel_size=N, "
                         "distributed_executor_backend=ray): drop --workers / --ray-address / --batch-invariant")
    options = {}
    for item in args.vllm_option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--vllm-option takes KEY=VALUE, got {shown(item)}")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    from verispec.integrations.vllm.executor import VllmExecutor

    return VllmExecutor(cfg, Path(cfg.out), vllm_kwargs=options, batch_size=cluster.batch_size or 64)


def cmd_bench(args) -> int:
    _allow_unsafe_sandbox(args)
    cfg, cluster = config_from_args(args), flags.cluster_from_args(args)
    executor = vllm_executor(args, cfg, cluster)
    if executor is not None:
        cluster = None      # the batch size went to vLLM
    if args.dry_run:   # everything the run checks before it decodes: the dry run refuses what the run refuses
        bench = runner.Bench(cfg, progress=False, cluster=cluster, log=lambda m: print(m, file=sys.stderr),
                             executor=executor)
        # the vLLM executor checked its models when it was built, as vLLM loads them (cached exports count)
        plan = bench.plan(check_models=executor is None)
        print(runner.describe_plan(plan))
        n = sum(len(p) for p in bench.problems.values())
        print(f"(dry run: {len(plan)} runs over {n} problems x {cfg.n_samples} samples; nothing decoded or written)",
              file=sys.stderr)
        return 0
    out, report = runner.run_bench(cfg, progress=not args.no_progress, cluster=cluster, executor=executor)
    if report is not None:
        print(Path(report.markdown_path).read_text())
        print(f"report: {report.markdown_path}; plots: {', '.join(str(p) for p in report.plot_paths)}", file=sys.stderr)
    return 0


def cmd_report(args) -> int:
    import tempfile

    from verispec.bench.report import build_report
    from verispec.outputs import OutputError, check_out_dir

    src = Path(args.dir)
    if not src.exists():
        raise FileNotFoundError(f"no bench results at {src}")
    if args.out:
        report = build_report(src, check_out_dir(args.out))
    else:
        out = src if src.is_dir() else src.parent
        try:
            check_out_dir(out)
        except OutputError:     # a read-only bench folder is still readable: print the report, save nothing
            with tempfile.TemporaryDirectory(prefix="verispec-report-") as tmp:
                report = build_report(src, tmp)
                print(Path(report.markdown_path).read_text())
            print(f"({out} is not writable: the report was printed, not saved; pass --out DIR to save it with "
                  "its plots)", file=sys.stderr)
            return 0
        report = build_report(src, out)
    print(Path(report.markdown_path).read_text())
    print(f"report: {report.markdown_path}; plots: {', '.join(str(p) for p in report.plot_paths)}", file=sys.stderr)
    return 0


def _regrade_timeout(src: Path, given: float | None) -> float | None:
    """``--check-timeout``, else the bench's own, checked as a bench checks it: a store written before that
    check may hold ``Infinity``, which failed correct answers in the checkers."""
    if given is not None:
        return given
    from verispec.bench.regrade import _bench_config, _store_path

    stored = _bench_config(_store_path(src)).get("check_timeout_s")
    if stored is None:
        return None
    try:
        return float(check_number(stored, "its check_timeout_s", lo=0.0, lo_open=True, hi=MAX_CHECK_TIMEOUT_S,
                                  unit="seconds"))
    except ValueError as exc:
        raise ValueError(f"the bench's config.json beside {src}: {exc}: pass --check-timeout SECONDS") from None


def cmd_regrade(args) -> int:
    from verispec.bench.regrade import regrade
    from verispec.bench.report import build_report

    _allow_unsafe_sandbox(args)
    src = Path(args.dir)
    if not src.exists():
        raise FileNotFoundError(f"no bench results at {src}")
    if args.write:   # before the (long) re-check: a store that cannot be written is refused now
        from verispec.outputs import check_out_dir

        check_out_dir(src if src.is_dir() else src.parent, flag="regrade --write: the bench folder")
    timeout = _regrade_timeout(src, args.check_timeout)
    summary = regrade(src, write=args.write, data_dir=args.data_dir, timeout_s=timeout)
    print(summary.format())
    if args.write:
        out = src if src.is_dir() else src.parent
        report = build_report(src, out)
        print(f"report: {report.markdown_path}", file=sys.stderr)
    return 0
