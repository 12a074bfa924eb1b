"""Spec-Bench in the report: speed per category in the layout of Spec-Bench's table (Xia et al. 2024).

Spec-Bench runs are speed only (checker ``speed``): each category is a dataset of its own
(``spec_bench:<category>``, :func:`verispec.tasks.datasets.load_problems`) with its own target-only run on
the same prompts. A *method* here is one decoding configuration (rule, sampling, γ, tree, draft source,
models, budget, seed) over every category it ran. Per column (MT-bench's eight categories pooled into one,
then translation, summarization, QA, math reasoning, RAG, and all of them) the table gives the measured
**speed-up** over target-only: the pooled tokens/s of the method's samples over those of the target-only
samples of the same prompts (seconds after each prompt's prefill, the engine's ``Stats.wall_s``), with a
percentile-bootstrap interval over problems (:func:`verispec.bench.stats.speedup_interval`); beside it **τ**,
Spec-Bench's mean accepted tokens (new tokens per target call), and the **acceptance length**, vLLM's
``mean_acceptance_length`` (accepted drafts + 1 per step that verified drafts).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from verispec.tasks.builders import SPEC_BENCH, SPEC_BENCH_COLUMNS

from .rows import RunRow, pooled_speedup
from .stats import SpeedUp

__all__ = ["spec_bench_rows", "method_label", "methods", "column_speedups", "format_spec_bench"]

#: Column headings of Spec-Bench's table.
_HEADINGS = {"mt_bench": "MT-bench", "translation": "Translation", "summarization": "Summarization",
             "qa": "QA", "math_reasoning": "Math reasoning", "rag": "RAG"}


def spec_bench_rows(rows: Sequence[RunRow]) -> list[RunRow]:
    """The rows of Spec-Bench categories."""
    return [r for r in rows if r.dataset.startswith(SPEC_BENCH + ":")]


def category(row: RunRow) -> str:
    return row.dataset.split(":", 1)[1]


def method_label(r: RunRow) -> str:
    """A decoding configuration in words: ``target-only``, or the rule with its γ, tree and draft source."""
    if r.role == "target_only":
        return "target-only"
    parts = [r.rule, f"γ={r.gamma_label}"]
    if r.tree:
        parts.append(f"tree {r.tree}")
    parts.append(f"draft {r.draft}")
    return ", ".join(parts)


def _method_key(r: RunRow) -> tuple:
    k = r.key
    return (k.role, k.rule, k.sampling, r.gamma_label, k.tree, k.draft, k.target, k.max_new_tokens, k.seed)


def methods(rows: Sequence[RunRow]) -> "OrderedDict[tuple, list[RunRow]]":
    """Spec-Bench rows grouped by decoding configuration (target-only first), each with its categories' rows."""
    groups: OrderedDict[tuple, list[RunRow]] = OrderedDict()
    for r in sorted(spec_bench_rows(rows), key=lambda r: (r.role != "target_only",) + _method_key(r)[1:]):
        groups.setdefault(_method_key(r), []).append(r)
    return groups


def column_speedups(members: Sequence[RunRow], conf: float) -> dict[str, SpeedUp | None]:
    """Speed-up over target-only per Spec-Bench column and ``"overall"``, pooling the categories' samples."""
    by_cat = {category(r): r for r in members}
    out: dict[str, SpeedUp | None] = {}
    for name, cats in SPEC_BENCH_COLUMNS:
        pairs = [p for c in cats if c in by_cat for p in by_cat[c].speed_pairs]
        out[name] = pooled_speedup(pairs, conf) if pairs else None
    every = [p for r in members for p in r.speed_pairs]
    out["overall"] = pooled_speedup(every, conf) if every else None
    return out


def _fmt_speedup(s: SpeedUp | None) -> str:
    if s is None:
        return "n/a"
    if s.lo is None:
        return f"{s.estimate:.2f}×"
    return f"{s.estimate:.2f}× [{s.lo:.2f}, {s.hi:.2f}]"


def _ratio(num: int, den: int) -> str:
    return f"{num / den:.2f}" if den else "n/a"


def format_spec_bench(rows: Sequence[RunRow], conf: float = 0.95) -> str:
    """The Markdown of the report's Spec-Bench section ("" when no Spec-Bench run is in ``rows``): the table
    in Spec-Bench's layout, then every category on its own."""
    groups = methods(rows)
    if not groups:
        return ""
    pct = f"{100 * conf:g}%"
    head = ["method", "sampling", *(_HEADINGS[n] for n, _ in SPEC_BENCH_COLUMNS), "overall", "τ", "acc. length"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for members in groups.values():
        first = members[0]
        if first.role == "target_only":
            cells = ["1.00×"] * (len(SPEC_BENCH_COLUMNS) + 1)
        else:
            sp = column_speedups(members, conf)
            cells = [_fmt_speedup(sp[n]) for n, _ in SPEC_BENCH_COLUMNS] + [_fmt_speedup(sp["overall"])]
        tokens, calls = sum(r.new_tokens for r in members), sum(r.target_calls for r in members)
        accepted, steps = sum(r.accepted_drafts for r in members), sum(r.spec_steps for r in members)
        lines.append("| " + " | ".join([_esc(method_label(first)), _esc(first.sampling), *cells,
                                        _ratio(tokens, calls), f"{1 + accepted / steps:.2f}" if steps else "n/a"])
                     + " |")
    per_cat = ["| method | category | prompts | acc. length | τ | tok/s | speed-up [" + pct + " CI] |",
               "|---|---|---|---|---|---|---|"]
    for members in groups.values():
        for r in members:
            speed = "1.00×" if r.role == "target_only" else _fmt_speedup(r.speedup)
            per_cat.append(f"| {_esc(method_label(r))} | {category(r)} | {r.n_problems} | "
                           f"{_num(r.acceptance_length)} | {_num(r.block_efficiency)} | {_num(r.tokens_per_s, '.1f')}"
                           f" | {speed} |")
    n_prompts = sorted({r.n_problems for r in spec_bench_rows(rows)})
    return "\n".join([
        "## Spec-Bench (speed only)",
        "",
        f"Speed-up over target-only on the same prompts [{pct} bootstrap interval over prompts]; MT-bench pools its "
        "eight categories (first turn only). **τ**: new tokens per target call (Spec-Bench's mean accepted tokens); "
        "**acc. length**: accepted drafts + 1 per step that verified drafts (vLLM's mean acceptance length). "
        f"Prompts per category: {', '.join(map(str, n_prompts))}. Timings are each generation's wall-clock "
        "seconds after its prefill (as tok/s elsewhere in this report), on this machine: compare rows of one run "
        "only.",
        "",
        *lines,
        "",
        "### Per category",
        "",
        *per_cat,
        "",
    ])


def _num(v: float | None, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _esc(s) -> str:
    return str(s).replace("|", "\\|")
