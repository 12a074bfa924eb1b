"""Exact joint law of the tokens a verification rule emits, by enumeration on small toy models.

A toy model is any function from a prefix (a tuple of token ids) to a distribution over ``V``
tokens (``[V]`` float64); :class:`ToyModel` draws one Dirichlet row per prefix. For a rule, a draft
model ``q``, a target ``p``, a block size ``γ`` and a length ``L``, :func:`joint_law` returns the
law of the first ``L`` emitted tokens of speculative decoding started from the empty prefix::

    for each prefix shorter than L (reached with some probability):
        for each draft block x_1..x_γ  (probability Π_k q(x_k | prefix, x_<k)):
            P(n accepted = k, next = v | block)            <- outcome_law(rule, p, q, block)
            the prefix grows by x_1..x_k, v

and compares it with the target's own law ``Π_i p(x_i | x_<i)``. Cost: ``V^γ`` blocks per prefix,
at most ``Σ_{l<L} V^l`` prefixes (``V <= 5``, ``γ <= 3``, ``L <= 4`` take well under a second).

The per-block law ``outcome_law`` (``[B, G+1, V]``) is exact for

* per-token rules (:class:`~verispec.rules.base.PerTokenRule`): ``P(n = k) = Π_{i<k} h_i (1 − h_k)``,
  next ``~ r_k``; ``P(n = G) = Π h_i``, next ``~ bonus(p_{G+1})``: the chain semantics of docs/verification-rules.md §0;
* ``block`` (Sun et al.): ``P(τ = i) = s_i Π_{j>i}(1 − s_j)`` (``s_0 := 1``), next ``~ norm(R_τ)``;
* ``hsd`` and its published variants (:mod:`verispec.rules.hsd_variants`): the backward walk's
  stopping probabilities;
* any rule with an ``outcome_law`` method (FLy: enumeration of its native decisions).

Any other rule gets a Monte-Carlo estimate from its own ``verify`` (``mc_samples`` draws per
block), flagged ``exact = False`` with a binomial standard error; enumerating a rule's uniforms on a
grid is not exact and is not offered.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from verispec.rules.base import PerTokenRule, Rule, check_verify_inputs, normalize_or
from verispec.rules.block import BlockVerification
from verispec.rules.hsd import HSD
from verispec.rules.hsd_variants import RUNNING_MAX, hierarchical_outcome_law

#: A toy language model: prefix -> next-token distribution ``[V]`` (float64, sums to 1).
Model = Callable[[tuple[int, ...]], torch.Tensor]

#: Largest sizes the enumeration accepts (V^γ blocks per prefix, V^L sequences).
MAX_VOCAB, MAX_GAMMA, MAX_LENGTH = 5, 3, 4


class ToyModel:
    """Prefix -> Dirichlet(conc) row over ``vocab`` tokens, fixed by ``(seed, prefix)`` and cached."""

    def __init__(self, vocab: int, seed: int, conc: float = 0.6) -> None:
        if not 2 <= vocab <= MAX_VOCAB:
            raise ValueError(f"toy vocabulary must hold 2..{MAX_VOCAB} tokens, got {vocab}")
        if not conc > 0:
            raise ValueError(f"Dirichlet concentration must be > 0, got {conc}")
        self.vocab, self.seed, self.conc = vocab, seed, conc
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:
        row = self._rows.get(prefix)
        if row is None:
            code = sum((t + 1) * (self.vocab + 1) ** i for i, t in enumerate(prefix))
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + code * 7919 + len(prefix))
            g = torch._standard_gamma(torch.full((self.vocab,), self.conc, dtype=torch.float64), generator=gen)
            row = g.clamp_min(1e-300) / g.clamp_min(1e-300).sum()
            self._rows[prefix] = row
        return row


# --- one block ------------------------------------------------------------------------------------

def outcome_law(
    rule: Rule, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, *, mc_samples: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, bool]:
    """``(law [B, G+1, V], exact)``: ``P(n_accepted = k, next_token = v)`` for each draft block.

    ``p: [B, G+1, V]``, ``q: [B, G, V]``, ``draft: [B, G]``. Exact for the rule kinds listed in the
    module docstring; otherwise, if ``mc_samples > 0``, the empirical frequencies of ``mc_samples``
    calls of ``rule.verify`` per block (``exact = False``), else ``ValueError``.
    """
    p, q, draft = check_verify_inputs(p, q, draft)
    p, q = p.double(), q.double()
    if hasattr(rule, "outcome_law"):
        return rule.outcome_law(p, q, draft), True
    if isinstance(rule, HSD):
        return hierarchical_outcome_law(p, q, draft, cap=RUNNING_MAX, final_capped=True, forced_stop=False), True
    if isinstance(rule, BlockVerification):
        return _block_verification_law(rule, p, q, draft), True
    if isinstance(rule, PerTokenRule):
        return _per_token_law(rule, p, q, draft), True
    if mc_samples > 0:
        return _monte_carlo_law(rule, p, q, draft, mc_samples, generator), False
    raise ValueError(f"no exact block law for {rule.spec()}; pass mc_samples > 0 for a Monte-Carlo estimate")


def _per_token_law(rule: PerTokenRule, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    gamma = draft.shape[1]
    h = rule.accept_prob_at(p[:, :gamma], q, draft)                                   # [B, G]
    before = torch.cat([torch.ones_like(h[:, :1]), h.cumprod(-1)], dim=-1)           # Π_{i<k} h_i, k = 0..G
    law = torch.empty(p.shape[0], gamma + 1, p.shape[-1], dtype=p.dtype, device=p.device)
    # the correction after rejecting this very draft token (SGLang and vLLM strict remove it from p)
    law[:, :gamma] = (before[:, :gamma] * (1 - h))[..., None] * rule.correction_at(p[:, :gamma], q, draft)
    law[:, gamma] = before[:, gamma, None] * rule.bonus(p[:, gamma])
    return law


def _block_verification_law(rule: BlockVerification, p, q, draft) -> torch.Tensor:
    gamma = draft.shape[1]
    _, s, residual_mass = rule.firing_probabilities(p, q, draft)
    s = s.clone()
    s[:, 0] = 1.0                                                                     # τ >= 0 always
    none_above = torch.flip(torch.cumprod(torch.flip(1 - s, [-1]), -1), [-1])        # Π_{j>=i}(1 − s_j)
    none_above = torch.cat([none_above[:, 1:], torch.ones_like(s[:, :1])], dim=-1)   # Π_{j>i}
    prob_tau = s * none_above                                                         # [B, G+1]
    law = torch.empty(p.shape[0], gamma + 1, p.shape[-1], dtype=p.dtype, device=p.device)
    law[:, :gamma] = prob_tau[:, :gamma, None] * normalize_or(residual_mass, p[:, :gamma])
    law[:, gamma] = prob_tau[:, gamma, None] * p[:, gamma]
    return law


def _monte_carlo_law(rule: Rule, p, q, draft, samples: int, generator) -> torch.Tensor:
    batch, gamma = draft.shape
    vocab = p.shape[-1]
    n, z = rule.verify(p.repeat(samples, 1, 1), q.repeat(samples, 1, 1), draft.repeat(samples, 1), generator=generator)
    cell = (torch.arange(batch).repeat(samples) * (gamma + 1) + n) * vocab + z
    counts = torch.bincount(cell, minlength=batch * (gamma + 1) * vocab).double()
    return (counts / samples).view(batch, gamma + 1, vocab)


# --- whole sequences ------------------------------------------------------------------------------

def enumerate_blocks(target: Model, draft: Model, prefix: tuple[int, ...], gamma: int, vocab: int):
    """Every draft block from ``prefix``: ``(blocks [B, γ], p [B, γ+1, V], q [B, γ, V], weight [B])``."""
    blocks = list(itertools.product(range(vocab), repeat=gamma))
    ps, qs, weights = [], [], []
    for b in blocks:
        q_rows = [draft(prefix + b[:k]) for k in range(gamma)]
        weights.append(math.prod(q_rows[k][b[k]].item() for k in range(gamma)))
        qs.append(torch.stack(q_rows))
        ps.append(torch.stack([target(prefix + b[:k]) for k in range(gamma + 1)]))
    return torch.tensor(blocks), torch.stack(ps), torch.stack(qs), torch.tensor(weights, dtype=torch.float64)


@dataclass
class JointLaw:
    """Law of the first ``length`` emitted tokens (``law[x_1, …, x_L]``) next to the target's.

    ``expected_tokens``: tokens emitted by the first block, ``E[n_accepted] + 1`` (from the empty
    prefix). ``exact``: False when some block law was a Monte-Carlo estimate (then ``std_error`` bounds
    the per-sequence error of ``law`` roughly, one standard error).
    """

    law: np.ndarray
    target: np.ndarray
    expected_tokens: float
    exact: bool
    std_error: float = 0.0

    @property
    def max_abs_deviation(self) -> float:
        return float(np.abs(self.law - self.target).max())

    @property
    def total_variation(self) -> float:
        return float(0.5 * np.abs(self.law - self.target).sum())

    def is_lossless(self, atol: float = 1e-12) -> bool:
        return self.exact and self.max_abs_deviation <= atol


def target_law(target: Model, vocab: int, length: int) -> np.ndarray:
    """``Π_i p(x_i | x_<i)`` for every sequence of ``length`` tokens, ``[V] * length``."""
    law = np.zeros((vocab,) * length)
    for seq in itertools.product(range(vocab), repeat=length):
        law[seq] = math.prod(target(seq[:i])[seq[i]].item() for i in range(length))
    return law


def joint_law(
    rule: Rule, target: Model, draft: Model, *, vocab: int, gamma: int, length: int, mc_samples: int = 0,
    seed: int = 0,
) -> JointLaw:
    """Exact law of the first ``length`` tokens speculative decoding with ``rule`` emits (see module doc)."""
    if not 2 <= vocab <= MAX_VOCAB or not 1 <= gamma <= MAX_GAMMA or not 1 <= length <= MAX_LENGTH:
        raise ValueError(
            f"block_law enumerates V^γ blocks per prefix: needs 2 <= V <= {MAX_VOCAB}, 1 <= γ <= {MAX_GAMMA}, "
            f"1 <= L <= {MAX_LENGTH}; got V = {vocab}, γ = {gamma}, L = {length}")
    generator = torch.Generator().manual_seed(seed)
    law = np.zeros((vocab,) * length)
    exact = True
    variance = 0.0
    expected_tokens = float("nan")
    pending: dict[tuple[int, ...], float] = {(): 1.0}
    while pending:
        prefix = min(pending, key=len)
        mass = pending.pop(prefix)
        if len(prefix) >= length:
            law[prefix[:length]] += mass
            continue
        blocks, p, q, weight = enumerate_blocks(target, draft, prefix, gamma, vocab)
        block_law, block_exact = outcome_law(rule, p, q, blocks, mc_samples=mc_samples, generator=generator)
        exact &= block_exact
        if not block_exact:
            # Binomial variance of each estimated cell, summed (ignores the noise carried by prefix masses).
            variance += float(((mass * weight[:, None, None]) ** 2 * block_law * (1 - block_law) / mc_samples).sum())
        if prefix == ():
            tokens = torch.arange(gamma + 1, dtype=torch.float64) + 1
            expected_tokens = float((weight[:, None] * (block_law.sum(-1) * tokens)).sum())
        cells = (weight[:, None, None] * block_law * mass).nonzero(as_tuple=False)
        for b, k, v in cells.tolist():
            grown = prefix + tuple(blocks[b, :k].tolist()) + (v,)
            key = grown if len(grown) < length else grown[:length]
            pending[key] = pending.get(key, 0.0) + mass * weight[b].item() * block_law[b, k, v].item()
    return JointLaw(law, target_law(target, vocab, length), expected_tokens, exact, math.sqrt(variance))


def expected_tokens_per_block(rule: Rule, target: Model, draft: Model, *, vocab: int, gamma: int,
                              prefix: tuple[int, ...] = ()) -> float:
    """Exact ``E[n_accepted] + 1`` for one block from ``prefix``."""
    blocks, p, q, weight = enumerate_blocks(target, draft, prefix, gamma, vocab)
    block_law, exact = outcome_law(rule, p, q, blocks)
    tokens = torch.arange(gamma + 1, dtype=torch.float64) + 1
    return float((weight[:, None] * (block_law.sum(-1) * tokens)).sum())
