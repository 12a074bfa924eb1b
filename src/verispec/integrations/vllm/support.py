"""Which verispec rule can verify which vLLM proposer's drafts, and why the others are refused.

vLLM hands its rejection sampler the target's processed logits and, per drafted token, either the draft's
probabilities or nothing:

* ``probabilistic`` drafts — a draft model or an EAGLE-style head with
  ``draft_sample_method="probabilistic"`` (and ``rejection_sample_method="standard"``): the draft token
  was sampled from ``q`` (the draft's softmax at the request's temperature) and ``q`` reaches the
  sampler. Every per-token rule runs in its chain form (``rule.verify``'s semantics).
* ``point_mass`` drafts — ``ngram``, ``suffix``, ``medusa``, ``mlp_speculator``, and any model-based
  proposer with ``draft_sample_method="greedy"`` (vLLM's default): the draft is a deterministic candidate,
  ``q = δ_x``. Rules run in their deterministic-candidate form (:mod:`verispec.rules.tree`: accept with
  ``rule.accept_prob_at(p, δ_x, x)``, on rejection zero ``p(x)`` and renormalise), which exists for
  lossless, greedy, lenience, the ceiling on ``p`` and the truncation-set rules (and the lossless
  settings of the others); a rule that reads the draft's full ``q`` has no such form.

Refused everywhere (raised before any generation, with what to use instead): sequence-level rules
(``block``, ``hsd`` and its variants, ``fly``: their law is defined per draft block, not per token),
rules that read the raw untruncated distributions (``fuzzy`` / ``kl_judge`` with ``on=raw``: vLLM does
not pass the draft's raw distribution), and trained judges (``judge:``: the predicate is registered in one
Python process and reads features that vLLM's sampler does not receive).

No vLLM import here: the table is plain data, usable from the CLI and the docs.
"""

from __future__ import annotations

from dataclasses import dataclass

from verispec import rules as rule_registry
from verispec.rules.base import PerTokenRule, Rule
from verispec.rules.judge import JudgeRule
from verispec.rules.tree import check_tree_rule

PROBABILISTIC = "probabilistic"
POINT_MASS = "point_mass"
DRAFT_KINDS = (PROBABILISTIC, POINT_MASS)

#: The pseudo-rule that keeps vLLM's own rejection sampler for a request (or for the engine).
NATIVE = "vllm"

#: Proposers whose drafts come from a model's softmax, so that they can carry ``q`` to the sampler.
MODEL_PROPOSERS = ("draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark")

#: Rules that have a closed form per drafted token on probabilistic drafts, to list in errors.
POINT_MASS_ADVICE = ("lossless, greedy, lenience, ceiling (base=p), speccascade, typical, truncation, relaxed, "
                     "bild")


@dataclass(frozen=True)
class Proposer:
    """What a vLLM ``speculative_config`` means for verification: its ``method`` and whether the sampler
    receives the draft probabilities (``drafts``: :data:`PROBABILISTIC` or :data:`POINT_MASS`)."""

    method: str
    drafts: str

    @classmethod
    def from_config(cls, speculative_config: dict | object | None) -> Proposer:
        """From a ``speculative_config`` dict (as given to ``vllm.LLM``) or vLLM's ``SpeculativeConfig``."""
        if speculative_config is None:
            raise ValueError("the verispec plug-in verifies speculative decoding: give vLLM a speculative_config "
                             "(e.g. {'method': 'draft_model', 'model': ..., 'num_speculative_tokens': 5, "
                             "'draft_sample_method': 'probabilistic'})")
        get = (speculative_config.get if isinstance(speculative_config, dict)
               else lambda k, d=None: getattr(speculative_config, k, d))
        method = get("method", None)
        if method is None:   # vLLM infers it from the model: "draft_model" for an ordinary LM
            method = "ngram" if get("model", None) in (None, "ngram", "[ngram]") else "draft_model"
        method = str(method)
        probabilistic = (any(method == m or method.startswith(m) for m in MODEL_PROPOSERS)
                         and get("draft_sample_method", "greedy") == "probabilistic"
                         and get("rejection_sample_method", "standard") == "standard")
        return cls(method, PROBABILISTIC if probabilistic else POINT_MASS)


def refusal(rule: Rule, drafts: str) -> str | None:
    """Why ``rule`` cannot verify ``drafts`` (:data:`PROBABILISTIC` or :data:`POINT_MASS`) in vLLM, with what
    to use instead; None when it can."""
    if drafts not in DRAFT_KINDS:
        raise ValueError(f"drafts must be one of {', '.join(DRAFT_KINDS)}, got {drafts!r}")
    spec = rule.spec()
    if not rule.per_token or not isinstance(rule, PerTokenRule):
        lossless = (f" {spec} is lossless, so 'lossless' samples the same law (it only accepts fewer tokens)"
                    if type(rule).is_lossless is True else "")
        return (f"rule {spec!r} is sequence-level (its law is defined per draft block, not per token); the vLLM "
                f"plug-in verifies per token.{lossless} Use a per-token rule (see `verispec rules`), or verispec's "
                "own engine for this rule")
    if getattr(rule, "needs_raw", False):
        return (f"rule {spec!r} reads the raw (untruncated, temperature-1) target and draft distributions; vLLM "
                "passes its sampler only the processed target logits and the draft's probabilities, so use the "
                "same rule with on=processed")
    if isinstance(rule, JudgeRule):
        return (f"rule {spec!r} calls a judge predicate registered in this Python process, with features vLLM's "
                "sampler does not receive; run it with verispec's own engine")
    if drafts == POINT_MASS:
        try:
            check_tree_rule(rule, "deterministic", 1)
        except ValueError:
            return (f"rule {spec!r} has no point-mass form (verispec.rules.tree: it reads the draft's full "
                    "distribution q, under which a deterministic candidate degenerates), and this proposer's drafts "
                    "reach the sampler as point masses (ngram, suffix, medusa, or a draft model / EAGLE head with "
                    "draft_sample_method='greedy'). Use a draft model or EAGLE head with "
                    f"draft_sample_method='probabilistic', or a rule with a point-mass form: {POINT_MASS_ADVICE}")
    return None


def check_rule(spec: str | Rule, drafts: str) -> Rule:
    """The rule of ``spec`` if it can verify ``drafts`` in vLLM, else ``ValueError`` saying why and what to use."""
    rule = rule_registry.get(spec)
    why = refusal(rule, drafts)
    if why is not None:
        raise ValueError(why)
    return rule


def support_table() -> list[tuple[str, str, str]]:
    """``(rule spec, probabilistic drafts, point-mass drafts)`` for every registered rule's catalogue
    example: ``"yes"`` or the first words of the refusal (the table of docs/vllm.md)."""
    from verispec.rules.catalogue import entries

    rows = []
    for entry in entries():
        if "<" in entry.example:
            rows.append((entry.example, "no (judge)", "no (judge)"))
            continue
        rule = rule_registry.get(entry.example)
        cells = []
        for drafts in DRAFT_KINDS:
            why = refusal(rule, drafts)
            cells.append("yes" if why is None else "no: " + _reason(why))
        rows.append((entry.example, *cells))
    return rows


def _reason(why: str) -> str:
    for key, short in (("no point-mass form", "needs the draft's q"), ("sequence-level", "sequence-level"),
                       ("raw (untruncated", "reads raw distributions"), ("judge predicate", "judge")):
        if key in why:
            return short
    return why
