"""Command line: thin commands over the library.

  verispec demo                      rules on an illustrative (p, q): acceptance, TV, overshoot, ceiling
  verispec rules                     every rule spec with its meaning
  verispec generate ...              one generation (SD with a rule, or --baseline target-only)
  verispec calibrate ...             measure this machine's call costs for a model pair (cached)
  verispec bench ...                 diagnostic evaluation: rules beside their true baselines
  verispec report DIR                the report of a bench directory
  verispec regrade DIR [--write]     re-check a bench directory's stored outputs with today's checkers
  verispec diagnose ...              per-token distortion of each rule on real trajectories
"""

from __future__ import annotations

import argparse
import json
import sys

from verispec import __version__, flags
from verispec.commands import run_command
from verispec.runtime import tune_process
from verispec.settings import MAX_GAMMA, check_model_settings, check_token_budget


def cmd_demo(args) -> int:
    from verispec.demo import demo_table

    specs = None
    if args.rules is not None:
        specs = [x.strip() for x in args.rules.split(";") if x.strip()]
        if not specs:
            raise ValueError(f"--rules {args.rules!r} names no rule: give ';'-separated rule specs (e.g. "
                             "'lossless;lenience:ell=0.5'; `verispec rules` lists them), or drop --rules for the "
                             "default table")
    print(demo_table(specs))
    return 0


def _draft_stop(text: str) -> float | str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--draft-stop takes a probability in [0, 1) or auto, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"--draft-stop takes a probability in [0, 1) or auto, got {text!r}")
    return value


def cmd_rules(args) -> int:
    from verispec.rules.catalogue import catalogue_text

    print(catalogue_text())
    return 0


