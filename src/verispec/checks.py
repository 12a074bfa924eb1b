"""Input validation shared by every layer: one place, one wording for each kind of bad input."""

from __future__ import annotations

import torch

#: Smallest probability mass treated as non-zero when normalising residuals.
MASS_EPS = 1e-12


def check_finite_logits(logits: torch.Tensor, name: str = "logits") -> None:
    """Refuse NaN or +inf logits (-inf is a legitimate mask value)."""
    if torch.isnan(logits).any():
        raise ValueError(f"{name} contain NaN values")
    if torch.isposinf(logits).any():
        raise ValueError(f"{name} contain +inf values")
    if (logits == float("-inf")).all(dim=-1).any():
        raise ValueError(f"{name}: a row is entirely -inf (no token can be sampled)")


def check_probs(probs: torch.Tensor, name: str, atol: float = 1e-3) -> None:
    """Refuse tensors that are not probability vectors over the last dimension."""
    if not torch.is_floating_point(probs):
        raise TypeError(f"{name} must be a floating-point tensor, got {probs.dtype}")
    if not torch.isfinite(probs).all():
        raise ValueError(f"{name} contain NaN or inf values")
    if (probs < 0).any():
        raise ValueError(f"{name} contain negative probabilities")
    sums = probs.sum(-1)
    bad = (sums - 1).abs() > atol
    if bad.any():
        raise ValueError(
            f"{name} rows must sum to 1 (found a row summing to {sums[bad].flatten()[0].item():.6g}); "
            "pass probabilities after the sampling pipeline, not logits"
        )


def check_same_vocab(p: torch.Tensor, q: torch.Tensor) -> None:
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"vocabulary size mismatch: target has {p.shape[-1]} tokens, draft has {q.shape[-1]}"
        )
