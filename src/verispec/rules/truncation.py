"""Truncation-set verification: accept the draft token iff it is in a target's allowed set.

The mathematics: docs/verification-rules.md §3.

Every rule of the family is a :class:`Truncation`: ``A(p)`` is the support of a truncation pipeline run on
the processed target ``p`` (:func:`verispec.sets.truncation_mask`: steps prob-gap -> top-k -> top-p ->
min-p -> η -> ε, each on the renormalised survivors of the previous ones); ``h = 1[x ∈ A]`` (and
``q(x) > 0``); on rejection ``z ~ p``, the full processed target (the reference code ``min_p_spd`` /
``eta_spd``), not a residual. Law ``P_R = q·1_A + (1 − q(A))·p``, acceptance ``β = q(A)``, lossy unless
``A`` holds every token the draft can propose. True baseline ``p_A``: the target sampled with the same
truncation applied after its own sampling pipeline (:meth:`Truncation.baseline_truncation`: the
ordinary ``min_p`` / ``eta`` / ``epsilon`` fields of :class:`~verispec.sampling.SamplingConfig` for
sets made of those alone — they are the last warpers, so they already run on the processed ``p`` —,
the ``post_*`` fields of its post-truncation pass otherwise).

* ``truncation:prob_gap,top_k,top_p,min_p,eta,eta_delta,epsilon`` — the generic rule: any combination
  of the truncation settings of the sampling config (``prob_gap``: keep ``p >= max p − gap``), given
  by name; the spec lists the active ones in that order.
* ``speccascade:p_base`` — SpecCascade as analysed by the paper (reference code ``min_p_spd``): the
  min-p set ``A = {p >= p_base·max p}``. True baseline: min-p sampling ``p_base``.
* ``typical:eps[,delta]`` — typical acceptance with the η set ``A = {p >= min(ε, δ·exp(−H(p)))}``
  (``δ = √ε`` default; HF's ``>=``; the argmax is always in ``A`` as in the η warper).
* ``relaxed:top_k,delta`` — TensorRT-LLM's relaxed acceptance (MTP, DeepSeek-R1 thinking phase;
  ``MTPDecodingConfig.relaxed_topk`` / ``relaxed_delta``; kernel ``mtpRelaxedAcceptanceKernel`` in
  ``cpp/tensorrt_llm/kernels/speculativeDecoding/mtpKernels.cu``, driven by
  ``tensorrt_llm/_torch/speculative/mtp.py``; blog "DeepSeek R1 MTP Implementation and Optimization"):
  ``A = top-K(p) ∩ {p >= max p − δ}``, top-1 always in. As in the source the gap is additive in
  probability (``softmax`` values, compared as ``value >= top1 − δ``), not in log-probability.
* ``bild:alpha`` — the rollback policy of Big Little Decoder (Kim et al., NeurIPS 2023, arXiv 2302.07863;
  code github.com/kssteven418/BigLittleDecoder ``src/transformers/models/t5/modeling_t5.py``): roll back
  at the first drafted token whose cross-entropy ``−log p(x)`` exceeds ``α`` (``--bild_rollback``,
  "normally 2~5"). Accept iff ``p(x) >= e^{−α}`` or ``x = argmax p`` — the ε set of ``ε = e^{−α}``;
  the code also keeps a token the large model would itself predict ("avoid rollback if the new
  prediction … is same"), which is the argmax that the ε set always holds. True baseline: ε-cutoff
  sampling ``ε = e^{−α}``.
* ``cascade:rule=…,alpha`` — the original speculative cascades (Narasimhan et al.): exact
  speculative sampling against the deferral target ``π`` (table of §3.3). Deliberate deviation:
  the deferral statistics use the same processed probabilities as ``π`` (the official colab uses
  temperature-1 ones), because rules only receive processed probabilities. ``token_v3`` with
  ``α = 1 − p_base`` has exactly SpecCascade's law (tested) and the same true baseline ``p_A``;
  the other deferral rules are judged against the plain target ``p``.

Deliberate differences from the sources. (1) Relaxed acceptance and BiLD are greedy methods: their
drafts are argmax tokens, the sets are read from the temperature-1 softmax of the raw logits, and a
rejection (like the bonus) emits ``argmax p``. Here the set is computed on the processed ``p`` and a
rejection samples ``p`` — the same thing at temperature 0 (one-hot ``p``), where the sets shrink to
``{argmax p}`` and both rules are exact-match verification; with sampling they are the truncation rules
above. (2) Ties: top-k keeps every token tied with the k-th most probable one (TensorRT-LLM keeps
``torch.topk``'s arbitrary choice among them); BiLD compares ``−log p(x) > α`` in float32, we compare
``p(x) >= e^{−α}``, which can differ only within rounding of the threshold. (3) BiLD's fallback policy
(when the small model hands over) and TensorRT-LLM's switching between relaxed and strict acceptance
at the thinking tokens decide when to draft or which rule to use, not how to verify; they are not
rules here.

Ties and the support (the :mod:`verispec.sets` conventions): each step keeps the argmax of the current
distribution; min-p, η, ε and prob-gap keep tokens equal to their threshold; top-k and top-p keep the
whole tie group at their boundary; the η and ε sets keep only the *first* argmax when the maximum itself
is below the threshold. With at least one active step ``A`` is a subset of ``supp(p)`` (a drafted token
the target gives probability 0 is always rejected); a set with no active step (``speccascade:p_base=0``)
holds every token: the draft is always accepted.

The allowed sets come from :mod:`verispec.sets`, the same functions the sampling pipeline uses (its
warpers for the ordinary fields, :func:`~verispec.sets.truncation_mask` for the post pass), and the
acceptance test reads the same mask as the closed form: each rule's sampler, law and ``reference``
agree with target-only sampling under the matching truncation, ties included.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from verispec import sets
from verispec.params import Param, in_range, one_of
from verispec.rules.base import ExactTargetRule, InducedForm, PerTokenRule, Rule, check_pair
from verispec.sampling import CONFIG_PARAMS, POST, TRUNCATION_SETTINGS

P_BASE = Param("p_base", float, in_range(0, 1), "a number with 0 <= p_base <= 1", "min-p fraction of max p")
EPS = Param("eps", float, in_range(0, 1, lo_open=True, hi_open=True),
            "a number with 0 < eps < 1 (the range of η-sampling, its baseline)", "η-set ε")
DELTA = Param("delta", float, lambda v: v > 0, "a number > 0", "η-set δ (default √ε)")
RELAXED_TOP_K = Param("top_k", int, lambda v: v >= 1, "an integer >= 1", "candidates: the K most probable tokens")
RELAXED_DELTA = Param("delta", float, in_range(0, 1), "a number with 0 <= delta <= 1 (1: no probability condition)",
                      "keep candidates with p >= max p − δ")
BILD_ALPHA = Param("alpha", float, lambda v: v > 0 and 0 < math.exp(-v) < 1,
                   "a number > 0 (rollback threshold on −log p(x), nats) with 0 < exp(-alpha) < 1",
                   "rollback threshold α: accept iff p(x) >= e^{-α}")
#: The settings of the generic rule: the post-truncation fields of the sampling config without their
#: prefix, with the same valid values; each may be omitted (no default: "off" is not shown as a value).
SET_PARAMS = tuple(dataclasses.replace(p, name=p.name[len(POST):], valid_text=p.valid_text.replace(POST, ""),
                                       aliases=(), default=None, help="truncation setting " + p.name[len(POST):])
                   for p in CONFIG_PARAMS if p.name.startswith(POST))
_SET_PARAM = {p.name: p for p in SET_PARAMS}
#: The settings that are also the last warpers of the sampling pipeline (their baseline can use the
#: ordinary fields).
_TAIL_SETTINGS = ("min_p", "eta", "eta_delta", "epsilon")
CASCADE_RULES = ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3")
CASCADE_RULE = Param("rule", str, one_of(*CASCADE_RULES), "one of " + ", ".join(CASCADE_RULES), "deferral rule",
                     "token_v3")
ALPHA = Param("alpha", float, lambda v: True,
              "a real number (chow/token_v3: [0, 1]; diff/token_v1/token_v2: [-1, 1])", "deferral knob α")
_ALPHA_RANGE = {
    "chow": (0.0, 1.0), "token_v3": (0.0, 1.0), "diff": (-1.0, 1.0), "token_v1": (-1.0, 1.0), "token_v2": (-1.0, 1.0),
}


def truncation_settings(owner: str, settings: dict) -> dict:
    """Validate truncation settings (keys of :data:`SET_PARAMS`) and return the active ones in canonical
    order (``eta_delta`` kept with an active ``eta``); raise ``ValueError`` naming ``owner``."""
    unknown = [k for k in settings if k not in _SET_PARAM]
    if unknown:
        raise ValueError(f"{owner}: unknown setting {unknown[0]!r}; valid settings: {', '.join(TRUNCATION_SETTINGS)}")
    values = {k: _SET_PARAM[k].check(owner, v) for k, v in settings.items()}
    if values.get("eta_delta") is not None and values.get("eta", 0.0) == 0.0:
        raise ValueError(f"{owner}: eta_delta is the δ of the η step; set eta too")
    out = {}
    for key in TRUNCATION_SETTINGS:
        if key == "eta_delta":
            if values.get("eta_delta") is not None:
                out[key] = values[key]
        elif key in values and values[key] != sets.TRUNCATION_OFF[key]:
            out[key] = values[key]
    return out


class Truncation(PerTokenRule):
    """Accept iff the draft is in ``A(p)``, the support of a truncation of ``p``; reject -> sample ``p``.

    ``Truncation(top_k=5, min_p=0.3)`` (any keys of :data:`SET_PARAMS`, at least one active): ``A`` is
    :func:`verispec.sets.truncation_mask` of ``p`` with these settings. The named rules of the family
    (SpecCascade, typical, relaxed, BiLD) are subclasses that fix the settings from their own
    parameters. ``h`` is read from the same keep-mask as the closed form and the true baseline, so the
    sampler, the law and the baseline agree even on ties.
    """

    name = "truncation"
    family = "truncation"
    taxonomy = "truncation set"
    PARAMS = SET_PARAMS

    def __init__(self, **settings: float) -> None:
        truncation = truncation_settings(self.name, settings)
        if not any(k != "eta_delta" for k in truncation):
            raise ValueError(f"{self.name}: set at least one truncation step to a value other than its off value "
                             f"(e.g. truncation:top_k=5); settings: {', '.join(TRUNCATION_SETTINGS)}")
        self._init_set(truncation, truncation)

    def _init_set(self, params: dict, truncation: dict) -> None:
        """Record the spec parameters and the truncation settings that define ``A``."""
        Rule.__init__(self, **params)
        #: ``verispec.sets.truncation_mask`` keywords of ``A`` (inactive values allowed).
        self.truncation = dict(truncation)

    def describe(self) -> str:
        body = ", ".join(f"{k}={v:g}" for k, v in self.truncation.items())
        return f"truncation-set acceptance ({body}): accept iff x is in the truncated target's support, else sample p"

    def allowed(self, p: torch.Tensor) -> torch.Tensor:
        """Boolean keep-mask ``[..., V]`` of the allowed set of ``p: [..., V]``."""
        return sets.truncation_mask(p, **self.truncation)

    def accept_prob_at(self, p, q, x):
        idx = x.unsqueeze(-1)
        inside = self.allowed(p).gather(-1, idx)[..., 0]
        return (inside & (q.gather(-1, idx)[..., 0] > 0)).to(p.dtype)

    def accept_prob_all(self, p, q):
        return (self.allowed(p) & (q > 0)).to(p.dtype)

    def residual(self, p, q):
        return p

    def closed_form(self, p, q):
        """``q·1_A + (1 − q(A))·p``."""
        inside = torch.where(self.allowed(p), q, torch.zeros_like(q))
        return inside + (1 - inside.sum(-1, keepdim=True)).clamp_min(0) * p     # q(A) may round to 1 + 1 ulp

    def closed_form_acceptance(self, p, q):
        return torch.where(self.allowed(p), q, torch.zeros_like(q)).sum(-1)

    def reference(self, p, q=None, *, own_target=False):
        """The true baseline ``p_A`` (target sampling with the same truncation after its pipeline)."""
        p, _ = check_pair(p, None)
        return sets.restrict(p, self.allowed(p))

    def baseline_truncation(self):
        """Sampling fields for ``SamplingConfig.with_truncation``: the ordinary ``min_p`` / ``eta`` /
        ``eta_delta`` / ``epsilon`` when the set uses only those, else the ``post_*`` fields."""
        if set(self.truncation) <= set(_TAIL_SETTINGS):
            return dict(self.truncation)
        return {POST + k: v for k, v in self.truncation.items()}

    def induced_form(self):
        active = {k for k, v in self.truncation.items() if k == "eta_delta" or v != sets.TRUNCATION_OFF[k]}
        if not active:          # every draft token is accepted: P = q
            return InducedForm("mixture", lam=0.0)
        if active == {"min_p"}:
            return InducedForm("min_p_set", p_base=self.truncation["min_p"])
        if active <= {"eta", "eta_delta"}:
            eps = self.truncation["eta"]
            delta = self.truncation.get("eta_delta")
            return InducedForm("eta_set", eps=eps, delta=math.sqrt(eps) if delta is None else delta)
        return InducedForm("other")


class SpecCascade(Truncation):
    name = "speccascade"
    family = "speccascade"
    PARAMS = (P_BASE,)

    def __init__(self, p_base: float) -> None:
        p_base = P_BASE.check(self.name, p_base)   # built directly or from a spec: the same validation
        self._init_set({"p_base": p_base}, {"min_p": p_base})
        self.p_base = p_base

    def describe(self) -> str:
        return f"SpecCascade (min-p acceptance) p_base={self.p_base:g}: accept iff p(x) >= p_base·max p, else sample p"


class Typical(Truncation):
    name = "typical"
    family = "typical"
    PARAMS = (EPS, DELTA)

    def __init__(self, eps: float, delta: float | None = None) -> None:
        eps = EPS.check(self.name, eps)
        delta = None if delta is None else DELTA.check(self.name, delta)
        if delta is None:   # the η warper's default δ is √ε too
            self._init_set({"eps": eps}, {"eta": eps})
        else:
            self._init_set({"eps": eps, "delta": delta}, {"eta": eps, "eta_delta": delta})
        self.eps = eps
        self.delta = math.sqrt(eps) if delta is None else delta

    def describe(self) -> str:
        return (f"typical acceptance ε={self.eps:g}, δ={self.delta:g}: "
                "accept iff p(x) >= min(ε, δ·exp(-H(p))), else sample p")


class Relaxed(Truncation):
    """TensorRT-LLM's relaxed acceptance: ``A = top-K(p) ∩ {p >= max p − δ}`` (module docstring)."""

    name = "relaxed"
    family = "relaxed"
    PARAMS = (RELAXED_TOP_K, RELAXED_DELTA)

    def __init__(self, top_k: int, delta: float) -> None:
        top_k, delta = RELAXED_TOP_K.check(self.name, top_k), RELAXED_DELTA.check(self.name, delta)
        truncation = {"top_k": top_k} if delta == 1.0 else {"prob_gap": delta, "top_k": top_k}
        self._init_set({"top_k": top_k, "delta": delta}, truncation)
        self.top_k, self.delta = top_k, delta

    def describe(self) -> str:
        return (f"relaxed acceptance (TensorRT-LLM) top_k={self.top_k}, δ={self.delta:g}: accept iff x is among the "
                f"{self.top_k} most probable tokens with p(x) >= max p − {self.delta:g}, else sample p")