def _stats_table(stats, baseline: bool) -> str:
    d = stats.to_dict()
    rows = [("new tokens", d["new_tokens"]), ("target calls", d["target_calls"])]
    if not baseline:
        rows += [
            ("draft calls", d["draft_calls"]),
            ("block efficiency (tokens/target call)", f"{d['block_efficiency']:.3f}"),
            ("mean accepted per step", f"{d['mean_accepted']:.3f}"),
            ("draft nodes per target call", f"{d['nodes_per_call']:.2f}"),
            ("prompt-lookup steps (drafts accepted)", f"{d['lookup_steps']} ({d['lookup_accepted']})"),
            ("accepted-per-step histogram", d["accepted_hist"]),
            ("per-position acceptance", "[" + ", ".join(f"{x:.2f}" for x in d["per_position_acceptance"]) + "]"),
            ("draft forward time (s)", f"{d['draft_s']:.3f}"),
            ("sampling + rule time (s)", f"{d['rule_s']:.3f}"),
        ]
    rows += [
        ("target forward time (s)", f"{d['verify_s']:.3f}"),
        ("outside model calls (s)", f"{d['other_s']:.3f}"),
        ("wall time after prefill (s)", f"{d['wall_s']:.3f}"),
        ("tokens/s", f"{d['tokens_per_s']:.2f}"),
        ("stop reason", d["stop_reason"]),
    ]
    if not baseline:
        hist = d.get("gamma_hist") or []
        rows.insert(3, (f"draft length γ ({d.get('gamma_policy') or 'fixed'})",
                        f"mean {d.get('mean_gamma', 0.0):.2f}, steps per γ = 0..{len(hist) - 1}: {hist}"))
    if d.get("cost_model_speedup") is not None:
        rows.append(("cost-model speedup (modelled, vs target-only)", f"{d['cost_model_speedup']:.3f}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def cmd_generate(args) -> int:
    import verispec.rules as R
    from verispec.engine import cached_profile, generate, generate_target_only
    from verispec.engine.costs import DEFAULT_G_MAX
    from verispec.engine.ngram import lookup_for
    from verispec.models import load_pair
    from verispec.sampling import SamplingConfig

    check_generate_flags(args)
    sampling = SamplingConfig.parse(args.sampling)
    rule = R.get(args.rule)
    if args.tree is not None and args.gamma == "auto":
        raise ValueError("--gamma auto chooses the length of a chain; drop it or drop --tree")
    if args.gamma == "auto" and args.no_cost_model:
        raise ValueError("--gamma auto chooses γ from the cost model: drop --no-cost-model")
    head = None
    if args.draft_head and not args.baseline:
        from verispec.engine.tree import TreeShape
        from verispec.models.eagle3 import load_head_pair

        shape = TreeShape.parse(args.tree or "dynamic")
        if shape.kind != "dynamic":
            raise ValueError("an EAGLE-3 head grows dynamic trees: --tree dynamic:top_k=..,depth=..,nodes=..")
        target, head = load_head_pair(args.target, args.draft_head, device=args.device, dtype=args.dtype,
                                      top_k=shape.top_k, depth=shape.depth, nodes=shape.nodes)
        draft, width, args.tree = None, None, None
    else:
        target, draft, width = load_pair(args, need_draft=not args.baseline)
        draft = _reduced_draft(args, draft)
    if args.no_chat:
        prompt_ids = target.tokenize(args.prompt, add_special=True)
    else:
        prompt_ids = target.chat_prompt(args.prompt, system=args.system)
    if args.baseline:
        sampling = sampling.with_truncation(**rule.baseline_truncation()) if rule.baseline_truncation() else sampling
        result = generate_target_only(target, prompt_ids, sampling=sampling, max_new_tokens=args.max_new_tokens,
                                      stop=args.stop, seed=args.seed)
    else:
        costs = None
        lookup = lookup_for(args, DEFAULT_G_MAX if args.gamma == "auto" else args.gamma)
        if not args.no_cost_model and args.tree is None and head is None and (draft is not None or lookup is not None):
            g_max = DEFAULT_G_MAX if args.gamma == "auto" else max(DEFAULT_G_MAX, args.gamma)
            costs, measured = cached_profile(target, draft, prompt_ids, n_threads=args.n_threads, g_max=g_max,
                                             progress=None if args.json else _progress_line)
            if measured and not args.json:
                print("(measured this machine's call costs once; cached for the next runs)", file=sys.stderr)
        result = generate(
            target, draft, prompt_ids, rule=rule, sampling=sampling, gamma=args.gamma,
            max_new_tokens=args.max_new_tokens, stop=args.stop, seed=args.seed, vocab_width=width, costs=costs,
            tree=args.tree, lookup=lookup, head=head, draft_stop=args.draft_stop,
        )
    if args.json:
        record = {"text": result.text, "tokens": result.tokens,
                  "rule": "" if args.baseline else rule.spec(), "sampling": sampling.spec()}
        record.update(result.stats.to_dict())
        print(json.dumps(record))
    else:
        print(result.text)
        setting = sampling.spec() or "temperature=1"
        shape = f"tree {result.stats.tree}" if result.stats.tree else f"γ={args.gamma}"
        label = f"target-only ({setting})" if args.baseline else f"{rule.spec()} {shape} ({setting})"
        print(f"\n--- {label}", file=sys.stderr)
        print(_stats_table(result.stats, args.baseline), file=sys.stderr)
    return 0


def _progress_line(message: str) -> None:
    print(f"(measuring this machine's call costs: {message})", file=sys.stderr, flush=True)


def _reduced_draft(args, draft):
    """The draft with ``--draft-vocab`` output tokens (ranked on ``--draft-vocab-corpus``), or as loaded."""
    if getattr(args, "draft_vocab", None) is None:
        if getattr(args, "draft_vocab_corpus", None):
            raise ValueError("--draft-vocab-corpus ranks the tokens of --draft-vocab: give --draft-vocab N too")
        return draft
    if draft is None:
        raise ValueError("--draft-vocab reduces a draft model's output layer: it needs a draft model (not --draft "
                         "ngram or --draft-head)")
    vocab = int(draft.vocab_size)
    if args.draft_vocab > vocab:
        raise ValueError(f"--draft-vocab {args.draft_vocab} is beyond the draft's vocabulary of {vocab} tokens: give "
                         f"at most {vocab}, or full for no reduction")
    from verispec.models.draft_vocab import draft_vocabulary, with_draft_vocab

    return with_draft_vocab(draft, draft_vocabulary(draft, args.draft_vocab, args.draft_vocab_corpus))


#: generate flags that only speculative decoding reads: with --baseline they would be ignored
_SD_ONLY = {"lookup": "--lookup", "tree": "--tree", "draft_head": "--draft-head", "gamma": "--gamma",
            "draft_stop": "--draft-stop", "draft": "--draft", "no_cost_model": "--no-cost-model",
            "draft_vocab": "--draft-vocab", "draft_vocab_corpus": "--draft-vocab-corpus"}


def check_generate_flags(args) -> None:
    """Refuse what ``generate`` would otherwise ignore or trip over later: SD flags with ``--baseline``,
    γ out of range, a tree with ``--gamma auto``."""
    given = flags.explicit(args)
    if args.baseline:
        ignored = [flag for dest, flag in _SD_ONLY.items() if dest in given]
        if ignored:
            many = len(ignored) > 1
            raise ValueError(f"--baseline decodes the target alone; {', '.join(ignored)} only "
                             f"appl{'y' if many else 'ies'} to speculative decoding and would be ignored: drop "
                             f"{'them' if many else 'it'} or --baseline")
    if args.gamma != "auto" and args.gamma < 1:
        raise ValueError(f"--gamma must be >= 1 or auto, got {args.gamma}")
    check_model_settings(args, need_draft=not args.baseline and not args.draft_head)
    check_token_budget(args, args.max_new_tokens)
    if args.draft_head and args.lookup:
        raise ValueError("--draft-head drafts with an EAGLE-3 head; --lookup drafts with prompt lookup beside a draft "
                         "model: drop one")


def cmd_calibrate(args) -> int:
    from verispec.engine import best_gamma, cached_profile
    from verispec.engine.costs import DEFAULT_G_MAX
    from verispec.models import load_pair

    g_max = DEFAULT_G_MAX if args.g_max is None else args.g_max
    check_model_settings(args)
    target, draft, _ = load_pair(args)   # --draft ngram: no draft model, the target's costs alone (lookup)
    for backend in (target, draft):     # transformers, weight-major: its plan per row count is timed again too
        if getattr(backend, "row_plan", None) is not None:
            from verispec.models.cpu_linear import cached_plan, describe_plan

            backend.row_plan = cached_plan(backend.model, refresh=True)
            print(f"{backend.name}: linear products per row count: {describe_plan(backend.row_plan)}")
    draft = _reduced_draft(args, draft)
    prompt = target.chat_prompt("Write a Python function that returns the n-th Fibonacci number.")
    prof, _ = cached_profile(target, draft, prompt, n_threads=args.n_threads, g_max=g_max, refresh=True,
                             progress=_progress_line)
    if prof.has_draft:
        pair = prof.draft_pair or prof.draft_token
        print(f"draft forward of 1 / 2 tokens {1e3 * prof.draft_token:.1f} / {1e3 * pair:.1f} ms, target token "
              f"{1e3 * prof.target_token:.1f} ms, c = {prof.c:.3f}, sampling per row {1e3 * prof.row_s:.2f} ms")
    else:
        print(f"no draft model (prompt lookup): target token {1e3 * prof.target_token:.1f} ms, "
              f"sampling per row {1e3 * prof.row_s:.2f} ms")
    if prof.step_overhead is not None:
        o_a, o_b = prof.step_overhead
        print(f"outside the model forwards: {1e3 * o_a:.2f} + {1e3 * o_b:.2f}·γ ms per SD step, "
              f"{1e3 * (prof.plain_overhead or 0.0):.2f} ms per target-only step")
    print("v(γ) = " + ", ".join(f"{g}: {prof.v(g):.2f}" for g in range(1, prof.g_max + 1)))
    alphas = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    what = "best γ" if prof.has_draft else "best lookup draft length"
    print(f"{what} by per-position acceptance α: " + ", ".join(
        f"α={a}: {best_gamma(prof, a, free=not prof.has_draft)}" for a in alphas) + "  (0: target-only is faster)")
    print(f"identity: {prof.identity}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="verispec", description="Speculative decoding with lossless and lossy verification, and diagnostics.")
    ap.add_argument("--version", action="version", version=f"verispec {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="each rule on an illustrative (p, q): acceptance, TV, overshoot, ceiling ratio")
    p.add_argument("--rules", default=None, help="';'-separated rule specs (default: one of each family)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("rules", help="list every rule spec")
    p.set_defaults(func=cmd_rules)

    p = sub.add_parser("generate", help="generate text with speculative decoding (or --baseline target-only)")
    flags.track_explicit(p)   # --baseline refuses the SD flags given with it
    p.add_argument("--prompt", required=True, type=flags.text("--prompt", "the text to answer or continue"))
    p.add_argument("--system", default=None, type=flags.utf8_text("--system"),
                   help="system message for the chat template")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--rule", default="lossless", type=flags.text("--rule", "a rule spec (`verispec rules` lists them)"),
                   help="verification rule spec (see `verispec rules`)")
    p.add_argument("--baseline", action="store_true",
                   help="target-only decoding with the same sampling plus the rule's true-baseline truncation; "
                   "no draft loaded")
    p.add_argument("--stop", action="append", default=[],
                   type=flags.text("--stop", "the text to stop at (an empty stop string would end every generation "
                                   "before its first token)"),
                   help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON record")
    p.add_argument("--no-cost-model", action="store_true",
                   help="skip measuring per-call costs for the cost-model speedup")
    p.add_argument("--draft-stop", type=_draft_stop, default=None,
                   help="stop drafting at a token the draft gave probability below this (0: never), or auto: "
                   "the cost model decides token by token whether one more draft token pays (default: auto with "
                   "--gamma auto and a draft model without --lookup, else 0; --gamma auto --draft-stop 0: the cost "
                   "model chooses each step's γ alone)")
    p.add_argument("--draft-head", default=None,
                   type=flags.text("--draft-head", "an EAGLE-3 head's directory", path=True),
                   help="an EAGLE-3 head (directory in its authors' layout) drafting for a transformers --target "
                   "instead of a draft model; its tree: --tree dynamic:top_k=10,depth=5,nodes=60 (the default)")
    flags.add_model_flags(p)
    flags.add_draft_vocab_flags(p)
    flags.add_decoding_flags(p, allow_auto_gamma=True)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("calibrate", help="measure this machine's call costs for a model pair (cached; used by "
                       "--gamma auto and the cost-model speedup)")
    p.add_argument("--g-max", type=flags.positive_int("--g-max", MAX_GAMMA), default=None,
                   help=f"longest draft measured (default: the one --gamma auto uses; at most {MAX_GAMMA}): every "
                   "length up to it is timed, minutes on a CPU at the top of the range")
    flags.add_model_flags(p)
    flags.add_draft_vocab_flags(p)
    p.set_defaults(func=cmd_calibrate)

    _add_bench_parsers(sub)
    _add_integration_parsers(sub)
    return ap


def _add_integration_parsers(sub) -> None:
    from verispec.integrations.lm_eval import add_lm_eval_parser
    from verispec.serve.cli import add_serve_parser

    add_serve_parser(sub)
    add_lm_eval_parser(sub)


def _add_bench_parsers(sub) -> None:
    from verispec.bench.cli import accuracy_gaps, add_parsers
    from verispec.diagnose.cli import add_parser as add_diagnose_parser

    add_parsers(sub)
    add_diagnose_parser(sub, accuracy_gaps=accuracy_gaps)


def main(argv: list[str] | None = None) -> int:
    """Run a command (:func:`verispec.commands.run_command`: one ``verispec: error:`` line for what the user
    can fix, never a traceback)."""
    tune_process()  # before anything imports torch
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
