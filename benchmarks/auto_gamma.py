"""``--gamma auto`` against every draft-length schedule it competes with, per prompt class, in one run.

For each backend -- ``llama`` (the embedded GGUF pair, llama.cpp) and ``hf`` (the same pair dequantised to
float32 by transformers, verispec's transformers backend on one side and transformers' own assisted
generation on the other, the same model objects) -- and each prompt class (code, arithmetic, prose, a
repetitive one), every round runs, interleaved so that a slow spell of the machine hits all of them:

* ``target-only`` (verispec's ``generate_target_only``): the reference of every ratio;
  (the modes run in an order rotated from one prompt to the next, so that none always runs first)
* ``γ=G`` for every fixed ``G`` of ``--gammas``: lossless chain SD;
* ``auto``: ``gamma="auto", draft_stop=0.0`` (the cost model picks γ per step alone,
  :class:`~verispec.engine.gamma.AutoGamma`);
* ``auto+stop``: ``gamma="auto"`` and ``draft_stop="auto"`` (and the chain is cut token by token): what
  ``gamma="auto"`` does by default with a draft model;
* with ``--lookup-gammas G1,G2``: ``lookup γ=G`` and ``lookup auto``, prompt lookup alone (no draft model;
  :class:`~verispec.engine.gamma.LookupGamma` chooses how many of its tokens to verify), whose drafts pay on
  llama.cpp on machines where the draft model's do not;
* with ``--draft-vocab K``: ``auto, vocab K``, ``auto+stop, vocab K`` and ``γ=G, vocab K`` (``--vocab-gammas``):
  the draft computing only the ``K`` most frequent tokens of its output layer
  (:mod:`verispec.models.draft_vocab`: transformers slices the output layer's rows, llama.cpp runs a GGUF
  whose vocabulary and output layer are cut to the subset, :mod:`verispec.models.gguf_vocab`);
* ``hf`` only: ``transformers default`` (``assistant_model`` with its defaults: 20 tokens, constant schedule,
  confidence threshold 0.4), ``transformers heuristic`` (γ + 2 after a block accepted whole, γ − 1 otherwise,
  from γ = 5) and ``transformers constant γ=5``, and where verispec's backend computes few-row linears
  weight-major, ``transformers default, w-major``: its default inside that kernel layout.

Each generation is timed end to end (prefill included, as a user waits for it) and watched by
:class:`~verispec.engine.calibrate.OtherLoad`: one during which other work took more than ``--quiet`` of the
CPU is run again (up to ``--retries`` times; the share is printed). Printed per backend and class: the
median tokens/s over the rounds and its range, the median over rounds of the ratio to target-only measured
in the same round, tokens per target call (BE), the mean draft length per step (transformers: draft forwards
per target forward), the acceptance per verified draft position, and the cost model's predicted speedup
(verispec: ``Stats.cost_model_speedup`` over the steps taken; transformers: its calls priced by the same
profile). Then, per class, auto's ratio to the best fixed γ in hindsight and to transformers' default, and
over all classes (``overall``: per round, every class's tokens over every class's seconds; the median over
rounds of its ratio to target-only's).

    .venv/bin/python benchmarks/auto_gamma.py [--backends llama,hf] [--tokens 64] [--rounds 3]
        [--gammas 1,2,3,4,6,8,12,15] [--g-max 16] [--draft-vocab 32768] [--classes code,prose] [--only 'auto$,γ=3']
        [--layout weight-major] [--budget 420]

``--budget`` (or a SIGTERM, e.g. from ``timeout``) ends the run after the last round that fits and reports the
rounds completed.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from verispec.runtime import tune_process

tune_process()

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from assisted import ASSIST_KEYS, CallCounter, hf_config, load_model  # noqa: E402

from verispec.engine import cached_profile, generate, generate_target_only  # noqa: E402
from verispec.engine.calibrate import BUSY_LIMIT, OtherLoad, other_load_now  # noqa: E402
from verispec.engine.costs import DEFAULT_G_MAX  # noqa: E402
from verispec.engine.ngram import NgramDrafter  # noqa: E402
from verispec.models import load_pair  # noqa: E402
from verispec.models.cpu_linear import WeightMajorLinear, describe_plan  # noqa: E402
from verispec.models.draft_vocab import draft_vocabulary, with_draft_vocab  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402
from verispec.settings import ModelSettings  # noqa: E402

PROMPTS = {
    "code": "Write a Python function that checks whether a string is a palindrome, ignoring case and punctuation. "
            "Include a docstring and three example calls.",
    "arithmetic": "A shop sells pencils at 3 for $0.75 and pens at $1.20 each. Tom buys 12 pencils and 5 pens and "
                  "pays with a $10 bill. How much change does he get? Explain step by step.",
    "prose": "Write a short story, in plain prose, about a lighthouse keeper who finds a message in a bottle.",
    "repetitive": "List the numbers from 1 to 30, one per line, each followed by its square, in the form "
                  "'n squared is m'.",
}


def _ours(target, draft, profile, sampling, width, gamma, stop=0.0, lookup=False):
    """verispec's lossless chains; ``lookup``: prompt lookup drafts (with ``draft=None``: alone)."""
    def run(ids, n, seed):
        drafter = NgramDrafter(max_tokens=profile.g_max if gamma == "auto" else gamma) if lookup else None
        r = generate(target, draft, ids, rule="lossless", sampling=sampling, gamma=gamma, draft_stop=stop,
                     max_new_tokens=n, seed=seed, vocab_width=width, costs=profile, lookup=drafter)
        st = r.stats
        hist = st.gamma_hist
        return {"tokens": st.new_tokens, "calls": st.target_calls,
                "mean_g": sum(k * v for k, v in enumerate(hist)) / max(sum(hist), 1),
                "accepted": sum(st.position_accepted), "verified": sum(st.position_reached),
                "predicted": st.cost_model_speedup}
    return run


