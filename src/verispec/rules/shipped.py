"""Acceptance rules that ship in serving engines: SGLang's thresholds, vLLM's strict sampler, HF's ensemble.

``sglang:single=θs,acc=θa`` — SGLang's ``--speculative-accept-threshold-single`` /
``--speculative-accept-threshold-acc`` (defaults 1.0). Source: sgl-project/sglang,
``sgl-kernel/csrc/speculative/speculative_sampling.cuh``, kernel ``TreeSpeculativeSamplingTargetOnly``
(the accept test ``coin <= prob_acc / threshold_acc || target_prob_single >= threshold_single``, about
line 80 at commit 120affb; the host wrapper floors ``threshold_acc`` at 1e-9), called by
``python/sglang/srt/speculative/eagle_info.py`` ``EagleVerifyInput.verify`` with ``draft_probs`` all
zeros, one ``torch.rand`` coin per tree node and one more for the final draw, and the target
probabilities after temperature, top-k and top-p. The draft's probabilities are never read
("target-only"): the drafted token ``c`` acts as a point mass. In a chain (one candidate per depth) the
kernel's running sum ``prob_acc`` holds only ``p(c)``, so

* accept ``c`` with ``h(c) = 1`` if ``p(c) >= θs``, else ``h(c) = min(1, p(c)/θa)``;
* on rejection emit ``z ~ r_c = norm(p·1_{V∖{c}})``: the kernel writes ``draft_probs[c] = p(c)`` for
  each rejected candidate and samples ``relu(p − draft_probs)``, i.e. ``p`` with ``c`` removed;
* bonus ``z ~ p`` at the last accepted node. At ``θs = θa = 1``: ``h = p(c)`` and
  ``p(c)δ_c + (1 − p(c))·r_c = p`` for every ``c``, so the rule is lossless for any draft.

Deliberate differences from the source: SGLang's candidates are the draft's top-k (deterministic),
verispec's chain drafts ``c ~ q`` — the rule reads only which token was drafted; the kernel's ``>=``
is kept although the flag's help says "greater than"; SGLang accepts any float, we require
``0 < θs, θa <= 1`` (1 switches a threshold off; above 1 would accept less than the lossless setting); when
``p`` without ``c`` has no mass (only if ``p(c) = 1``, which is always accepted) we fall back to ``p``
where the kernel takes its last valid index.

The correction depends on the rejected token, so there is no single residual: with ``c ~ q`` the law
is ``P = Σ_c q(c)[h(c)δ_c + (1 − h(c))·r_c]``, in closed form ``P(x) = q(x)h(x) + p(x)(W − w(x))``
with ``w(c) = q(c)(1 − h(c))/(1 − p(c))`` (0 where ``h = 1``) and ``W = Σ_c w(c)``; ``β = Σ_c q(c)h(c)``.
:meth:`_TargetOnlyRule.residual` is the rejection law averaged over ``c``,
``r̄ = Σ_c q(c)(1 − h(c))·r_c / (1 − β)``, with which eq. (0.1) holds; the samplers draw from ``r_c``
as the kernels do (the two give the same law at each position; only ``r_c`` never re-emits ``c``).

*Tree form (differs from the chain form).* SGLang's siblings ``c_1..c_m`` at a node share one coin
``u`` and ``prob_acc`` sums the raw target probabilities of the siblings tried so far: ``c_k`` is
accepted iff it is the first with ``u <= S_k/θa`` (``S_k = Σ_{j<=k} p(c_j)``) or ``p(c_k) >= θs``;
if none is, ``z ~ p`` with every candidate removed (:meth:`SGLangThresholds.tree_node_law`). Given
``c_1..c_{k−1}`` rejected, ``c_k`` is accepted with ``min(1, p(c_k)/(θa − S_{k−1}))``, not with the
chain rule on the renormalised target, ``min(1, p(c_k)/(θa(1 − S_{k−1})))`` (what
:mod:`verispec.rules.tree` does for other rules on deterministic trees); the two agree at ``θa = 1``.
:mod:`verispec.rules.tree` runs this rule on deterministic trees only in its lossless setting.

``strict`` — vLLM's strict rejection sampler. Source: vllm-project/vllm,
``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``, ``_strict_rejection_sample_kernel`` /
``strict_rejection_sample`` (``RejectionSampler(use_strict_rejection_sampling=True)``, the default,
commit 3e66089; the same loop as ``_rejection_sample_kernel`` in the earlier ``rejection_sample.py``).
The target sampler draws ``y_i ~ p_i`` at every position, bonus row included; position ``i`` keeps
``y_i`` and continues while ``y_i`` equals draft token ``i``; the first mismatch emits ``y_i`` and
stops; if all match, ``y_G`` is the bonus. The emitted token is always a draw from ``p``, so the law is
``p`` for any draft, with ``β = Σ_x p(x)q(x) <= Σ_x min(p, q) = 1 − d(p, q)`` (lossless SD's).
Per token it is ``sglang:single=1,acc=1``: ``h(c) = p(c)``, ``r_c = norm(p·1_{V∖{c}})`` (the law of
``y`` given ``y ≠ c``). The sampler is the source's: one draw from ``p`` per position.

``hf_ensemble:weight=w`` — transformers' ``assistant_ensemble_weight`` (static ensemble verification,
DIVERSE, arXiv 2604.07622). Source: transformers 5.24 ``generation/utils.py`` ``_speculative_sampling``
(lines 4444–4507): ``q``, ``p`` are the softmax of the assistant's scores and of the target's logits,
both after the logits processors (utils.py 4111; the assistant generates with the target's processors
and ``output_scores``, candidate_generator.py 166–187, 337); accept iff ``r <= 1 − w + w·p/q``
(4471, 4479), i.e. with ``min(1, w·p/q + 1 − w)``: ``w`` weighs the **target**; on rejection
``z ~ norm((p − q)_+)`` (4489; the ensemble residual ``norm((v − q)_+)`` is the same law), falling back
to ``p`` when that mass is below ``finfo.tiny`` (4491–4494); bonus from ``p`` (4498). This is exactly
``cos_we:lam=w`` (:class:`~verispec.rules.collaborative.CosWE`, law ``w·p + (1 − w)·q``), so the spec
builds that rule (its canonical spec is ``cos_we:lam=w``). Differences, none changing the law: HF
accepts on ``r <= ratio`` (we ``u < h``); HF accepts a draft with ``q = 0`` (ratio ``inf``), ours
rejects it (such a token is never drafted); HF's zero-residual threshold is ``finfo.tiny``, ours
``MASS_EPS``. HF requires ``0 < w < 1`` (configuration_utils.py 672–676), and so does the spec. HF's
greedy path with a weight (``do_sample=False``, utils.py 4134–4140: match against ``argmax(w·p +
(1 − w)·q)``) is not a sampling rule and is not modelled here.

Taxonomy. ``sglang``: truncation set — the test is a threshold on the target probability of the drafted
token alone (sure acceptance on the set ``{p >= θs}``, a soft threshold ``p/θa`` below it), ``q`` is
never interpolated; lossy unless ``θs = θa = 1``; true baseline ``p`` (no target-side truncation
reproduces it). ``strict``: lossless. ``hf_ensemble``: collaborative (it is CoS-WE).
"""

