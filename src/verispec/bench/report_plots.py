"""Figures of the bench report (matplotlib object API with the Agg canvas; pyplot's global state is
never touched).

* :func:`plot_frontier`: accuracy vs block efficiency, one panel per dataset. Every point and line is
  named in the legend and nothing is written on the axes, so no label can collide with another or
  with a reference line; runs on the same point are spread by a small horizontal offset.
* :func:`plot_gap`: accuracy gap to the true baseline per dataset (easiest first), and to plain
  target sampling (the wrong baseline) for truncation rules.
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from pathlib import Path

from verispec.outputs import atomic_path

from .rows import RunRow, baseline_label, reference_accuracy, row_sort_key
from .spec_bench import column_speedups, method_label, methods

__all__ = ["plot_frontier", "plot_gap", "plot_spec_bench"]




def _new_figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colours(names: Iterable[str]) -> dict[str, tuple]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(names)}


_MARKERS = ["o", "s", "^", "v", "P", "X", "*", "<", ">", "h"]


def _families_of_baselines(rows: list[RunRow]) -> dict[str, tuple[str | None, str]]:
    """baseline run_id -> (family of the methods paired with it or None if several, the truncation it
    adds, e.g. ``min_p=0.3``) -- used to colour and name the baseline markers."""
    fams: dict[str, set] = defaultdict(set)
    extra: dict[str, str] = {}
    by_id = {r.run_id: r for r in rows}
    for r in rows:
        if r.role == "method" and r.baseline_run_id in by_id and by_id[r.baseline_run_id].role == "baseline":
            fams[r.baseline_run_id].add(r.family)
            extra[r.baseline_run_id] = baseline_label(r, by_id).replace("target + ", "")
    return {rid: (next(iter(f)) if len(f) == 1 else None, extra.get(rid, "")) for rid, f in fams.items()}


def plot_frontier(rows: list[RunRow], datasets: list[str], path: Path) -> Path:
    """Accuracy vs BE.  Every point and line is named in the legend (nothing is written on the axes,
    so labels cannot collide with each other or with the reference lines); methods that land on the
    same point are spread by a small horizontal offset so that none hides another."""
    from matplotlib.lines import Line2D

    n = max(1, len(datasets))
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(5.2 * ncols + 3.6, 4.2 * nrows + 0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    meth = [r for r in rows if r.role == "method"]
    families = list(OrderedDict.fromkeys(r.family for r in meth))
    colour = _colours(families)
    members: dict[str, list[str]] = defaultdict(list)   # family -> member labels, for markers
    vary = {"sampling": len({r.sampling for r in meth}) > 1, "gamma": len({r.gamma_label for r in meth}) > 1,
            "models": len({(r.draft, r.target) for r in meth}) > 1}
    base_family = _families_of_baselines(rows)
    ref_styles = {"target_only": ("0.2", "--"), "lossless_ref": ("0.5", ":")}
    ref_samplings = list(OrderedDict.fromkeys(r.sampling for r in rows if r.role in ref_styles))
    legend: OrderedDict[str, object] = OrderedDict()
    for ax, ds in zip(axes, datasets):
        mine = [r for r in rows if r.dataset == ds and r.accuracy.estimate is not None]
        for r in mine:
            if r.role in ref_styles:
                c, ls = ref_styles[r.role]
                width = 1.2 + 0.8 * ref_samplings.index(r.sampling) if len(ref_samplings) > 1 else 1.2
                ax.axhline(r.accuracy.estimate, color=c, ls=ls, lw=width, zorder=1)
                label = r.role.replace("_", "-").replace("ref", "reference") + " accuracy"
                if len(ref_samplings) > 1:
                    label += f" ({r.sampling})"
                legend.setdefault(label, Line2D([], [], color=c, ls=ls, lw=width, label=label))
                if r.role == "lossless_ref" and r.block_efficiency is not None:  # the speed reference
                    a = r.accuracy
                    ax.errorbar(r.block_efficiency, a.estimate, yerr=[[a.estimate - a.lo], [a.hi - a.estimate]],
                                fmt="*", color="0.15", ms=12, capsize=3, elinewidth=0.8, zorder=5)
                    label = "lossless SD (speed reference)"
                    legend.setdefault(label, Line2D([], [], ls="none", marker="*", color="0.15", ms=12, label=label))
        # runs with the same (BE, accuracy) would hide each other: spread them by a small x offset
        bes = [r.block_efficiency for r in mine if r.block_efficiency is not None] or [1.0]
        step = 0.025 * max(max(bes) - min(bes), 0.5)
        same: dict[tuple, list[str]] = defaultdict(list)
        for r in mine:
            if r.role in ("method", "baseline") and r.block_efficiency is not None:
                same[(round(r.block_efficiency, 3), round(r.accuracy.estimate, 3))].append(r.run_id)
        dx = {rid: (i - (len(ids) - 1) / 2) * step for ids in same.values() for i, rid in enumerate(ids)}
        for r in mine:
            if r.role == "baseline" and r.block_efficiency is not None:
                fam, extra = base_family.get(r.run_id, (None, ""))
                c = colour.get(fam, "0.3") if fam else "0.3"
                a = r.accuracy
                ax.errorbar(r.block_efficiency + dx[r.run_id], a.estimate,
                            yerr=[[a.estimate - a.lo], [a.hi - a.estimate]], fmt="D", mfc="white", mec=c, ecolor=c,
                            ms=7, mew=1.5, capsize=3, elinewidth=0.8, zorder=3)
                label = f"true baseline{' of ' + fam if fam else ''}: target + {extra or r.sampling}"
                legend.setdefault(label, Line2D([], [], ls="none", marker="D", mfc="white", mec=c, mew=1.5, ms=7,
                                                label=label))
        groups: OrderedDict[tuple, list[RunRow]] = OrderedDict()
        for r in mine:
            if r.role == "method" and r.block_efficiency is not None:
                groups.setdefault((r.family, r.sampling, r.gamma_label, r.draft, r.target), []).append(r)
        for (fam, *_), grp in groups.items():
            grp.sort(key=lambda r: r.block_efficiency)
            if len(grp) > 1:  # the family's frontier
                ax.plot([r.block_efficiency for r in grp], [r.accuracy.estimate for r in grp], color=colour[fam],
                        lw=1.0, alpha=0.6, zorder=2)
            for r in grp:
                label = _series_label(r, vary)
                if label not in members[fam]:
                    members[fam].append(label)
                mk = _MARKERS[members[fam].index(label) % len(_MARKERS)]
                a = r.accuracy
                ax.errorbar(r.block_efficiency + dx[r.run_id], a.estimate,
                            yerr=[[a.estimate - a.lo], [a.hi - a.estimate]],
                            color=colour[fam], marker=mk, ms=7, ls="none", capsize=3, elinewidth=0.8, zorder=4)
                legend.setdefault(label, Line2D([], [], color=colour[fam], marker=mk, ms=7, ls="none", label=label))
        ax.margins(x=0.08)
        ax.set_title(f"{ds}: accuracy vs block efficiency (up-right is better)", fontsize=10)
        ax.set_xlabel("block efficiency (new tokens / target call)")
        ax.set_ylabel("accuracy (95% CI)")
        ax.grid(True, alpha=0.3)
        lo, hi = ax.get_ylim()
        ax.set_ylim(max(-0.05, lo), min(1.05, hi))
        if not mine:
            ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center")
    for ax in axes[len(datasets):]:
        ax.set_visible(False)
    if legend:
        fig.legend(handles=list(legend.values()), loc="outside right upper", fontsize=8,
                   title="run (hollow ◇: true baselines)", title_fontsize=8, frameon=False)
    with atomic_path(path) as tmp:   # a full disk leaves no half-written PNG
        fig.savefig(tmp, format="png")
    return path


def _series_label(r: RunRow, vary: dict[str, bool]) -> str:
    parts = [r.rule]
    if vary["sampling"]:
        parts.append(r.sampling)
    if vary["gamma"]:
        parts.append(f"γ={r.gamma_label}")
    if vary["models"]:
        parts.append(f"{r.draft}→{r.target}")
    return ", ".join(parts)


def plot_gap(rows: list[RunRow], datasets: list[str], path: Path) -> Path:
    import numpy as np

    meth = [r for r in rows if r.role == "method" and r.vs_baseline is not None]
    vary = {
        "sampling": len({r.sampling for r in meth}) > 1,
        "gamma": len({r.gamma_label for r in meth}) > 1,
        "models": len({(r.draft, r.target) for r in meth}) > 1,
    }
    # one series per rule vs its true baseline, plus one per truncation rule vs the wrong baseline
    series: OrderedDict[tuple[str, bool], dict[str, RunRow]] = OrderedDict()
    for r in sorted(meth, key=row_sort_key):
        series.setdefault((_series_label(r, vary), False), {})[r.dataset] = r
        if r.vs_target_only is not None:
            series.setdefault((_series_label(r, vary), True), {})[r.dataset] = r
    fig = _new_figure(max(6.5, 1.6 * len(datasets) + 5.0), 4.8)
    ax = fig.add_subplot()
    fams = list(OrderedDict.fromkeys(r.family for r in sorted(meth, key=row_sort_key)))
    colour = _colours(fams)
    x = np.arange(len(datasets), dtype=float)
    width = 0.8 / max(1, len(series))
    marker_of: dict[str, str] = {}
    per_family_count: dict[str, int] = defaultdict(int)
    for i, ((label, wrong), by_ds) in enumerate(series.items()):
        fam = next(iter(by_ds.values())).family
        if label not in marker_of:
            marker_of[label] = _MARKERS[per_family_count[fam] % len(_MARKERS)]
            per_family_count[fam] += 1
        xs, ys, lo, hi = [], [], [], []
        for k, ds in enumerate(datasets):
            r = by_ds.get(ds)
            if r is None:
                continue
            c = r.vs_target_only if wrong else r.vs_baseline
            xs.append(x[k] - 0.4 + width * (i + 0.5))
            ys.append(c.diff)
            lo.append(c.diff - c.lo)
            hi.append(c.hi - c.diff)
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=marker_of[label], color=colour[fam],
                    mfc="white" if wrong else colour[fam], ms=6, capsize=3, elinewidth=1.0, lw=0.8,
                    ls="-" if len(xs) > 1 else "none", alpha=0.95,
                    label=label + (" vs target-only (wrong baseline)" if wrong else ""))
    ax.axhline(0.0, color="0.2", lw=1.0)
    ticks = []
    diff_known = all(any(r.difficulty is not None for r in rows if r.dataset == d) for d in datasets)
    for ds in datasets:
        if diff_known:
            dd = [r for r in rows if r.dataset == ds and r.difficulty is not None]
            v = sum(r.difficulty * r.n_samples for r in dd) / max(1, sum(r.n_samples for r in dd))
            ticks.append(f"{ds}\n(difficulty {v:.2g})")
        else:
            ticks.append(f"{ds}\n(ref. acc {reference_accuracy(rows, ds):.2f})")
    ax.set_xticks(x, ticks, fontsize=8)
    ax.set_xlim(-0.6, len(datasets) - 0.4)
    ax.set_xlabel("dataset (easier → harder)")
    ax.set_ylabel("accuracy − baseline accuracy")
    ax.set_title("Accuracy gap vs true baseline (filled) and, for truncation rules,\nvs plain target "
                 "sampling (hollow; paired, 95% CI)", fontsize=10)
    return _save_with_legend(fig, ax, path, "rule", bool(series), "no method run has a paired baseline")


def plot_spec_bench(rows: list[RunRow], conf: float, path: Path) -> Path:
    """Speed-up over target-only per Spec-Bench column (and overall), one bar per method with its bootstrap
    interval; the line at 1 is target-only."""
    import numpy as np

    from verispec.tasks.builders import SPEC_BENCH_COLUMNS

    columns = [name for name, _ in SPEC_BENCH_COLUMNS] + ["overall"]
    groups = [m for m in methods(rows).values() if m[0].role != "target_only"]
    fig = _new_figure(max(7.0, 1.3 * len(columns) + 4.0), 4.6)
    ax = fig.add_subplot()
    x = np.arange(len(columns), dtype=float)
    width = 0.8 / max(1, len(groups))
    colour = _colours(method_label(m[0]) for m in groups)
    for i, members in enumerate(groups):
        label = method_label(members[0])
        sp = column_speedups(members, conf)
        xs = [x[k] - 0.4 + width * (i + 0.5) for k, c in enumerate(columns) if sp[c] is not None]
        known = [sp[c] for c in columns if sp[c] is not None]
        lo = [s.estimate - (s.lo if s.lo is not None else s.estimate) for s in known]
        hi = [(s.hi if s.hi is not None else s.estimate) - s.estimate for s in known]
        ax.bar(xs, [s.estimate for s in known], width * 0.9, yerr=[lo, hi], capsize=2, color=colour[label],
               label=label, error_kw={"elinewidth": 0.8})
    ax.axhline(1.0, color="0.2", lw=1.0, ls="--")
    ax.set_xticks(x, columns, fontsize=8)
    ax.set_ylabel("speed-up over target-only (tokens/s)")
    ax.set_title(f"Spec-Bench: measured speed-up per column ({100 * conf:g}% bootstrap interval)", fontsize=10)
    return _save_with_legend(fig, ax, path, "method", bool(groups), "no method run beside a target-only run")


def _save_with_legend(fig, ax, path: Path, title: str, has_series: bool, empty_note: str) -> Path:
    """A y grid, the legend beside the axes (or ``empty_note`` on them when nothing was drawn), then the PNG."""
    ax.grid(True, axis="y", alpha=0.3)
    if has_series:
        fig.legend(loc="outside right upper", fontsize=8, title=title, title_fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, empty_note, transform=ax.transAxes, ha="center")
    with atomic_path(path) as tmp:   # a full disk leaves no half-written PNG
        fig.savefig(tmp, format="png")
    return path
