"""Decoding loops over a :class:`~verispec.models.Backend`: target-only and chain SD; the machine's
cost profile and the draft length it chooses (``gamma="auto"``)."""

from verispec.engine.batch import BatchResult, generate_batch, generate_target_only_batch
from verispec.engine.costs import CostProfile, cached_profile, measure_costs, measure_profile
from verispec.engine.gamma import AutoGamma, LookupGamma, best_gamma, expected_tokens
from verispec.engine.generate import GenerationResult, generate, generate_target_only
from verispec.engine.stats import CallCosts, Stats

__all__ = ["generate", "generate_target_only", "measure_costs", "GenerationResult", "Stats", "CallCosts",
           "CostProfile", "measure_profile", "cached_profile", "AutoGamma", "LookupGamma", "best_gamma",
           "expected_tokens", "generate_batch", "generate_target_only_batch", "BatchResult"]
