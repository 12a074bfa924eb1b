"""``verispec lm-eval [flags] -- <lm_eval args>``: lm-evaluation-harness with the ``verispec`` model.

lm-eval has no plugin discovery (its model registry is a static mapping), so this command registers the
``verispec`` model (:class:`~verispec.integrations.lm_eval_model.VerispecLM`, with these flags as the defaults
of its arguments) and runs lm_eval's own command line with ``--model verispec`` (also
``python -m verispec.integrations.lm_eval``)::

    verispec lm-eval --rule lenience:ell=0.5 --gamma 3 -- --tasks gsm8k --limit 50
    verispec lm-eval --rule speccascade:p_base=0.3 --baseline -- --tasks gsm8k --limit 50

:func:`add_lm_eval_parser` registers the subcommand on ``verispec``'s subparsers without importing lm_eval.
"""

from __future__ import annotations

import argparse
import sys

from verispec import flags
from verispec.integrations.lm_eval_args import DRAFT_SOURCES, check_rule_applies
from verispec.settings import MAX_BATCH_ROWS, check_model_settings

MODEL_NAME = "verispec"


def add_lm_eval_parser(subparsers) -> argparse.ArgumentParser:
    """``verispec lm-eval [flags] -- <lm_eval args>`` on ``verispec``'s subparsers."""
    p = subparsers.add_parser("lm-eval", help="run lm-evaluation-harness with a `verispec` model (any rule, true "
                              "baseline or target-only): verispec lm-eval [flags] -- <lm_eval args>")
    flags.track_explicit(p)   # --gamma / --tree given with --draft-source none or --baseline are refused
    p.add_argument("--rule", default="lossless", type=flags.text("--rule", "a rule spec (`verispec rules` lists them)"),
                   help="verification rule (see `verispec rules`)")
    p.add_argument("--gamma", type=lambda t: flags.gamma_value(t, True), default=5,
                   help="draft tokens per step (an integer, or auto)")
    p.add_argument("--tree", default=None, type=flags.text("--tree", "a tree spec such as 4,2,2,1"),
                   help="draft a tree instead of a chain (one sequence at a time)")
    p.add_argument("--draft-source", choices=list(DRAFT_SOURCES), default=None,
                   help="model (default with a draft model), ngram (prompt lookup), none (target-only)")
    p.add_argument("--baseline", action="store_true", help="the rule's true baseline (target-only with its truncation)")
    p.add_argument("--seed", type=flags.seed_value(), default=1234)
    p.add_argument("--batch-size", type=flags.positive_int("--batch-size", MAX_BATCH_ROWS), default=8,
                   help="rows decoded together (continuous batching)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="compute each row alone: outputs do not depend on the batch, at the cost of its speed-up")
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER,
                   help="lm_eval's own arguments after `--` (e.g. --tasks gsm8k --limit 10)")
    flags.add_model_flags(p)
    p.set_defaults(func=cmd_lm_eval)
    return p


def cmd_lm_eval(args) -> int:
    extra = list(args.lm_eval_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    return run_lm_eval(args, extra)


def run_lm_eval(args, lm_eval_args: list[str]) -> int:
    """The flags become the ``verispec`` model's defaults, then lm_eval's CLI runs with ``lm_eval_args``."""
    if args.lookup:
        raise ValueError("--lookup: choose prompt lookup with --draft-source ngram")
    if not lm_eval_args:
        raise ValueError("give lm_eval's arguments after `--`, e.g. verispec lm-eval --rule lossless -- --tasks "
                         "gsm8k --limit 10")
    check_flags(args)
    from lm_eval.__main__ import cli_evaluate

    from verispec.integrations.lm_eval_model import DEFAULTS, register

    DEFAULTS.clear()
    DEFAULTS.update(rule=args.rule, gamma=args.gamma, tree=args.tree, draft_source=args.draft_source,
                    baseline=args.baseline, seed=args.seed, rows=args.batch_size, target=args.target,
                    draft=args.draft, n_ctx=args.n_ctx, n_threads=args.n_threads, device=args.device, dtype=args.dtype,
                    batch_invariant=args.batch_invariant)
    register()
    if "--model" not in lm_eval_args:
        lm_eval_args = ["--model", MODEL_NAME, *lm_eval_args]
    saved = sys.argv
    sys.argv = ["lm-eval", *lm_eval_args]
    try:
        cli_evaluate()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def check_flags(args) -> None:
    """Refuse flags that make no valid decoding (a ``ValueError`` naming the flag) before lm_eval loads anything."""
    from verispec.engine.request import resolve_decode
    from verispec.models import is_ngram_draft
    from verispec.sampling import SamplingConfig

    if args.gamma != "auto" and args.gamma < 1:
        raise ValueError(f"--gamma must be >= 1 or auto, got {args.gamma}")
    draft = args.draft_source or ("ngram" if is_ngram_draft(args.draft) else "model")
    check_rule_applies(args.rule, draft, args.baseline, flag=True)
    given = flags.explicit(args) & {"gamma", "tree"}
    if given and (args.baseline or draft == "none"):
        why = "--baseline decodes the target alone" if args.baseline else "--draft-source none decodes the target alone"
        names = ", ".join(f"--{g}" for g in sorted(given))
        raise ValueError(f"{why}; {names} only appl{'ies' if len(given) == 1 else 'y'} to speculative decoding and "
                         f"would be ignored: drop {names}")
    check_model_settings(args, need_draft=draft == "model" and not args.baseline)
    try:
        resolve_decode(rule=args.rule, gamma=args.gamma, tree=args.tree, draft=draft, baseline=args.baseline,
                       sampling=SamplingConfig(), max_tokens=1)
    except ValueError as exc:
        flag = {"verification.rule": "--rule", "verification.gamma": "--gamma", "verification.tree": "--tree",
                "verification.draft": "--draft-source"}.get(getattr(exc, "param", None), "--rule/--gamma/--tree")
        raise ValueError(f"{flag}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m verispec.integrations.lm_eval [flags] -- <lm_eval args>``."""
    from verispec.commands import run_command
    from verispec.runtime import tune_process

    tune_process()
    ap = argparse.ArgumentParser(prog="python -m verispec.integrations.lm_eval")
    sub = ap.add_subparsers(dest="command", required=True)
    add_lm_eval_parser(sub)
    return run_command(ap.parse_args(["lm-eval", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    raise SystemExit(main())
