"""The cost model's parts against the measured ones, per SD step, on this machine (llama.cpp path).

For each prompt and round: target-only sampling, then lossless chains of each γ, each printing the
measured draft / target / engine ("other") seconds per step beside what the machine's cached cost
profile models for them (the draft's catch-up at the run's acceptance), and the measured speedup
over the target-only run just before it beside the modelled one (``Stats.cost_model_speedup``).
Single runs of ~100 tokens vary by ±7% on a shared VM, so the summary pools them per γ: measured =
all SD tokens over all SD seconds, against the same for target-only; modelled = the mean of the
runs' modelled speedups.

    .venv/bin/python benchmarks/cost_components.py [--gammas 1,3,5] [--tokens 96] [--rounds 2]
"""

from __future__ import annotations

import argparse

from verispec.runtime import tune_process

tune_process()

from gamma import PROMPTS  # noqa: E402  (benchmarks/gamma.py: the same prompts as the speed comparison)

from verispec.engine import cached_profile, generate, generate_target_only  # noqa: E402
from verispec.models import load_pair  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402
from verispec.settings import ModelSettings  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gammas", default="1,3,5")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    args = ap.parse_args(argv)
    sampling = SamplingConfig.parse(args.sampling)
    target, draft, width = load_pair(ModelSettings())
    prompts = [target.chat_prompt(p) for p in PROMPTS]
    gammas = [int(g) for g in args.gammas.split(",")]
    prof, _ = cached_profile(target, draft, prompts[0], g_max=max(8, *gammas))

    def ms(x: float) -> str:
        return f"{1000 * x:6.1f}"

    pooled: dict[int, list[float]] = {g: [0, 0.0] for g in [0, *gammas]}   # γ -> [tokens, seconds]
    modelled: dict[int, list[float]] = {g: [] for g in gammas}
    print("per step, measured / modelled ms; speedup measured / modelled")
    for rnd in range(args.rounds):
        for i, ids in enumerate(prompts):
            ref = generate_target_only(target, ids, sampling=sampling, max_new_tokens=args.tokens, seed=rnd,
                                       vocab_width=width).stats
            pooled[0][0] += ref.new_tokens
            pooled[0][1] += ref.wall_s
            print(f"round {rnd + 1} prompt {i + 1} target-only: target {ms(ref.verify_s / ref.target_calls)} / "
                  f"{ms(prof.target_token)}, other {ms(ref.other_s / ref.target_calls)} / "
                  f"{ms(prof.step_cost(0) * prof.target_token - prof.target_token)}, {ref.tokens_per_s:.2f} tok/s")
            for g in gammas:
                st = generate(target, draft, ids, rule="lossless", sampling=sampling, gamma=g, seed=rnd,
                              max_new_tokens=args.tokens, vocab_width=width, costs=prof).stats
                n = st.target_calls
                pooled[g][0] += st.new_tokens
                pooled[g][1] += st.wall_s
                modelled[g].append(st.cost_model_speedup)
                full = (sum(st.position_accepted) / max(sum(st.position_reached), 1)) ** g
                draft_model = (g - 1) * prof.draft_token + full * prof.draft_feed(2) + (1 - full) * prof.draft_token
                other_model = (prof.step_cost(g) - prof.v(g)) * prof.target_token - prof.draft_token * g
                print(f"  γ={g}: draft {ms(st.draft_s / n)} / {ms(draft_model)}, target {ms(st.verify_s / n)} / "
                      f"{ms(prof.target_block[g])}, other {ms(st.other_s / n)} / {ms(other_model)}, "
                      f"speedup {st.tokens_per_s / ref.tokens_per_s:.2f} / {st.cost_model_speedup:.2f}x "
                      f"(BE {st.block_efficiency:.2f})", flush=True)
    ref_rate = pooled[0][0] / pooled[0][1]
    print(f"pooled over {args.rounds} round(s) x {len(prompts)} prompts: target-only {ref_rate:.2f} tok/s")
    for g in gammas:
        measured = pooled[g][0] / pooled[g][1] / ref_rate
        model = sum(modelled[g]) / len(modelled[g])
        print(f"  γ={g}: speedup measured {measured:.2f}x, modelled {model:.2f}x "
              f"({100 * (model / measured - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
