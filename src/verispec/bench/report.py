"""Markdown + PNG report of a ``verispec bench`` result store.

One table row per run, grouped by dataset.  Per row:

* ``n problems`` / ``n samples``; ``accuracy`` = correct samples / samples, with a Wilson CI;
* ``Δ vs baseline``: paired accuracy difference (method − its true baseline, matched on
  (problem_id, sample_idx)), Newcombe method-10 CI and exact McNemar p (see :mod:`.stats`);
* ``BE`` (block efficiency) = total new tokens / total target calls;
* ``tok/s`` = total new tokens / total wall seconds;
* ``acc/step`` = mean number of draft tokens accepted per verification step, from the pooled
  ``accepted_hist`` (index = number accepted);
* ``cost speedup`` = token-weighted mean of ``meta["cost_model_speedup"]`` over the samples
  that carry it, "n/a" when none does.

Plots (matplotlib object API with the Agg canvas; pyplot's global state is never touched):

1. ``frontier.png``: accuracy vs block efficiency, one panel per dataset, one colour per rule
   family (rule name before ':'), points of one family joined in BE order per (sampling, γ);
   true baselines are hollow diamonds, target-only / lossless-reference runs horizontal lines.
2. ``accuracy_gap.png``: method − baseline accuracy per dataset with CI bars, one series per
   rule (configuration); datasets ordered easiest → hardest (mean ``meta["difficulty"]``
   ascending when every dataset has it, else reference accuracy descending).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .stats import paired_difference, wilson_interval
from .store import ResultStore, RunKey, SampleRecord

__all__ = [
    "ReportResult",
    "build_report",
    "collect_rows",
    "format_table",
    "order_datasets",
    "STORE_SUFFIXES",
]

STORE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
_ROLE_ORDER = {"target_only": 0, "lossless_ref": 1, "baseline": 2, "method": 3}
_ROLE_LABEL = {
    "method": "method",
    "baseline": "**baseline**",
    "target_only": "**target-only**",
    "lossless_ref": "**lossless ref**",
}


@dataclass
class ReportResult:
    markdown_path: Path
    plot_paths: list[Path]
    table_rows: list[dict] = field(default_factory=list)


# ------------------------------------------------------------------------------------------
# Loading


def _store_files(store_path_or_dir: str | Path) -> list[Path]:
    p = Path(store_path_or_dir)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in STORE_SUFFIXES)
        if not files:
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in STORE_SUFFIXES)
        if files:
            return files
        raise FileNotFoundError(f"no result store ({', '.join(STORE_SUFFIXES)}) under {p}")
    raise FileNotFoundError(f"{p} does not exist")


def _load(store_path_or_dir) -> "OrderedDict[str, tuple[RunKey, dict, list[SampleRecord]]]":
    """run_id -> (key, pair, samples), merged over every store file found (first copy wins)."""
    runs: OrderedDict[str, tuple[RunKey, dict, dict]] = OrderedDict()
    for f in _store_files(store_path_or_dir):
        with ResultStore(f) as st:
            for key, pair in st.runs():
                rid = key.run_id
                if rid not in runs:
                    runs[rid] = (key, dict(pair), {})
                else:
                    runs[rid][1].update(pair)
                recs = runs[rid][2]
                for r in st.iter_samples(rid):
                    recs.setdefault((r.problem_id, r.sample_idx), r)
    return OrderedDict(
        (rid, (k, p, [recs[x] for x in sorted(recs)])) for rid, (k, p, recs) in runs.items()
    )


# ------------------------------------------------------------------------------------------
# Per-run numbers


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _paired(samples: list[SampleRecord], ref: list[SampleRecord] | None, conf: float) -> dict:
    empty = {"diff": None, "diff_lo": None, "diff_hi": None, "p_value": None,
             "n_pairs": 0, "n01": 0, "n10": 0}
    if ref is None:
        return empty
    ref_by_key = {r.key: r.correct for r in ref}
    keys = sorted(k for k in {s.key for s in samples} if k in ref_by_key)
    if not keys:
        return empty
    mine = {s.key: s.correct for s in samples}
    res = paired_difference([mine[k] for k in keys], [ref_by_key[k] for k in keys], conf=conf)
    return {"diff": res.diff, "diff_lo": res.ci_lo, "diff_hi": res.ci_hi, "p_value": res.p_value,
            "n_pairs": res.n, "n01": res.n01, "n10": res.n10}


def _run_row(key: RunKey, pair: dict, samples: list[SampleRecord], runs: dict, conf: float) -> dict:
    n = len(samples)
    n_correct = sum(1 for s in samples if s.correct)
    lo, hi = wilson_interval(n_correct, n, conf) if n else (None, None)
    tok = sum(s.new_tokens for s in samples)
    calls = sum(s.target_calls for s in samples)
    wall = sum(s.wall_s for s in samples)
    hist: list[int] = []
    for s in samples:
        for i, c in enumerate(s.accepted_hist):
            if i >= len(hist):
                hist.extend([0] * (i + 1 - len(hist)))
            hist[i] += int(c)
    steps = sum(hist)
    # cost-model speedup: token-weighted mean over the samples that report it
    sp = [(v, s.new_tokens) for s in samples if (v := _num(s.meta.get("cost_model_speedup"))) is not None]
    if not sp:
        speedup = None
    elif sum(w for _, w in sp) > 0:
        speedup = sum(v * w for v, w in sp) / sum(w for _, w in sp)
    else:
        speedup = sum(v for v, _ in sp) / len(sp)
    diffs = [d for s in samples if (d := _num(s.meta.get("difficulty"))) is not None]

    def ref_samples(rel):
        rid = pair.get(rel)
        return runs[rid][2] if rid in runs else None

    row = {
        "run_id": key.run_id,
        "dataset": key.dataset,
        "rule": key.rule,
        "family": key.family,
        "sampling": key.sampling,
        "gamma": key.gamma,
        "role": key.role,
        "is_reference": key.role != "method",
        "draft": key.draft,
        "target": key.target,
        "max_new_tokens": key.max_new_tokens,
        "seed": key.seed,
        "n_problems": len({s.problem_id for s in samples}),
        "n_samples": n,
        "n_correct": n_correct,
        "accuracy": n_correct / n if n else None,
        "acc_lo": lo,
        "acc_hi": hi,
        "baseline_run_id": pair.get("baseline"),
        "lossless_ref_run_id": pair.get("lossless_ref"),
        "new_tokens": tok,
        "target_calls": calls,
        "wall_s": wall,
        "block_efficiency": tok / calls if calls > 0 else None,
        "tokens_per_s": tok / wall if wall > 0 else None,
        "mean_accepted": sum(i * c for i, c in enumerate(hist)) / steps if steps > 0 else None,
        "cost_model_speedup": speedup,
        "difficulty": sum(diffs) / len(diffs) if diffs else None,
    }
    row.update(_paired(samples, ref_samples("baseline"), conf))
    ll = _paired(samples, ref_samples("lossless_ref"), conf)
    row.update({f"ll_{k}": v for k, v in ll.items()})
    return row


def order_datasets(rows: list[dict]) -> list[str]:
    """Datasets ordered easiest -> hardest.

    By the mean ``meta["difficulty"]`` (ascending; samples of every run of the dataset pooled)
    when every dataset has one; otherwise by reference accuracy descending, where reference
    accuracy pools the dataset's baseline and target-only runs (all runs if it has none).
    Ties keep first-seen order.
    """
    datasets = list(OrderedDict.fromkeys(r["dataset"] for r in rows))
    diff_sum: dict[str, float] = defaultdict(float)
    diff_n: dict[str, int] = defaultdict(int)
    for r in rows:
        if r["difficulty"] is not None:
            diff_sum[r["dataset"]] += r["difficulty"] * r["n_samples"]
            diff_n[r["dataset"]] += r["n_samples"]
    if datasets and all(diff_n[d] > 0 for d in datasets):
        return sorted(datasets, key=lambda d: diff_sum[d] / diff_n[d])
    return sorted(datasets, key=lambda d: -_reference_accuracy(rows, d))


def _reference_accuracy(rows: list[dict], dataset: str) -> float:
    mine = [r for r in rows if r["dataset"] == dataset]
    refs = [r for r in mine if r["role"] in ("baseline", "target_only")] or mine
    n = sum(r["n_samples"] for r in refs)
    return sum(r["n_correct"] for r in refs) / n if n else 0.0


def _row_sort_key(r: dict):
    return (_ROLE_ORDER.get(r["role"], 9), r["family"], r["rule"], r["sampling"], r["gamma"],
            r["draft"], r["target"], r["max_new_tokens"], r["seed"])


def collect_rows(store_path_or_dir: str | Path, conf: float = 0.95) -> list[dict]:
    """One dict per run (see the module docstring), grouped by dataset (easiest first) and,
    within a dataset, reference runs (target-only, lossless ref, baseline) before methods."""
    runs = _load(store_path_or_dir)
    rows = [_run_row(k, p, s, runs, conf) for k, p, s in runs.values()]
    order = {d: i for i, d in enumerate(order_datasets(rows))}
    return sorted(rows, key=lambda r: (order[r["dataset"]],) + _row_sort_key(r))


# ------------------------------------------------------------------------------------------
# Markdown


def _f(v, fmt: str, na: str = "n/a") -> str:
    return na if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _fmt_p(p) -> str:
    if p is None:
        return "—"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _fmt_diff(r: dict, prefix: str = "") -> str:
    d = r.get(prefix + "diff")
    if d is None:
        return "—" if r.get("is_reference") else "n/a"
    s = f"{d:+.3f} [{r[prefix + 'diff_lo']:+.3f}, {r[prefix + 'diff_hi']:+.3f}]"
    if r.get(prefix + "n_pairs") != r.get("n_samples"):
        s += f" (n={r[prefix + 'n_pairs']})"
    return s


def _esc(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


_TEXT_COLS = {"dataset", "rule", "sampling", "γ", "role", "draft", "target"}


def format_table(rows: list[dict]) -> str:
    """A Markdown table of ``rows`` (as produced by :func:`collect_rows`).

    A ``dataset`` column appears when rows span several datasets; ``draft``/``target``/
    ``max new``/``seed`` columns when they vary; a ``Δ vs lossless`` column when any row has a
    lossless reference.  Reference runs are marked in the ``role`` column (bold).
    """
    if not rows:
        return "_no runs_\n"
    cols: list[tuple[str, callable]] = []
    if len({r["dataset"] for r in rows}) > 1:
        cols.append(("dataset", lambda r: _esc(r["dataset"])))
    cols += [
        ("rule", lambda r: _esc(r["rule"])),
        ("sampling", lambda r: _esc(r["sampling"])),
        ("γ", lambda r: str(r["gamma"])),
        ("role", lambda r: _ROLE_LABEL.get(r["role"], _esc(r["role"]))),
    ]
    for name, k in (("draft", "draft"), ("target", "target"), ("max new", "max_new_tokens"), ("seed", "seed")):
        if len({r[k] for r in rows}) > 1:
            cols.append((name, lambda r, k=k: _esc(r[k])))
    cols += [
        ("problems", lambda r: str(r["n_problems"])),
        ("samples", lambda r: str(r["n_samples"])),
        ("accuracy [95% CI]", lambda r: "n/a" if r["accuracy"] is None else
         f"{r['accuracy']:.3f} [{r['acc_lo']:.3f}, {r['acc_hi']:.3f}]"),
        ("Δ vs baseline [95% CI]", _fmt_diff),
        ("McNemar p", lambda r: _fmt_p(r.get("p_value"))),
    ]
    if any(r.get("ll_diff") is not None for r in rows):
        cols += [
            ("Δ vs lossless [95% CI]", lambda r: _fmt_diff(r, "ll_")),
            ("p (lossless)", lambda r: _fmt_p(r.get("ll_p_value"))),
        ]
    cols += [
        ("BE", lambda r: _f(r["block_efficiency"], ".2f")),
        ("tok/s", lambda r: _f(r["tokens_per_s"], ".1f")),
        ("acc/step", lambda r: _f(r["mean_accepted"], ".2f")),
        ("cost speedup", lambda r: _f(r["cost_model_speedup"], ".2f") + ("×" if r["cost_model_speedup"] is not None else "")),
    ]
    lines = [
        "| " + " | ".join(c for c, _ in cols) + " |",
        "|" + "|".join("---" if c in _TEXT_COLS else "---:" for c, _ in cols) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(fn(r) for _, fn in cols) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# Plots


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


def _rule_param(rule: str) -> str:
    return rule.split(":", 1)[1] if ":" in rule else ""


def _families_of_baselines(rows: list[dict]) -> dict[str, tuple[str | None, str]]:
    """baseline run_id -> (family of the methods paired with it or None if several, their rule
    parameters joined) -- used to colour and tag the baseline markers."""
    fams: dict[str, set] = defaultdict(set)
    params: dict[str, list] = defaultdict(list)
    for r in rows:
        if r["role"] == "method" and r["baseline_run_id"]:
            fams[r["baseline_run_id"]].add(r["family"])
            p = _rule_param(r["rule"])
            if p and p not in params[r["baseline_run_id"]]:
                params[r["baseline_run_id"]].append(p)
    return {
        rid: (next(iter(f)) if len(f) == 1 else None, "/".join(params[rid]))
        for rid, f in fams.items()
    }


def _plot_frontier(rows: list[dict], datasets: list[str], path: Path) -> Path:
    from matplotlib.lines import Line2D

    n = max(1, len(datasets))
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(5.2 * ncols + 2.6, 4.2 * nrows + 0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    families = list(OrderedDict.fromkeys(r["family"] for r in rows if r["role"] == "method"))
    colour = _colours(families)
    marker = {f: _MARKERS[i % len(_MARKERS)] for i, f in enumerate(families)}
    base_family = _families_of_baselines(rows)
    ref_styles = {"target_only": ("0.25", "--"), "lossless_ref": ("0.45", ":")}
    legend: OrderedDict[str, object] = OrderedDict()
    for ax, ds in zip(axes, datasets):
        mine = [r for r in rows if r["dataset"] == ds and r["accuracy"] is not None]
        # reference lines: target-only and lossless reference runs
        for r in mine:
            if r["role"] in ref_styles:
                c, ls = ref_styles[r["role"]]
                ax.axhline(r["accuracy"], color=c, ls=ls, lw=1.2, zorder=1)
                lab = f"{r['role'].replace('_', '-')} ({r['sampling']})"
                ax.annotate(lab, xy=(1.0, r["accuracy"]), xycoords=("axes fraction", "data"),
                            xytext=(-3, 2), textcoords="offset points", ha="right", va="bottom",
                            fontsize=7, color=c)
                legend.setdefault(r["role"], Line2D([], [], color=c, ls=ls, lw=1.2,
                                                    label=r["role"].replace("_", "-") + " accuracy"))
        # true baselines: hollow diamonds in their family's colour
        for r in mine:
            if r["role"] == "baseline" and r["block_efficiency"] is not None:
                fam, tag = base_family.get(r["run_id"], (None, ""))
                c = colour.get(fam, "0.3") if fam else "0.3"
                ax.errorbar(r["block_efficiency"], r["accuracy"],
                            yerr=[[r["accuracy"] - r["acc_lo"]], [r["acc_hi"] - r["accuracy"]]],
                            fmt="D", mfc="white", mec=c, ecolor=c, ms=7, mew=1.5, capsize=3,
                            elinewidth=0.8, zorder=3)
                if tag:  # the rule parameter of the paired method(s), e.g. "0.5"
                    ax.annotate(tag, (r["block_efficiency"], r["accuracy"]), xytext=(-6, 0),
                                textcoords="offset points", ha="right", va="center",
                                fontsize=6.5, color=c)
                legend.setdefault("baseline", Line2D([], [], ls="none", marker="D", mfc="white",
                                                     mec="0.3", ms=7, label="true baseline\n(target-only + truncation;\ntag = paired rule parameter)"))
        # methods: one colour per family, joined per (sampling, γ, models) in BE order
        show_gamma = len({r["gamma"] for r in mine if r["role"] == "method"}) > 1
        groups: OrderedDict[tuple, list[dict]] = OrderedDict()
        for r in mine:
            if r["role"] == "method" and r["block_efficiency"] is not None:
                groups.setdefault((r["family"], r["sampling"], r["gamma"], r["draft"], r["target"]), []).append(r)
        for (fam, *_), grp in groups.items():
            grp.sort(key=lambda r: r["block_efficiency"])
            xs = [r["block_efficiency"] for r in grp]
            ys = [r["accuracy"] for r in grp]
            yerr = [[r["accuracy"] - r["acc_lo"] for r in grp], [r["acc_hi"] - r["accuracy"] for r in grp]]
            ax.errorbar(xs, ys, yerr=yerr, color=colour[fam], marker=marker[fam], ms=6, lw=1.3,
                        capsize=3, elinewidth=0.8, zorder=4)
            for r in grp:
                tag = _rule_param(r["rule"])
                if show_gamma:
                    tag = (tag + f" γ={r['gamma']}").strip()
                ax.annotate(tag, (r["block_efficiency"], r["accuracy"]), xytext=(4, 4),
                            textcoords="offset points", fontsize=6.5, color=colour[fam])
            legend.setdefault("fam:" + fam, Line2D([], [], color=colour[fam], marker=marker[fam],
                                                   lw=1.3, label=f"{fam}"))
        ax.margins(x=0.12)  # room for the tags left of the baseline markers
        ax.set_title(f"{ds}: speed–quality frontier", fontsize=10)
        ax.set_xlabel("block efficiency (new tokens / target call)")
        ax.set_ylabel("accuracy (95% Wilson CI)")
        ax.grid(True, alpha=0.3)
        lo, hi = ax.get_ylim()
        ax.set_ylim(max(-0.02, lo), min(1.02, hi))
        if not mine:
            ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center")
    for ax in axes[len(datasets):]:
        ax.set_visible(False)
    if legend:
        fig.legend(handles=list(legend.values()), loc="outside right upper", fontsize=8,
                   title="rule family / reference", title_fontsize=8, frameon=False)
    fig.suptitle("Accuracy vs block efficiency (up-right is better)", fontsize=12)
    fig.savefig(path)
    return path


def _series_label(r: dict, vary: dict[str, bool]) -> str:
    parts = [r["rule"]]
    if vary["sampling"]:
        parts.append(r["sampling"])
    if vary["gamma"]:
        parts.append(f"γ={r['gamma']}")
    if vary["models"]:
        parts.append(f"{r['draft']}→{r['target']}")
    return ", ".join(parts)


def _plot_gap(rows: list[dict], datasets: list[str], path: Path) -> Path:
    import numpy as np

    meth = [r for r in rows if r["role"] == "method" and r["diff"] is not None]
    vary = {
        "sampling": len({r["sampling"] for r in meth}) > 1,
        "gamma": len({r["gamma"] for r in meth}) > 1,
        "models": len({(r["draft"], r["target"]) for r in meth}) > 1,
    }
    series: OrderedDict[str, dict[str, dict]] = OrderedDict()
    for r in sorted(meth, key=_row_sort_key):
        series.setdefault(_series_label(r, vary), {})[r["dataset"]] = r
    fig = _new_figure(max(6.5, 1.6 * len(datasets) + 4.0), 4.8)
    ax = fig.add_subplot()
    fams = list(OrderedDict.fromkeys(r["family"] for r in sorted(meth, key=_row_sort_key)))
    colour = _colours(fams)
    x = np.arange(len(datasets), dtype=float)
    width = 0.8 / max(1, len(series))
    per_family_count: dict[str, int] = defaultdict(int)
    for i, (label, by_ds) in enumerate(series.items()):
        fam = next(iter(by_ds.values()))["family"]
        j = per_family_count[fam]
        per_family_count[fam] += 1
        xs, ys, lo, hi = [], [], [], []
        for k, ds in enumerate(datasets):
            r = by_ds.get(ds)
            if r is None:
                continue
            xs.append(x[k] - 0.4 + width * (i + 0.5))
            ys.append(r["diff"])
            lo.append(r["diff"] - r["diff_lo"])
            hi.append(r["diff_hi"] - r["diff"])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=_MARKERS[j % len(_MARKERS)], color=colour[fam],
                    ms=6, capsize=3, elinewidth=1.0, lw=0.8, ls="-" if len(xs) > 1 else "none",
                    alpha=0.95, label=label)
    ax.axhline(0.0, color="0.2", lw=1.0)
    ticks = []
    diff_known = all(any(r["difficulty"] is not None for r in rows if r["dataset"] == d) for d in datasets)
    for ds in datasets:
        if diff_known:
            dd = [r for r in rows if r["dataset"] == ds and r["difficulty"] is not None]
            v = sum(r["difficulty"] * r["n_samples"] for r in dd) / max(1, sum(r["n_samples"] for r in dd))
            ticks.append(f"{ds}\n(difficulty {v:.2g})")
        else:
            ticks.append(f"{ds}\n(ref. acc {_reference_accuracy(rows, ds):.2f})")
    ax.set_xticks(x, ticks, fontsize=8)
    ax.set_xlim(-0.6, len(datasets) - 0.4)
    ax.set_xlabel("dataset (easier → harder)")
    ax.set_ylabel("accuracy − baseline accuracy")
    ax.set_title("Accuracy gap vs true baseline (paired; 95% Newcombe CI)", fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    if series:
        fig.legend(loc="outside right upper", fontsize=8, title="rule", title_fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no method run has a paired baseline", transform=ax.transAxes, ha="center")
    fig.savefig(path)
    return path


# ------------------------------------------------------------------------------------------
# Entry point


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def build_report(store_path_or_dir: str | Path, out_dir: str | Path, conf: float = 0.95) -> ReportResult:
    """Read a store file (or every store file in a directory), write ``report.md``,
    ``frontier.png``, ``accuracy_gap.png`` and ``summary.json`` (the table rows) to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = collect_rows(store_path_or_dir, conf)
    datasets = order_datasets(rows)
    pct = f"{100 * conf:g}%"
    plots = [
        _plot_frontier(rows, datasets, out / "frontier.png"),
        _plot_gap(rows, datasets, out / "accuracy_gap.png"),
    ]
    srcs = ", ".join(f"`{p}`" for p in _store_files(store_path_or_dir))
    md = [
        "# verispec bench report",
        "",
        f"Source: {srcs}  ",
        f"Runs: {len(rows)} ({sum(r['role'] == 'method' for r in rows)} method, "
        f"{sum(r['role'] != 'method' for r in rows)} reference) over {len(datasets)} dataset(s); "
        f"{sum(r['n_samples'] for r in rows)} samples.",
        "",
        "Datasets are listed easiest first (by mean `difficulty` when every dataset has one, "
        "else by reference accuracy).",
        "",
    ]
    for ds in datasets:
        md += [f"## {ds}", "", format_table([r for r in rows if r["dataset"] == ds]), ""]
    md += [
        "## Plots",
        "",
        "![Accuracy vs block efficiency](frontier.png)",
        "",
        "![Accuracy gap vs true baseline](accuracy_gap.png)",
        "",
        "## Notes",
        "",
        f"- **accuracy**: correct samples / samples, {pct} Wilson score interval.",
        "- **Δ vs baseline**: accuracy of the run minus accuracy of its *true baseline* (target-only "
        "sampling with the rule's truncation), paired on (problem, sample index); "
        f"{pct} Newcombe (1998) method-10 interval; **McNemar p** is the exact two-sided McNemar "
        "test on the discordant pairs (p = 1 with none). `(n=…)` marks a partial pairing.",
        "- The CIs and tests treat samples as independent; several samples of one problem are "
        "correlated, so with `samples > problems` they are somewhat optimistic.",
        "- **BE**: total new tokens / total target calls. **tok/s**: total new tokens / total wall "
        "seconds. **acc/step**: mean accepted draft tokens per verification step. "
        "**cost speedup**: token-weighted mean of the cost-model speedup recorded per sample.",
        "",
    ]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md), encoding="utf-8")
    (out / "summary.json").write_text(
        json.dumps([{k: _json_safe(v) for k, v in r.items()} for r in rows], indent=1),
        encoding="utf-8",
    )
    return ReportResult(markdown_path=md_path, plot_paths=plots, table_rows=rows)
