"""Verification rules: a registry of spec strings shared by the API and the CLI.

``get("lenience:ell=0.5")`` returns a :class:`Rule`. Spec grammar: ``name[:param=value,...]``; the
first parameters may also be given positionally (``lenience:0.5``). The settings after ``:`` follow
the grammar of :mod:`verispec.params`, shared with ``SamplingConfig.parse``. Unknown names or
parameters, missing required ones and values out of range raise ``ValueError`` naming the valid
choices. :func:`split_specs` splits a comma-separated list of specs.

Every registered rule, grouped by its place in the taxonomy, with its law and true baseline, is printed by
``verispec rules`` (:mod:`verispec.rules.catalogue`):

* lossless: ``lossless``, ``block``, ``hsd``, ``greedy``, ``strict`` — law p (greedy: argmax p);
* truncation set: ``speccascade:p_base``, ``typical:eps[,delta]``, ``truncation:…``,
  ``relaxed:top_k,delta``, ``bild:alpha`` — law q·1_A + (1−q(A))·p, baseline p_A (the target sampled
  with the same truncation); ``sglang:single,acc`` — Σ_c q(c)[h(c)δ_c + (1−h(c))·p₋c], baseline p;
* collaborative: ``lenience:ell``, ``ceiling:kappa,base=p|we|cd``, ``cos_we:lam``, ``cos_cd:mu``,
  ``hf_ensemble:weight``, ``mentored:D`` / ``mentored:alpha``, ``cactus:delta`` — eq. (2.3), norm(min(π, κp)),
  λp + (1−λ)q, π_CD, clip(q, p/β, p/α), Cactus's law (§2.6); baseline p (CoS: its own target π on request);
* deferral: ``cascade:rule=…,alpha``, ``fuzzy:T,div,on``, ``kl_judge:tau,confident,div,reject`` — π, or
  q where a divergence gate opens and p (or SD) elsewhere; baseline p_A (token_v3) or p;
* other: ``hsd_uncapped_final``, ``hsd_mincap:ell``, ``hsd_nocap:ell``, ``fly:theta,window``
  (sequence-level: exact block laws on toy models in :mod:`verispec.rules.block_law`), ``judge:name``
  (q·h + (1−β)·p), ``logit_compare:eps`` (q·1[q <= e^ε p] + (1−β)·δ_argmax p), ``reject_to_p`` (a known wrong
  implementation: min(p, q) + d(p, q)·p); baseline p.
"""

from __future__ import annotations

from collections.abc import Callable

from verispec.params import Param, parse_settings
from verispec.rules.base import ExactTargetRule, InducedForm, PerTokenRule, Rule
from verispec.rules.block import BlockVerification
from verispec.rules.cactus import Cactus
from verispec.rules.collaborative import CeilingOnEnsemble, CosCD, CosWE, Lenience, make_ceiling
from verispec.rules.divergence import Fuzzy, KLJudge
from verispec.rules.fly import FLy
from verispec.rules.hsd import HSD
from verispec.rules.hsd_variants import HSDMinCap, HSDNoCap, HSDUncappedFinal
from verispec.rules.judge import JudgeRule, registered_judge
from verispec.rules.logit_compare import LogitCompare
from verispec.rules.lossless import Greedy, Lossless
from verispec.rules.mentored import Mentored
from verispec.rules.shipped import WEIGHT, SGLangThresholds, Strict, hf_ensemble
from verispec.rules.truncation import BiLD, Cascade, Relaxed, SpecCascade, Truncation, Typical
from verispec.rules.wrong import RejectToP

__all__ = [
    "Rule", "PerTokenRule", "ExactTargetRule", "InducedForm", "get", "names", "split_specs", "REGISTRY", "help_text",
]


class _Entry:
    def __init__(self, build: Callable[..., Rule], params: tuple[Param, ...], summary: str) -> None:
        self.build, self.params, self.summary = build, params, summary


