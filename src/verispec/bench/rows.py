"""Typed rows of a ``verispec bench`` result store: one :class:`RunRow` per run.

Numbers per run (see :mod:`verispec.bench.report` for how they are shown):

* :class:`Accuracy`: correct samples / samples with Wilson's interval -- problem-clustered
  (:func:`.stats.clustered_proportion`) when a problem of the run has several samples, with the
  sample-level interval kept beside it;
* :class:`Comparison`: paired accuracy difference against the run's true baseline, the lossless
  reference, and -- for rules whose true baseline is not plain target sampling -- against the
  target-only run (the *wrong* baseline): Newcombe method 10 and exact McNemar, or their clustered
  versions (:func:`.stats.clustered_paired_difference`);
* :class:`Truncation`: share of samples cut at the token limit and accuracy of the others;
* speed: block efficiency, tokens/s, accepted drafts per step, cost-model speedup, and the measured
  speed-up over the target-only run on the same prompts (:func:`.stats.speedup_interval`);
* speed-only runs (Spec-Bench: checker ``speed``, :func:`is_speed_only`) have no accuracy and no comparison;
* :class:`~.distortion.RuleDistortion`: exact per-token distortion on the positions recorded in the
  group's lossless run (attached by :func:`collect_rows` with ``distortion=True``).
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verispec import rules as rule_registry
from verispec.tasks.checkers.speed import NOT_GRADED

from .distortion import RECORDED_RULE, RuleDistortion, distortions, load_positions
from .records import RunKey, SampleRecord
from .stats import (
    SpeedUp,
    clustered_paired_difference,
    clustered_proportion,
    paired_difference,
    speedup_interval,
    wilson_interval,
)
from .store import ResultStore

__all__ = [
    "Accuracy",
    "Comparison",
    "Truncation",
    "RunRow",
    "collect_rows",
    "load_rows",
    "order_datasets",
    "baseline_label",
    "reference_accuracy",
    "row_sort_key",
    "store_files",
    "attach_distortion",
    "json_safe",
    "Corpus",
    "STORE_SUFFIXES",
    "TRUNCATION_WARN_SHARE",
    "decoding_label",
    "numerics_key",
    "is_speed_only",
    "SpeedPair",
]

STORE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
#: a run whose share of samples cut at the token limit reaches this is flagged: its accuracy then
#: measures the budget as much as the rule (a cut-off answer is graded as it stands)
TRUNCATION_WARN_SHARE = 0.2
_ROLE_ORDER = {"target_only": 0, "lossless_ref": 1, "baseline": 2, "method": 3}


# ------------------------------------------------------------------------------------------
# Rows


@dataclass(frozen=True)
class Accuracy:
    """``n_correct / n`` with the interval shown (``lo``, ``hi``: problem-clustered when ``clustered``)
    and the sample-level Wilson interval (``iid_lo``, ``iid_hi``).  ``estimate`` is None for no samples."""

    n_correct: int
    n: int
    estimate: float | None
    lo: float | None
    hi: float | None
    iid_lo: float | None
    iid_hi: float | None
    clustered: bool = False
    design_effect: float | None = None

    @classmethod
    def of(cls, outcomes: list[bool], problems: list[str], conf: float) -> "Accuracy":
        n, k = len(outcomes), sum(bool(x) for x in outcomes)
        if n == 0:
            return cls(0, 0, None, None, None, None, None)
        lo, hi = wilson_interval(k, n, conf)
        if len(set(problems)) == n:  # one sample per problem: nothing to cluster
            return cls(k, n, k / n, lo, hi, lo, hi)
        c = clustered_proportion(outcomes, problems, conf)
        return cls(k, n, k / n, c.lo, c.hi, lo, hi, True, c.design_effect)


@dataclass(frozen=True)
class Comparison:
    """Accuracy of a run minus that of ``ref_run_id``, paired on (problem, sample index).

    ``lo``/``hi``/``p_value`` are the interval and test shown (``test``: ``"mcnemar_exact"``, or
    ``"mcnemar_clustered"`` when a problem has several pairs); ``iid_*`` the sample-level Newcombe
    interval and exact McNemar p.  ``n01``: pairs only the reference got right; ``n10``: only this run."""

    ref_run_id: str
    diff: float
    lo: float
    hi: float
    p_value: float
    test: str
    n_pairs: int
    n01: int
    n10: int
    iid_lo: float
    iid_hi: float
    iid_p_value: float
    clustered: bool = False
    design_effect: float | None = None


@dataclass(frozen=True)
class Truncation:
    """Samples cut at the token limit and the accuracy of the others.

    ``share`` = truncated / samples with a known stop reason (None when none is known);
    ``finished_accuracy`` = correct / finished samples (None when none finished); ``warn`` when the share
    reaches :data:`TRUNCATION_WARN_SHARE`."""

    n_truncated: int
    n_known: int
    share: float | None
    n_finished: int
    finished_accuracy: float | None
    warn: bool


@dataclass(frozen=True)
class SpeedPair:
    """One sample of a run beside the target-only run's sample of the same prompt (problem, sample index):
    what :func:`.stats.speedup_interval` pools, kept so that the report can pool runs over datasets."""

    problem: str
    tokens: int
    seconds: float
    target_only_tokens: int
    target_only_seconds: float


@dataclass
class RunRow:
    """Everything the report shows about one run."""

    key: RunKey
    n_problems: int
    n_samples: int
    accuracy: Accuracy
    truncation: Truncation
    flexible: Accuracy | None          # the checker's lenient verdict, where samples carry one
    new_tokens: int
    target_calls: int
    wall_s: float
    block_efficiency: float | None
    tokens_per_s: float | None
    mean_accepted: float | None
    cost_model_speedup: float | None
    difficulty: float | None
    baseline_run_id: str | None = None
    lossless_ref_run_id: str | None = None
    target_only_run_id: str | None = None
    vs_baseline: Comparison | None = None
    vs_lossless: Comparison | None = None
    vs_target_only: Comparison | None = None   # the wrong baseline, for rules whose true one is not it
    distortion: RuleDistortion | None = None   # exact per-token distortion, where positions were recorded
    #: how the samples were decoded (:func:`decoding_label`), distinct values; empty before it was recorded
    decoding: tuple[str, ...] = ()
    #: distinct :func:`numerics_key` of the samples (samples with one key share the float arithmetic per row)
    numerics: tuple[tuple, ...] = ()
    #: the samples are timed, never graded (checker ``speed``): no accuracy, no comparison
    speed_only: bool = False
    spec_steps: int = 0             # verification steps that verified drafted tokens
    accepted_drafts: int = 0        # drafted tokens accepted over those steps
    #: measured speed-up over the target-only run on the same prompts (None: no such run, or no pair)
    speedup: SpeedUp | None = None
    speed_pairs: tuple[SpeedPair, ...] = field(default=(), repr=False)

    @property
    def acceptance_length(self) -> float | None:
        """Tokens emitted per verification step that verified drafts: accepted drafts + the next token (vLLM's
        ``mean_acceptance_length``; Spec-Bench's τ counts plain steps too: that is ``block_efficiency``)."""
        return 1 + self.accepted_drafts / self.spec_steps if self.spec_steps else None

    # -- the run's identity, for grouping and display
    run_id = property(lambda self: self.key.run_id)
    dataset = property(lambda self: self.key.dataset)
    rule = property(lambda self: self.key.rule)
    family = property(lambda self: self.key.family)
    sampling = property(lambda self: self.key.sampling)
    gamma = property(lambda self: self.key.gamma)
    #: γ as shown: the number, or "auto" (chosen per step by the cost model, up to ``gamma``)
    gamma_label = property(lambda self: "auto" if self.key.gamma_policy == "auto" else str(self.key.gamma))
    tree = property(lambda self: self.key.tree)
    role = property(lambda self: self.key.role)
    draft = property(lambda self: self.key.draft)
    target = property(lambda self: self.key.target)
    max_new_tokens = property(lambda self: self.key.max_new_tokens)
    seed = property(lambda self: self.key.seed)

    @property
    def is_reference(self) -> bool:
        return self.key.role != "method"

    @property
    def group(self) -> tuple:
        """Runs that share prompts, sampling, draft blocks and budget (so share a recorded corpus)."""
        k = self.key
        return (k.dataset, k.sampling, k.gamma, k.draft, k.target, k.max_new_tokens, k.seed, k.tree, k.gamma_policy)

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["speed_pairs"]        # per-sample data: the store has it
        d["key"] = self.key.to_dict()
        d["run_id"] = self.run_id
        return json_safe(d)


# ------------------------------------------------------------------------------------------
# Loading


def store_files(store_path_or_dir: str | Path) -> list[Path]:
    """The store file given, or the store files in a directory (searched recursively if none at its top)."""
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


@dataclass
class _Run:
    key: RunKey
    pair: dict
    samples: list[SampleRecord]
    store_dir: Path  # where its recorded positions live


def _load(store_path_or_dir, warnings: list[str] | None = None) -> "OrderedDict[str, _Run]":
    """run_id -> run, merged over every store file found (first copy of a sample wins); the stores are
    only read (never migrated or written); what a store could not show is appended to ``warnings``."""
    runs: OrderedDict[str, tuple[RunKey, dict, dict, Path]] = OrderedDict()
    for f in store_files(store_path_or_dir):
        with ResultStore(f, readonly=True) as st:
            if warnings is not None:
                warnings.extend(st.warnings)
            for key, pair in st.runs():
                rid = key.run_id
                if rid not in runs:
                    runs[rid] = (key, dict(pair), {}, f.parent)
                else:
                    runs[rid][1].update(pair)
                recs = runs[rid][2]
                for r in st.iter_samples(rid):
                    recs.setdefault((r.problem_id, r.sample_idx), r)
    return OrderedDict(
        (rid, _Run(k, p, [recs[x] for x in sorted(recs)], d)) for rid, (k, p, recs, d) in runs.items()
    )


# ------------------------------------------------------------------------------------------
# Per-run numbers


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _compare(samples: list[SampleRecord], ref: _Run | None, ref_id: str | None, conf: float) -> Comparison | None:
    if ref is None or ref_id is None:
        return None
    ref_by_key = {r.key: r.correct for r in ref.samples}
    keys = sorted(k for k in {s.key for s in samples} if k in ref_by_key)
    if not keys:
        return None
    mine = {s.key: s.correct for s in samples}
    a, b = [mine[k] for k in keys], [ref_by_key[k] for k in keys]
    iid = paired_difference(a, b, conf=conf)
    problems = [k[0] for k in keys]
    if len(set(problems)) == len(keys):
        return Comparison(ref_id, iid.diff, iid.ci_lo, iid.ci_hi, iid.p_value, iid.test, iid.n, iid.n01,
                          iid.n10, iid.ci_lo, iid.ci_hi, iid.p_value)
    c = clustered_paired_difference(a, b, problems, conf=conf)
    return Comparison(ref_id, c.diff, c.ci_lo, c.ci_hi, c.p_value, c.test, c.n, c.n01, c.n10,
                      iid.ci_lo, iid.ci_hi, iid.p_value, True, c.design_effect)


def _truncation(samples: list[SampleRecord]) -> Truncation:
    known = [s for s in samples if s.stop_reason]
    cut = [s for s in known if s.truncated]
    finished = [s for s in known if not s.truncated]
    share = len(cut) / len(known) if known else None
    fin_acc = sum(s.correct for s in finished) / len(finished) if finished else None
    return Truncation(len(cut), len(known), share, len(finished), fin_acc,
                      share is not None and share >= TRUNCATION_WARN_SHARE)


def _target_only_of(key: RunKey, runs: dict[str, _Run]) -> str | None:
    """The plain target-sampling run with this run's prompts, sampling, target and budget."""
    for rid, r in runs.items():
        k = r.key
        if (k.role == "target_only" and k.dataset == key.dataset and k.sampling == key.sampling
                and k.target == key.target and k.max_new_tokens == key.max_new_tokens and k.seed == key.seed):
            return rid
    return None


def is_speed_only(sample: SampleRecord) -> bool:
    """Whether a sample was timed and never graded (Spec-Bench's checker ``speed``)."""
    return sample.meta.get("check_detail") == NOT_GRADED


def _speed_pairs(samples: list[SampleRecord], plain: _Run | None) -> tuple[SpeedPair, ...]:
    if plain is None:
        return ()
    by_key = {r.key: r for r in plain.samples}
    return tuple(SpeedPair(s.problem_id, s.new_tokens, s.wall_s, by_key[s.key].new_tokens, by_key[s.key].wall_s)
                 for s in samples if s.key in by_key)


def pooled_speedup(pairs, conf: float = 0.95) -> SpeedUp | None:
    """The speed-up over target-only of the :class:`SpeedPair` s ``pairs`` (one run's, or several runs' pooled),
    with its bootstrap interval over problems."""
    pairs = list(pairs)
    return speedup_interval([x.tokens for x in pairs], [x.seconds for x in pairs],
                            [x.target_only_tokens for x in pairs], [x.target_only_seconds for x in pairs],
                            [x.problem for x in pairs], conf)


def decoding_label(meta: dict) -> str | None:
    """How the bench decoded a sample (``meta`` keys ``backend``, ``batched``, ``batch_size``,
    ``batch_invariant``): ``"llama.cpp, one at a time"``, ``"llama.cpp, batch 4"`` or ``"llama.cpp,
    batch 4 invariant"``; None for a sample stored before the bench recorded it."""
    if "backend" not in meta and "batch_size" not in meta:
        return None
    backend = meta.get("backend") or "?"
    if not meta.get("batched"):
        return f"{backend}, one at a time"
    return f"{backend}, batch {meta.get('batch_size')}" + (" invariant" if meta.get("batch_invariant") else "")


def numerics_key(meta: dict) -> tuple | None:
    """Samples with equal keys had each row computed by the same float arithmetic, so a greedy output
    is the same whichever of them made it: the backend, and ``"one at a time"``, ``"rows"`` (a batched
    row computed alone: batch size 1, or any size with ``--batch-invariant``) or ``"batch N"``. None: not
    recorded. (``docs/reproducibility.md``: what is bitwise equal and what is equal in law.)"""
    if "backend" not in meta and "batch_size" not in meta:
        return None
    if not meta.get("batched"):
        how = "one at a time"
    elif meta.get("batch_invariant") or meta.get("batch_size") == 1:
        how = "rows"
    else:
        how = f"batch {meta.get('batch_size')}"
    return (meta.get("backend") or "?", how)


def _run_row(run: _Run, runs: dict[str, _Run], conf: float) -> RunRow:
    key, pair, samples = run.key, run.pair, run.samples
    problems = [s.problem_id for s in samples]
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
    sp = [(v, s.new_tokens) for s in samples if (v := _num(s.cost_model_speedup)) is not None]
    if not sp:
        speedup = None
    elif sum(w for _, w in sp) > 0:
        speedup = sum(v * w for v, w in sp) / sum(w for _, w in sp)
    else:
        speedup = sum(v for v, _ in sp) / len(sp)
    diffs = [d for s in samples if (d := _num(s.meta.get("difficulty"))) is not None]
    flex = [(s.correct_flexible, s.problem_id) for s in samples if s.correct_flexible is not None]
    base_id, ll_id = pair.get("baseline"), pair.get("lossless_ref")
    plain_id = _target_only_of(key, runs) if key.role != "target_only" else None
    to_id = plain_id if key.role == "method" else None
    wrong = to_id if (to_id and base_id and to_id != base_id) else None
    speed_only = bool(samples) and all(is_speed_only(s) for s in samples)
    pairs = _speed_pairs(samples, runs.get(plain_id or ""))
    graded = not speed_only
    return RunRow(
        key=key,
        n_problems=len(set(problems)),
        n_samples=len(samples),
        accuracy=Accuracy.of([s.correct for s in samples] if graded else [], problems if graded else [], conf),
        truncation=_truncation(samples),
        flexible=Accuracy.of([f for f, _ in flex], [p for _, p in flex], conf) if flex and graded else None,
        new_tokens=tok,
        target_calls=calls,
        wall_s=wall,
        block_efficiency=tok / calls if calls > 0 else None,
        tokens_per_s=tok / wall if wall > 0 else None,
        mean_accepted=sum(i * c for i, c in enumerate(hist)) / steps if steps > 0 else None,
        cost_model_speedup=speedup,
        difficulty=sum(diffs) / len(diffs) if diffs else None,
        baseline_run_id=base_id,
        lossless_ref_run_id=ll_id,
        target_only_run_id=to_id,
        vs_baseline=_compare(samples, runs.get(base_id), base_id, conf) if graded else None,
        vs_lossless=_compare(samples, runs.get(ll_id), ll_id, conf) if graded else None,
        vs_target_only=_compare(samples, runs.get(wrong), wrong, conf) if wrong and graded else None,
        decoding=tuple(sorted({decoding_label(s.meta) or "not recorded" for s in samples}))
        if any(decoding_label(s.meta) for s in samples) else (),
        numerics=tuple(sorted({k for s in samples if (k := numerics_key(s.meta)) is not None})),
        speed_only=speed_only,
        spec_steps=steps,
        accepted_drafts=sum(i * c for i, c in enumerate(hist)),
        speedup=pooled_speedup(pairs, conf) if pairs else None,
        speed_pairs=pairs,
    )


def order_datasets(rows: list[RunRow]) -> list[str]:
    """Datasets ordered easiest -> hardest.

    By the mean ``meta["difficulty"]`` (ascending; samples of every run of the dataset pooled)
    when every dataset has one; otherwise by reference accuracy descending, where reference
    accuracy pools the dataset's baseline and target-only runs (all runs if it has none).
    Ties keep first-seen order.
    """
    datasets = list(OrderedDict.fromkeys(r.dataset for r in rows))
    diff_sum: dict[str, float] = defaultdict(float)
    diff_n: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.difficulty is not None:
            diff_sum[r.dataset] += r.difficulty * r.n_samples
            diff_n[r.dataset] += r.n_samples
    if datasets and all(diff_n[d] > 0 for d in datasets):
        return sorted(datasets, key=lambda d: diff_sum[d] / diff_n[d])
    return sorted(datasets, key=lambda d: -reference_accuracy(rows, d))


def reference_accuracy(rows: list[RunRow], dataset: str) -> float:
    mine = [r for r in rows if r.dataset == dataset]
    refs = [r for r in mine if r.role in ("baseline", "target_only")] or mine
    n = sum(r.n_samples for r in refs)
    return sum(r.accuracy.n_correct for r in refs) / n if n else 0.0


def row_sort_key(r: RunRow):
    return (_ROLE_ORDER.get(r.role, 9), r.family, r.rule, r.sampling, r.gamma, r.draft, r.target,
            r.max_new_tokens, r.seed)


def load_rows(store_path_or_dir: str | Path, conf: float = 0.95, *, distortion: bool = False,
              warnings: list[str] | None = None) -> tuple[list[RunRow], list["Corpus"]]:
    """:func:`collect_rows` and, with ``distortion``, the recorded corpora the distortions came from;
    what a store could not show (a WAL unreadable on a read-only mount) is appended to ``warnings``."""
    runs = _load(store_path_or_dir, warnings)
    rows = [_run_row(r, runs, conf) for r in runs.values()]
    corpora = attach_distortion(rows, runs) if distortion else []
    order = {d: i for i, d in enumerate(order_datasets(rows))}
    return sorted(rows, key=lambda r: (order[r.dataset],) + row_sort_key(r)), corpora


def collect_rows(store_path_or_dir: str | Path, conf: float = 0.95, *, distortion: bool = False) -> list[RunRow]:
    """One :class:`RunRow` per run, grouped by dataset (easiest first) and, within a dataset, reference
    runs (target-only, lossless ref, baseline) before methods.  With ``distortion``, rows of groups
    whose lossless run recorded positions get their :class:`~.distortion.RuleDistortion`."""
    return load_rows(store_path_or_dir, conf, distortion=distortion)[0]


# ------------------------------------------------------------------------------------------
# Distortion (exact, per token) from the positions recorded in lossless runs


@dataclass
class Corpus:
    """The positions recorded in the lossless run of one (dataset, sampling, γ, models) group."""

    group: tuple
    run_id: str
    records: object            # PositionRecorder
    tokens: dict[int, str]
    missing: int
    rules: list[str]


def _recorded_groups(rows: list[RunRow], runs: dict[str, _Run]) -> list[Corpus]:
    out = []
    for r in rows:
        if r.rule != RECORDED_RULE or r.n_samples == 0:
            continue
        if any(c.group == r.group for c in out):
            continue
        run = runs[r.run_id]
        records, tokens, missing = load_positions(run.store_dir, r.run_id, [s.key for s in run.samples])
        if records is None or len(records) == 0:
            continue
        rules = [x.rule for x in rows if x.group == r.group and (x.role == "method" or x.rule == RECORDED_RULE)]
        out.append(Corpus(r.group, r.run_id, records, tokens, len(missing), list(dict.fromkeys(rules))))
    return out


def attach_distortion(rows: list[RunRow], runs: dict[str, _Run]) -> list[Corpus]:
    """Set ``row.distortion`` on every row of a group whose lossless run recorded positions."""
    corpora = _recorded_groups(rows, runs)
    for c in corpora:
        by_rule = distortions(c.records, c.rules, gamma=c.group[2])
        for r in rows:
            if r.group == c.group and r.rule in by_rule:
                r.distortion = by_rule[r.rule]
    return corpora


def baseline_label(row: RunRow, by_id: dict[str, RunRow]) -> str:
    """A run's true baseline in words: the truncation it adds to target sampling (``target + min_p=0.3``)
    or ``target p`` -- read from the paired baseline run when there is one, else from the rule."""
    base = by_id.get(row.baseline_run_id or "")
    if base is not None:
        extra = [x for x in base.sampling.split(",") if x not in row.sampling.split(",")]
    else:
        try:
            extra = [f"{k}={v:g}" for k, v in rule_registry.get(row.rule).baseline_truncation().items()]
        except ValueError:  # not a rule (a baseline or target-only run)
            return "n/a"
    return "target + " + ",".join(extra) if extra else "target p"


def json_safe(v):
    """``v`` with non-finite floats replaced by None, recursively (for ``summary.json``)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v
