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
