"""Corpus summaries of the measures (:func:`summarize`: means, quantiles, error bounds, breakdowns by target
entropy and block position), their JSON / Markdown writers, and the rank correlation of distortion with
accuracy gaps."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verispec import rules as rules_mod
from verispec.diagnose.measures import MEASURES, tokens_per_call
from verispec.diagnose.on_records import measure_records, recorded_block_efficiency
from verispec.rules.base import Rule

#: default target-entropy bin edges (nats)
ENTROPY_EDGES = (0.0, 0.05, 0.25, 0.5, 1.0, 2.0, math.inf)
QUANTILES = (0.1, 0.5, 0.9)

def _f(x: float) -> float:
    return float(x)


def _stats_of(values: torch.Tensor, quantiles: Sequence[float]) -> dict[str, float]:
    v = values[~torch.isnan(values)]
    if v.numel() == 0:
        return {"mean": math.nan, "max": math.nan, **{f"q{int(round(qq * 100)):02d}": math.nan for qq in quantiles}}
    qs = np.quantile(v.numpy(), list(quantiles), method="nearest")
    out = {"mean": _f(v.mean()), "max": _f(v.max())}
    for qq, val in zip(quantiles, qs):
        out[f"q{int(round(qq * 100)):02d}"] = float(val)
    return out


def _means(vals: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    out: dict[str, float] = {"n": int(mask.sum())}
    for m in MEASURES:
        v = vals[m][mask]
        out[m] = _f(v.mean()) if v.numel() else math.nan
        out["err_" + m] = _f(vals["err_" + m][mask].mean()) if v.numel() else math.nan
    return out


def summarize(corpus, rule_specs: Iterable[str | Rule], *, gamma: int,
              entropy_edges: Sequence[float] = ENTROPY_EDGES, quantiles: Sequence[float] = QUANTILES,
              block_efficiency: bool = True) -> list[dict[str, Any]]:
    """Per rule: corpus means of every measure, quantiles, compression-error bounds and breakdowns.

    ``corpus`` is a :class:`~verispec.diagnose.record.PositionRecorder`. Each entry holds ``rule``
    (canonical spec), ``family``, ``params``, ``is_lossless``, ``per_token``, ``n_positions``, the mean
    of every measure (keys of :data:`MEASURES`; NaN = n/a for sequence-level rules),
    ``tokens_per_call_at_mean_acceptance``, ``kl_inf_fraction``, ``quantiles`` (per measure: mean,
    max and the requested quantiles), ``max_compression_error`` / ``mean_compression_error`` (per
    measure: largest per-position bound, and the bound on the error of the reported mean),
    ``n_uncertain`` (positions with an infinite bound), ``by_entropy`` (target-entropy bins) and
    ``by_position`` (position in the block) with the means of every measure per bin, and — with
    ``block_efficiency`` — ``recorded_blocks`` (:func:`recorded_block_efficiency`).
    """
    meta = corpus.arrays
    ent = torch.as_tensor(meta["target_entropy"].astype(np.float64))
    position = torch.as_tensor(meta["position"].astype(np.int64))
    out = []
    for spec in rule_specs:
        rule = rules_mod.get(spec)
        vals = measure_records(rule, corpus, gamma=gamma)
        n = len(corpus)
        entry: dict[str, Any] = {
            "rule": rule.spec(), "family": rule.family, "params": dict(rule.params),
            "is_lossless": bool(rule.is_lossless), "per_token": bool(rule.per_token),
            "description": rule.describe(), "gamma": gamma, "n_positions": n,
        }
        for m in MEASURES:
            v = vals[m]
            entry[m] = _f(v.mean()) if n else math.nan
        beta_mean = entry["acceptance"]
        entry["tokens_per_call_at_mean_acceptance"] = (
            _f(tokens_per_call(torch.tensor([beta_mean]), gamma)[0]) if not math.isnan(beta_mean) else math.nan)
        entry["kl_inf_fraction"] = _f(torch.isinf(vals["kl"]).double().mean()) if n else math.nan
        entry["kl_reverse_inf_fraction"] = _f(torch.isinf(vals["kl_reverse"]).double().mean()) if n else math.nan
        entry["quantiles"] = {m: _stats_of(vals[m], quantiles) for m in MEASURES}
        entry["max_compression_error"] = {m: _f(vals["err_" + m].max()) if n else 0.0 for m in MEASURES}
        entry["mean_compression_error"] = {m: _f(vals["err_" + m].mean()) if n else 0.0 for m in MEASURES}
        any_inf = torch.zeros(n, dtype=torch.bool)
        for m in MEASURES:
            any_inf |= torch.isinf(vals["err_" + m])
        entry["n_uncertain"] = int(any_inf.sum())
        entry["max_p_rest"] = float(meta["p_rest"].max()) if n else 0.0
        entry["max_q_rest"] = float(meta["q_rest"].max()) if n else 0.0
        bins = []
        for lo, hi in zip(entropy_edges[:-1], entropy_edges[1:]):
            mask = (ent >= lo) & (ent < hi)
            bins.append({"lo": float(lo), "hi": float(hi), **_means(vals, mask)})
        entry["by_entropy"] = bins
        entry["by_position"] = [{"position": int(k), **_means(vals, position == k)}
                                for k in sorted(set(position.tolist()))]
        if block_efficiency:
            entry["recorded_blocks"] = recorded_block_efficiency(rule, corpus)
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------------
# writers


_NA_KEYS = {"acceptance", "tokens_per_call", "tokens_per_call_at_mean_acceptance"}


def to_jsonable(x: Any) -> Any:
    """Plain JSON values: tensors/numpy scalars unwrapped, NaN -> "n/a", ±inf -> "inf"/"-inf"."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, (np.generic,)):
        x = x.item()
    if isinstance(x, torch.Tensor):
        x = x.item()
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
    return x


