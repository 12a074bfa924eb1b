"""The vLLM plug-in's verification step against vLLM's own, on 1 and 2 torch threads in one run, and where the
second thread's time goes.

Run with the vLLM environment: ``.venv-vllm/bin/python benchmarks/vllm_threads.py`` (``--batches 1,8,64
--gamma 5 --vocab 151936 --threads 1,2``). Inputs as in ``benchmarks/vllm_sampler.py`` (what vLLM hands its
sampler: processed target logits and draft probabilities ``[B·γ, V]``, drafts sampled from them). For each
thread count (``torch.set_num_threads``, in this one process, alternating so that a change of load hits both):

* the step: vLLM's ``rejection_sample`` (its CPU kernels) against the plug-in's ``verify_flat`` with lossless
  and its uniforms, median ms and the ratio;
* the plug-in's step taken apart into its passes over ``[B·γ, V]`` (the softmax of the target, the acceptance
  gather, the residual ``(p − q)_+`` of the rejected rows, the float64 inverse-CDF draw), and vLLM's into its
  softmax and the rest of its kernels, each timed alone, with its 2-thread / 1-thread ratio.
"""

from __future__ import annotations

import argparse
import os

import torch
from vllm_sampler import _inputs, _median_ms, _metadata  # the sampler benchmark's inputs and timer


def _cases(batch: int, gamma: int, vocab: int):
    """``{name: fn}``: the two whole steps, then their parts (each a pass the step makes)."""
    from vllm.v1.sample.rejection_sampler import generate_uniform_probs, rejection_sample

    from verispec import rules as R
    from verispec.integrations.vllm.verify import _lossless_residual_mass, _sample, verify_flat

    target_logits, draft_probs, draft, bonus = _inputs(batch, gamma, vocab, seed=batch)
    counts = [gamma] * batch
    cu = torch.cumsum(torch.tensor(counts, dtype=torch.int32), 0).to(torch.int32)
    meta = _metadata(batch)
    lossless = R.get("lossless")
    x = draft.long()
    p = torch.softmax(target_logits, dim=-1)
    rejected = torch.arange(0, batch * gamma, gamma)         # one rejected position per request
    u_rows = torch.rand(rejected.numel(), dtype=torch.float64)

    def vllm_step():
        return rejection_sample(draft.clone(), counts, gamma, cu, draft_probs, target_logits.clone(), bonus, meta)

    def ours_step():
        u = generate_uniform_probs(draft.numel(), counts, {}, target_logits.device)
        return verify_flat([lossless] * batch, target_logits.clone(), draft_probs, draft, counts, bonus, u,
                           max_spec_len=gamma)

    return {
        "vLLM rejection_sample": vllm_step,
        "plug-in verify_flat (lossless)": ours_step,
        "  copy of the target logits": lambda: target_logits.clone(),
        "  softmax of the target (float32)": lambda: torch.softmax(target_logits, dim=-1),
        "  acceptance h = min(1, p(x)/q(x))": lambda: lossless.accept_prob_at(p, draft_probs, x),
        "  residual (p - q)_+ of rejected rows": lambda: _lossless_residual_mass(p, draft_probs, rejected),
        "  inverse-CDF draw (float64 cumsum)": lambda: _sample(_lossless_residual_mass(p, draft_probs, rejected),
                                                               u_rows),
        "  uniforms (vLLM's generate_uniform_probs)": lambda: generate_uniform_probs(draft.numel(), counts, {},
                                                                                    target_logits.device),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if any(t < 1 for t in threads) or not threads:
        raise SystemExit("--threads: comma-separated thread counts >= 1, e.g. 1,2")

    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()     # vLLM's CPU kernels, as in its workers
    print(f"V = {args.vocab}, γ = {args.gamma}, torch threads {threads} (cores here: {os.cpu_count()}, load "
          f"{os.getloadavg()[0]:.1f}); median of {args.repeats}, ms")
    step_rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        cases = _cases(batch, args.gamma, args.vocab)
        repeats = args.repeats if batch <= 8 else max(3, args.repeats // 2)
        times: dict[str, dict[int, float]] = {name: {} for name in cases}
        for name, fn in cases.items():
            for t in threads:            # both thread counts back to back, per case
                torch.set_num_threads(t)
                times[name][t] = _median_ms(fn, repeats)
        print(f"\nB = {batch} (B·γ = {batch * args.gamma} rows)")
        print("| pass | " + " | ".join(f"{t} thread{'s' * (t > 1)}" for t in threads)
              + (f" | {threads[-1]} / {threads[0]} threads" if len(threads) > 1 else "") + " |")
        print("|---|" + "---|" * (len(threads) + (len(threads) > 1)))
        for name, by_t in times.items():
            cells = [f"{by_t[t]:.2f}" for t in threads]
            if len(threads) > 1:
                cells.append(f"{by_t[threads[-1]] / by_t[threads[0]]:.2f}x")
            print(f"| {name.strip() if not name.startswith('  ') else '↳ ' + name.strip()} | " + " | ".join(cells)
                  + " |")
        step_rows.append((batch, times))
    print("\nThe plug-in's step / vLLM's step (lossless, probabilistic drafts)")
    print("| B | " + " | ".join(f"{t} thread{'s' * (t > 1)}" for t in threads) + " |")
    print("|---|" + "---|" * len(threads))
    for batch, times in step_rows:
        ours, theirs = times["plug-in verify_flat (lossless)"], times["vLLM rejection_sample"]
        print(f"| {batch} | " + " | ".join(f"{ours[t] / theirs[t]:.2f}x ({ours[t]:.1f} / {theirs[t]:.1f} ms)"
                                           for t in threads) + " |")


if __name__ == "__main__":
    main()
