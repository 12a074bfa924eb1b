"""Token-level lossless speculative sampling and greedy exact-match verification (docs/verification-rules.md §1.1).

``lossless``: ``h = min(1, p/q)``, ``r = norm((p − q)_+)`` (fallback ``p``), ``P_R = p``,
``β = 1 − d(p, q)``.

``greedy``: accept iff the draft token is the target's argmax (first index on ties, as
``torch.argmax``), correction = that argmax. Its law is ``δ_argmax p`` whatever ``q`` is; with the
one-hot ``p`` and ``q`` that temperature 0 produces, ``lossless`` reduces to exactly this rule.
"""

from __future__ import annotations

import torch

from verispec.rules.base import (
    InducedForm,
    PerTokenRule,
    check_pair,
    normalize_or,
    positive_part,
    ratio,
    total_variation,
)


class Lossless(PerTokenRule):
    name = "lossless"
    is_lossless = True
    pointwise_acceptance = True
    family = "lossless"
    taxonomy = "lossless"

    def describe(self) -> str:
        return "lossless token-level speculative sampling: accept min(1, p/q), resample norm((p-q)+)"

    def accept_prob(self, p, q, px, qx):
        return torch.clamp(ratio(px, qx), max=1.0)

    def residual(self, p, q):
        return normalize_or(positive_part(p - q), p)

    def closed_form(self, p, q):
        return p

    def closed_form_acceptance(self, p, q):
        return 1 - total_variation(p, q)

    def induced_form(self):
        return InducedForm("target")


def argmax_one_hot(p: torch.Tensor) -> torch.Tensor:
    """One-hot of the first argmax of each row ``[..., V] -> [..., V]``."""
    return torch.zeros_like(p).scatter_(-1, p.argmax(-1, keepdim=True), 1.0)


class Greedy(PerTokenRule):
    name = "greedy"
    is_lossless = True
    family = "lossless"
    taxonomy = "lossless"

    def describe(self) -> str:
        return "greedy exact match: accept iff the draft is argmax p, correct to argmax p"

    def accept_prob_at(self, p, q, x):
        return (x == p.argmax(-1)).to(p.dtype)

    def accept_prob_all(self, p, q):
        return argmax_one_hot(p)

    def residual(self, p, q):
        return argmax_one_hot(p)

    def bonus(self, p_next):
        return argmax_one_hot(p_next)

    def closed_form(self, p, q):
        return argmax_one_hot(p)

    def closed_form_acceptance(self, p, q):
        return q.gather(-1, p.argmax(-1, keepdim=True))[..., 0]

    def reference(self, p, q=None, *, own_target=False):
        p, _ = check_pair(p, None)
        return argmax_one_hot(p)

    def induced_form(self):
        return InducedForm("argmax")
