"""Prompt-lookup (n-gram) drafting on this machine: alone, beside the draft model, and the draft model alone.

On the embedded pair (llama.cpp), for HumanEval-style code completion and GSM8K prompts (offline copies:
``--data-dir`` or ``$VERISPEC_DATA``), lossless SD with: the draft model (chain of γ), prompt lookup alone
(``--draft ngram``: no draft model; a step without a match is a plain target step), and both (lookup where
the text's suffix occurred before, the draft model otherwise); target-only sampling as the reference.
With ``γ auto`` the cost model chooses, step by step, whether and how much of lookup's draft to
verify (``LookupGamma``, from the machine's cached cost profile: ``cached_profile(target, None)`` for
lookup alone) and the draft model's γ. Settings are interleaved round by round. Printed per dataset
and setting: tokens per target call (BE), the share of steps drafted by lookup and their mean accepted
tokens, tokens/s over target-only (ratio of the medians), the median and range of the per-run
ratios to the target-only run of the same prompt and round (adjacent in time, so a machine that
speeds up or slows down over minutes cancels out), and the cost model's predicted speedup (mean
over the runs). ``--only a,b`` keeps the settings whose names contain one of the texts (target-only
always runs).

    .venv/bin/python benchmarks/ngram.py [--datasets humaneval,gsm8k] [--limit 3] [--tokens 128]
        [--gamma 3] [--lookup-gamma 5] [--min-ngram 1] [--rounds 1] [--sampling temperature=0.7,top_k=20,top_p=0.8]
"""

from __future__ import annotations

import argparse
import statistics

from verispec.runtime import tune_process

tune_process()

from verispec.engine import cached_profile, generate, generate_target_only  # noqa: E402
from verispec.engine.ngram import NgramDrafter  # noqa: E402
from verispec.models import load_pair  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402
from verispec.settings import DataSettings, ModelSettings  # noqa: E402
from verispec.tasks.datasets import load_problems  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="humaneval,gsm8k")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=3, help="draft-model chain length")
    ap.add_argument("--lookup-gamma", type=int, default=5, help="longest lookup draft")
    ap.add_argument("--min-ngram", type=int, default=1, help="shortest suffix match that drafts")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--only", default="", help="comma-separated texts: run the settings whose names contain one")
    args = ap.parse_args(argv)
    sampling = SamplingConfig.parse(args.sampling)
    data = DataSettings(datasets=[d for d in args.datasets.split(",") if d], data_dir=args.data_dir,
                        limit=args.limit)
    problems = load_problems(data, print)
    settings = ModelSettings(n_threads=args.n_threads)
    target, draft, width = load_pair(settings)
    names = ["target-only", f"draft model γ={args.gamma}", f"lookup alone γ≤{args.lookup_gamma}",
             "lookup alone γ auto", f"lookup + draft γ={args.gamma}", "lookup + draft γ auto"]
    modes = names[:1] + [m for m in names[1:] if not args.only or any(w in m for w in args.only.split(",") if w)]
    probe = target.chat_prompt("Write a Python function that returns the n-th Fibonacci number.")
    free_costs, _ = cached_profile(target, None, probe)     # the target alone: lookup's drafts are free
    pair_costs, _ = cached_profile(target, draft, probe)

    def fixed_lookup(g: int) -> NgramDrafter:
        return NgramDrafter(min_ngram=args.min_ngram, max_ngram=max(3, args.min_ngram), max_tokens=g)

    def run(mode: str, ids: list[int], seed: int):
        kw = dict(rule="lossless", sampling=sampling, max_new_tokens=args.tokens, seed=seed)
        auto_lookup = NgramDrafter(min_ngram=1, max_ngram=4, max_tokens=free_costs.g_max)   # the policy judges
        if mode == names[0]:
            return generate_target_only(target, ids, sampling=sampling, max_new_tokens=args.tokens, seed=seed).stats
        if mode == names[1]:
            return generate(target, draft, ids, gamma=args.gamma, vocab_width=width, **kw).stats
        if mode == names[2]:
            return generate(target, None, ids, gamma=args.lookup_gamma, lookup=fixed_lookup(args.lookup_gamma),
                            **kw).stats
        if mode == names[3]:
            return generate(target, None, ids, gamma="auto", costs=free_costs, lookup=auto_lookup, **kw).stats
        if mode == names[4]:
            return generate(target, draft, ids, gamma=args.gamma, vocab_width=width, lookup=fixed_lookup(args.gamma),
                            **kw).stats
        return generate(target, draft, ids, gamma="auto", costs=pair_costs, vocab_width=width, lookup=auto_lookup,
                        **kw).stats

    for name, probs in problems.items():
        prompts = [target.chat_prompt(p.prompt) for p in probs]
        rates = {m: [] for m in modes}
        predicted = {m: [] for m in modes}
        paired = {m: [] for m in modes}   # per (round, prompt): tok/s over the same prompt's target-only
        tot = {m: {"tokens": 0, "calls": 0, "steps": 0, "lookup": 0, "lookup_acc": 0} for m in modes}
        for rnd in range(args.rounds):
            for i, ids in enumerate(prompts):
                for mode in modes:
                    st = run(mode, ids, 1000 * rnd + i)
                    rates[mode].append(st.tokens_per_s)
                    paired[mode].append(st.tokens_per_s / rates[modes[0]][-1])
                    if st.cost_model_speedup is not None and "auto" in mode:
                        predicted[mode].append(st.cost_model_speedup)
                    t = tot[mode]
                    t["tokens"] += st.new_tokens
                    t["calls"] += st.target_calls
                    t["steps"] += sum(st.gamma_hist)
                    t["lookup"] += st.lookup_steps
                    t["lookup_acc"] += st.lookup_accepted
            print(f"{name}: round {rnd + 1} done", flush=True)
        base = statistics.median(rates[modes[0]])
        print(f"\n{name}: {len(prompts)} prompts x {args.rounds} rounds x {args.tokens} tokens, lossless, "
              f"{args.sampling}; target-only {base:.2f} tok/s")
        print(f"  {'setting':24} {'BE':>6} {'lookup steps':>12} {'acc/lookup':>10} {'tok/s':>7} {'vs target':>9} "
              f"{'paired (range)':>20} {'predicted':>9}")
        for mode in modes:
            t = tot[mode]
            med = statistics.median(rates[mode])
            share = f"{t['lookup'] / t['steps']:.0%}" if t["steps"] else ""
            acc = f"{t['lookup_acc'] / t['lookup']:.2f}" if t["lookup"] else ""
            pred = f"{statistics.mean(predicted[mode]):8.2f}x" if predicted[mode] else ""
            pair = paired[mode]
            pair_text = f"{statistics.median(pair):.2f}x ({min(pair):.2f}-{max(pair):.2f})"
            print(f"  {mode:24} {t['tokens'] / t['calls']:6.2f} {share:>12} {acc:>10} {med:7.2f} {med / base:8.2f}x "
                  f"{pair_text:>20} {pred:>9}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
