"""Truncation sets on probability vectors, shared by the sampling warpers and the truncation rules.

Both sides must use the same definition, otherwise a truncation rule would be judged against a
baseline that truncates differently. Every function takes probabilities ``p: [..., V]`` (rows sum to
one, zeros allowed) and returns a boolean keep-mask ``[..., V]`` that always keeps at least the
argmax, as Hugging Face's warpers do (``min_tokens_to_keep = 1``).
"""

from __future__ import annotations

import math

import torch


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last dimension, with 0·log 0 = 0. ``[..., V] -> [...]``."""
    return torch.special.entr(p).sum(-1)


def _keep_argmax(keep: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    top = p.argmax(-1, keepdim=True)
    return keep.scatter(-1, top, True)


def min_p_mask(p: torch.Tensor, p_base: float) -> torch.Tensor:
    """min-p set ``{x : p(x) >= p_base * max p}`` (ties with the threshold are kept)."""
    threshold = p_base * p.amax(-1, keepdim=True)
    return p >= threshold


def eta_threshold(p: torch.Tensor, epsilon: float, delta: float | None = None) -> torch.Tensor:
    """η-sampling threshold ``min(ε, δ·exp(−H(p)))`` with ``δ = √ε`` by default. ``[..., V] -> [..., 1]``."""
    if delta is None:
        delta = math.sqrt(epsilon)
    ent = entropy(p).unsqueeze(-1)
    return torch.clamp(delta * torch.exp(-ent), max=epsilon)


def eta_mask(p: torch.Tensor, epsilon: float, delta: float | None = None) -> torch.Tensor:
    """η set ``{x : p(x) >= θ_η}`` (HF's ``>=``), argmax always kept."""
    return _keep_argmax(p >= eta_threshold(p, epsilon, delta), p)


def epsilon_mask(p: torch.Tensor, epsilon: float) -> torch.Tensor:
    """ε set ``{x : p(x) >= ε}``, argmax always kept."""
    return _keep_argmax(p >= epsilon, p)


def restrict(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Renormalised restriction ``p_A = p·1_A / p(A)``; ``keep`` always holds the argmax so p(A) > 0."""
    kept = torch.where(keep, p, torch.zeros_like(p))
    return kept / kept.sum(-1, keepdim=True)
