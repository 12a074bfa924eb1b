"""``--gamma auto`` against every fixed γ on simulated acceptance, priced by a cost profile (no model runs).

Each generation emits ``--tokens`` tokens. Every drafted token comes with the draft's confidence ``c``,
drawn from a Beta law of mean ``α`` (concentration ``--spread``; ``c = 1`` at ``α = 1``), and is accepted
with probability ``c`` (a calibrated draft), so each position is accepted with probability ``α``
(i.i.d.); for ``runs``, ``α`` is 0.97 in an easy stretch and 0.45 in a hard one, switching with
probability 0.08 per position. A step costs the profile's ``step_cost(g)``. Printed per acceptance
process: the best fixed γ's tokens per unit of cost (target steps) and, for each
:class:`~verispec.engine.gamma.AutoGamma` setting (``--settings``: optimism / prior weight / prior α /
``by_confidence=1``, the per-token stop, which reads each token's ``c`` as the engine reads the draft's
probability of it), its rate over the best fixed γ's -- the figures behind ``AutoGamma.optimism``'s
default and ``gamma="auto"``'s default per-token stop.

``--records FILE`` (written by ``benchmarks/confidence_acceptance.py --out``) replaces the processes by the
prompt classes of a real pair, and ``all`` of them pooled: each drafted token draws its ``(c, accepted)``
jointly from the class's recorded positions (i.i.d.), so confidence and acceptance relate as they did on
the pair, not by calibration; with ``--sequential`` they are read in their recorded order from a random start,
so that what follows an unsure token is what followed it on the pair (acceptance comes in runs).

    .venv/bin/python benchmarks/gamma_sim.py [--profile FILE.json] [--tokens 48] [--seeds 200]
        [--settings 'optimism=1;optimism=0.5;optimism=0;by_confidence=1'] [--spread 4] [--records FILE [--sequential]]

Without ``--profile``: the transformers-backend profile of the 2-core AMD EPYC VM of 2026-12-02
(target token 254.8 ms, ``c = 0.359``, ``v(1..16)`` as in docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from verispec.engine.costs import CostProfile
from verispec.engine.gamma import AutoGamma

#: v(0..16) of the transformers backend's profile on the 2-core VM (docs/performance.md, second round)
VM_V = (1.0, 1.21, 1.74, 1.96, 2.30, 2.54, 2.59, 2.68, 2.99, 2.80, 2.90, 2.94, 2.96, 2.72, 3.13, 3.19, 3.99)


def vm_profile() -> CostProfile:
    t = 0.2548
    return CostProfile(draft_token=0.359 * t, target_block=tuple(v * t for v in VM_V))


def _confidences(process: str, rng: random.Random, spread: float):
    """A function drawing the next drafted token's confidence ``c`` (its chance of acceptance)."""
    def draw(alpha: float) -> float:
        return 1.0 if alpha >= 1.0 else rng.betavariate(spread * alpha, spread * (1.0 - alpha))
    if process != "runs":
        alpha = float(process)
        return lambda: draw(alpha)
    easy = [True]

    def confidence() -> float:
        if rng.random() < 0.08:
            easy[0] = not easy[0]
        return draw(0.97 if easy[0] else 0.45)
    return confidence


class _Recorded:
    """A class's recorded positions as a source of ``(c, accepted)`` for the tokens a step drafts: drawn
    i.i.d., or with ``sequential`` read in their recorded order from a random start, so that what follows an
    unsure token is what followed it on the pair (a step that accepted ``n`` tokens moves ``n + 1`` positions
    on: the accepted ones and the one the target emitted in place of a rejected or undrafted token)."""

    def __init__(self, pairs: list[tuple[float, int]], rng: random.Random, sequential: bool) -> None:
        self.pairs, self.rng, self.sequential = pairs, rng, sequential
        self.start = rng.randrange(len(pairs)) if sequential else 0    # i.i.d. draws: the seed's stream as before

    def at(self, j: int) -> tuple[float, int]:
        """The step's ``j``-th drafted token."""
        if not self.sequential:
            return self.rng.choice(self.pairs)
        return self.pairs[(self.start + j) % len(self.pairs)]

    def advance(self, n_accepted: int) -> None:
        self.start = (self.start + n_accepted + 1) % len(self.pairs)


