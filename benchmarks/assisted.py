"""verispec vs transformers' assisted generation, the same models on both sides, measured in one run.

Both sides run the same transformers model objects (the embedded pair dequantised to float32 by
transformers, unless ``--target`` / ``--draft`` name other models: a ``.gguf`` file, a hub id or a
directory), the same sampling (default T 0.7 / top-k 20 / top-p 0.8, applied to draft and target
alike) and the same prompts (chat template, two code and two arithmetic requests), each generation
stopping at the end-of-text token or after ``--tokens`` new tokens. Modes, interleaved per prompt
and round so that a slow spell of the machine hits all of them:

* ``target-only`` (verispec's ``generate_target_only``) and ``transformers target-only`` (plain
  ``generate``): the reference for both speed-ups;
* ``verispec γ=G``: lossless chain SD with a constant draft length;
* ``verispec auto``: ``gamma="auto"`` and ``draft_stop="auto"`` from this machine's cached cost
  profile of the pair (measured before the timed runs when absent: ``verispec calibrate`` measures the
  same thing, and generation then reads it from the cache);
* ``verispec auto + prompt lookup``: the same, drafting the continuation of an earlier occurrence
  of the text's suffix where there is one (free drafts), the draft model otherwise (transformers
  offers prompt lookup only instead of an assistant model, not beside it);
* ``transformers default``: ``assistant_model`` with transformers' own defaults (20 assistant
  tokens, ``constant`` schedule, assistant confidence threshold 0.4, adapted from the ROC curve of
  past drafts when scikit-learn is installed);
* ``transformers heuristic``: the ``heuristic`` schedule (γ + 2 after a fully accepted block, γ − 1
  otherwise) from γ = G, no confidence stop;
* ``transformers constant γ=G``: G drafts every step, no confidence stop (the same work as ours);
* ``transformers default, weight-major linears`` and ``transformers constant γ=G, weight-major
  linears``: the same inside verispec's :class:`~verispec.models.cpu_linear.WeightMajorLinear` mode
  (multi-row linears computed as ``(W @ x.T).T``), when verispec's transformers backend chose that
  layout on this machine: they separate what the kernel layout gives from what verispec's engine
  and schedule give;
* ``verispec auto, RULE`` and ``verispec γ=G, RULE`` (one pair per ``--rules`` entry, none by
  default): a lossy rule, e.g. ``lenience:ell=0.5`` or ``speccascade:p_base=0.3``, with ``auto`` and
  with the fixed γ (its speed-up and the γ auto chose for it; transformers has no lossy verification);
* ``verispec tree SPEC`` (one per ``--trees`` entry, none by default): lossless SD drafting that tree
  (e.g. ``dynamic:top_k=4,depth=5,nodes=16``); transformers has no tree drafting;
* ``verispec prompt lookup (auto)`` and ``transformers prompt lookup``: draft-free drafting on both
  sides, no assistant model: ours with ``gamma="auto"`` (the cost model decides per step whether
  and how much of lookup's draft to verify; its target costs are read from the pair's profile),
  theirs with ``prompt_lookup_num_tokens=10`` (its documented example; matches of up to 2 tokens).

``--only a,b`` keeps the modes whose names contain one of the given texts (e.g. ``--only
target-only,lookup`` for the draft-free comparison alone).

Printed per mode: tokens/s (all tokens over all wall time, prefill included); milliseconds per
generated token spent in target model calls, in draft model calls and outside both (engine, sampling,
rule, transformers' own bookkeeping; forward hooks on both models); tokens per target
forward (BE; verispec: its statistics, prefill excluded; transformers: forwards of the target's
output layer counted by a hook, the first one included where it verifies drafts), the mean
draft length per step (transformers: draft forwards per target forward, one per drafted token),
and the speed-up over verispec's target-only and over each transformers mode.

    .venv/bin/python benchmarks/assisted.py [--tokens 96] [--rounds 1] [--gamma 5] [--prompts 4]
        [--target embedded-target] [--draft embedded-draft] [--dtype float32] [--g-max 12] [--only a,b]
        [--trees "SPEC;SPEC"] [--rules "RULE;RULE"]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import time
from collections import defaultdict
from pathlib import Path

from verispec.runtime import tune_process

tune_process()

import torch  # noqa: E402

from verispec.engine import cached_profile, generate, generate_target_only  # noqa: E402
from verispec.engine.ngram import NgramDrafter  # noqa: E402
from verispec.engine.tree import TreeShape  # noqa: E402
from verispec.models.cpu_linear import WeightMajorLinear  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, ignoring case and punctuation. "
    "Include a docstring and three example calls.",
    "A shop sells pencils at 3 for $0.75 and pens at $1.20 each. Tom buys 12 pencils and 5 pens and pays "
    "with a $10 bill. How much change does he get? Explain step by step.",
    "Write a Python class for a bank account with deposit, withdraw (refusing overdrafts) and a transaction "
    "history, with docstrings.",
    "A train leaves at 9:40 and travels 210 km at 84 km/h, then stops for 15 minutes and travels 96 km at "
    "72 km/h. When does it arrive? Show the steps.",
]


def load_model(spec: str, dtype: torch.dtype):
    """(model, tokenizer) from ``embedded-target`` / ``embedded-draft``, a ``.gguf`` file, a hub id or a directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec in ("embedded-target", "embedded-draft"):
        from verispec.models import embedded_model_path

        spec = str(embedded_model_path(spec.split("-")[1]))
    kw = {}
    if spec.endswith(".gguf"):   # dequantised by transformers
        path = Path(spec)
        spec, kw = str(path.parent), {"gguf_file": path.name}
    model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype, **kw).eval()
    return model, AutoTokenizer.from_pretrained(spec, **kw)