def write_diagnostics_json(path: str | os.PathLike, summary: Sequence[Mapping[str, Any]]) -> None:
    """Write ``{rule_spec: {"tv", "kl", "overshoot", "ceiling_ratio", "tail_leak", "acceptance",
    "n_positions", ...}}``. Non-finite numbers become strings: NaN -> ``"n/a"`` (e.g. the acceptance of
    sequence-level rules), ``inf`` -> ``"inf"``; everything else in the summary entry is kept."""
    doc = {entry["rule"]: to_jsonable({k: v for k, v in entry.items() if k != "rule"}) for entry in summary}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, allow_nan=False)
        fh.write("\n")


def _cell(x: Any, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        if math.isinf(x):
            return "∞"
        if x != 0 and (abs(x) < 10 ** -(digits - 1) or abs(x) >= 1e5):
            return f"{x:.2e}"
        return f"{x:.{digits}f}"
    return str(x)


def diagnostics_markdown(summary: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table: one row per rule (means over the corpus, medians for KL, error bounds)."""
    head = ["rule", "n", "TV", "KL(P‖ref) median", "KL(ref‖P)", "overshoot", "ceiling max P/p (median)",
            "tail leak", "acceptance", "tokens/call", "max comp. err (TV)", "uncertain"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for e in summary:
        qs = e.get("quantiles", {})
        row = [
            f"`{e['rule']}`", str(e["n_positions"]), _cell(e["tv"]),
            _cell(qs.get("kl", {}).get("q50", e["kl"])), _cell(e["kl_reverse"]), _cell(e["overshoot"]),
            _cell(qs.get("ceiling_ratio", {}).get("q50", e["ceiling_ratio"]), 3), _cell(e["tail_leak"]),
            _cell(e["acceptance"]), _cell(e["tokens_per_call"], 3),
            _cell(e.get("max_compression_error", {}).get("tv", 0.0)), str(e.get("n_uncertain", 0)),
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("Means over positions unless marked; KL(P‖ref) is ∞ wherever a rule leaks mass outside "
                 "the baseline's support, so its median is shown. n/a: sequence-level rule (law = p, no "
                 "per-position acceptance). 'max comp. err' bounds the per-position error due to record "
                 "compression; 'uncertain' counts positions where no finite bound holds.")
    return "\n".join(lines) + "\n"


def write_diagnostics_markdown(path: str | os.PathLike, summary: Sequence[Mapping[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(diagnostics_markdown(summary))


# ---------------------------------------------------------------------------------------------------
# linking to benchmark results


def distortion_by_rule(summary: Sequence[Mapping[str, Any]], measure_name: str = "tv") -> dict[str, float]:
    """``{rule_spec: mean measure}`` from a :func:`summarize` result (for :func:`rank_correlation`)."""
    return {e["rule"]: float(e[measure_name]) for e in summary}


def rank_correlation(distortion_by_rule: Mapping[str, Any], accuracy_gap_by_rule: Mapping[str, Any]) -> dict[str, Any]:
    """Spearman ρ between a distortion measure and the accuracy gap, over the rules present in both.

    Non-numeric or NaN values are dropped (``inf`` is kept: it ranks last). Returns
    ``{"rho", "p_value", "n", "rules"}``; ``rho``/``p_value`` are NaN with fewer than 3 rules or a
    constant input.
    """
    from scipy.stats import spearmanr

    rules_common, xs, ys = [], [], []
    for spec, x in distortion_by_rule.items():
        if spec not in accuracy_gap_by_rule:
            continue
        y = accuracy_gap_by_rule[spec]
        try:
            x, y = float(x), float(y)
        except (TypeError, ValueError):
            continue
        if math.isnan(x) or math.isnan(y):
            continue
        rules_common.append(spec)
        xs.append(x)
        ys.append(y)
    n = len(xs)
    if n < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return {"rho": math.nan, "p_value": math.nan, "n": n, "rules": rules_common}
    res = spearmanr(xs, ys)
    return {"rho": float(res.statistic), "p_value": float(res.pvalue), "n": n, "rules": rules_common}
