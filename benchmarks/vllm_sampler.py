"""The vLLM plug-in's verification step against vLLM's own rejection sampler, on this machine's CPU.

Run with the vLLM environment: ``.venv-vllm/bin/python benchmarks/vllm_sampler.py`` (``--batches 1,8,64
--gamma 5 --vocab 151936``, Qwen2.5's vocabulary). Inputs are what vLLM hands its sampler: processed target logits
``[B·γ, V]`` (random, a peaked softmax), draft probabilities ``[B·γ, V]`` and drafts sampled from them, bonus tokens.
Timed (median of ``--repeats``): vLLM's ``rejection_sample`` (its CPU kernels; its own temperature expansion is
left out, see verispec.integrations.vllm.sampler.sampling_constraints) against the plug-in's
``verify_flat`` plus its uniforms, for lossless and every rule that runs on probabilistic drafts, and lossless
on point-mass drafts (no ``q``: vLLM's ngram path). Prints milliseconds and the ratio to vLLM's time in the same
run; the goal for lossless is <= 1.5x.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _inputs(batch: int, gamma: int, vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    n = batch * gamma
    target_logits = torch.randn(n, vocab, generator=gen) * 3.0
    draft_probs = torch.softmax(target_logits + torch.randn(n, vocab, generator=gen) * 1.5, dim=-1)
    draft = torch.multinomial(draft_probs, 1, generator=gen)[:, 0].to(torch.int32)
    bonus = torch.randint(0, vocab, (batch, 1), generator=gen, dtype=torch.int32)
    return target_logits, draft_probs, draft, bonus


def _metadata(batch: int):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.ones(batch), all_greedy=False, all_random=True, top_p=None, top_k=None, generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch), repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())


def _median_ms(fn, repeats: int) -> float:
    t0 = time.perf_counter()
    fn()                                             # warm-up (allocations, kernel dispatch)
    if time.perf_counter() - t0 > 5.0:               # a rule slow in itself (mentored's solve): time it once more
        repeats = 1
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rules", default="", help="comma-separated specs (default: every rule probabilistic drafts run)")
    args = ap.parse_args()

    from vllm.platforms import current_platform

    from verispec import rules as R
    from verispec.integrations.vllm.support import PROBABILISTIC, refusal
    from verispec.rules.catalogue import entries

    current_platform.register_triton_kernel_overrides()     # vLLM's CPU kernels, as in its workers
    if args.rules:
        specs = R.split_specs(args.rules)
    else:
        specs = [e.example for e in entries() if "<" not in e.example
                 and refusal(R.get(e.example), PROBABILISTIC) is None]
        specs.remove("lossless")
        specs.insert(0, "lossless")
    print(f"verification step, V = {args.vocab}, γ = {args.gamma}, torch threads = {torch.get_num_threads()}; "
          f"median of {args.repeats} (ms) and ratio to vLLM's rejection_sample in the same run")
    for batch in (int(b) for b in args.batches.split(",")):
        _bench_batch(batch, args, specs)


def _bench_batch(batch: int, args, specs: list[str]) -> None:
    from vllm.v1.sample.rejection_sampler import generate_uniform_probs, rejection_sample

    from verispec import rules as R
    from verispec.integrations.vllm.verify import verify_flat

    target_logits, draft_probs, draft, bonus = _inputs(batch, args.gamma, args.vocab, seed=batch)
    counts = [args.gamma] * batch
    cu = torch.cumsum(torch.tensor(counts, dtype=torch.int32), 0).to(torch.int32)
    meta = _metadata(batch)
    repeats = args.repeats if batch <= 8 else max(3, args.repeats // 2)

    def vllm_step(probs):
        return rejection_sample(draft.clone(), counts, args.gamma, cu, probs, target_logits.clone(), bonus, meta)

    def ours(rule, probs):
        u = generate_uniform_probs(draft.numel(), counts, {}, target_logits.device)
        return verify_flat([rule] * batch, target_logits.clone(), probs, draft, counts, bonus, u,
                           bonus_logits=target_logits[:batch], max_spec_len=args.gamma)

    base = _median_ms(lambda: vllm_step(draft_probs), repeats)
    base_pm = _median_ms(lambda: vllm_step(None), repeats)
    print(f"\nB = {batch}: vLLM rejection_sample {base:.1f} ms (probabilistic), {base_pm:.1f} ms (point mass)")
    for spec in specs:
        rule = R.get(spec)
        ms = _median_ms(lambda rule=rule: ours(rule, draft_probs), repeats)
        print(f"  {spec:36} {ms:9.1f} ms  {ms / base:5.2f}x")
    ms = _median_ms(lambda: ours(R.get("lossless"), None), repeats)
    print(f"  {'lossless (point-mass drafts)':36} {ms:9.1f} ms  {ms / base_pm:5.2f}x")

if __name__ == "__main__":
    main()
