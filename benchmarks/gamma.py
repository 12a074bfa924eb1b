"""Draft length on this machine: fixed γ vs ``γ = auto`` (per step) vs ``--draft-stop auto`` (per token) vs
target-only, measured in one run.

On the embedded pair (llama.cpp), for lossless SD and for lossy rules: tokens/s of each setting over
target-only sampling, block efficiency, mean γ per step, and the cost model's predicted speedup (new
tokens / Σ over the steps taken of γc + v(γ), from the machine's cached cost profile) beside the
measured one.  Settings are interleaved round by round so that a busy machine slows them alike.

    .venv/bin/python benchmarks/gamma.py [--tokens 96] [--rounds 2] [--gammas 1,2,3,5]
        [--rules lossless,lenience:ell=0.5,speccascade:p_base=0.3] [--n-threads N] [--stop auto,5]

``--stop``: the draft lengths also run with ``draft_stop="auto"`` (``auto+stop``: γ chosen by the cost
model per step, chains cut per token; ``5+stop``: at most 5 tokens, cut per token).
"""

from __future__ import annotations

import argparse
import statistics

from verispec.runtime import tune_process

tune_process()

from verispec.engine import cached_profile, generate, generate_target_only  # noqa: E402
from verispec.models import load_pair  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402
from verispec.settings import ModelSettings  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? Think step by step.",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gammas", default="1,2,3,5")
    ap.add_argument("--rules", default="lossless,lenience:ell=0.5,speccascade:p_base=0.3")
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--stop", default="auto", help="comma-separated γ (or auto) also run with draft_stop=auto; "
                    "'' for none")
    args = ap.parse_args(argv)
    sampling = SamplingConfig.parse(args.sampling)
    settings = ModelSettings(n_threads=args.n_threads)
    target, draft, width = load_pair(settings)
    prompts = [target.chat_prompt(p) for p in PROMPTS]
    gammas = [int(g) for g in args.gammas.split(",")]
    profile, measured = cached_profile(target, draft, prompts[0], n_threads=args.n_threads,
                                       g_max=max(8, *gammas))
    busy = "" if profile.busy is None else f", other work {100 * profile.busy:.0f}% of the CPU"
    print(f"cost profile ({'measured now' if measured else 'cached'}{busy}): c = {profile.c:.3f}, "
          + ", ".join(f"v({g}) = {profile.v(g):.2f}" for g in range(1, profile.g_max + 1)))
    settings_list = [("target-only", None, 0)]
    for rule in args.rules.split(","):
        settings_list += [(rule, rule, g) for g in gammas] + [(rule, rule, "auto")]
        settings_list += [(rule, rule, f"{g}+stop") for g in args.stop.split(",") if g]

    rates: dict = {s: [] for s in settings_list}
    totals: dict = {s: {"tokens": 0, "calls": 0, "steps_g": 0.0, "steps": 0, "pred": []} for s in settings_list}
    for rnd in range(args.rounds):
        for s in settings_list:
            label, rule, g = s
            for i, ids in enumerate(prompts):
                seed = 1000 * rnd + i
                if rule is None:
                    res = generate_target_only(target, ids, sampling=sampling, max_new_tokens=args.tokens, seed=seed)
                else:
                    gamma, stop = str(g).split("+")[0], "auto" if "+stop" in str(g) else 0.0
                    res = generate(target, draft, ids, rule=rule, sampling=sampling,
                                   gamma=gamma if gamma == "auto" else int(gamma), max_new_tokens=args.tokens,
                                   seed=seed, vocab_width=width, costs=profile, draft_stop=stop)
                st = res.stats
                rates[s].append(st.tokens_per_s)
                t = totals[s]
                t["tokens"] += st.new_tokens
                t["calls"] += st.target_calls
                t["steps"] += sum(st.gamma_hist)
                t["steps_g"] += st.mean_gamma * sum(st.gamma_hist)
                if st.cost_model_speedup is not None:
                    t["pred"].append(st.cost_model_speedup)
            print(f"round {rnd + 1} {label:28} γ={g!s:9} {statistics.median(rates[s][-len(prompts):]):6.2f} tok/s",
                  flush=True)

    base = statistics.median(rates[settings_list[0]])
    print(f"\nmedian tokens/s over {args.rounds} rounds x {len(prompts)} prompts, {args.tokens} tokens, "
          f"{args.sampling}; ratio to target-only ({base:.2f} tok/s):")
    print(f"  {'rule':28} {'γ':>9} {'tok/s':>7} {'measured':>9} {'predicted':>9} {'BE':>6} {'mean γ':>7}")
    for s in settings_list:
        label, rule, g = s
        t = totals[s]
        med = statistics.median(rates[s])
        pred = f"{statistics.median(t['pred']):.2f}x" if t["pred"] else ""
        mean_g = t["steps_g"] / t["steps"] if t["steps"] else 0.0
        print(f"  {label:28} {g!s:>9} {med:7.2f} {med / base:8.2f}x {pred:>9} {t['tokens'] / t['calls']:6.2f} "
              f"{mean_g:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
