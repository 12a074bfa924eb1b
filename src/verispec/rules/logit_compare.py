"""Modular MAX's logit comparison (``rejection_sampling_strategy=logit-comparison``; docs/verification-rules.md §11.1).

Source: github.com/modular/modular, ``max/python/max/nn/sampling/rejection_sampler.py`` class
``RejectionSampler`` (commit ae6ee1f), built by ``max/python/max/pipelines/lib/sampling/sampling.py``
``rejection_sampler(device, seed=...)`` and run by ``_LogitComparisonRunner`` in
``max/python/max/pipelines/lib/speculative_decoding/base.py``. What the source does, step by step:

* the draft samples ``x`` with the request's sampling parameters and hands over ``z_q(x)``, its *raw*
  logit of ``x`` (the token sampler gathers the logits before temperature; penalties and grammar masks
  already applied); the target's raw logits ``z_p`` at the drafted positions are read unchanged;
* position ``i`` is rejected iff ``z_q(x_i) > z_p(x_i) + ε`` with ``ε = 1e-5`` (the constructor's
  default; nothing passes another value), i.e. accepted iff the draft's logit does not exceed the
  target's by more than ``ε``. The test is deterministic: no uniform is drawn;
* at the first rejected position the next token is ``topk_fused_sampling`` of the target logits with
  the constructor's ``top_k = 1``: the target's **argmax**, whatever the request's temperature; when all
  are accepted the sentinel index points at the bonus row and the same ``top_k = 1`` draw gives its
  argmax too.

Rule (``logit_compare:eps=ε``). Raw logits are determined by ``(p, q)`` only up to one additive
constant per row (``z = log p + LSE(z)``), so the source's test depends on the two models' logit
offsets ``LSE(z_p) − LSE(z_q)``, which no probability input carries. verispec compares the
log-probabilities of the processed rows instead — the source's test with both offsets removed::

    h(x) = 1[log q(x) <= log p(x) + ε] = 1[q(x) <= e^ε·p(x)]     (0 where p(x) = 0 or q(x) = 0)
    r    = δ_argmax p                                              (the source's top_k = 1 correction)
    P_R  = q·h + (1 − β)·δ_argmax p,   β = Σ_x q(x)·h(x)

True baseline: ``p`` (the target the request would otherwise sample). Lossy for every ``ε``. At
temperature 0 (one-hot ``p``, ``q``) it is exact greedy matching. Deliberate differences: (1) the
comparison is on log-probabilities (above); with raw logits the acceptance set shifts by the offset
difference, which verispec cannot reproduce; (2) the bonus is ``z ~ p`` as for every verispec rule
(§0; ``greedy`` alone takes the argmax), where the source takes the bonus row's argmax as well — the law
of every *drafted* position is unaffected.

Taxonomy: other. The acceptance is a hard threshold on the likelihood ratio ``p/q`` (the lossless test
rounded to 0 or 1), neither a target-side allowed set nor an interpolation, and the correction is the
target's argmax.
"""

from __future__ import annotations

import torch

from verispec.params import Param
from verispec.rules.base import InducedForm, PerTokenRule
from verispec.rules.lossless import argmax_one_hot

EPS = Param("eps", float, lambda v: v >= 0,
            "a number >= 0 (the margin in nats: accept iff log q(x) <= log p(x) + eps)",
            "accept the draft iff its log-probability exceeds the target's by at most eps (MAX: 1e-5)", 1e-5)


class LogitCompare(PerTokenRule):
    """Accept the drafted token iff ``log q(x) <= log p(x) + ε``; on rejection emit the target's argmax."""

    name = "logit_compare"
    family = "logit_compare"
    taxonomy = "other"
    pointwise_acceptance = True
    PARAMS = (EPS,)

    def __init__(self, eps: float = 1e-5) -> None:
        eps = EPS.check(self.name, eps)
        super().__init__(eps=eps)
        self.eps = eps

    def describe(self) -> str:
        return (f"Modular MAX logit comparison, eps={self.eps:g}: accept iff log q(x) <= log p(x) + eps, "
                "else emit argmax p")

    def accept_prob(self, p, q, px, qx):
        both = (px > 0) & (qx > 0)
        safe_p = torch.where(both, px, torch.ones_like(px))
        safe_q = torch.where(both, qx, torch.ones_like(qx))
        return (both & (safe_q.log() <= safe_p.log() + self.eps)).to(p.dtype)

    def residual(self, p, q):
        return argmax_one_hot(p)

    def closed_form(self, p, q):
        """``q·h + (1 − β)·δ_argmax p``."""
        y = q * self.accept_prob_all(p, q)
        return y + (1 - y.sum(-1, keepdim=True)).clamp_min(0) * argmax_one_hot(p)

    def closed_form_acceptance(self, p, q):
        return (q * self.accept_prob_all(p, q)).sum(-1)

    def induced_form(self):
        return InducedForm("other")
