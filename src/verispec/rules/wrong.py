"""Known wrong implementations, kept as rules so that their laws can be measured (docs/verification-rules.md §11.2).

``reject_to_p`` — lossless SD's acceptance with the wrong correction. Source: ShopeeLLM/Spec-RL issue 14
("Questions about the speculative decoding algorithm", 2025-10-21): the RL rollout code accepts a drafted
token with ``min(1, p/q)`` and, at the first rejection, samples the target ``p`` itself instead of the
residual ``norm((p − q)_+)``; the maintainers answered that Spec-RL targets training-time acceleration,
not distribution preservation.

    h(x) = min(1, p(x)/q(x)),   r = p
    P    = q·min(1, p/q) + (1 − β)·p = min(p, q) + d(p, q)·p,   β = 1 − d(p, q)

So ``P − p = min(p, q) − (1 − d)·p``: tokens the draft over-weights (``q > p``) get ``(1 + d)·p``, the
others ``q + d·p < p`` — the law leans towards the draft by a factor of at most ``1 + d(p, q)``, and
equals ``p`` only where ``d(p, q) = 0`` or ``p`` is a point mass. The true baseline is ``p`` (what the
code means to sample); the rule is lossy, and the tests show its sampler rejects ``p``.

Taxonomy: other (a broken lossless rule: the acceptance is SD's, the correction is not).
"""

from __future__ import annotations

import torch

from verispec.rules.base import InducedForm, PerTokenRule, ratio, total_variation


class RejectToP(PerTokenRule):
    """Accept ``min(1, p/q)``; on rejection sample ``p`` (not the residual): not lossless."""

    name = "reject_to_p"
    family = "wrong"
    taxonomy = "other"
    pointwise_acceptance = True

    def describe(self) -> str:
        return "WRONG (Spec-RL issue 14): accept min(1, p/q), on rejection sample p instead of norm((p-q)+)"

    def accept_prob(self, p, q, px, qx):
        return torch.clamp(ratio(px, qx), max=1.0)

    def residual(self, p, q):
        return p

    def closed_form(self, p, q):
        """``min(p, q) + d(p, q)·p``."""
        return torch.minimum(p, q) + total_variation(p, q).unsqueeze(-1) * p

    def closed_form_acceptance(self, p, q):
        return 1 - total_variation(p, q)

    def induced_form(self):
        return InducedForm("other")
