"""vLLM's per-request speculative-decoding metrics (``metrics.speculative_decoding``), from verispec's statistics.

vLLM 0.32 answers, with ``--per-request-spec-decode-metrics summary|detailed``, a
``metrics.speculative_decoding`` object on every single-sequence response (``null`` for ``n > 1``; when
streaming it rides the final usage chunk); AIPerf and the SPEED-Bench reports read it. Its fields
(vLLM's ``RequestSpecDecodeMetrics.to_dict``), over the verification steps that verified drafted tokens:

* ``acceptance_histogram``: dense, index ``j`` = steps that accepted exactly ``j`` drafts (no bonus token),
  length ``num_spec_tokens + 1``;
* ``num_spec_steps`` = Σ histogram; ``num_accepted_draft_tokens`` = Σ j·histogram[j];
  ``num_draft_tokens``: the draft tokens proposed; ``num_spec_tokens``: the configured most per step (k);
* ``mean_acceptance_length`` = 1 + accepted / steps (1.0 without steps: the bonus token counts);
  ``draft_acceptance_rate`` = accepted / drafted (0.0 without drafts);
* ``detailed`` only: ``per_step_accepted`` / ``per_step_drafted`` in step order (left out when empty).

verispec's steps map one to one: a step that drafted nothing (a plain target step, γ = "auto" choosing 0)
is not a speculative step, as in vLLM. For a tree the drafted tokens of a step are its nodes (every node is
a proposed token) and ``num_spec_tokens`` its depth, the longest path it can accept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:       # the command line reads LEVELS before torch loads: no engine import at run time
    from verispec.engine.stats import Stats

#: ``--per-request-spec-decode-metrics`` levels, as vLLM's.
LEVELS = ("none", "summary", "detailed")


def spec_decode_metrics(stats: Stats, num_spec_tokens: int, level: str) -> dict[str, Any] | None:
    """The ``metrics.speculative_decoding`` object of one generation (None at level ``none``)."""
    if level not in LEVELS:
        raise ValueError(f"per-request spec-decode metrics level must be one of {', '.join(LEVELS)}, got {level!r}")
    if level == "none":
        return None
    k = max(num_spec_tokens, len(stats.accepted_hist) - 1, 0)
    histogram = [0] * (k + 1)
    for j, count in enumerate(stats.accepted_hist):
        histogram[j] += count
    steps = sum(histogram)
    accepted = sum(j * c for j, c in enumerate(histogram))
    drafted = sum(stats.step_drafted)
    out: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": k,
    }
    if level == "detailed" and stats.step_accepted:
        out["per_step_accepted"] = list(stats.step_accepted)
        out["per_step_drafted"] = list(stats.step_drafted)
    return out


def response_metrics(stats: Sequence[Stats], num_spec_tokens: int, level: str) -> dict[str, Any] | None:
    """The response's ``metrics`` object: ``{"speculative_decoding": ...}`` for one choice, None for several
    (vLLM: not attributable to one sequence) or at level ``none``."""
    if level == "none" or len(stats) != 1:
        return None
    return {"speculative_decoding": spec_decode_metrics(stats[0], num_spec_tokens, level)}