class BiLD(Truncation):
    """Big Little Decoder's rollback policy: accept iff ``−log p(x) <= α`` or ``x = argmax p`` (module docstring)."""

    name = "bild"
    family = "bild"
    PARAMS = (BILD_ALPHA,)

    def __init__(self, alpha: float) -> None:
        alpha = BILD_ALPHA.check(self.name, alpha)
        self._init_set({"alpha": alpha}, {"epsilon": math.exp(-alpha)})
        self.alpha = alpha

    def describe(self) -> str:
        return (f"BiLD rollback α={self.alpha:g}: accept iff -log p(x) <= {self.alpha:g} (p(x) >= "
                f"{math.exp(-self.alpha):.3g}) or x = argmax p, else sample p")


def cascade_target(p: torch.Tensor, q: torch.Tensor, rule: str, alpha: float) -> torch.Tensor:
    """Deferral target ``π`` of the original speculative cascades (docs/verification-rules.md §3.3). ``[..., V]``."""
    max_p = p.amax(-1, keepdim=True)
    max_q = q.amax(-1, keepdim=True)
    if rule in ("chow", "diff", "opt"):
        if rule == "chow":
            use_draft = max_q >= 1 - alpha
        elif rule == "diff":
            use_draft = max_q >= max_p - alpha
        else:
            use_draft = max_q >= max_p - alpha * (q - p).clamp_min(0).sum(-1, keepdim=True)
        return torch.where(use_draft, q, p)
    if rule == "token_v1":
        in_t = q >= max_p - alpha
    elif rule == "token_v2":
        in_t = p >= max_p - alpha
    else:
        in_t = p >= (1 - alpha) * max_p
    inside = torch.where(in_t, q, torch.zeros_like(q))
    return inside + (1 - inside.sum(-1, keepdim=True)) * p


