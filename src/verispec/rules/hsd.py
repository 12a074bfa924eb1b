"""Hierarchical speculative decoding, lossless variant (Zhou et al., arXiv 2601.05724; docs/verification-rules.md §1.3).

The reference implementation's lossless path (running-max cap, backward walk), with one correction::

    P_k = Π_{i<=k} p_i(x_i),  Q_k = Π_{i<=k} q_i(x_i),  M_k = max(1, max_{j<=k} P_j/Q_j)
    A_k(v) = (P_k/M_k)·p_{k+1}(v),  B_k(v) = Q_k·q_{k+1}(v)            k = 0..G−1
    D⁺_k = Σ(A_k − B_k)_+,  D⁻_k = Σ(B_k − A_k)_+,  Z_k = max(D⁺_k, D⁻_k)
    ρ_k = (A_k − B_k)_+/Z_k,  s_k = 1 − D⁺_k/Z_k                       (step-back probability)
    accept all G with prob min(1, P_G/(M_{G−1}·Q_G)) -> bonus ~ p_{G+1}
    else walk k = G−1 .. 0: step back with prob s_k, otherwise emit x_{1:k}, z ~ norm(ρ_k), stop

The correction: the whole block is accepted with ``min(1, P_G/(M_{G−1}·Q_G))``. No published HSD code
caps this final ratio (the HSD repository at f3adf7f uses ``min(1, P_G/Q_G)``, registered as
``hsd_uncapped_final`` in :mod:`verispec.rules.hsd_variants` beside the Fast-HSD variants), and without
the cap the law is not ``p`` (exact block laws: ``benchmarks/sequence_rules.py``). An earlier design note
called the capped form "as implemented"; it is verispec's lossless correction of it.

All joint masses are handled relative to ``Q_k`` (the walk only uses ratios), in log space.
Guards: ``Z_k = 0`` gives ``s_k = 1`` (reference code's nan_to_num); a walk that steps back past
k = 0 (impossible in exact arithmetic) emits ``z ~ p_1`` with nothing accepted.

Note: working the algebra through, ``A_k/Q_k = w_k·p_{k+1}`` with block verification's ``w_k``
and ``Z_k = D⁻_k``, so this transcription has exactly the law of block verification (same firing
probabilities, read top-down); the tests check both against the target and against each other.
"""

from __future__ import annotations

import torch

from verispec.rules.base import Rule, check_verify_inputs, normalize_or, positive_part, sample_categorical, uniform
from verispec.rules.block import _sequence_level_error, log_ratios


class HSD(Rule):
    name = "hsd"
    is_lossless = True
    per_token = False
    family = "lossless"
    taxonomy = "lossless"

    def describe(self) -> str:
        return "hierarchical speculative decoding (lossless, running-max cap, backward walk)"

    def verify(self, p, q, draft, generator=None):
        """``p: [B, G+1, V]``, ``q: [B, G, V]``, ``draft: [B, G]`` -> ``(n_accepted [B], next_token [B])``."""
        p, q, draft = check_verify_inputs(p, q, draft)
        batch, gamma = draft.shape
        zero = torch.zeros(batch, 1, dtype=p.dtype, device=p.device)
        log_pq = torch.cat([zero, log_ratios(p, q, draft).cumsum(-1)], dim=-1)        # log P_k/Q_k, k=0..G
        log_m = log_pq.cummax(-1).values.clamp_min(0)                                  # log M_k
        # scale_k = P_k/(M_k Q_k): branch masses relative to Q_k.
        scale = torch.exp(log_pq - log_m)
        scale = torch.where(torch.isnan(scale), torch.zeros_like(scale), scale)
        a_rel = scale[:, :gamma, None] * p[:, :gamma]      # A_k/Q_k  [B, G, V] (p_{k+1} is row k)
        b_rel = q                                                                      # B_k/Q_k
        d_plus = positive_part(a_rel - b_rel).sum(-1)
        d_minus = positive_part(b_rel - a_rel).sum(-1)
        z = torch.maximum(d_plus, d_minus)
        step_back = torch.where(z > 0, 1 - d_plus / torch.where(z > 0, z, torch.ones_like(z)), torch.ones_like(z))

        accept_all = torch.exp((log_pq[:, gamma] - log_m[:, gamma - 1]).clamp(max=0))
        accept_all = torch.where(torch.isnan(accept_all), torch.zeros_like(accept_all), accept_all)
        u = uniform((batch, gamma + 1), generator, dtype=p.dtype, device=p.device)
        all_ok = u[:, gamma] < accept_all
        # Walk down from k = G−1: the first k (from the top) that does not step back emits.
        stops = u[:, :gamma] >= step_back                                              # [B, G]
        idx = torch.arange(gamma, device=p.device)
        stop_k = torch.where(stops, idx, torch.full_like(idx, -1)).amax(-1)            # -1: walked past 0
        walked_out = stop_k < 0
        k = stop_k.clamp_min(0)
        rows = torch.arange(batch, device=p.device)
        corr = normalize_or(positive_part(a_rel[rows, k] - b_rel[rows, k]), p[rows, k])
        corr = torch.where(walked_out.unsqueeze(-1), p[:, 0], corr)
        n_accepted = torch.where(all_ok, torch.full_like(k, gamma), k)
        dist = torch.where(all_ok.unsqueeze(-1), p[:, gamma], corr)
        return n_accepted, sample_categorical(dist, generator)

    def induced(self, p, q):
        raise _sequence_level_error(self.name)

    def acceptance_rate(self, p, q):
        raise _sequence_level_error(self.name)