class CallCounter:
    """Counts forward calls of a module and the seconds spent in them (forward hooks)."""

    def __init__(self, module) -> None:
        self.calls, self.seconds, self._start = 0, 0.0, 0.0
        module.register_forward_pre_hook(self._pre)
        module.register_forward_hook(self._post)

    def _pre(self, *_) -> None:
        self._start = time.perf_counter()

    def _post(self, *_) -> None:
        self.calls += 1
        self.seconds += time.perf_counter() - self._start


#: assisted-generation settings transformers takes from the assistant model's generation config
ASSIST_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def hf_config(sampling: SamplingConfig, n: int, eos: list[int]):
    from transformers import GenerationConfig

    return GenerationConfig(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None,
                            top_p=sampling.top_p, max_new_tokens=n, eos_token_id=eos, pad_token_id=eos[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded-target")
    ap.add_argument("--draft", default="embedded-draft")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--g-max", type=int, default=12, help="longest draft the cost profile measures (auto's cap)")
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    ap.add_argument("--skip-target-only", action="store_true")
    ap.add_argument("--rules", default="", help="semicolon-separated lossy rule specs: verispec modes with each")
    ap.add_argument("--trees", default="", help="semicolon-separated tree specs: one verispec mode each")
    ap.add_argument("--only", default="", help="comma-separated texts: run the modes whose names contain one")
    args = ap.parse_args(argv)

    from verispec.models import check_compatible
    from verispec.models.hf import HFBackend

    dtype = getattr(torch, args.dtype)
    target_model, tokenizer = load_model(args.target, dtype)
    draft_model, _ = load_model(args.draft, dtype)
    target = HFBackend(target_model, tokenizer=tokenizer)
    draft = HFBackend(draft_model, tokenizer=tokenizer)
    width = check_compatible(target, draft)
    sampling = SamplingConfig.parse(args.sampling)
    prompts = [target.chat_prompt(p) for p in PROMPTS[: args.prompts]]
    eos = sorted(target.eos_token_ids)
    counter = CallCounter(target_model.get_output_embeddings())   # one call per target forward
    draft_counter = CallCounter(draft_model.get_output_embeddings())
    target_time, draft_time = CallCounter(target_model), CallCounter(draft_model)   # whole model calls
    g = args.gamma
    print(f"verispec's linear layout for multi-row calls (measured): target {target.linear_layout}, "
          f"draft {draft.linear_layout}")

    t = time.perf_counter()
    profile, measured = cached_profile(target, draft, prompts[0], g_max=args.g_max)
    print(f"cost profile ({'measured now, ' + format(time.perf_counter() - t, '.0f') + ' s' if measured else 'cached'})"
          f"{'' if profile.busy is None else f', other work {100 * profile.busy:.0f}% of the CPU'}"
          f": target token {1000 * profile.target_token:.0f} ms, c = {profile.c:.3f}, "
          + ", ".join(f"v({k}) = {profile.v(k):.2f}" for k in (1, 2, 3, 5, 8, args.g_max) if k <= profile.g_max))

    def ours(mode, tree=None, rule="lossless"):
        def run(ids, n, seed):
            kw = {"gamma": "auto", "draft_stop": "auto"} if mode != "fixed" else {"gamma": g, "tree": tree}
            if mode in ("auto+lookup", "lookup"):
                kw["lookup"] = NgramDrafter(min_ngram=1, max_ngram=4)   # auto judges matches by their length
            if mode == "lookup":
                kw.pop("draft_stop")
            r = generate(target, None if mode == "lookup" else draft, ids, rule=rule, sampling=sampling,
                         max_new_tokens=n, seed=seed, vocab_width=width, costs=profile, **kw)
            hist = r.stats.gamma_hist   # index k: steps that drafted k tokens
            return r.stats.new_tokens, r.stats.target_calls, sum(k * v for k, v in enumerate(hist)) / max(sum(hist), 1)
        return run

    def ours_target_only(ids, n, seed):
        r = generate_target_only(target, ids, sampling=sampling, max_new_tokens=n, seed=seed, vocab_width=width)
        return r.stats.new_tokens, r.stats.target_calls, 0.0

    def theirs(assist: dict | None, lookup_tokens: int = 0, weight_major: bool = False):
        def run(ids, n, seed):
            prompt = torch.tensor([ids])
            torch.manual_seed(seed)
            before, draft_before = counter.calls, draft_counter.calls
            extra = {}
            if assist is not None:
                # transformers reads these three from the *assistant's* generation config (None: its defaults)
                for key in ASSIST_KEYS:
                    setattr(draft_model.generation_config, key, assist.get(key))
                extra["assistant_model"] = draft_model
            if lookup_tokens:
                extra["prompt_lookup_num_tokens"] = lookup_tokens
            with WeightMajorLinear(plan=target.row_plan) if weight_major else contextlib.nullcontext():
                out = target_model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                            generation_config=hf_config(sampling, n, eos), **extra)
            new = int(out.shape[1] - prompt.shape[1])
            calls = counter.calls - before - (assist is None and not lookup_tokens)   # plain: prefill emits token 1
            return new, calls, (draft_counter.calls - draft_before) / max(calls, 1)
        return run

    modes = {}
    if not args.skip_target_only:
        modes["verispec target-only"] = ours_target_only
        modes["transformers target-only"] = theirs(None)
    modes[f"verispec γ={g}"] = ours("fixed")
    modes["verispec auto (γ and stop)"] = ours("auto")
    modes["verispec auto + prompt lookup"] = ours("auto+lookup")
    for rule in filter(None, (r.strip() for r in args.rules.split(";"))):
        modes[f"verispec auto, {rule}"] = ours("auto", rule=rule)
        modes[f"verispec γ={g}, {rule}"] = ours("fixed", rule=rule)
    for spec in filter(None, (t.strip() for t in args.trees.split(";"))):
        modes[f"verispec tree {spec}"] = ours("fixed", TreeShape.parse(spec))
    modes["transformers default"] = theirs({})
    modes[f"transformers heuristic from γ={g}"] = theirs(
        {"num_assistant_tokens": g, "num_assistant_tokens_schedule": "heuristic_transient",
         "assistant_confidence_threshold": 0.0})
    constant = {"num_assistant_tokens": g, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
    modes[f"transformers constant γ={g}"] = theirs(constant)
    if target.linear_layout == "weight-major":   # transformers' schedules with verispec's kernel layout
        modes["transformers default, weight-major linears"] = theirs({}, weight_major=True)
        modes[f"transformers constant γ={g}, weight-major linears"] = theirs(constant, weight_major=True)
    modes["verispec prompt lookup (auto)"] = ours("lookup")
    modes["transformers prompt lookup"] = theirs(None, lookup_tokens=10)
    if args.only:
        wanted = [w for w in args.only.split(",") if w]
        modes = {name: run for name, run in modes.items() if any(w in name for w in wanted)}
        if not modes:
            raise SystemExit(f"--only {args.only!r} matches no mode")

    for run in modes.values():   # warm-up: first-call allocations and kernels, not timed
        run(prompts[0], 4, 0)
    # tokens, seconds, target calls, draft length sum, runs, seconds in target / draft model calls
    totals = defaultdict(lambda: [0, 0.0, 0, 0.0, 0, 0.0, 0.0])
    for rnd in range(args.rounds):
        for i, ids in enumerate(prompts):
            for name, run in modes.items():
                in_target, in_draft = target_time.seconds, draft_time.seconds
                t = time.perf_counter()
                tok, calls, mean_g = run(ids, args.tokens, 1000 * rnd + i)
                tot = totals[name]
                tot[0] += tok
                tot[1] += time.perf_counter() - t
                tot[2] += calls
                tot[3] += mean_g
                tot[4] += 1
                tot[5] += target_time.seconds - in_target
                tot[6] += draft_time.seconds - in_draft
            print(f"round {rnd + 1}/{args.rounds}, prompt {i + 1}/{len(prompts)} done", flush=True)

    sklearn = importlib.util.find_spec("sklearn") is not None
    print(f"\n== transformers backend, {args.target} / {args.draft} ({args.dtype}), "
          f"lossless unless a mode names a rule, {args.sampling}, "
          f"{len(prompts)} prompts x {args.rounds} rounds, up to {args.tokens} new tokens, "
          f"{torch.get_num_threads()} torch threads; transformers default's confidence threshold "
          f"{'adapted (scikit-learn present)' if sklearn else 'fixed at 0.4 (no scikit-learn)'}")
    tps = {name: tot[0] / tot[1] for name, tot in totals.items()}
    ref = tps.get("verispec target-only")
    theirs_names = [n for n in tps if n.startswith("transformers") and "target-only" not in n
                    and "weight-major" not in n]
    head = f"{'mode':48} {'tok/s':>7} {'BE':>6} {'mean γ':>7} {'ms/tok: target':>14} {'draft':>6} {'other':>6}"
    head += f" {'vs target-only':>15}" if ref else ""
    head += "".join(f" {'vs ' + n.removeprefix('transformers '):>22}" for n in theirs_names)
    print(head)
    for name, tot in totals.items():
        be = tot[0] / tot[2] if tot[2] else float("nan")
        per_tok = [1000 * x / max(tot[0], 1) for x in (tot[5], tot[6], tot[1] - tot[5] - tot[6])]
        line = f"{name:48} {tps[name]:7.2f} {be:6.2f} {tot[3] / tot[4]:7.2f} {per_tok[0]:14.0f} {per_tok[1]:6.0f} " \
               f"{per_tok[2]:6.0f}"
        line += f" {tps[name] / ref:14.2f}x" if ref else ""
        line += "".join(f" {tps[name] / tps[n]:21.2f}x" for n in theirs_names)
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
