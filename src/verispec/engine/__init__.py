"""Decoding loops over a :class:`~verispec.models.Backend`: target-only and chain SD."""

from verispec.engine.generate import GenerationResult, generate, generate_target_only, measure_costs
from verispec.engine.stats import CallCosts, Stats

__all__ = ["generate", "generate_target_only", "measure_costs", "GenerationResult", "Stats", "CallCosts"]