class Cascade(ExactTargetRule):
    name = "cascade"
    family = "cascade"
    taxonomy = "deferral"
    PARAMS = (CASCADE_RULE, ALPHA)

    def __init__(self, rule: str = "token_v3", alpha: float | None = None) -> None:   # alpha required, as in specs
        rule, alpha = CASCADE_RULE.check(self.name, rule), ALPHA.check(self.name, alpha)
        lo_hi = _ALPHA_RANGE.get(rule)
        if lo_hi is not None and not lo_hi[0] <= alpha <= lo_hi[1]:
            raise ValueError(f"cascade: alpha={alpha} is out of range for rule={rule}; "
                             f"expected {lo_hi[0]} <= alpha <= {lo_hi[1]}")
        super().__init__(rule=rule, alpha=alpha)
        self.rule, self.alpha = rule, alpha

    def describe(self) -> str:
        return f"speculative cascade ({self.rule}, α={self.alpha:g}): exact SD against the deferral target π"

    def target(self, p, q):
        return cascade_target(p, q, self.rule, self.alpha)

    def reference(self, p, q=None, *, own_target=False):
        if not own_target and self.rule == "token_v3":
            p, _ = check_pair(p, None)
            return sets.restrict(p, sets.min_p_mask(p, 1 - self.alpha))
        return super().reference(p, q, own_target=own_target)

    def baseline_truncation(self):
        return {"min_p": 1 - self.alpha} if self.rule == "token_v3" else {}

    def induced_form(self):
        if self.rule != "token_v3":
            return InducedForm("other")
        if self.alpha == 1:    # T holds every token: π = q
            return InducedForm("mixture", lam=0.0)
        # SpecCascade's law with p_base = 1 − α, but β = 1 − d(π, q) rather than q(A)
        return InducedForm("min_p_set", p_base=1 - self.alpha, acceptance_is_set_mass=False)
