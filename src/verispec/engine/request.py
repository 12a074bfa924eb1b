"""One decoding request, checked and resolved: what a choice of ``verispec serve`` or a request of the
lm-evaluation-harness ``verispec`` model asks of the engine, and the two ways to run it.

:func:`resolve_decode` turns the per-request settings (rule spec, γ, tree, draft source, true baseline,
sampling pipeline, budget, stop strings, seed) into a :class:`Decode`, or raises :class:`DecodeError`
(a ``ValueError`` naming what is wrong and the setting, ``param``, that holds it). A :class:`Decode` runs
either as a row of a :class:`~verispec.engine.session.BatchSession` (:meth:`Decode.batched`,
:func:`row_request`: chains of the draft model with an integer γ, target-only rows, true baselines) or
one sequence at a time with :func:`verispec.engine.generate` (:func:`generate_single`: prompt lookup,
trees, ``gamma="auto"``, rules that read raw distributions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verispec.engine.config import resolve
from verispec.engine.costs import DEFAULT_G_MAX, CostProfile
from verispec.engine.decoding import GenerationResult
from verispec.engine.session import RowRequest
from verispec.engine.tree import TreeShape
from verispec.rules import Rule
from verispec.rules import get as get_rule
from verispec.sampling import SamplingConfig
from verispec.settings import MAX_GAMMA

#: Where drafts come from: the draft model, prompt lookup (n-grams of the context), none (target-only).
DRAFT_SOURCES = ("model", "ngram", "none")
#: A placeholder profile: lets :func:`resolve` check ``gamma="auto"`` before any measurement.
_CHECK_PROFILE = CostProfile(draft_token=0.01, target_block=tuple(0.05 * (1 + 0.1 * g) for g in range(9)))


class DecodeError(ValueError):
    """A request's decoding settings are not valid: the message says what to change; ``param`` names the
    setting (``verification.rule``, ``verification.gamma``, ``verification.tree``, ``verification.draft``,
    ``verification`` for a combination, ``baseline``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class Decode:
    """What one request decodes. ``rule`` None: target-only (``baseline`` tells whether that is a rule's
    true baseline, whose truncation ``sampling`` then holds); ``gamma`` an integer or ``"auto"``; ``tree``
    a tree spec (chains: None); ``draft``: ``model`` / ``ngram`` / ``none``; ``rule_spec``: the rule asked
    for (the baseline's rule for a baseline; empty for plain target-only)."""

    rule: Rule | None
    sampling: SamplingConfig
    max_tokens: int
    stop: list[str] = field(default_factory=list)
    seed: int = 0
    gamma: int | str = 0
    tree: str | None = None
    draft: str = "none"
    baseline: bool = False
    rule_spec: str = ""

    @property
    def batched(self) -> bool:
        """Whether a :class:`BatchSession` can decode it (else: one sequence at a time, :func:`generate_single`)."""
        if self.rule is None:
            return True
        return self.draft == "model" and self.tree is None and isinstance(self.gamma, int) \
            and not getattr(self.rule, "needs_raw", False)

    @property
    def spec_tokens(self) -> int:
        """The most draft tokens a step can accept (vLLM's ``num_spec_tokens``): γ, the cost model's γ_max for
        ``"auto"``, a tree's depth; 0 for target-only."""
        if self.rule is None:
            return 0
        if self.tree is not None:
            return TreeShape.parse(self.tree).depth
        return DEFAULT_G_MAX if self.gamma == "auto" else int(self.gamma)

    @property
    def verify_room(self) -> int:
        """Context a verification may need beyond the committed tokens (the engine keeps it free)."""
        if self.rule is None:
            return 0
        return (MAX_GAMMA if self.gamma == "auto" else int(self.gamma)) + 1 if self.tree is None else 64


def resolve_decode(*, rule: str, gamma: Any, tree: Any, draft: Any, baseline: bool, sampling: SamplingConfig,
                   max_tokens: int, stop: Sequence[str] = (), seed: int = 0,
                   draft_sources: Sequence[str] = DRAFT_SOURCES) -> Decode:
    """Check the settings of one request and resolve them (:class:`DecodeError` naming what is wrong).

    ``rule``: a rule spec; ``gamma``: an integer in 1..MAX_GAMMA or ``"auto"``; ``tree``: a tree spec or
    None; ``draft``: one of :data:`DRAFT_SOURCES`, and one of ``draft_sources`` (those available: ``model``
    needs a loaded draft model); ``baseline``: the rule's true baseline (target-only with the baseline's
    truncation over ``sampling``). ``draft="none"`` decodes from the target alone with ``sampling``."""
    if not isinstance(rule, str) or not rule.strip():
        raise DecodeError(f"the rule must be a rule spec such as 'lossless' or 'lenience:ell=0.5' (`verispec rules` "
                          f"lists them), got {rule!r}", "verification.rule")
    try:
        rule_obj = get_rule(rule)
    except (ValueError, TypeError) as exc:
        raise DecodeError(str(exc), "verification.rule") from None
    if draft not in DRAFT_SOURCES:
        raise DecodeError(f"the draft source must be one of {', '.join(DRAFT_SOURCES)}, got {draft!r}",
                          "verification.draft")
    stop = list(stop)
    if baseline:
        trunc = rule_obj.baseline_truncation()
        try:
            base = sampling.with_truncation(**trunc) if trunc else sampling
        except ValueError as exc:
            raise DecodeError(str(exc), "baseline") from None
        return Decode(None, base, max_tokens, stop, seed, baseline=True, rule_spec=rule_obj.spec())
    if draft == "none":
        return Decode(None, sampling, max_tokens, stop, seed)
    if draft not in draft_sources:
        hint = "load a draft model (--draft)" if draft == "model" else "allow it"
        raise DecodeError(f"draft source '{draft}' is not available here (available: {', '.join(draft_sources)}): "
                          f"{hint}, or choose another", "verification.draft")
    if gamma != "auto" and (isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA):
        if isinstance(gamma, float) and gamma.is_integer() and 1 <= gamma <= MAX_GAMMA:
            gamma = int(gamma)
        else:
            raise DecodeError(f"gamma must be an integer in 1..{MAX_GAMMA} or 'auto', got {gamma!r}"[:300],
                              "verification.gamma")
    if tree is not None and (not isinstance(tree, str) or not tree.strip()):
        raise DecodeError("the tree must be a tree spec string such as '4,2,2,1' or "
                          "'dynamic:top_k=10,depth=5,nodes=60'", "verification.tree")
    try:
        cfg = resolve(rule=rule_obj, gamma=gamma, tree=tree, draft_stop=0.0,
                      costs=_CHECK_PROFILE if gamma == "auto" else None, draft=draft == "model",
                      lookup=draft == "ngram", head=None)
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"the verification settings do not combine: {exc}", "verification") from None
    if cfg.tree is not None:
        return Decode(rule_obj, sampling, max_tokens, stop, seed, gamma=cfg.gamma, tree=cfg.tree_label, draft=draft,
                      rule_spec=rule_obj.spec())
    return Decode(rule_obj, sampling, max_tokens, stop, seed, gamma="auto" if gamma == "auto" else cfg.gamma,
                  draft=draft, rule_spec=rule_obj.spec())


