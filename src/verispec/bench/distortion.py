"""Exact per-token distortion of every bench rule, from the (p, q) recorded in the bench's lossless runs.

Accuracy on a handful of problems cannot separate rules; their per-token laws can. Lossless SD samples
exactly from the target, so the drafted positions of a lossless run are the target's own trajectories,
and at each of them every rule's induced law is known in closed form
(:mod:`verispec.diagnose.measures`). The bench therefore

1. records, during every sample of a ``lossless`` run, each drafted position's processed ``p`` and ``q``
   (:class:`SampleRecording`, the engine's observer hook) and writes them to
   ``<store dir>/positions/<run_id>/<problem>-<sample>.npz`` *before* the sample's row is committed:
   a row in the store implies its positions are on disk, so a killed bench loses nothing and a resumed
   one re-records only the sample it re-generates (same seed, same positions);
2. at report time pools the positions of the samples that are in the store, per lossless run, and
   summarises every rule of the same (dataset, sampling, γ, models, budget) group against its true
   baseline (:func:`verispec.diagnose.summary.summarize`), plus — for truncation rules — the total
   variation to plain target sampling, the *wrong* baseline (:func:`distortions`);
3. draws the Figure-2 view of the most contested recorded position (:func:`plot_figure2`).

The recording format, the measures and the figure are those of ``verispec diagnose``
(:mod:`verispec.diagnose.record`, :mod:`~verispec.diagnose.measures`, :mod:`~verispec.diagnose.plots`;
none of them imports the bench), imported where they are used.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verispec.outputs import atomic_path, write_text_atomic

#: directory (next to the store) holding the recorded positions
POSITIONS_DIR = "positions"
#: the rule whose runs are recorded: its trajectories follow the target exactly
RECORDED_RULE = "lossless"
#: Figure 2 shows a position whose target is uncertain (nats), else every rule looks alike
FIGURE2_MIN_ENTROPY = 0.5

__all__ = [
    "POSITIONS_DIR",
    "RECORDED_RULE",
    "SampleRecording",
    "positions_path",
    "load_positions",
    "RuleDistortion",
    "distortions",
    "contested_position",
    "plot_figure2",
]


def _safe(name: str) -> str:
    """A file-name-safe, collision-free form of a problem id (``HumanEval/0`` -> ``HumanEval_0-<hash>``)."""
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:60]}-{digest}"


def positions_path(store_dir: str | Path, run_id: str, problem_id: str, sample_idx: int) -> Path:
    """Where the positions of one lossless sample live."""
    return Path(store_dir) / POSITIONS_DIR / run_id / f"{_safe(str(problem_id))}-{int(sample_idx)}.npz"


class SampleRecording:
    """Engine observer that records every drafted position of one lossless generation.

    Called with each :class:`~verispec.engine.VerifiedStep`; of a draft-model chain (:meth:`VerifiedStep.chain`:
    ``p [G+1, V]``, ``q [G, V]``, ``draft [G]``, ``n_accepted``) rows ``0..G−1`` of ``p`` and ``q`` are
    recorded with meta ``dataset``, ``problem_id``, ``step``, ``position``, ``accepted``, ``draft_token``
    (the format of :func:`verispec.diagnose.corpus.collect_corpus`).

    The observer runs inside the timed generation, so it only keeps the block's joint support (one pass
    over the rows, ~1 ms); the full rows are rebuilt — exactly: everything outside that support is 0 — and
    compressed by the :class:`~verispec.diagnose.record.PositionRecorder` after the generation (:meth:`flush`,
    called by :meth:`save`), so recording does not slow the lossless run's measured speed. A block whose
    support is too wide to keep this way (no top-k / top-p) is compressed at once.
    """

    def __init__(self, dataset: str, problem_id: str) -> None:
        from verispec.diagnose.record import PositionRecorder

        self.recorder = PositionRecorder()
        self.dataset, self.problem_id = str(dataset), str(problem_id)
        self.steps = 0
        self._pending: list[tuple] = []  # (step, vocab, support ids, p [g, S], q [g, S], draft, n_accepted)

    def __call__(self, step) -> None:
        chain = step.chain()
        if chain is None:
            return
        p, q, draft_tokens, n_accepted = chain
        g = int(q.shape[0])
        support = (p[:g] + q).amax(0).nonzero()[:, 0]  # p, q >= 0: tokens where either is positive
        draft = [int(t) for t in draft_tokens[:g]]
        if support.numel() > self.recorder.max_keep:
            self.flush()
            self._add(self.steps, p[:g], q, draft, int(n_accepted))
        else:
            # small copies on the CPU (the rows may live on an accelerator)
            self._pending.append((self.steps, int(p.shape[-1]), support.cpu(), p[:g, support].cpu(),
                                  q[:, support].cpu(), draft, int(n_accepted)))
        self.steps += 1

    def _add(self, step: int, p, q, draft: list[int], n_accepted: int) -> None:
        g = len(draft)
        self.recorder.add(p, q, dataset=self.dataset, problem_id=self.problem_id, step=step,
                          position=list(range(g)), accepted=[int(j < n_accepted) for j in range(g)], draft_token=draft)

    def flush(self) -> None:
        """Rebuild and compress the positions kept during the generation."""
        import torch

        for step, vocab, support, ps, qs, draft, n in self._pending:
            p = torch.zeros(ps.shape[0], vocab, dtype=ps.dtype)
            q = torch.zeros(qs.shape[0], vocab, dtype=qs.dtype)
            p[:, support], q[:, support] = ps, qs
            self._add(step, p, q, draft, n)
        self._pending.clear()

    def save(self, path: str | Path, decode: Callable[[int], str] | None = None) -> Path:
        """Write the positions (and, with ``decode``, the text of every kept token, for the figures)
        atomically: a crash leaves either the old file or the new one."""
        self.flush()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            self.recorder.save(tmp)
        if decode is not None and len(self.recorder):
            import numpy as np

            ids = np.unique(self.recorder.arrays["token_ids"]).tolist()
            text = json.dumps({str(t): decode(int(t)) for t in ids}, ensure_ascii=False)
            write_text_atomic(path.with_suffix(".tokens.json"), text)
        return path


def load_positions(store_dir: str | Path, run_id: str, keys: Iterable[tuple[str, int]]):
    """The recorded positions of the samples ``keys`` (``(problem_id, sample_idx)``) of ``run_id``,
    pooled in key order, and the token texts found beside them.

    Returns ``(recorder, tokens, missing)``: ``missing`` lists the keys without a file (a store written
    before positions were recorded, or a deleted folder); ``recorder`` is None when no key has one.
    """
    from verispec.diagnose.record import PositionRecorder

    pooled, tokens, missing = None, {}, []
    for pid, k in sorted(keys):
        path = positions_path(store_dir, run_id, pid, k)
        if not path.exists():
            missing.append((pid, k))
            continue
        try:
            rec = PositionRecorder.load(path)
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"{path}: unreadable position record ({exc}); delete it and re-run the same "
                             "bench command to record it again") from exc
        if pooled is None:
            pooled = rec
        else:
            pooled.extend(rec)
        tok = path.with_suffix(".tokens.json")
        if tok.exists():
            tokens.update({int(t): s for t, s in json.loads(tok.read_text(encoding="utf-8")).items()})
    return pooled, tokens, missing


@dataclass(frozen=True)
class RuleDistortion:
    """One rule's exact per-token distortion on the recorded positions (means over positions).

    ``tv``, ``kl`` (its median: the mean is ∞ as soon as one position leaks tail mass), ``kl_reverse``,
    ``overshoot``, ``tail_leak``: against the rule's *true* baseline; ``ceiling_ratio``: mean and max
    of ``max_v P(v)/p(v)``; ``acceptance``: per-position β; ``tokens_per_call``: at the recorded draft
    blocks (exact for the rule given those blocks); ``tv_to_target``: TV to plain target sampling ``p``
    — for a truncation rule, the distance to the *wrong* baseline (equal to ``tv`` for rules whose
    baseline is ``p``); between distributions ``½‖P − p‖₁ = Σ(P − p)+``, so it is the overshoot;
    ``max_err_tv`` bounds the compression error of any position's TV (0 when the
    records are exact, always so under top-k / top-p).
    """

    rule: str
    family: str
    truncation: bool
    n_positions: int
    tv: float
    kl_median: float
    kl_inf_fraction: float
    kl_reverse: float
    overshoot: float
    ceiling_ratio: float
    ceiling_ratio_max: float
    tail_leak: float
    acceptance: float
    tokens_per_call: float
    tv_to_target: float
    max_err_tv: float
    n_uncertain: int


def distortions(records, rule_specs: Sequence[str], *, gamma: int) -> dict[str, RuleDistortion]:
    """``{rule spec: RuleDistortion}`` of every rule on ``records`` (a PositionRecorder)."""
    from verispec import rules as rules_mod
    from verispec.diagnose.summary import summarize

    specs = list(dict.fromkeys(rules_mod.get(s).spec() for s in rule_specs))
    out = {}
    for e in summarize(records, specs, gamma=gamma):
        rule = rules_mod.get(e["rule"])
        qs = e["quantiles"]
        be = e.get("recorded_blocks", {}).get("tokens_per_call", math.nan)
        out[e["rule"]] = RuleDistortion(
            rule=e["rule"], family=e["family"], truncation=bool(rule.baseline_truncation()),
            n_positions=int(e["n_positions"]), tv=e["tv"], kl_median=qs["kl"]["q50"],
            kl_inf_fraction=e["kl_inf_fraction"], kl_reverse=e["kl_reverse"], overshoot=e["overshoot"],
            ceiling_ratio=e["ceiling_ratio"], ceiling_ratio_max=qs["ceiling_ratio"]["max"],
            tail_leak=e["tail_leak"], acceptance=e["acceptance"],
            tokens_per_call=be if not math.isnan(be) else e["tokens_per_call"],
            tv_to_target=e["overshoot"], max_err_tv=e["max_compression_error"]["tv"],
            n_uncertain=int(e["n_uncertain"]),
        )
    return out


def contested_position(records) -> int | None:
    """The recorded position where the draft overshoots the target most (max Σ(q − p)+), among those
    whose target entropy is at least :data:`FIGURE2_MIN_ENTROPY` nats when there are any."""
    import torch

    if records is None or len(records) == 0:
        return None
    p, q, _ = records.dense()
    overshoot = (q - p).clamp_min(0).sum(-1)
    entropy = torch.as_tensor(records.arrays["target_entropy"].astype("float64"))
    uncertain = entropy >= FIGURE2_MIN_ENTROPY
    if bool(uncertain.any()):
        overshoot = torch.where(uncertain, overshoot, torch.full_like(overshoot, -1.0))
    return int(overshoot.argmax())


def plot_figure2(records, rule_specs: Sequence[str], path: str | Path, *, tokens: dict[int, str] | None = None,
                 title: str | None = None) -> Path | None:
    """Figure-2 view (:func:`verispec.diagnose.plots.plot_position`) of :func:`contested_position`;
    None when there is no recorded position."""
    from verispec.diagnose.plots import plot_position

    index = contested_position(records)
    if index is None:
        return None
    decode = (lambda t: tokens.get(int(t), str(t))) if tokens else None
    plot_position(records, index, list(rule_specs), path, decode=decode, title=title)
    return Path(path)
