"""Diagnostics of verification rules on real positions: exact distortion, acceptance and speed.

* :mod:`~verispec.diagnose.record` — :class:`PositionRecorder`, compact (exact-where-it-matters)
  records of ``(p, q)`` rows with meta, saved to one compressed ``.npz``;
* :mod:`~verispec.diagnose.measures` — exact per-position measures (:func:`measure`; the distances
  :func:`tv_distance`, :func:`overshoot_mass`, :func:`ceiling_ratio` used everywhere);
* :mod:`~verispec.diagnose.on_records` — the same on compressed records, with compression-error bounds
  (:func:`measure_records`), and :func:`recorded_block_efficiency`;
* :mod:`~verispec.diagnose.summary` — corpus summaries (:func:`summarize`), JSON / Markdown writers and
  :func:`rank_correlation`;
* :mod:`~verispec.diagnose.plots` — frontier, entropy and single-position figures (matplotlib Agg);
* :mod:`~verispec.diagnose.corpus` — :func:`collect_corpus` records the drafted positions of real
  lossless generations through an engine observer.
"""

from verispec.diagnose.corpus import collect_corpus
from verispec.diagnose.measures import MEASURES, ceiling_ratio, measure, overshoot_mass, tokens_per_call, tv_distance
from verispec.diagnose.on_records import measure_records, recorded_block_efficiency
from verispec.diagnose.record import PositionRecorder
from verispec.diagnose.summary import (
    diagnostics_markdown,
    distortion_by_rule,
    rank_correlation,
    summarize,
    write_diagnostics_json,
    write_diagnostics_markdown,
)

__all__ = [
    "PositionRecorder",
    "MEASURES",
    "measure",
    "tv_distance",
    "overshoot_mass",
    "ceiling_ratio",
    "measure_records",
    "tokens_per_call",
    "summarize",
    "recorded_block_efficiency",
    "write_diagnostics_json",
    "diagnostics_markdown",
    "write_diagnostics_markdown",
    "distortion_by_rule",
    "rank_correlation",
    "collect_corpus",
]
