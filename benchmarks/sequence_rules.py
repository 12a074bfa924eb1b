"""Exact laws of the sequence-level rules on toy models: which are lossless, how far the others are, and
how many tokens each emits per block.

For seeded random toy pairs (target and draft: one Dirichlet row per prefix, V = 4) and γ in {2, 3},
prints per rule, from :func:`verispec.rules.block_law.joint_law` (exact enumeration, no sampling):

* ``max|Δ|``: largest absolute deviation of the law of the first ``L`` emitted tokens from the target's
  (``lossless`` = yes when at most 1e-12);
* ``TV``: total variation between the two laws;
* ``E[tok]``: expected tokens emitted by the first block (accepted + 1).

Rules: ``lossless``, ``block``, ``hsd``, the published HSD variants (:mod:`verispec.rules.hsd_variants`)
and FLy at two settings. Run: ``.venv/bin/python benchmarks/sequence_rules.py [--seeds 1,2,3]
[--length 3] [--conc 0.5]`` (a few seconds).
"""

from __future__ import annotations

import argparse

import verispec.rules as R
from verispec.rules.block_law import ToyModel, joint_law

VOCAB = 4
GAMMAS = (2, 3)
RULES = [
    "lossless", "block", "hsd",
    "hsd_uncapped_final", "hsd_mincap", "hsd_nocap", "hsd_mincap:ell=0.7",
    "fly:theta=0.3,window=1", "fly:theta=0.7,window=2",
]
LOSSLESS_ATOL = 1e-12


def table(seed: int, gamma: int, length: int, conc: float) -> list[str]:
    target, draft = ToyModel(VOCAB, seed, conc), ToyModel(VOCAB, 1000 + seed, conc)
    lines = [f"seed {seed}, V = {VOCAB}, γ = {gamma}, law of the first {length} tokens",
             f"  {'rule':<26} {'lossless':>8} {'max|Δ|':>10} {'TV':>8} {'E[tok]':>8}"]
    for spec in RULES:
        law = joint_law(R.get(spec), target, draft, vocab=VOCAB, gamma=gamma, length=length)
        verdict = "yes" if law.is_lossless(LOSSLESS_ATOL) else "no"
        lines.append(f"  {spec:<26} {verdict:>8} {law.max_abs_deviation:>10.2e} {law.total_variation:>8.4f} "
                     f"{law.expected_tokens:>8.4f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated toy-pair seeds")
    parser.add_argument("--length", type=int, default=3, help="tokens of the compared joint law (<= 4)")
    parser.add_argument("--conc", type=float, default=0.5, help="Dirichlet concentration of the toy rows")
    args = parser.parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        for gamma in GAMMAS:
            print("\n".join(table(seed, gamma, args.length, args.conc)))
            print()


if __name__ == "__main__":
    main()