def _target_only(target, sampling, width):
    def run(ids, n, seed):
        st = generate_target_only(target, ids, sampling=sampling, max_new_tokens=n, seed=seed, vocab_width=width).stats
        return {"tokens": st.new_tokens, "calls": st.target_calls, "mean_g": 0.0, "accepted": 0, "verified": 0,
                "predicted": 1.0}
    return run


def _theirs(target_model, draft_model, sampling, eos, profile, counters, assist, row_plan=None):
    """transformers' assisted generation with ``assist`` (settings read from the assistant's generation config);
    ``row_plan``: inside verispec's weight-major linear layout with this plan of products per row count (the
    target backend's: one mode covers both models' calls)."""
    target_calls, draft_calls = counters

    def run(ids, n, seed):
        prompt = torch.tensor([ids])
        torch.manual_seed(seed)
        before, draft_before = target_calls.calls, draft_calls.calls
        for key in ASSIST_KEYS:
            setattr(draft_model.generation_config, key, assist.get(key))
        with WeightMajorLinear(plan=row_plan) if row_plan is not None else contextlib.nullcontext():
            out = target_model.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=draft_model,
                                        generation_config=hf_config(sampling, n, eos))
        tokens = int(out.shape[1] - prompt.shape[1])
        calls, drafts = target_calls.calls - before, draft_calls.calls - draft_before
        mean_g = drafts / max(calls, 1)
        g = min(max(round(mean_g), 0), profile.g_max)   # its steps priced at their mean length
        cost = calls * profile.verify_cost(g) + drafts * profile.c
        return {"tokens": tokens, "calls": calls, "mean_g": mean_g, "accepted": None, "verified": None,
                "predicted": tokens * profile.step_cost(0) / cost if cost else None}
    return run


def _pair(backend: str, dtype: torch.dtype, layout: str = "auto"):
    """``(target, draft, width, extras)``; ``extras``: the transformers model objects for their modes."""
    if backend == "llama":
        target, draft, width = load_pair(ModelSettings())
        return target, draft, width, None
    from verispec.models import check_compatible
    from verispec.models.hf import HFBackend

    target_model, tokenizer = load_model("embedded-target", dtype)
    draft_model, _ = load_model("embedded-draft", dtype)
    target = HFBackend(target_model, tokenizer=tokenizer, linear_layout=layout)
    draft = HFBackend(draft_model, tokenizer=tokenizer, linear_layout=layout)
    return target, draft, check_compatible(target, draft), (target_model, draft_model)


def _quiet_profile(target, draft, ids, g_max: int, wait_s: float):
    """The pair's cached profile; one measured on a busy machine is measured again once the machine is quiet
    (waiting up to ``wait_s`` seconds for that)."""
    profile, measured = cached_profile(target, draft, ids, g_max=g_max)
    deadline = time.time() + wait_s
    while profile.busy is not None and profile.busy > BUSY_LIMIT and time.time() < deadline:
        share = other_load_now(2.0)
        if share is not None and share < BUSY_LIMIT / 2:
            profile, measured = cached_profile(target, draft, ids, g_max=g_max, refresh=True)
    return profile, measured


