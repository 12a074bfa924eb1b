"""How a drafted token's acceptance depends on the draft's confidence, on the real pair, per prompt class.

The per-token stop (``--draft-stop auto``, :meth:`~verispec.engine.gamma.AutoGamma.keep_drafting`) reads
the draft's probability ``c`` of each token it drafts and prices the tokens not yet drafted; this measures
what those choices assume. Every class of ``benchmarks/auto_gamma.py`` is generated ``--seeds`` times with
lossless chains of exactly ``--gamma`` tokens (no stop), and every verified draft position (the accepted ones
and the first rejected one: a position's acceptance given that its predecessors were accepted) is recorded
with its ``c``. Printed per class and over all of them:

* per bin of ``c`` (tenths): positions, acceptance, mean ``c`` -- is a draft's confidence its acceptance
  (EAGLE-2), as the bins' starting values assume?
* ``λ = rejections / Σ (1 − c)``: 1 where acceptance equals confidence on average, 0 where every token is
  accepted whatever its confidence;
* the next position's acceptance after an accepted token with ``c < 0.9`` and after one with ``c >= 0.9``:
  does an unsure token announce unsure ones?

``--out FILE`` writes the records (``[class, position, c, accepted]``), which ``benchmarks/gamma_sim.py
--records FILE`` replays through the policy.

    .venv/bin/python benchmarks/confidence_acceptance.py [--backend llama|hf] [--gamma 8] [--seeds 3]
        [--tokens 96] [--out records.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verispec.runtime import tune_process

tune_process()

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from auto_gamma import PROMPTS, _pair  # noqa: E402

from verispec.engine import cached_profile, generate  # noqa: E402
from verispec.engine.gamma import CONFIDENCE_BINS, AutoGamma, _bin  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402


class _Recorder(AutoGamma):
    """Drafts exactly ``fixed`` tokens every step and records each verified position with its confidence."""

    def __init__(self, *args, label: str, records: list, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.label, self.records = label, records

    def keep_drafting(self, confidences: list[float]) -> bool:
        return len(confidences) < self.fixed

    def update(self, n_accepted: int, g: int, confidences: list[float] | None = None) -> None:
        for i, c in enumerate((confidences or [])[:min(n_accepted + 1, g)]):
            self.records.append([self.label, i, c, int(i < n_accepted)])
        super().update(n_accepted, g, confidences)


def summary(records: list) -> list[str]:
    """The printed table of one set of records (see the module docstring)."""
    if not records:
        return ["  no verified positions"]
    lines = [f"  {len(records)} verified positions, acceptance {sum(r[3] for r in records) / len(records):.3f}"]
    for b in range(CONFIDENCE_BINS):
        in_bin = [r for r in records if _bin(r[2]) == b]
        if in_bin:
            lines.append(f"  c in [{b / CONFIDENCE_BINS:.1f}, {(b + 1) / CONFIDENCE_BINS:.1f}): {len(in_bin):4d} "
                         f"positions, acceptance {sum(r[3] for r in in_bin) / len(in_bin):.3f}, "
                         f"mean c {sum(r[2] for r in in_bin) / len(in_bin):.3f}")
    missing = sum(1.0 - r[2] for r in records)
    rejected = sum(1 - r[3] for r in records)
    lines.append(f"  λ = rejections / Σ(1 − c) = {rejected / missing:.2f}" if missing > 0 else "  λ: every c is 1")
    pairs = [(a, b) for a, b in zip(records, records[1:]) if b[1] == a[1] + 1 and b[0] == a[0] and a[3]]
    for name, keep in (("c < 0.9", lambda c: c < 0.9), ("c >= 0.9", lambda c: c >= 0.9)):
        after = [b for a, b in pairs if keep(a[2])]
        if after:
            accepted, mean_c = sum(b[3] for b in after) / len(after), sum(b[2] for b in after) / len(after)
            lines.append(f"  after an accepted token with {name}: next position's acceptance {accepted:.3f}, "
                         f"mean c {mean_c:.3f} ({len(after)} positions)")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="llama", choices=("llama", "hf"))
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--sampling", default="temperature=0.7,top_k=20,top_p=0.8")
    ap.add_argument("--out", help="write the records here (JSON)")
    args = ap.parse_args(argv)
    if args.gamma < 1 or args.seeds < 1 or args.tokens < 1:
        raise SystemExit("--gamma, --seeds and --tokens must be >= 1")
    sampling = SamplingConfig.parse(args.sampling)
    target, draft, width, _ = _pair(args.backend, torch.float32)
    profile, _ = cached_profile(target, draft, target.chat_prompt(PROMPTS["code"]))
    if args.gamma > profile.g_max:
        raise SystemExit(f"--gamma {args.gamma} is beyond the cost profile's longest draft ({profile.g_max})")
    records: list = []
    for label, text in PROMPTS.items():
        ids = target.chat_prompt(text)
        for seed in range(args.seeds):
            policy = _Recorder(profile, by_confidence=True, fixed=args.gamma, label=label, records=records)
            generate(target, draft, ids, rule="lossless", sampling=sampling, gamma=policy, max_new_tokens=args.tokens,
                     seed=seed, vocab_width=width, costs=profile)
        print(f"{label}:", *summary([r for r in records if r[0] == label]), sep="\n", flush=True)
    print("all classes:", *summary(records), sep="\n")
    if args.out:
        Path(args.out).write_text(json.dumps(records))
        print(f"records written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