REGISTRY: dict[str, _Entry] = {
    "lossless": _Entry(Lossless, (), "token-level lossless speculative sampling"),
    "block": _Entry(BlockVerification, (), "block verification (lossless)"),
    "hsd": _Entry(HSD, (), "hierarchical speculative decoding (lossless)"),
    "hsd_uncapped_final": _Entry(HSDUncappedFinal, (), "HSD, published code: final joint ratio not capped (lossy)"),
    "hsd_mincap": _Entry(HSDMinCap, HSDMinCap.PARAMS, "HSD, Fast-HSD: branches capped by min(P_k, Q_k) (lossy)"),
    "hsd_nocap": _Entry(HSDNoCap, HSDNoCap.PARAMS, "HSD, Fast-HSD \"fast\": branches not capped (lossy)"),
    "fly": _Entry(FLy, FLy.PARAMS, "FLy: defer a rejection at top-3 entropy >= θ if the next W pass (lossy)"),
    "greedy": _Entry(Greedy, (), "exact match against argmax p"),
    "lenience": _Entry(Lenience, Lenience.PARAMS, "accept min(1, p/(ℓq))"),
    "cos_we": _Entry(CosWE, CosWE.PARAMS, "CoS weighted ensemble λp + (1-λ)q"),
    "cos_cd": _Entry(CosCD, CosCD.PARAMS, "CoS contrastive π ∝ p q^(-μ)"),
    "ceiling": _Entry(make_ceiling, CeilingOnEnsemble.PARAMS, "overshoot ceiling P <= κp (base p = lenience 1/κ)"),
    "speccascade": _Entry(SpecCascade, SpecCascade.PARAMS, "accept iff in the min-p set, reject -> sample p"),
    "cascade": _Entry(Cascade, Cascade.PARAMS, "original speculative cascades (deferral rules)"),
    "typical": _Entry(Typical, Typical.PARAMS, "typical acceptance with the η set"),
    "truncation": _Entry(Truncation, Truncation.PARAMS, "accept iff in a truncation of p (any top-k/top-p/min-p/η/ε)"),
    "relaxed": _Entry(Relaxed, Relaxed.PARAMS, "TensorRT-LLM relaxed acceptance: top-K ∩ {p >= max p - δ}"),
    "bild": _Entry(BiLD, BiLD.PARAMS, "BiLD rollback: accept iff -log p(x) <= α or x = argmax p"),
    "judge": _Entry(registered_judge, JudgeRule.PARAMS, "trained judge: accept with a registered predicate's h(x)"),
    "sglang": _Entry(SGLangThresholds, SGLangThresholds.PARAMS, "SGLang: accept p(x) >= single, else min(1, p(x)/acc)"),
    "strict": _Entry(Strict, (), "vLLM strict: y ~ p, accept iff y = draft, else emit y (lossless)"),
    "hf_ensemble": _Entry(hf_ensemble, (WEIGHT,), "transformers assistant_ensemble_weight w (= cos_we:lam=w)"),
    "fuzzy": _Entry(Fuzzy, Fuzzy.PARAMS, "fuzzy SD: accept any draft where D(p, q) <= T, else sample p"),
    "kl_judge": _Entry(KLJudge, KLJudge.PARAMS, "accept any draft where KL < τ; SD where max p > confident"),
    "mentored": _Entry(Mentored, Mentored.PARAMS, "mentored decoding: most acceptance with KL(p‖π) <= D (or fixed α)"),
    "cactus": _Entry(Cactus, Cactus.PARAMS, "Cactus: verify against p raised at the draft to p + sqrt(2δp(1-p))"),
    "logit_compare": _Entry(LogitCompare, LogitCompare.PARAMS,
                            "Modular MAX logit comparison: accept iff log q <= log p + eps, else argmax p"),
    "reject_to_p": _Entry(RejectToP, (), "WRONG (Spec-RL issue 14): accept min(1, p/q), rejection samples p (lossy)"),
}


def names() -> list[str]:
    return list(REGISTRY)


def help_text() -> str:
    """One line per rule: spec syntax and meaning (for ``--help`` and error messages)."""
    lines = []
    for name, entry in REGISTRY.items():
        params = ",".join(p.name + ("" if p.default is None else f"={p.default}") for p in entry.params)
        syntax = name + (":" + params if entry.params else "")
        lines.append(f"  {syntax:<44} {entry.summary}")
    return "\n".join(lines)


def get(spec: str | Rule) -> Rule:
    """Build a rule from its spec string (``"lenience:ell=0.5"``); a ``Rule`` is returned as is."""
    if isinstance(spec, Rule):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a rule spec must be a non-empty string; valid rules: {', '.join(names())}")
    name, _, body = spec.strip().partition(":")
    name = _rule_name(name)
    entry = REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"unknown rule {name!r}; valid rules: {', '.join(names())}")
    values = parse_settings(body, entry.params, owner=name, positional=True)
    optional = _OPTIONAL.get(name, ())
    required = [p.name for p in entry.params if p.default is None and p.name not in values and p.name not in optional]
    if required:
        raise ValueError(f"{name}: missing required parameter(s) {', '.join(required)}; e.g. {_EXAMPLES[name]}")
    return entry.build(**values)


def split_specs(text: str) -> list[str]:
    """Split a comma-separated list of rule specs, ``"lenience:ell=0.5,ceiling:kappa=2,base=we,lossless"``
    -> ``["lenience:ell=0.5", "ceiling:kappa=2,base=we", "lossless"]``: a comma starts a new spec only
    where the next item begins with a known rule name (parameters are comma-separated too)."""
    specs: list[str] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if _rule_name(item.split(":", 1)[0]) in REGISTRY or not specs:
            specs.append(item)
        else:
            specs[-1] += "," + item
    return specs


def _rule_name(text: str) -> str:
    return text.strip().lower().replace("-", "_")


#: Parameters without a default that may still be omitted (their meaning depends on other params).
_OPTIONAL = {"typical": ("delta",), "ceiling": ("lam", "mu"), "truncation": tuple(p.name for p in Truncation.PARAMS)}
_EXAMPLES = {
    "lenience": "lenience:ell=0.5",
    "ceiling": "ceiling:kappa=2 or ceiling:kappa=2,base=we,lam=0.5",
    "speccascade": "speccascade:p_base=0.3",
    "typical": "typical:eps=0.15",
    "relaxed": "relaxed:top_k=10,delta=0.6",
    "bild": "bild:alpha=3",
    "judge": "judge:name=<a name given to verispec.rules.judge.register_judge>",
    "cascade": "cascade:rule=token_v3,alpha=0.5",
    "hf_ensemble": "hf_ensemble:weight=0.5",
    "fuzzy": "fuzzy:T=0.4,div=js",
    "kl_judge": "kl_judge:tau=0.5",
    "mentored": "mentored:D=0.1 or mentored:alpha=0.5",
    "cactus": "cactus:delta=1",
}
