"""Figures of the diagnostics (matplotlib, Agg canvas; no global backend change).

* :func:`plot_frontier` — distortion vs acceptance, one series per rule family, each point labelled
  with its parameter: the rules' frontier in distribution space;
* :func:`plot_distortion_vs_entropy` — binned mean distortion per rule against the target entropy;
* :func:`plot_position` — one recorded position (Figure-2 style): tokens sorted by target probability
  (top ``top`` + "rest"), bars for ``p`` and ``q``, their overlap ``min(p, q)``, and the induced
  distribution of each chosen rule;
* :func:`plot_tree_form` — each rule's tree form beside its chain form at the same nodes, overall
  and by target entropy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verispec import rules as rules_mod
from verispec.outputs import atomic_path

_LABELS = {
    "tv": "TV distance to the true baseline",
    "kl": "KL(P_R ‖ baseline) [nats]",
    "kl_reverse": "KL(baseline ‖ P_R) [nats]",
    "overshoot": "overshoot Σ(P_R − p)+",
    "ceiling_ratio": "ceiling ratio max P_R/p",
    "tail_leak": "tail mass outside the baseline support",
    "acceptance": "acceptance rate β (per position)",
    "tokens_per_call": "expected tokens per target call",
}
_SYMBOL = {"ell": "ℓ", "lam": "λ", "mu": "μ", "kappa": "κ", "p_base": "p_base", "eps": "ε", "alpha": "α"}


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | os.PathLike) -> str:
    path = os.fspath(path)
    with atomic_path(path) as tmp:   # a full disk leaves no half-written PNG
        fig.savefig(tmp, format="png")
    return path


def _param_label(entry: Mapping[str, Any]) -> str:
    params = entry.get("params") or {}
    if not params:
        return ""
    parts = []
    for k, v in params.items():
        if isinstance(v, str):
            continue
        parts.append(f"{_SYMBOL.get(k, k)}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}")
    return ",".join(parts)


def _family_label(entry: Mapping[str, Any]) -> str:
    fam = entry.get("family") or entry["rule"].split(":")[0]
    params = entry.get("params") or {}
    extra = [f"{k}={v}" for k, v in params.items() if isinstance(v, str)]
    return fam + (f" ({','.join(extra)})" if extra else "")


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def plot_frontier(summary: Sequence[Mapping[str, Any]], path: str | os.PathLike, *, x: str = "acceptance",
                  y: str = "tv", title: str | None = None) -> str:
    """Distortion ``y`` vs ``x`` (acceptance or tokens_per_call), one series per family. Returns ``path``.

    Rules without a per-position acceptance (``block``, ``hsd``) cannot be placed and are listed in
    the caption instead.
    """
    fig = _figure(7.5, 5.2)
    ax = fig.add_subplot()
    groups: dict[str, list[Mapping[str, Any]]] = {}
    skipped = []
    for e in summary:
        if math.isnan(_num(e.get(x))) or math.isnan(_num(e.get(y))):
            skipped.append(e["rule"])
            continue
        groups.setdefault(_family_label(e), []).append(e)
    markers = "osD^v<>Ph*X"
    finite_y = [_num(e[y]) for g in groups.values() for e in g if math.isfinite(_num(e[y]))]
    cap = max(finite_y) * 1.15 if finite_y and max(finite_y) > 0 else 1.0
    for i, (fam, entries) in enumerate(sorted(groups.items())):
        entries = sorted(entries, key=lambda e: _num(e[x]))
        xs = [_num(e[x]) for e in entries]
        ys = [_num(e[y]) if math.isfinite(_num(e[y])) else cap for e in entries]
        lossless = all(e.get("is_lossless") for e in entries)
        ax.plot(xs, ys, marker="*" if lossless else markers[i % len(markers)], ms=11 if lossless else 7,
                lw=1.5, label=fam)
        for e, xv, yv in zip(entries, xs, ys):
            lab = _param_label(e)
            if not math.isfinite(_num(e[y])):
                lab = (lab + " " if lab else "") + "(∞)"
            if lab:
                ax.annotate(lab, (xv, yv), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel(_LABELS.get(x, x))
    ax.set_ylabel(_LABELS.get(y, y) + " (mean over positions)")
    ax.grid(True, alpha=0.3)
    ax.legend(title="rule family", fontsize=8, title_fontsize=9, loc="best")
    n = max((int(e.get("n_positions", 0)) for e in summary), default=0)
    ax.set_title(title or f"Distortion–acceptance frontier ({n} recorded positions)")
    if skipped:
        ax.text(0.99, 0.01, "not shown (no per-position acceptance): " + ", ".join(skipped), fontsize=7,
                transform=ax.transAxes, ha="right", va="bottom", color="0.35")
    return _save(fig, path)


def _bin_label(lo: float, hi: float) -> str:
    return f"[{lo:g}, {hi:g})" if math.isfinite(hi) else f"≥ {lo:g}"


def plot_distortion_vs_entropy(summary: Sequence[Mapping[str, Any]], path: str | os.PathLike, *, y: str = "tv",
                               title: str | None = None) -> str:
    """Binned mean of measure ``y`` against the target entropy (bins of ``summary[i]["by_entropy"]``)."""
    fig = _figure(9.5, 5.0)
    ax = fig.add_subplot()
    bins = summary[0]["by_entropy"] if summary else []
    labels = [_bin_label(b["lo"], b["hi"]) for b in bins]
    xs = np.arange(len(bins))
    # colour by family, marker/line style by member within the family
    families = sorted({_family_label(e) for e in summary})
    palette = [f"C{i % 10}" for i in range(len(families))]
    colour = dict(zip(families, palette))
    seen: dict[str, int] = {}
    markers, styles = "osD^vP", ["-", "--", "-.", ":"]
    for e in summary:
        vals = [(_num(b[y]) if b["n"] else math.nan) for b in e["by_entropy"]]
        if all(math.isnan(v) for v in vals):
            continue
        fam = _family_label(e)
        k = seen.get(fam, 0)
        seen[fam] = k + 1
        ax.plot(xs, vals, marker=markers[k % len(markers)], ls=styles[k % len(styles)], lw=1.5, ms=5,
                color=colour[fam], label=e["rule"])
    counts = [b["n"] for b in bins]
    ax.set_xticks(xs, [f"{lab}\nn={c}" for lab, c in zip(labels, counts)], fontsize=8)
    ax.set_xlabel("target entropy H(p) [nats]")
    ax.set_ylabel(_LABELS.get(y, y) + " (bin mean)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(title or "Distortion vs target entropy")
    return _save(fig, path)


def plot_position(records, index: int, rule_specs: Sequence[str], path: str | os.PathLike, *, top: int = 20,
                  decode: Callable[[int], str] | None = None, log: bool = False, title: str | None = None) -> str:
    """Figure-2-style view of recorded position ``index``: tokens sorted by ``p`` (top ``top`` + rest).

    Bars: ``p`` (target) and ``q`` (draft); black ticks: the overlap ``min(p, q)``; lines: the induced
    distribution ``P_R`` of each per-token rule in ``rule_specs`` (computed on the record; sequence-level
    rules are skipped: their law is ``p``). ``decode`` maps token ids to labels.
    """
    pbar, qbar, ids = records.dense([index])
    p, q, ids = pbar[0], qbar[0], ids[0]
    width = ids.shape[0]
    order = torch.argsort(p[:width], descending=True, stable=True)[:top]
    curves = {}
    for spec in rule_specs:
        rule = rules_mod.get(spec)
        if not rule.per_token:
            continue
        curves[rule.spec()] = rule.induced(pbar, qbar)[0]

    def shown(dist: torch.Tensor) -> np.ndarray:
        vals = dist[order].numpy()
        return np.append(vals, max(0.0, 1.0 - float(vals.sum())))

    pv, qv = shown(p), shown(q)
    ov = np.minimum(pv[:-1], qv[:-1])
    labels = []
    for t in ids[order].tolist():
        lab = decode(t) if decode is not None else str(t)
        labels.append(repr(lab)[1:-1] if decode is not None else lab)
    labels.append("rest")
    xs = np.arange(len(pv))
    fig = _figure(max(8.0, 0.45 * len(xs) + 2), 5.4)
    ax = fig.add_subplot()
    ax.bar(xs - 0.2, pv, width=0.4, color="#9e9e9e", label="target p")
    ax.bar(xs + 0.2, qv, width=0.4, color="#90caf9", label="draft q")
    ax.hlines(ov, xs[:-1] - 0.4, xs[:-1] + 0.4, colors="black", lw=1.5, label="overlap min(p, q)")
    styles = ["-o", "-s", "-D", "-^", "-v", "-P", "-X"]
    for i, (spec, dist) in enumerate(curves.items()):
        ax.plot(xs, shown(dist), styles[i % len(styles)], ms=4, lw=1.2, label=f"P_R {spec}")
    ax.set_xticks(xs, labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("probability")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("token (sorted by target probability)" + (" id" if decode is None else ""))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    m = records.meta()
    desc = (f"{m['dataset'][index] or '?'} / {m['problem_id'][index] or '?'}, step {m['step'][index]}, "
            f"position {m['position'][index]}; H(p) = {float(m['target_entropy'][index]):.3f} nats; "
            f"rest p = {float(m['p_rest'][index]):.1e}, q = {float(m['q_rest'][index]):.1e}")
    ax.set_title(title or desc, fontsize=9)
    return _save(fig, path)


def plot_tree_form(summary: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> str:
    """Tree form vs chain form of each rule at the same decision nodes
    (:func:`verispec.diagnose.tree_form.summarize_tree_form`): left, mean TV to the true baseline per
    rule; right, TV by target entropy, chain dashed and tree solid, one colour per rule."""
    rows = [e for e in summary if e.get("tree_form") and _num(e["chain_form"].get("tv")) > 0]
    fig = _figure(12, 4.6)
    left, right = fig.subplots(1, 2)
    names = [e["rule"] for e in rows]
    xs = np.arange(len(rows))
    left.bar(xs - 0.2, [_num(e["chain_form"]["tv"]) for e in rows], 0.4, label="chain form (same nodes)")
    left.bar(xs + 0.2, [_num(e["tree_form"]["tv"]) for e in rows], 0.4, label="tree form")
    for x, e in zip(xs, rows):
        left.annotate(f"{_num(e['tv_amplification']):.2f}x", (x + 0.2, _num(e["tree_form"]["tv"])),
                      ha="center", va="bottom", fontsize=8)
    left.set_xticks(xs, names, rotation=35, ha="right", fontsize=8)
    left.set_ylabel(_LABELS["tv"])
    left.set_title(f"{summary[0]['tree'] if summary else ''}: {summary[0]['n_decision_nodes'] if summary else 0} "
                   "decision nodes", fontsize=9)
    top = max([_num(e["tree_form"]["tv"]) for e in rows] + [_num(e["chain_form"]["tv"]) for e in rows] + [1e-9])
    left.set_ylim(0, 1.3 * top)
    left.legend(fontsize=8, loc="upper right")
    for i, e in enumerate(rows):
        bins = e.get("by_entropy") or []
        centers = [(b["lo"] + (b["hi"] if math.isfinite(b["hi"]) else b["lo"] + 1)) / 2 for b in bins]
        colour = f"C{i % 10}"
        right.plot(centers, [_num(b["tv_chain"]) for b in bins], "--", color=colour, marker="o", markersize=3)
        right.plot(centers, [_num(b["tv_tree"]) for b in bins], "-", color=colour, marker="o", markersize=3,
                   label=e["rule"])
    right.set_xlabel("target entropy at the node [nats] (bin centres)")
    right.set_ylabel("TV: chain form dashed, tree form solid")
    right.legend(fontsize=7)
    return _save(fig, path)
