"""Speed of every rule's ``verify`` and of the warper pipeline at the real vocabulary size, per device.

Prints milliseconds per call (median of repeated runs) for V = 151,936 on every device present (CPU,
CUDA, MPS; or those given with ``--devices``):

* ``verify`` alone, G in {4, 8, 16}, B in {1, 8, 64} (``--batches``), for every rule;
* the warper pipeline on ``[rows, V]`` logits;
* the engine's step at G = 5: the pipeline on the target's G+1 and the draft's G rows, ``verify`` with a
  generator on the device, and the one copy to the host (accepted counts and next tokens) — what
  :func:`verispec.engine.generate` does per step besides the model forwards. The issue's aim on a GPU:
  at most 0.5 ms at B = 1.

Run: ``.venv/bin/python benchmarks/rules.py [--repeats N] [--threads T] [--devices cpu,cuda]
[--batches 1,8,64]``. CUDA timings synchronise before reading the clock.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

from verispec.runtime import tune_process

tune_process()

import torch  # noqa: E402

import verispec.rules as R  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402

VOCAB = 151_936
RULES = [
    "lossless", "greedy", "block", "hsd", "lenience:ell=0.5", "cos_we:lam=0.5", "cos_cd:mu=0.1",
    "ceiling:kappa=2", "ceiling:kappa=2,base=we,lam=0.5", "speccascade:p_base=0.3",
    "cascade:rule=token_v3,alpha=0.7", "typical:eps=0.15",
]
PIPELINE = "temperature=0.7,top_k=20,top_p=0.8"
#: CPU cells above this many target rows (B·(G+1)) are skipped unless --big-cpu: minutes of work each
CPU_ROW_LIMIT = 200


def devices_present() -> list[str]:
    out = ["cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        out.append("mps")
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


CPU = torch.device("cpu")


def median_ms(fn, repeats: int, device: torch.device = CPU) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def inputs(batch: int, gamma: int, sampling: SamplingConfig, device: str | torch.device = "cpu", seed: int = 0):
    """Heavy-tailed logits like a real LM head, their processed rows and drafts, on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(batch, gamma + 1, VOCAB, generator=gen) * 3
    draft_logits = target_logits[:, :gamma] + torch.randn(batch, gamma, VOCAB, generator=gen)
    p = sampling.process(target_logits)
    q = sampling.process(draft_logits)
    draft = torch.multinomial(q.view(-1, VOCAB), 1, generator=gen).view(batch, gamma)
    return tuple(t.to(device) for t in (target_logits, draft_logits, p, q, draft))


def engine_step(rule, sampling: SamplingConfig, target_logits, draft_logits, draft, gen) -> list[int]:
    """What the engine does per step besides the forwards: process both models' rows, verify on the
    device, copy the accepted counts and next tokens to the host."""
    p = sampling.process(target_logits)
    q = sampling.process(draft_logits)
    n, z = rule.verify(p, q, draft, generator=gen)
    return torch.cat([n, z]).tolist()


def step_ms(rule_spec: str, sampling: SamplingConfig, batch: int, gamma: int, device: str, repeats: int) -> float:
    """Median ms of :func:`engine_step` for one rule and shape on ``device``."""
    dev = torch.device(device)
    t_logits, d_logits, _, _, draft = inputs(batch, gamma, sampling, dev)
    gen = torch.Generator(device=dev).manual_seed(2)
    return median_ms(functools.partial(engine_step, R.get(rule_spec), sampling, t_logits, d_logits, draft, gen),
                     repeats, dev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--devices", default=None, help="comma-separated (default: every device present)")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--gammas", default="4,8,16")
    ap.add_argument("--big-cpu", action="store_true", help=f"also time CPU cells above {CPU_ROW_LIMIT} rows")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.devices.split(",") if args.devices else devices_present()
    batches = [int(b) for b in args.batches.split(",")]
    gammas = [int(g) for g in args.gammas.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, V = {VOCAB}, devices: {devices}")
    for device in devices:
        dev = torch.device(device)
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else device
        for label, spec in [("dense (T=1)", "temperature=1"), ("truncated", PIPELINE)]:
            sampling = SamplingConfig.parse(spec)
            shapes = [(b, g) for b in batches for g in gammas
                      if dev.type != "cpu" or args.big_cpu or b * (g + 1) <= CPU_ROW_LIMIT]
            print(f"\n== [{name}] verify, ms per call, median of {args.repeats} — inputs {label}: {spec}")
            print(f"{'rule':34}" + "".join(f"{f'B={b},G={g}':>12}" for b, g in shapes))
            for rule_spec in RULES:
                rule = R.get(rule_spec)
                cells = []
                for b, g in shapes:
                    _, _, p, q, draft = inputs(b, g, sampling, dev)
                    gen = torch.Generator(device=dev).manual_seed(1)
                    reps = args.repeats if b * (g + 1) <= CPU_ROW_LIMIT or dev.type != "cpu" else 3
                    cells.append(median_ms(functools.partial(rule.verify, p, q, draft, generator=gen), reps, dev))
                    del p, q, draft
                print(f"{rule_spec:34}" + "".join(f"{c:12.2f}" for c in cells))

        print(f"\n== [{name}] warper pipeline, ms per call on [rows, V] logits, median of {args.repeats}")
        for spec in ["temperature=1", "temperature=0", PIPELINE, PIPELINE + ",min_p=0.1",
                     "temperature=0.7,eta=0.0009"]:
            sampling = SamplingConfig.parse(spec)
            cells = []
            for rows in (1, 6, 48):
                logits = (torch.randn(rows, VOCAB) * 3).to(dev)
                cells.append(median_ms(functools.partial(sampling.process, logits), args.repeats, dev))
            print(f"{spec:44} rows=1 {cells[0]:7.2f}   rows=6 {cells[1]:7.2f}   rows=48 {cells[2]:7.2f}")

        print(f"\n== [{name}] engine step at G=5 (pipeline on 6 target + 5 draft rows, verify, counts to host), ms")
        step_batches = [b for b in batches if dev.type != "cpu" or b * 6 <= CPU_ROW_LIMIT]
        print(f"  {'sampling':34} {'rule':34}" + "".join(f"{f'B={b}':>9}" for b in step_batches))
        for spec in ["temperature=1", PIPELINE]:
            sampling = SamplingConfig.parse(spec)
            for rule_spec in RULES:
                cells = [step_ms(rule_spec, sampling, b, 5, device, args.repeats) for b in step_batches]
                print(f"  {spec:34} {rule_spec:34}" + "".join(f"{c:9.2f}" for c in cells))


if __name__ == "__main__":
    main()