from __future__ import annotations

import torch

from verispec.params import Param, in_range
from verispec.rules.base import (
    InducedForm,
    PerTokenRule,
    as_float,
    check_distribution,
    check_pair,
    check_verify_inputs,
    normalize_or,
    sample_categorical,
)
from verispec.rules.collaborative import CosWE

SINGLE = Param("single", float, in_range(0, 1, lo_open=True), "a number with 0 < single <= 1",
               "SGLang θs: accept surely when p(c) >= θs (1: only p(c) = 1)", 1.0)
ACC = Param("acc", float, in_range(0, 1, lo_open=True), "a number with 0 < acc <= 1",
            "SGLang θa: else accept with min(1, p(c)/θa) (1: lossless)", 1.0)
WEIGHT = Param("weight", float, in_range(0, 1, lo_open=True, hi_open=True),
               "a number with 0 < weight < 1 (transformers' assistant_ensemble_weight range)",
               "HF assistant_ensemble_weight w on the target")


def without_token(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``r_x = norm(p·1_{V∖{x}})``: ``p: [..., V]``, ``x: [...]`` -> ``[..., V]`` (fallback ``p``)."""
    return normalize_or(p.scatter(-1, x.unsqueeze(-1), 0.0), p)


class _TargetOnlyRule(PerTokenRule):
    """Accept the drafted token ``c`` with ``h(p(c))``; on rejection draw from ``p`` with ``c`` removed.

    ``h`` reads ``p(c)`` only (the draft is a point mass at ``c``), so it is not zeroed where
    ``q(c) = 0``: the yield ``q·h`` is zero there anyway. Subclasses define :meth:`accept_from_p`.
    """

    pointwise_acceptance = True

    def accept_from_p(self, px: torch.Tensor) -> torch.Tensor:
        """``h`` from the target probabilities ``px: [...]`` of the drafted tokens."""
        raise NotImplementedError

    def accept_prob(self, p, q, px, qx):
        return self.accept_from_p(px)

    def accept_prob_at(self, p, q, x):
        return self.accept_from_p(p.gather(-1, x.unsqueeze(-1))[..., 0])

    def accept_prob_all(self, p, q):
        return self.accept_from_p(p)

    def correction_at(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The correction after rejecting ``x: [...]``: ``p`` without ``x`` (``q`` is not read)."""
        return without_token(p, x)

    def _weights(self, p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h, w)`` with ``w(c) = q(c)(1 − h(c))/(1 − p(c))``, 0 where ``h = 1`` (then ``p(c) = 1`` is possible)."""
        h = self.accept_from_p(p)
        miss = 1 - h
        rest = 1 - p
        ok = (miss > 0) & (rest > 0)
        w = torch.where(ok, q * miss / torch.where(ok, rest, torch.ones_like(rest)), torch.zeros_like(q))
        return h, w

    def residual(self, p, q):
        """The rejection law averaged over the drafted token, ``r̄ ∝ p·(W − w)`` (eq. 0.1 then holds).

        Consumers that need one residual per position (:mod:`verispec.rules.tree` on sampled children)
        get the correct conditional law; :meth:`verify` draws from :meth:`correction_at` instead."""
        _, w = self._weights(p, q)
        return normalize_or(p * (w.sum(-1, keepdim=True) - w), p)

    def closed_form(self, p, q):
        """``q·h + p·(W − w)`` = ``Σ_c q(c)[h(c)δ_c + (1 − h(c))·norm(p·1_{V∖{c}})]``."""
        h, w = self._weights(p, q)
        return q * h + p * (w.sum(-1, keepdim=True) - w)

    def induced_mechanism(self, p, q):
        """The law the sampler realises, summed token by token: ``Σ_c q(c)[h(c)δ_c + (1 − h(c))·r_c]``.

        Builds the ``[..., V, V]`` table of ``r_c`` (for tests and small vocabularies)."""
        p, q = check_pair(p, q)
        vocab = p.shape[-1]
        tokens = torch.arange(vocab, device=p.device).expand(*p.shape[:-1], vocab)     # [..., V]
        r = without_token(p.unsqueeze(-2).expand(*p.shape[:-1], vocab, vocab), tokens)      # [..., c, V]
        h = self.accept_prob_all(p, q)
        keep = torch.diag_embed(h)                                                        # h(c)·δ_c
        return (q.unsqueeze(-1) * (keep + (1 - h).unsqueeze(-1) * r)).sum(-2)


class SGLangThresholds(_TargetOnlyRule):
    name = "sglang"
    family = "sglang"
    taxonomy = "truncation set"
    PARAMS = (SINGLE, ACC)

    def __init__(self, single: float = 1.0, acc: float = 1.0) -> None:
        single = SINGLE.check(self.name, single)   # built directly or from a spec: the same validation
        acc = ACC.check(self.name, acc)
        super().__init__(single=single, acc=acc)
        self.single, self.acc = single, acc

    @property
    def is_lossless(self) -> bool:  # type: ignore[override]
        return self.single == 1.0 and self.acc == 1.0

    def describe(self) -> str:
        return (f"SGLang accept thresholds θs={self.single:g}, θa={self.acc:g}: accept if p(x) >= θs, "
                "else with min(1, p(x)/θa); on rejection sample p without x")

    def accept_from_p(self, px):
        return torch.where(px >= self.single, torch.ones_like(px), torch.clamp(px / self.acc, max=1.0))

    def induced_form(self):
        return InducedForm("target") if self.is_lossless else InducedForm("other")

    def tree_node_law(self, g: torch.Tensor, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's law at one tree node (one shared coin, cumulative ``prob_acc``; module docstring).

        ``g: [..., V]`` the processed target at the node, ``candidates: [..., m]`` distinct sibling
        tokens in the kernel's order. ``-> (law [..., V]`` of the token the node emits (accepted child
        or correction), ``accept [..., m]`` = P(child k is the accepted one)). One candidate: the chain form.
        """
        g = as_float(g)
        check_distribution(g, "target g")
        if candidates.dtype.is_floating_point or candidates.shape[:-1] != g.shape[:-1]:
            raise ValueError(f"candidates must be integer [..., m] sharing g's leading shape {tuple(g.shape[:-1])}; "
                             f"got {candidates.dtype} {tuple(candidates.shape)}")
        cand = candidates.long()
        vocab = g.shape[-1]
        if ((cand < 0) | (cand >= vocab)).any():
            raise ValueError(f"candidate token ids must lie in [0, {vocab})")
        m = cand.shape[-1]
        if m > 1 and (cand.unsqueeze(-1) == cand.unsqueeze(-2)).sum((-1, -2)).gt(m).any():
            raise ValueError("SGLang tree siblings are distinct tokens; got a duplicate candidate")
        pc = g.gather(-1, cand)                                               # [..., m]
        reached = (pc >= self.single).long().cumsum(-1) > 0                   # a sure accept at or before k
        cdf = torch.where(reached, torch.ones_like(pc), torch.clamp(pc.cumsum(-1) / self.acc, max=1.0))
        accept = torch.diff(cdf, dim=-1, prepend=torch.zeros_like(cdf[..., :1]))
        rest = normalize_or(g.scatter(-1, cand, 0.0), g)
        law = (1 - cdf[..., -1:]) * rest
        return law.scatter_add(-1, cand, accept), accept


class Strict(_TargetOnlyRule):
    name = "strict"
    family = "strict"
    taxonomy = "lossless"
    is_lossless = True

    def describe(self) -> str:
        return "vLLM strict: draw y ~ p at each position, accept iff y is the draft, else emit y (lossless)"

    def accept_from_p(self, px):
        return px

    def closed_form(self, p, q):
        return p

    def closed_form_acceptance(self, p, q):
        """``Σ_x p(x)q(x)``."""
        return (p * q).sum(-1)

    def induced_form(self):
        return InducedForm("target")

    def verify(
        self,
        p: torch.Tensor,
        q: torch.Tensor,
        draft: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``p: [B, G+1, V]``, ``q: [B, G, V]`` (unused), ``draft: [B, G]`` -> ``(n_accepted [B],
        next_token [B])``: ``y_i ~ p_i`` at every position; the emitted token is ``y`` at the first
        mismatch, or the bonus ``y_G``."""
        p, q, draft = check_verify_inputs(p, q, draft)
        batch, gamma = draft.shape
        y = sample_categorical(p, generator)                                   # [B, G+1]
        n_accepted = (y[:, :gamma] == draft).long().cumprod(-1).sum(-1)
        return n_accepted, y.gather(1, n_accepted.unsqueeze(1))[:, 0]


def hf_ensemble(weight: float) -> CosWE:
    """transformers' ``assistant_ensemble_weight = w`` (weight on the target) is ``cos_we:lam=w``."""
    weight = WEIGHT.check("hf_ensemble", weight)
    return CosWE(lam=weight)
