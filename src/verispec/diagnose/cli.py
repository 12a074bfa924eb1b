"""`verispec diagnose`: argument parsing over :mod:`verispec.diagnose.run`."""

from __future__ import annotations

import sys

from verispec.bench.cli import add_dataset_args, dataset_list
from verispec.diagnose.run import DEFAULT_DIAGNOSE_RULES, DiagnoseConfig, run_diagnose


def add_parser(sub, add_model_args, add_decoding_args) -> None:
    p = sub.add_parser(
        "diagnose",
        help="per-token distortion of every rule (TV/KL to its true baseline, overshoot, ceiling, tail leak) on real positions",
        description="Records (p, q) at every drafted position of lossless generations on benchmark prompts, then "
        "measures each rule's induced distribution against its true baseline. Writes diagnostics.json, "
        "diagnostics.md and PNG figures to --out.",
    )
    add_dataset_args(p, "dataset name or path (repeatable or comma-separated); default gsm8k,math500")
    p.add_argument("--rules", default=None, help=f"rule specs, comma-separated (default: {len(DEFAULT_DIAGNOSE_RULES)} specs over every family)")
    p.add_argument("--limit", type=int, default=5, help="problems per dataset")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--out", default="verispec-out/diagnose")
    p.add_argument("--bench", dest="bench_dir", default=None, help="a bench directory: report the rank correlation of distortion and accuracy gap")
    p.add_argument("--recollect", action="store_true", help="record the corpus again even if corpus.npz matches")
    p.add_argument("--no-progress", action="store_true")
    add_model_args(p)
    add_decoding_args(p)
    p.set_defaults(func=cmd_diagnose, sampling=None, max_new_tokens=None)


def cmd_diagnose(args) -> int:
    from verispec.bench.runner import split_rule_list
    from verispec.diagnose.measures import diagnostics_markdown

    cfg = DiagnoseConfig()
    if args.dataset:
        cfg.datasets = dataset_list(args.dataset)
    if args.rules:
        cfg.rules = split_rule_list(args.rules)
    if args.sampling is not None:
        cfg.sampling = args.sampling
    if args.max_new_tokens is not None:
        cfg.max_new_tokens = args.max_new_tokens
    for name in ("data_dir", "question_field", "answer_field", "id_field", "checker", "on_bad_row", "limit", "offset", "out",
                 "bench_dir", "recollect", "gamma", "seed", "draft", "target", "n_threads", "n_ctx", "device", "dtype"):
        setattr(cfg, name, getattr(args, name))
    result = run_diagnose(cfg, progress=not args.no_progress)
    print(diagnostics_markdown(result["summary"]))
    if "correlation" in result:
        c = result["correlation"]
        print(f"\nSpearman rank correlation (mean TV vs accuracy gap, {c.get('n')} rules): rho = {c.get('rho')}, p = {c.get('p_value')}")
    print(f"\n{result['n_positions']} positions; outputs in {result['out']}: " + ", ".join(result["plots"]), file=sys.stderr)
    return 0
