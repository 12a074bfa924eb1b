"""Block verification (Sun et al. 2024, arXiv 2403.10444; docs/verification-rules.md §1.2): lossless per block.

With ``r_i = p_i(x_i)/q_i(x_i)``::

    w_0 = 1,  w_i = min(1, w_{i−1}·r_i)                       i = 1..G
    R_i(v) = (w_i·p_{i+1}(v) − q_{i+1}(v))_+                    i = 0..G−1
    s_i = ΣR_i / (ΣR_i + 1 − w_i)   (0/0 := 1),   s_G = w_G
    τ = max{i : u_i < s_i}  (s_0 counts as fired: τ >= 0)
    emit x_{1:τ}, then z ~ norm(R_τ) if τ < G, else z ~ p_{G+1}

``log w_i = S_i − max(0, max_{j<=i} S_j)`` with ``S_i = Σ_{j<=i} log r_j`` (the Lindley recursion),
which vectorises the running minimum. The law of the emitted sequence is exactly ``p``; the expected
number of accepted tokens is never below token-level ``lossless`` (both tested). There is no
per-position induced distribution: ``induced`` and ``acceptance_rate`` raise.
"""

from __future__ import annotations

import torch

from verispec.rules.base import Rule, check_verify_inputs, normalize_or, positive_part, sample_categorical, uniform


def log_ratios(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """``log p_i(x_i) − log q_i(x_i)`` for the drafted tokens ``[B, G]`` (−inf where ``p(x) = 0``)."""
    gamma = draft.shape[1]
    idx = draft.unsqueeze(-1)
    px = p[:, :gamma].gather(-1, idx)[..., 0]
    qx = q.gather(-1, idx)[..., 0]
    log_px = torch.where(px > 0, px.clamp_min(torch.finfo(px.dtype).tiny).log(), torch.full_like(px, -torch.inf))
    log_qx = torch.where(qx > 0, qx.clamp_min(torch.finfo(qx.dtype).tiny).log(), torch.full_like(qx, torch.inf))
    return log_px - log_qx


def capped_joint_weights(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """``w_0..w_G`` of block verification ``[B, G+1]`` (``w_0 = 1``)."""
    batch = draft.shape[0]
    zero = torch.zeros(batch, 1, dtype=p.dtype, device=p.device)
    cum = torch.cat([zero, log_ratios(p, q, draft).cumsum(-1)], dim=-1)          # S_0..S_G
    running_max = cum.cummax(-1).values.clamp_min(0)
    log_w = cum - running_max
    return torch.where(torch.isnan(log_w), torch.zeros_like(log_w), log_w.exp())  # -inf - x -> 0 weight


def _sequence_level_error(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"{name} is a sequence-level rule: it has no per-position induced distribution or acceptance "
        "rate; its emitted sequence law is exactly the target p (use reference(p))"
    )


class BlockVerification(Rule):
    name = "block"
    is_lossless = True
    per_token = False
    family = "lossless"
    taxonomy = "lossless"

    def describe(self) -> str:
        return "block verification (Sun et al.): lossless over the block, accepts at least as much as token-level"

    def firing_probabilities(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor):
        """``(w [B, G+1], s [B, G+1], residual mass R [B, G, V])`` of the block."""
        gamma = draft.shape[1]
        w = capped_joint_weights(p, q, draft)
        # R_0..R_{G−1}: p_{i+1}, q_{i+1} are rows i
        residual_mass = positive_part(w[:, :gamma, None] * p[:, :gamma] - q)
        total = residual_mass.sum(-1)
        den = total + (1 - w[:, :gamma])
        s = torch.where(den > 0, total / torch.where(den > 0, den, torch.ones_like(den)), torch.ones_like(den))
        s = torch.cat([s, w[:, gamma:]], dim=-1)
        return w, s, residual_mass

    def expected_accepted(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """Exact ``E[τ]`` for the given draft block ``[B]`` (``P(τ=i) = s_i·Π_{j>i}(1 − s_j)``)."""
        p, q, draft = check_verify_inputs(p, q, draft)
        _, s, _ = self.firing_probabilities(p, q, draft)
        s = s.clone()
        s[:, 0] = 1.0
        survive_above = torch.flip(torch.cumprod(torch.flip(1 - s, [-1]), -1), [-1])   # Π_{j>=i}(1 − s_j)
        none_above = torch.cat([survive_above[:, 1:], torch.ones_like(s[:, :1])], dim=-1)
        prob_tau = s * none_above
        idx = torch.arange(s.shape[1], dtype=s.dtype, device=s.device)
        return (prob_tau * idx).sum(-1)

    def verify(self, p, q, draft, generator=None):
        """``p: [B, G+1, V]``, ``q: [B, G, V]``, ``draft: [B, G]`` -> ``(n_accepted [B], next_token [B])``."""
        p, q, draft = check_verify_inputs(p, q, draft)
        batch, gamma = draft.shape
        _, s, residual_mass = self.firing_probabilities(p, q, draft)
        u = uniform(s.shape, generator, dtype=s.dtype, device=s.device)
        fired = u < s
        fired[:, 0] = True
        idx = torch.arange(gamma + 1, device=p.device)
        tau = torch.where(fired, idx, torch.zeros_like(idx)).amax(-1)                 # last firing index
        rows = torch.arange(batch, device=p.device)
        at = tau.clamp(max=gamma - 1)
        # A zero residual at τ < G cannot happen in exact arithmetic (then s_{τ+1} = 1); guard with p_{τ+1} (row τ).
        corr = normalize_or(residual_mass[rows, at], p[rows, at])
        dist = torch.where((tau == gamma).unsqueeze(-1), p[:, gamma], corr)
        return tau, sample_categorical(dist, generator)

    def induced(self, p, q):
        raise _sequence_level_error(self.name)

    def acceptance_rate(self, p, q):
        raise _sequence_level_error(self.name)
