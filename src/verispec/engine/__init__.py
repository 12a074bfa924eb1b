"""Decoding over :class:`~verispec.models.Backend` s: target-only sampling and speculative decoding on chains
and trees (:func:`generate`, :func:`generate_target_only`), batched (:func:`generate_batch`; rows admitted and
retired one by one: :class:`verispec.engine.session.BatchSession`), with the draft length fixed or chosen by the
machine's cost profile (``gamma="auto"``: :class:`CostProfile`, :func:`cached_profile`). One request of a server
or harness, checked and run either way: :mod:`verispec.engine.request`."""

from verispec.engine.batch import BatchResult, generate_batch, generate_target_only_batch
from verispec.engine.calibrate import cached_profile, measure_costs, measure_profile
from verispec.engine.costs import CostProfile
from verispec.engine.decoding import GenerationResult, Observer, VerifiedStep
from verispec.engine.gamma import AutoGamma, LookupGamma, best_gamma, expected_tokens
from verispec.engine.generate import generate, generate_target_only
from verispec.engine.ngram import NgramDrafter
from verispec.engine.stats import Stats
from verispec.engine.tree import TreeShape

__all__ = ["generate", "generate_target_only", "generate_batch", "generate_target_only_batch", "GenerationResult",
           "BatchResult", "Stats", "VerifiedStep", "Observer", "CostProfile", "measure_profile", "measure_costs",
           "cached_profile", "AutoGamma", "LookupGamma", "best_gamma", "expected_tokens", "NgramDrafter", "TreeShape"]