def rate(profile: CostProfile, process: str, tokens: int, seed: int, fixed: int | None = None,
         settings: dict | None = None, spread: float = 4.0, records: dict | None = None,
         sequential: bool = False) -> float:
    """Tokens per unit of cost of one simulated generation (a fixed γ, or AutoGamma with ``settings``);
    ``records``: per class, recorded ``(c, accepted)`` positions, replayed for a ``process`` naming a class
    (``sequential``: in their order, :class:`_Recorded`)."""
    rng = random.Random(seed)
    replay = _Recorded(records[process], rng, sequential) if records is not None and process in records else None
    confidence = None if replay else _confidences(process, rng, spread)
    policy = None if fixed is not None else AutoGamma(profile, **(settings or {}))
    emitted, cost = 0, 0.0
    while emitted < tokens:
        g = fixed if policy is None else policy.next()
        drafted: list[float] = []
        outcomes: list[int] = []
        while len(drafted) < g and (policy is None or not drafted or policy.keep_drafting(drafted)):
            if replay:
                c, accepted = replay.at(len(drafted))
                drafted.append(c)
                outcomes.append(accepted)
            else:
                drafted.append(confidence())
        n = 0
        while n < len(drafted) and (outcomes[n] if replay else rng.random() < drafted[n]):
            n += 1
        cost += profile.step_cost(len(drafted))
        emitted += n + 1
        if replay:
            replay.advance(n)
        if policy is not None:
            policy.update(n, len(drafted), drafted)
    return emitted / cost


def _settings(text: str) -> list[dict]:
    out = []
    for part in (p for p in text.split(";") if p.strip()):
        out.append({k.strip(): float(v) for k, v in (kv.split("=") for kv in part.split(","))})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a cached cost profile (JSON) instead of the VM's")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--processes", default="0.5,0.7,0.85,0.95,0.98,1.0,runs")
    ap.add_argument("--settings", default="optimism=1;optimism=0.5;optimism=0;by_confidence=1")
    ap.add_argument("--spread", type=float, default=4.0, help="concentration of the draft's confidences around α")
    ap.add_argument("--records", help="positions recorded on a real pair (benchmarks/confidence_acceptance.py "
                    "--out): replay each class's (c, accepted) instead of --processes")
    ap.add_argument("--sequential", action="store_true", help="with --records: replay the positions in their "
                    "recorded order (what follows an unsure token as on the pair), not i.i.d.")
    args = ap.parse_args(argv)
    profile = CostProfile.from_json(json.load(open(args.profile))) if args.profile else vm_profile()
    records = None
    if args.records:
        records = {}
        for label, _, c, accepted in json.load(open(args.records)):
            records.setdefault(label, []).append((float(c), int(accepted)))
        records["all"] = [p for label in list(records) for p in records[label]]
        args.processes = ",".join(records)
    settings = _settings(args.settings)
    gammas = sorted({1, 2, 3, 4, 6, 8, 12, profile.g_max - 1} & set(range(1, profile.g_max + 1)))
    print(f"{args.tokens} tokens, {args.seeds} seeds; columns: auto / best fixed γ for "
          + "; ".join(",".join(f"{k}={v:g}" for k, v in s.items()) for s in settings))
    for process in args.processes.split(","):
        fixed = {g: statistics.mean(rate(profile, process, args.tokens, s, fixed=g, spread=args.spread,
                                         records=records, sequential=args.sequential) for s in range(args.seeds))
                 for g in gammas}
        best = max(fixed, key=fixed.get)
        autos = [statistics.mean(rate(profile, process, args.tokens, s, settings=st, spread=args.spread,
                                      records=records, sequential=args.sequential) for s in range(args.seeds))
                 for st in settings]
        print(f"  α {process:>10}: best γ = {best:2d} ({fixed[best]:.2f} tokens per target step)  "
              + "  ".join(f"{a / fixed[best]:.2f}x" for a in autos))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