def _timed(run, ids, n, seed, quiet: float, retries: int):
    """``(result, seconds, others' CPU share)`` of the quietest of up to ``retries + 1`` tries."""
    best = None
    for _ in range(retries + 1):
        with OtherLoad() as load:
            t = time.perf_counter()
            res = run(ids, n, seed)
            dt = time.perf_counter() - t
        share = load.share if load.share is not None else 0.0
        if best is None or share < best[2]:
            best = (res, dt, share)
        if share <= quiet:
            break
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="llama,hf")
    ap.add_argument("--classes", default=",".join(PROMPTS))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gammas", default="1,2,3,4,6,8,12,15")
    ap.add_argument("--g-max", type=int, default=DEFAULT_G_MAX, help="longest draft of the cost profile (auto's cap)")
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    ap.add_argument("--dtype", default="float32", help="transformers backend's dtype")
    ap.add_argument("--layout", default="auto", help="transformers backend's linear layout (auto: timed at load)")
    ap.add_argument("--draft-vocab", type=int, default=0, help="also run with a draft of this many output tokens")
    ap.add_argument("--vocab-gammas", default="3,5")
    ap.add_argument("--lookup-gammas", default="", help="also run prompt lookup alone (no draft model) at these "
                    "fixed γ and with γ auto (LookupGamma): drafts that pay on llama.cpp where the draft model's don't")
    ap.add_argument("--quiet", type=float, default=0.15, help="others' CPU share above which a run is repeated")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for a quiet machine to re-measure a "
                    "cost profile measured on a busy one")
    ap.add_argument("--only", default="", help="comma-separated texts: keep the modes whose names contain one (a "
                    "text ending in $: the mode of exactly that name; separate them by ; where a name holds a comma)")
    ap.add_argument("--budget", type=float, default=0, help="seconds: start no round that would end after this "
                    "(from the start; 0: no limit); SIGTERM also reports the rounds completed")
    args = ap.parse_args(argv)
    started = time.time()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    sampling = SamplingConfig.parse(args.sampling)
    gammas = [int(g) for g in args.gammas.split(",") if g]
    classes = [c for c in args.classes.split(",") if c]
    unknown = [c for c in classes if c not in PROMPTS]
    if unknown:
        raise SystemExit(f"unknown prompt class {unknown[0]!r}: choose from {', '.join(PROMPTS)}")
    if max(gammas) > args.g_max:
        raise SystemExit(f"--gammas go up to {max(gammas)}, beyond --g-max {args.g_max}")

    for backend in [b for b in args.backends.split(",") if b]:
        target, draft, width, hf = _pair(backend, getattr(torch, args.dtype), args.layout)
        prompts = {c: target.chat_prompt(PROMPTS[c]) for c in classes}
        first = prompts[classes[0]]
        profile, measured = _quiet_profile(target, draft, first, args.g_max, args.wait)
        label = "llama.cpp (embedded Q4_K_M pair)" if backend == "llama" else \
            f"transformers {args.dtype} (embedded pair dequantised), layout {target.linear_layout} " \
            f"(target: {describe_plan(target.row_plan)}; draft: {describe_plan(draft.row_plan)})"
        print(f"\n######## {label}: cost profile ({'measured now' if measured else 'cached'}, other work "
              f"{'?' if profile.busy is None else format(100 * profile.busy, '.0f')}% of the CPU): target token "
              f"{1000 * profile.target_token:.1f} ms, c = {profile.c:.3f}, "
              + ", ".join(f"v({g}) = {profile.v(g):.2f}" for g in range(1, profile.g_max + 1)), flush=True)
        modes = {"target-only": _target_only(target, sampling, width)}
        for g in gammas:
            modes[f"γ={g}"] = _ours(target, draft, profile, sampling, width, g)
        modes["auto"] = _ours(target, draft, profile, sampling, width, "auto")
        modes["auto+stop"] = _ours(target, draft, profile, sampling, width, "auto", stop="auto")
        if args.draft_vocab:
            ids = draft_vocabulary(draft, args.draft_vocab)
            small = with_draft_vocab(draft, ids)
            small_prof, _ = _quiet_profile(target, small, first, args.g_max, args.wait)
            k = f"vocab {args.draft_vocab}"
            print(f"draft with {len(ids)} output tokens ({type(small).__name__}): c = {small_prof.c:.3f} "
                  f"(full: {profile.c:.3f}), draft token {1000 * small_prof.draft_token:.1f} ms "
                  f"(full: {1000 * profile.draft_token:.1f} ms)", flush=True)
            modes[f"auto, {k}"] = _ours(target, small, small_prof, sampling, width, "auto")
            modes[f"auto+stop, {k}"] = _ours(target, small, small_prof, sampling, width, "auto", stop="auto")
            for g in (int(x) for x in args.vocab_gammas.split(",") if x):
                modes[f"γ={g}, {k}"] = _ours(target, small, small_prof, sampling, width, g)
        if args.lookup_gammas:
            lookup_prof, _ = _quiet_profile(target, None, first, args.g_max, args.wait)
            for g in (int(x) for x in args.lookup_gammas.split(",") if x):
                modes[f"lookup γ={g}"] = _ours(target, None, lookup_prof, sampling, width, g, lookup=True)
            modes["lookup auto"] = _ours(target, None, lookup_prof, sampling, width, "auto", lookup=True)
        if hf is not None:
            target_model, draft_model = hf
            counters = (CallCounter(target_model.get_output_embeddings()),
                        CallCounter(draft_model.get_output_embeddings()))
            eos = sorted(target.eos_token_ids)
            for name, assist in [("transformers default", {}),
                                 ("transformers heuristic", {"num_assistant_tokens": 5,
                                                             "num_assistant_tokens_schedule": "heuristic_transient",
                                                             "assistant_confidence_threshold": 0.0}),
                                 ("transformers constant γ=5", {"num_assistant_tokens": 5,
                                                                "num_assistant_tokens_schedule": "constant",
                                                                "assistant_confidence_threshold": 0.0})]:
                modes[name] = _theirs(target_model, draft_model, sampling, eos, profile, counters, assist)
            if target.linear_layout == "weight-major":      # the same schedule with verispec's kernel layout
                modes["transformers default, w-major"] = _theirs(target_model, draft_model, sampling, eos, profile,
                                                                 counters, {}, row_plan=target.row_plan)
        if args.only:
            wanted = [w.strip() for w in args.only.split(";" if ";" in args.only else ",") if w.strip()]
            modes = {n: r for n, r in modes.items()
                     if n == "target-only" or any(n == w[:-1] if w.endswith("$") else w in n for w in wanted)}
        for run in modes.values():          # warm-up, not timed
            run(first, 4, 0)

        # results[cls][mode] -> list of per-round dicts (with "s", "share", "ratio")
        results: dict = defaultdict(lambda: defaultdict(list))
        done = 0
        try:
            done = _rounds(args, classes, modes, prompts, results, started)
        except _Stopped:
            print("stopped (SIGTERM/SIGINT): reporting the rounds completed", flush=True)
            done = min((len(results[c][n]) for c in classes for n in modes), default=0)
            for cls in classes:
                for name in modes:
                    del results[cls][name][done:]
        if done:
            _report(label, args, done, classes, modes, results)
    return 0


