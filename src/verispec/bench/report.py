"""Markdown + PNG report of a ``verispec bench`` result store.

One :class:`~.rows.RunRow` per run (computed in :mod:`.rows`, drawn by :mod:`.report_plots`), grouped
by dataset (easiest first), reference runs before methods.

* ``accuracy`` = correct samples / samples (:class:`Accuracy`).  Its interval is Wilson's; when a
  problem of the run has several samples they are correlated, and the interval shown is the
  *problem-clustered* one (:func:`.stats.clustered_proportion`), with the sample-level one beside it
  in a separate table;
* ``Δ vs baseline``: paired accuracy difference (run − its true baseline, matched on (problem, sample))
  (:class:`Comparison`): Newcombe method-10 interval and exact McNemar p, or with several samples per
  problem their clustered versions (:func:`.stats.clustered_paired_difference`);
  ``Δ vs lossless`` the same against the lossless reference run; for truncation rules also
  ``Δ vs target-only``, the comparison with the *wrong* baseline (plain target sampling);
* truncation (:class:`Truncation`): the share of samples that hit the token limit
  (``stop_reason == "length"``), the accuracy among the samples that finished, and a warning when the
  share reaches :data:`TRUNCATION_WARN_SHARE`;
* ``flexible acc.``: the share of samples the checker's lenient verdict (``meta["correct_flexible"]``,
  e.g. GSM8K flexible extraction) accepts, over the samples that have one;
* ``BE`` = new tokens / target calls; ``tok/s`` = new tokens / wall seconds; ``acc/step`` = mean
  accepted drafts per verification step (pooled ``accepted_hist``); ``cost speedup`` = token-weighted
  mean of the per-sample cost-model speedup;
* per-token distortion of every rule of a (dataset, sampling, γ, models) group, exact, on the (p, q)
  recorded in that group's lossless run (:mod:`.distortion`).

Files: ``report.md``, ``summary.json`` (the rows), ``frontier.png`` (accuracy vs block efficiency;
every point named in the legend, none on the axes), ``accuracy_gap.png`` (gap to the true baseline per
dataset, and to the wrong one for truncation rules), ``figure2_<dataset>.png`` (one recorded position:
p, q, overlap and each rule's induced law).  Plots use matplotlib's object API with the Agg canvas
(pyplot's global state is never touched).
"""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from verispec.outputs import ensure_out_dir, write_text_atomic

from .distortion import RECORDED_RULE, plot_figure2
from .report_plots import plot_frontier, plot_gap, plot_spec_bench
from .rows import (
    STORE_SUFFIXES,
    TRUNCATION_WARN_SHARE,
    Accuracy,
    Comparison,
    RunRow,
    Truncation,
    baseline_label,
    collect_rows,
    load_rows,
    order_datasets,
    store_files,
)
from .spec_bench import format_spec_bench, spec_bench_rows

__all__ = [
    "Accuracy",
    "Comparison",
    "Truncation",
    "RunRow",
    "ReportResult",
    "build_report",
    "collect_rows",
    "format_table",
    "order_datasets",
    "STORE_SUFFIXES",
    "TRUNCATION_WARN_SHARE",
]

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
    table_rows: list[RunRow] = field(default_factory=list)


# ------------------------------------------------------------------------------------------
# Markdown


def _f(v, fmt: str, na: str = "n/a") -> str:
    return na if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _fmt_p(p) -> str:
    if p is None:
        return "—"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _fmt_acc(a: Accuracy | None, iid: bool = False) -> str:
    if a is None or a.estimate is None:
        return "n/a"
    lo, hi = (a.iid_lo, a.iid_hi) if iid else (a.lo, a.hi)
    return f"{a.estimate:.3f} [{lo:.3f}, {hi:.3f}]" + (" ᶜ" if a.clustered and not iid else "")


def _fmt_cmp(c: Comparison | None, row: RunRow, iid: bool = False) -> str:
    if c is None:
        return "—" if row.is_reference else "n/a"
    lo, hi = (c.iid_lo, c.iid_hi) if iid else (c.lo, c.hi)
    s = f"{c.diff:+.3f} [{lo:+.3f}, {hi:+.3f}]" + (" ᶜ" if c.clustered and not iid else "")
    if c.n_pairs != row.n_samples:
        s += f" (n={c.n_pairs})"
    return s


def _fmt_trunc(t: Truncation) -> str:
    if t.share is None:
        return "n/a"
    return f"{t.share:.2f}" + (" ⚠" if t.warn else "")


