"""The distortion–acceptance frontier of every rule, from a ``verispec diagnose`` output directory.

Reads ``diagnostics.json`` and prints

1. per rule: per-position acceptance β, its gain over lossless Δβ, TV to the true baseline, TV / Δβ
   (for rules judged against ``p`` the least possible value is 1: any rule has
   ``TV(P, p) >= β − (1 − d(p, q))`` at each position, since the accepted drafts ``q·h`` alone exceed ``p``
   by at least that much), KL(P‖ref) and KL(ref‖P) (mean, and the share of positions where it is
   infinite), overshoot Σ(P − ref)+ and the largest ceiling ratio max P/p;
2. per family (rules of one registry name and parameter shape): TV and KL(ref‖P) interpolated at
   common acceptance levels, so rules are compared at equal acceptance.

Run: ``.venv/bin/python benchmarks/rule_map.py DIAGNOSE_DIR [--levels 0.917,0.92,0.925,0.929]``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path


def _num(x) -> float:
    if isinstance(x, (int, float)):
        return float(x)
    return {"inf": math.inf, "-inf": -math.inf}.get(x, math.nan)


def _fmt(x: float, digits: int = 4) -> str:
    if math.isinf(x):
        return "∞"
    if math.isnan(x):
        return "—"
    return f"{x:.{digits}f}"


def family_key(spec: str) -> str:
    """Rules on one curve: the same name, parameter names and non-numeric settings (``mentored:D=…`` is
    apart from ``mentored:alpha=…``, ``ceiling:…,base=we`` from ``base=p``); numeric values vary along it."""
    name, _, body = spec.partition(":")
    parts = []
    for kv in filter(None, body.split(",")):
        key, _, value = kv.partition("=")
        try:
            float(value)
            parts.append(key)
        except ValueError:
            parts.append(kv)
    return name + (":" + ",".join(parts) if parts else "")


def interpolate(points: list[tuple[float, float]], level: float) -> float:
    pts = sorted(points)
    for (b0, v0), (b1, v1) in zip(pts, pts[1:]):
        if b0 <= level <= b1:
            if math.isinf(v0) or math.isinf(v1):
                return math.inf
            return v0 if b1 == b0 else v0 + (v1 - v0) * (level - b0) / (b1 - b0)
    return math.nan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("diagnose_dir")
    ap.add_argument("--levels", default="0.917,0.92,0.925,0.929")
    args = ap.parse_args(argv)
    data = json.loads((Path(args.diagnose_dir) / "diagnostics.json").read_text())
    base = _num(data["lossless"]["acceptance"]) if "lossless" in data else math.nan
    n = next(iter(data.values()))["n_positions"]
    print(f"{n} positions; lossless acceptance {base:.4f}\n")
    print("| rule | β | Δβ | TV | TV/Δβ | KL(P‖ref) (∞ share) | KL(ref‖P) (∞ share) | overshoot | max P/p |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = sorted(data.items(), key=lambda kv: _num(kv[1]["acceptance"]))
    curves: dict[str, list[tuple[float, float, float]]] = {}
    for spec, m in rows:
        beta, tv = _num(m["acceptance"]), _num(m["tv"])
        gain = beta - base
        ratio = tv / gain if gain > 1e-6 else math.nan
        kl, kl_r = _num(m["kl"]), _num(m["kl_reverse"])
        kl_inf, klr_inf = _num(m.get("kl_inf_fraction", 0)), _num(m.get("kl_reverse_inf_fraction", 0))
        kl_txt = f"{_fmt(kl)} ({kl_inf:.0%})" if kl_inf else _fmt(kl)
        klr_txt = f"{_fmt(kl_r)} ({klr_inf:.0%})" if klr_inf else _fmt(kl_r)
        cmax = _num(m["quantiles"]["ceiling_ratio"]["max"]) if "quantiles" in m else math.nan
        short = re.sub(r",(confident=0\.9|div=kl_pq|reject=sd|on=processed|div=js)", "", spec)
        print(f"| `{short}` | {beta:.4f} | {gain:+.4f} | {_fmt(tv)} | {_fmt(ratio, 2)} | {kl_txt} | {klr_txt} | "
              f"{_fmt(_num(m['overshoot']))} | {_fmt(cmax, 2)} |")
        curves.setdefault(family_key(spec), []).append((beta, tv, kl_r if not klr_inf else math.inf))
    levels = [float(x) for x in args.levels.split(",")]
    print("\nAt equal acceptance (linear interpolation between a family's measured settings; — outside their "
          "range): TV / KL(ref‖P)\n")
    print("| family | " + " | ".join(f"β = {x:g}" for x in levels) + " |")
    print("|---|" + "---:|" * len(levels))
    for fam, pts in curves.items():
        if len(pts) < 2:
            continue
        tv_at = [interpolate([(b, t) for b, t, _ in pts], x) for x in levels]
        kl_at = [interpolate([(b, k) for b, _, k in pts], x) for x in levels]
        if all(math.isnan(v) for v in tv_at):
            continue
        print(f"| `{fam}` | " + " | ".join(f"{_fmt(t)} / {_fmt(k)}" for t, k in zip(tv_at, kl_at)) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