def resolve_verification(ver: Any, *, rule: str, gamma: Any, tree: Any, draft: str, baseline: bool,
                         sampling: SamplingConfig, max_tokens: int, stop: Sequence[str] = (), seed: int = 0,
                         draft_sources: Sequence[str] = DRAFT_SOURCES) -> Decode:
    """:func:`resolve_decode` of a request's ``verification`` object (``{rule, gamma, tree, draft}``, as
    ``verispec serve``'s requests and lm-eval's gen_kwargs carry it) over the defaults ``rule`` ... ``draft``.
    A key missing or null takes its default; a request that names ``gamma`` drops the default tree."""
    if ver is None:
        ver = {}
    if not isinstance(ver, dict):
        raise DecodeError(f"'verification' must be an object {{rule, gamma, tree, draft}}, got {ver!r}"[:300],
                          "verification")
    unknown = set(ver) - {"rule", "gamma", "tree", "draft"}
    if unknown:
        raise DecodeError(f"unknown key(s) in 'verification': {', '.join(sorted(map(str, unknown)))} (known: rule, "
                          "gamma, tree, draft)", "verification")
    given = {k: v for k, v in ver.items() if v is not None}
    return resolve_decode(rule=given.get("rule", rule), gamma=given.get("gamma", gamma),
                          tree=ver.get("tree", tree if "gamma" not in given else None), draft=given.get("draft", draft),
                          baseline=baseline, sampling=sampling, max_tokens=max_tokens, stop=stop, seed=seed,
                          draft_sources=draft_sources)


def row_request(prompt: Sequence[int], d: Decode, **callbacks: Any) -> RowRequest:
    """The :class:`RowRequest` of a batched decode (``callbacks``: ``on_commit``, ``on_done``, ``tag``, ...)."""
    if not d.batched:
        raise ValueError("this request does not run in a batch (prompt lookup, a tree, gamma 'auto' or a "
                         "raw-distribution rule): run it with generate_single")
    return RowRequest(list(prompt), d.max_tokens, d.sampling, rule=d.rule, gamma=d.gamma or 5, stop=d.stop,
                      seed=d.seed, **callbacks)


def generate_single(target: Any, draft: Any | None, prompt: Sequence[int], d: Decode, *,
                    costs: CostProfile | None = None,
                    observers: Sequence[Callable[[Any], None]] = ()) -> GenerationResult:
    """Decode ``d`` one sequence at a time with :func:`verispec.engine.generate` on the single-sequence
    ``target`` / ``draft`` (``draft`` may be None unless ``d.draft == "model"``). ``costs``: the machine's
    cost profile for ``gamma="auto"`` (measured with :func:`verispec.engine.cached_profile` when None)."""
    from verispec.engine import cached_profile, generate, generate_target_only
    from verispec.engine.costs import DEFAULT_G_MAX
    from verispec.engine.ngram import NgramDrafter

    if d.rule is None:
        return generate_target_only(target, list(prompt), max_new_tokens=d.max_tokens, sampling=d.sampling,
                                    stop=d.stop, seed=d.seed)
    if d.draft == "model" and draft is None:
        raise ValueError("no draft model is loaded: use the draft source 'ngram' or 'none'")
    draft_model = draft if d.draft == "model" else None
    lookup = NgramDrafter(max_tokens=DEFAULT_G_MAX if d.gamma == "auto" else int(d.gamma)) \
        if d.draft == "ngram" else None
    if d.gamma == "auto" and costs is None:
        costs = cached_profile(target, draft_model, list(prompt))[0]
    return generate(target, draft_model, list(prompt), rule=d.rule, sampling=d.sampling, gamma=d.gamma,
                    max_new_tokens=d.max_tokens, stop=d.stop, seed=d.seed, costs=costs, tree=d.tree, lookup=lookup,
                    observers=list(observers))