def _esc(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


_TEXT_COLS = {"dataset", "rule", "sampling", "γ", "role", "draft", "target", "true baseline", "decoding"}


def _table(cols: list[tuple[str, callable]], rows: list) -> str:
    lines = [
        "| " + " | ".join(c for c, _ in cols) + " |",
        "|" + "|".join("---" if c in _TEXT_COLS else "---:" for c, _ in cols) + "|",
    ]
    lines += ["| " + " | ".join(fn(r) for _, fn in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def format_table(rows: list[RunRow], conf: float = 0.95) -> str:
    """The main Markdown table of ``rows`` (as produced by :func:`collect_rows`).

    A ``dataset`` column appears when rows span several datasets; ``draft``/``target``/``max new``/
    ``seed`` columns when they vary; ``Δ vs lossless`` when any row has a lossless reference;
    ``flexible acc.`` when any sample carries a lenient verdict.  ``ᶜ`` marks a problem-clustered
    interval.  Reference runs are marked in the ``role`` column (bold).
    """
    if not rows:
        return "_no runs_\n"
    pct = f"{100 * conf:g}%"
    cols: list[tuple[str, callable]] = []
    if len({r.dataset for r in rows}) > 1:
        cols.append(("dataset", lambda r: _esc(r.dataset)))
    cols += [
        ("rule", lambda r: _esc(r.rule)),
        ("sampling", lambda r: _esc(r.sampling)),
        ("γ", lambda r: r.gamma_label),
        ("role", lambda r: _ROLE_LABEL.get(r.role, _esc(r.role))),
    ]
    if any(r.decoding for r in rows):
        cols.append(("decoding", lambda r: _esc("; ".join(r.decoding) or "not recorded")))
    if any(r.tree for r in rows):
        cols.insert(-1, ("tree", lambda r: _esc(r.tree or "chain")))
    for name, attr in (("draft", "draft"), ("target", "target"), ("max new", "max_new_tokens"), ("seed", "seed")):
        if len({getattr(r, attr) for r in rows}) > 1:
            cols.append((name, lambda r, a=attr: _esc(getattr(r, a))))
    cols += [
        ("problems", lambda r: str(r.n_problems)),
        ("samples", lambda r: str(r.n_samples)),
        (f"accuracy [{pct} CI]", lambda r: _fmt_acc(r.accuracy)),
    ]
    if any(r.flexible is not None for r in rows):
        cols.append(("flexible acc.", lambda r: _f(r.flexible.estimate if r.flexible else None, ".3f")))
    cols += [
        ("truncated", lambda r: _fmt_trunc(r.truncation)),
        ("acc. finished", lambda r: _f(r.truncation.finished_accuracy, ".3f")),
        (f"Δ vs baseline [{pct} CI]", lambda r: _fmt_cmp(r.vs_baseline, r)),
        ("McNemar p", lambda r: _fmt_p(r.vs_baseline.p_value if r.vs_baseline else None)),
    ]
    if any(r.vs_lossless is not None for r in rows):
        cols += [
            (f"Δ vs lossless [{pct} CI]", lambda r: _fmt_cmp(r.vs_lossless, r)),
            ("p (lossless)", lambda r: _fmt_p(r.vs_lossless.p_value if r.vs_lossless else None)),
        ]
    cols += [
        ("BE", lambda r: _f(r.block_efficiency, ".2f")),
        ("tok/s", lambda r: _f(r.tokens_per_s, ".1f")),
        ("acc/step", lambda r: _f(r.mean_accepted, ".2f")),
        ("cost speedup", lambda r: _f(r.cost_model_speedup, ".2f") + ("×" if r.cost_model_speedup is not None else "")),
    ]
    return _table(cols, rows)


def format_wrong_baseline_table(rows: list[RunRow], conf: float = 0.95) -> str:
    """Truncation rules against their true baseline and against plain target sampling."""
    pct = f"{100 * conf:g}%"
    by_id = {r.run_id: r for r in rows}
    mine = [r for r in rows if r.vs_target_only is not None]
    if not mine:
        return ""
    cols = [
        ("rule", lambda r: _esc(r.rule)),
        ("true baseline", lambda r: _esc(baseline_label(r, by_id))),
        (f"Δ vs true baseline [{pct} CI]", lambda r: _fmt_cmp(r.vs_baseline, r)),
        (f"Δ vs target-only (wrong) [{pct} CI]", lambda r: _fmt_cmp(r.vs_target_only, r)),
        ("TV to true baseline", lambda r: _f(r.distortion.tv if r.distortion else None, ".4f")),
        ("TV to target p (wrong)", lambda r: _f(r.distortion.tv_to_target if r.distortion else None, ".4f")),
    ]
    return _table(cols, mine)


def _num_cell(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    if x != 0 and abs(x) < 10 ** -(digits - 1):
        return f"{x:.1e}"
    return f"{x:.{digits}f}"


def format_distortion_table(rows: list[RunRow], conf: float = 0.95) -> str:
    """Per rule: exact per-token distortion against its true baseline, beside its accuracy gap."""
    pct = f"{100 * conf:g}%"
    by_id = {r.run_id: r for r in rows}
    mine = [r for r in rows if r.distortion is not None]
    if not mine:
        return ""
    cols = [
        ("rule", lambda r: _esc(r.rule)),
        ("true baseline", lambda r: _esc(baseline_label(r, by_id))),
        (f"Δ acc. vs baseline [{pct} CI]", lambda r: _fmt_cmp(r.vs_baseline, r)),
        ("TV", lambda r: _num_cell(r.distortion.tv)),
        ("KL(P‖ref) median", lambda r: _num_cell(r.distortion.kl_median)),
        ("KL = ∞ share", lambda r: _num_cell(r.distortion.kl_inf_fraction, 3)),
        ("KL(ref‖P)", lambda r: _num_cell(r.distortion.kl_reverse)),
        ("overshoot = TV to p", lambda r: _num_cell(r.distortion.overshoot)),
        ("ceiling ratio mean / max", lambda r: f"{_num_cell(r.distortion.ceiling_ratio, 3)} / "
                                               f"{_num_cell(r.distortion.ceiling_ratio_max, 3)}"),
        ("tail leak", lambda r: _num_cell(r.distortion.tail_leak)),
        ("acceptance", lambda r: _num_cell(r.distortion.acceptance, 3)),
        ("tokens/call", lambda r: _num_cell(r.distortion.tokens_per_call, 2)),
        ("measured BE", lambda r: _f(r.block_efficiency, ".2f")),
    ]
    return _table(cols, mine)


def format_interval_table(rows: list[RunRow], conf: float = 0.95) -> str:
    """Problem-clustered intervals beside the sample-level ones, for runs with several samples per problem."""
    pct = f"{100 * conf:g}%"
    mine = [r for r in rows if r.accuracy.clustered or (r.vs_baseline and r.vs_baseline.clustered)]
    if not mine:
        return ""
    cols = [
        ("rule", lambda r: _esc(r.rule)),
        ("role", lambda r: _ROLE_LABEL.get(r.role, _esc(r.role))),
        (f"accuracy, clustered [{pct}]", lambda r: _fmt_acc(r.accuracy)),
        (f"accuracy, samples [{pct}]", lambda r: _fmt_acc(r.accuracy, iid=True)),
        ("design effect", lambda r: _f(r.accuracy.design_effect, ".2f")),
        ("Δ vs baseline, clustered", lambda r: _fmt_cmp(r.vs_baseline, r)),
        ("p clustered", lambda r: _fmt_p(r.vs_baseline.p_value if r.vs_baseline else None)),
        ("Δ vs baseline, samples", lambda r: _fmt_cmp(r.vs_baseline, r, iid=True)),
        ("exact McNemar p", lambda r: _fmt_p(r.vs_baseline.iid_p_value if r.vs_baseline else None)),
    ]
    return _table(cols, mine)


# ------------------------------------------------------------------------------------------
# Entry point


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_") or "dataset"


def _warnings(rows: list[RunRow]) -> list[str]:
    """One line per dataset listing the runs whose truncation share reaches the warning level."""
    by_ds: OrderedDict[str, list[RunRow]] = OrderedDict()
    for r in rows:
        if r.truncation.warn and not r.speed_only:     # a cut output is still timed right: only accuracy suffers
            by_ds.setdefault(r.dataset, []).append(r)
    out = []
    for ds, runs in by_ds.items():
        parts = []
        for r in runs:
            t = r.truncation
            name = (r.rule if r.role == "method"
                    else f"{r.rule} ({r.role.replace('_', '-')}{', ' + r.sampling if r.role == 'baseline' else ''})")
            parts.append(f"{_esc(name)}: {t.n_truncated}/{t.n_known} cut ({t.share:.0%}), accuracy "
                         f"{_f(r.accuracy.estimate, '.3f')} vs {_f(t.finished_accuracy, '.3f')} on the finished")
        limits = sorted({r.max_new_tokens for r in runs})
        out.append(f"- ⚠ **{_esc(ds)}** — samples hit the {'/'.join(map(str, limits))}-token limit in "
                   f"{len(runs)} run(s); their accuracy measures the token budget as much as the rule "
                   f"(raise `--max-new-tokens`): " + "; ".join(parts) + ".")
    return out


_RELATIONS = (("baseline_run_id", "its true baseline"), ("lossless_ref_run_id", "its lossless reference"),
              ("target_only_run_id", "plain target sampling"))


def _numerics_text(keys) -> str:
    return " and ".join(f"{backend}, {how}" for backend, how in keys)


def _by_vllm(row: RunRow) -> bool:
    """Whether every sample of ``row`` was decoded by vLLM (``integrations.vllm``: it records no positions)."""
    return bool(row.decoding) and all(d.startswith("vLLM") for d in row.decoding)


def decoding_warnings(rows: list[RunRow]) -> list[str]:
    """One line per run that mixes several ways of decoding, and per comparison of two runs decoded
    differently (:func:`~.rows.numerics_key`: backend, one at a time / rows alone / batch size): their
    outputs can then differ by the round-off of batched model calls, not by the rule."""
    by_id = {r.run_id: r for r in rows}
    out = []
    for r in rows:
        name = r.rule if r.role == "method" else f"{r.rule} ({r.role.replace('_', '-')})"
        if len(r.numerics) > 1:
            out.append(f"- ⚠ **{_esc(name)}** ({_esc(r.dataset)}) mixes samples decoded as "
                       f"{_esc(_numerics_text(r.numerics))} (a bench resumed with another --batch-size or "
                       "backend): its samples do not share one arithmetic.")
        for attr, what in _RELATIONS:
            ref = by_id.get(getattr(r, attr) or "")
            if ref is None or not r.numerics or not ref.numerics or set(r.numerics) == set(ref.numerics):
                continue
            if attr == "target_only_run_id" and ref.run_id == r.baseline_run_id:
                continue
            out.append(f"- ⚠ **{_esc(name)}** ({_esc(r.dataset)}) was decoded as {_esc(_numerics_text(r.numerics))}, "
                       f"{what} as {_esc(_numerics_text(ref.numerics))}: batched model calls round differently, so "
                       "outputs can differ where the top tokens nearly tie, whatever the rule. Rerun both with the "
                       "same --batch-size, or with --batch-invariant (llama.cpp, transformers).")
    return out


def build_report(store_path_or_dir: str | Path, out_dir: str | Path, conf: float = 0.95) -> ReportResult:
    """Read a store file (or every store file in a directory; the stores are only read), write
    ``report.md``, ``summary.json`` (the rows), ``frontier.png``, ``accuracy_gap.png`` and, where
    lossless runs recorded positions, ``figure2_<dataset>.png`` to ``out_dir``. Every file is written
    whole or not at all."""
    out = ensure_out_dir(out_dir)
    read_warnings: list[str] = []
    rows, corpora = load_rows(store_path_or_dir, conf, distortion=True, warnings=read_warnings)
    datasets = order_datasets(rows)
    # speed-only datasets (Spec-Bench) have their own section and plot: no accuracy to show
    graded = [d for d in datasets if not all(r.speed_only for r in rows if r.dataset == d)]
    pct = f"{100 * conf:g}%"
    plots = [
        plot_frontier(rows, graded, out / "frontier.png"),
        plot_gap(rows, graded, out / "accuracy_gap.png"),
    ] if graded else []
    spec_bench = format_spec_bench(rows, conf)
    if spec_bench:
        plots.append(plot_spec_bench(spec_bench_rows(rows), conf, out / "spec_bench.png"))
    figure2: dict[tuple, Path] = {}
    for c in corpora:
        name = f"figure2_{_slug(c.group[0])}" + (f"_{len(figure2)}" if any(g[0] == c.group[0] for g in figure2) else "")
        path = plot_figure2(c.records, c.rules, out / f"{name}.png", tokens=c.tokens)   # written atomically
        if path is not None:
            figure2[c.group] = path
            plots.append(path)
    srcs = ", ".join(f"`{p}`" for p in store_files(store_path_or_dir))
    warnings = _warnings(rows)
    md = [
        "# verispec bench report",
        "",
        f"Source: {srcs}  ",
        f"Runs: {len(rows)} ({sum(r.role == 'method' for r in rows)} method, "
        f"{sum(r.role != 'method' for r in rows)} reference) over {len(datasets)} dataset(s); "
        f"{sum(r.n_samples for r in rows)} samples.",
        "",
        "Datasets are listed easiest first (by mean `difficulty` when every dataset has one, "
        "else by reference accuracy).",
        "",
    ]
    if warnings:
        md += ["**Truncation warnings**", "", *warnings, ""]
    decoding = decoding_warnings(rows)
    if decoding:
        md += ["**Decoding warnings**", "", *decoding, ""]
    if read_warnings:
        md += ["**Store warnings**", "", *(f"- ⚠ {_esc(w)}" for w in read_warnings), ""]
    if spec_bench:
        md += [spec_bench, "![Spec-Bench: speed-up over target-only per column](spec_bench.png)", ""]
    for ds in graded:
        mine = [r for r in rows if r.dataset == ds]
        md += [f"## {ds}", "", format_table(mine, conf), ""]
        wrong = format_wrong_baseline_table(mine, conf)
        if wrong:
            md += ["### Truncation rules: true baseline vs the wrong one", "",
                   "A truncation rule samples from a truncated target; compared with plain target sampling "
                   "it is charged for the truncation its true baseline also applies.", "", wrong, ""]
        dist = format_distortion_table(mine, conf)
        if dist:
            n_pos = sum(len(c.records) for c in corpora if c.group[0] == ds)
            n_missing = sum(c.missing for c in corpora if c.group[0] == ds)
            md += ["### Per-token distortion (exact, on the positions recorded in the lossless run)", "",
                   f"{n_pos} drafted positions of {ds}"
                   + (f" ({n_missing} stored lossless samples had no recorded positions). " if n_missing else ". ")
                   + "Means over positions against each rule's true baseline; accuracy on a few problems cannot "
                   "separate rules, these numbers can.", "", dist, ""]
            for g, path in figure2.items():
                if g[0] == ds:
                    md += [f"![Figure-2 view: one recorded position of {ds}]({path.name})", ""]
        elif any(r.rule == RECORDED_RULE and r.n_samples and _by_vllm(r) for r in mine):
            md += ["_Per-token distortion: the vLLM engine does not record (p, q) at drafted positions; run the "
                   "same bench with verispec's engine (without `--engine vllm`) for this table._", ""]
        elif any(r.rule == RECORDED_RULE and r.n_samples for r in mine):
            md += ["_Per-token distortion: the lossless run of this dataset has no recorded positions (a store "
                   "written before the bench recorded them, or a deleted `positions/` folder); run the bench into "
                   "a new `--out` to record them._", ""]
        clustered = format_interval_table(mine, conf)
        if clustered:
            md += ["### Problem-clustered vs sample-level intervals", "", clustered, ""]
    if graded:
        md += [
            "## Plots",
            "",
            "![Accuracy vs block efficiency](frontier.png)",
            "",
            "![Accuracy gap vs true baseline](accuracy_gap.png)",
            "",
        ]
    md += [
        "## Notes",
        "",
        f"- **accuracy**: correct samples / samples, {pct} Wilson score interval. With several samples per "
        "problem (samples are then correlated) the interval shown is problem-clustered (marked ᶜ): Wilson at "
        "the effective sample size n / design effect, the design effect comparing the cluster-robust variance "
        "with the independent-samples one; the sample-level intervals are listed beside it.",
        "- **Δ vs baseline**: accuracy of the run minus accuracy of its *true baseline* (target-only "
        "sampling with the rule's truncation), paired on (problem, sample index); "
        f"{pct} Newcombe (1998) method-10 interval; **McNemar p** is the exact two-sided McNemar "
        "test on the discordant pairs (p = 1 with none); with several samples per problem, Newcombe's interval "
        "at the effective sample size and the clustered McNemar test (Durkalski et al. 2003). "
        "`(n=…)` marks a partial pairing.",
        f"- **truncated**: share of samples that hit the token limit (⚠ from {TRUNCATION_WARN_SHARE:.0%}); "
        "**acc. finished**: accuracy among the samples that ended on their own (EOS or a stop string). "
        "**flexible acc.**: the checker's lenient verdict where it gives one.",
        "- **BE**: total new tokens / total target calls. **tok/s**: total new tokens / total wall "
        "seconds. **acc/step**: mean accepted draft tokens per verification step. "
        "**cost speedup**: token-weighted mean of the cost-model speedup recorded per sample.",
        "- **Per-token distortion**: on every drafted position of the lossless run (the target's own "
        "trajectories), TV and KL between each rule's induced law and its true baseline, overshoot "
        "Σ(P − p)+ (which is also the TV to plain target sampling p: for truncation rules the distance to the "
        "wrong baseline), ceiling ratio max P/p, tail leak (mass outside the baseline's support), acceptance "
        "and tokens per target call at the recorded draft blocks.",
        "",
    ]
    md_path = write_text_atomic(out / "report.md", "\n".join(md))
    write_text_atomic(out / "summary.json", json.dumps([r.to_dict() for r in rows], indent=1))
    return ReportResult(markdown_path=md_path, plot_paths=plots, table_rows=rows)