class _Stopped(Exception):
    pass


def _stop(*_):
    raise _Stopped


def _rounds(args, classes, modes, prompts, results, started: float) -> int:
    """Run up to ``args.rounds`` rounds into ``results``; the number completed (``--budget`` may stop it early)."""
    for rnd in range(args.rounds):
        t_round = time.time()
        for cls in classes:
            ids = prompts[cls]
            order = list(modes.items())
            shift = (rnd * len(classes) + classes.index(cls)) % len(order)   # no mode always runs first
            for name, run in order[shift:] + order[:shift]:
                res, dt, share = _timed(run, ids, args.tokens, 1000 * rnd + classes.index(cls), args.quiet,
                                        args.retries)
                res.update(s=dt, share=share)
                results[cls][name].append(res)
            ref = results[cls]["target-only"][-1]
            for name in modes:
                r = results[cls][name][-1]
                r["ratio"] = (r["tokens"] / r["s"]) / (ref["tokens"] / ref["s"])
            print(f"round {rnd + 1}/{args.rounds} {cls} done (others' CPU share, max over modes: "
                  f"{100 * max(results[cls][n][-1]['share'] for n in modes):.0f}%)", flush=True)
        spent = time.time() - started
        if args.budget and rnd + 1 < args.rounds and spent + (time.time() - t_round) > args.budget:
            print(f"--budget {args.budget:.0f} s: another round would not fit ({spent:.0f} s spent); reporting "
                  f"{rnd + 1} rounds", flush=True)
            return rnd + 1
    return args.rounds


