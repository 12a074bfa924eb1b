"""Truncation sets on probability vectors, shared by the sampling warpers and the truncation rules.

Both sides must use the same definition, otherwise a truncation rule would be judged against a
baseline that truncates differently. Every mask function takes probabilities ``p: [..., V]`` (rows
sum to one, zeros allowed) and returns a boolean keep-mask ``[..., V]`` that always keeps at least the
argmax, as Hugging Face's warpers do (``min_tokens_to_keep = 1``).

:func:`truncation_mask` chains them into a truncation pipeline on probabilities, in the order
:data:`TRUNCATION_STEPS` (``prob_gap``, then the warper order top-k -> top-p -> min-p -> η -> ε), each
step evaluated on the renormalised survivors of the previous ones. It defines both the allowed set of
the generic truncation rule (:class:`verispec.rules.truncation.Truncation`) and the post-truncation
pass of :class:`verispec.sampling.SamplingConfig` (the ``post_*`` fields) that realises its true
baseline, so the two cannot drift apart.
"""

from __future__ import annotations

import math

import torch

from . import topk

#: The steps of :func:`truncation_mask`, in application order. ``prob_gap`` comes first: it compares
#: probabilities with ``max p`` additively, so (unlike the other steps) it is not invariant under the
#: renormalisations the later steps perform.
TRUNCATION_STEPS = ("prob_gap", "top_k", "top_p", "min_p", "eta", "epsilon")
#: The value that switches each step off (``eta_delta`` is the η step's δ, not a step).
TRUNCATION_OFF = {"prob_gap": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "eta": 0.0, "epsilon": 0.0}

#: First window of the top-p search (grown ×4 until the mass threshold is inside the window).
TOP_P_WINDOW = 64


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


def top_k_mask(p: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` most probable tokens, ties with the k-th kept (as the top-k warper); ``k >= V``: all."""
    if k >= p.shape[-1]:
        return torch.ones_like(p, dtype=torch.bool)
    return p >= topk.topk_values(p, k)[..., -1:]


def top_p_threshold(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Smallest kept probability of top-p on ``probs [..., N]`` -> ``[..., 1]``.

    A token is kept iff the mass of the tokens strictly more probable than it is ``< top_p`` (masses
    summed in float64); every token tied with the smallest kept one is kept too. Looks at the ``k``
    most probable tokens only, growing ``k`` until every row's boundary falls inside the window; a
    full sort happens only when the nucleus is a sizeable part of the row.
    """
    N = probs.shape[-1]
    k = min(N, TOP_P_WINDOW)
    while True:
        if k == N:
            vals = torch.sort(probs, dim=-1, descending=True).values
        else:
            vals = topk.topk_values(probs, k)  # [..., k], descending
        cum = torch.cumsum(vals, dim=-1, dtype=torch.float64)
        above = torch.nn.functional.pad(cum[..., :-1], (1, 0))  # mass ranked strictly above
        # kept positions form a prefix (``above`` is non-decreasing); position 0 is always kept
        n_kept = ((above < top_p) & (vals > 0)).sum(-1, keepdim=True)
        if k == N or bool((n_kept < k).all()):
            return vals.gather(-1, n_kept.clamp_(min=1) - 1)
        # every token outside the window has p <= vals[k-1]: at least this many more are needed
        short = (top_p - cum[..., -1]).clamp_(min=0.0)
        missing = (short / vals[..., -1].double().clamp(min=1e-300)).max().item()
        k_next = max(4 * k, k + int(min(missing, N)) + 1)
        k = N if k_next > N // 4 else k_next


def top_p_mask(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus: keep a token iff the mass strictly above it is ``< top_p`` (ties kept); ``top_p >= 1``: all."""
    if top_p >= 1.0:
        return torch.ones_like(p, dtype=torch.bool)
    return p >= top_p_threshold(p, top_p)


def prob_gap_mask(p: torch.Tensor, gap: float) -> torch.Tensor:
    """``{x : p(x) >= max p − gap}`` (additive, in probability; ``gap >= 0`` so the argmax is kept).

    The probability condition of TensorRT-LLM's relaxed acceptance (``relaxed_delta``).
    """
    return p >= p.amax(-1, keepdim=True) - gap


def truncation_mask(
    p: torch.Tensor,
    *,
    prob_gap: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    eta: float = 0.0,
    eta_delta: float | None = None,
    epsilon: float = 0.0,
) -> torch.Tensor:
    """Keep-mask ``[..., V]`` of a truncation pipeline run on the probabilities ``p: [..., V]``.

    The active steps (values other than :data:`TRUNCATION_OFF`) run in the order
    :data:`TRUNCATION_STEPS`; each is evaluated on ``p`` restricted to the survivors of the previous
    steps and renormalised, as the warpers of the sampling pipeline are. With at least one active step
    the mask is the support of the truncated ``p`` (tokens with ``p = 0`` are out even where a step,
    e.g. top-k with ``k`` beyond the support, would keep them); with none it keeps every token. Every
    step keeps the argmax, so the kept mass is never zero.
    """
    settings = {"prob_gap": prob_gap, "top_k": top_k, "top_p": top_p, "min_p": min_p, "eta": eta,
                "epsilon": epsilon}
    steps = [s for s in TRUNCATION_STEPS if settings[s] != TRUNCATION_OFF[s]]
    keep = torch.ones_like(p, dtype=torch.bool)
    if not steps:
        return keep
    cur = p
    for i, step in enumerate(steps):
        value = settings[step]
        if step == "prob_gap":
            keep = keep & prob_gap_mask(cur, value)
        elif step == "top_k":
            keep = keep & top_k_mask(cur, value)
        elif step == "top_p":
            keep = keep & top_p_mask(cur, value)
        elif step == "min_p":
            keep = keep & min_p_mask(cur, value)
        elif step == "eta":
            keep = keep & eta_mask(cur, value, eta_delta)
        else:
            keep = keep & epsilon_mask(cur, value)
        if i + 1 < len(steps):
            cur = restrict(p, keep)
    return keep & (p > 0)