def _report(label, args, rounds, classes, modes, results) -> None:
    print(f"\n== {label}: lossless, {args.sampling}, {rounds} rounds x {args.tokens} new tokens per prompt, "
          f"{torch.get_num_threads()} torch threads; ratio: median over rounds of tok/s / target-only's in the "
          "same round")
    head = (f"  {'mode':24} {'tok/s':>6} {'range':>13} {'ratio':>6} {'range':>11} {'BE':>5} {'mean γ':>6} "
            f"{'accept':>6} {'predicted':>9} {'others':>6}")
    summary = []
    for cls in classes:
        print(f" [{cls}]\n{head}")
        med = {}
        for name in modes:
            rows = results[cls][name]
            rates = [r["tokens"] / r["s"] for r in rows]
            ratios = [r["ratio"] for r in rows]
            med[name] = statistics.median(ratios)
            calls = sum(r["calls"] for r in rows)
            be = sum(r["tokens"] for r in rows) / calls if calls else float("nan")
            ver = sum(r["verified"] or 0 for r in rows)
            acc = f"{sum(r['accepted'] or 0 for r in rows) / ver:6.2f}" if ver else f"{'':6}"
            preds = [r["predicted"] for r in rows if r["predicted"] is not None]
            pred = f"{statistics.median(preds):8.2f}x" if preds else f"{'':9}"
            print(f"  {name:24} {statistics.median(rates):6.2f} {min(rates):6.2f}-{max(rates):<6.2f} "
                  f"{med[name]:5.2f}x {min(ratios):5.2f}-{max(ratios):<5.2f} {be:5.2f} "
                  f"{statistics.mean(r['mean_g'] for r in rows):6.2f} {acc} {pred} "
                  f"{100 * max(r['share'] for r in rows):5.0f}%")
        summary.append(f"  {cls}:" + "".join(f" {auto} / {text};" for auto in med if _is_auto(auto)
                                             for text in _against(auto, med)))
    print(" per class:")
    print("\n".join(summary))
    base = [_pooled_rate(results, classes, "target-only", rnd) for rnd in range(rounds)]
    overall = {name: [_pooled_rate(results, classes, name, rnd) / base[rnd] for rnd in range(rounds)]
               for name in modes}
    print(f" overall ({len(classes)} classes, median over rounds of the ratio to target-only, range):")
    for name, ratios in overall.items():
        print(f"  {name:30} {statistics.median(ratios):5.2f}x {min(ratios):5.2f}-{max(ratios):<5.2f}")
    medians = {name: statistics.median(ratios) for name, ratios in overall.items()}
    for auto in [n for n in medians if _is_auto(n)]:
        print(f"  overall {auto}:" + "".join(f" / {text};" for text in _against(auto, medians)))


def _is_auto(mode: str) -> bool:
    return mode.startswith("auto") or mode == "lookup auto"


def _against(auto: str, ratios: dict[str, float]) -> list[str]:
    """``auto``'s ratio to the best fixed full-vocabulary γ (``lookup auto``: of prompt lookup) and to
    transformers' default schedules among ``ratios`` (mode -> ratio to target-only), e.g. ``best fixed (γ=4)
    1.16x``."""
    family = "lookup γ=" if auto.startswith("lookup") else "γ="
    fixed = {n: v for n, v in ratios.items() if n.startswith(family) and "vocab" not in n}
    texts = []
    if fixed:
        best = max(fixed, key=fixed.get)
        texts.append(f"best fixed ({best}) {ratios[auto] / fixed[best]:.2f}x")
    for theirs in ("transformers default", "transformers default, w-major"):
        if theirs in ratios and family == "γ=":
            texts.append(f"{theirs} {ratios[auto] / ratios[theirs]:.2f}x")
    return texts


def _pooled_rate(results, classes, mode: str, rnd: int) -> float:
    """Tokens per second of ``mode`` in round ``rnd`` over every class (their tokens over their seconds)."""
    rows = [results[cls][mode][rnd] for cls in classes]
    return sum(r["tokens"] for r in rows) / sum(r["s"] for r in rows)


if __name__ == "__main__":
    raise SystemExit(main())
