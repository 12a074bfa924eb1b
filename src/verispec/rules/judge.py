"""Trained judges: accept the draft token with a probability given by a user-supplied predicate.

Sources. Judge Decoding (Bachmann et al., ICLR 2025, arXiv 2501.19309): a small linear head on the
target's embeddings ("judge") scores each drafted token; a token is accepted when the judge's score is
above a threshold *or* the standard verification accepts it, and the first rejected position is replaced
by the target's own token (their setting is greedy: the target's argmax). AutoJudge (Garipov et al.,
arXiv 2504.20039; code github.com/garipovroma/autojudge, ``eval/generation_utils.py``): greedy drafts;
accept iff the draft equals the target's argmax *or* a logistic-regression head on hidden states (draft
and target, or target only) says the mismatch is unimportant (``p_head < head_threshold``); at the first
rejected position the target's argmax token is emitted. Neither source fixes the sampled case.

Rule (``judge:name=<registered>``, :class:`JudgeRule`). A *predicate* — the trained judge, any OR with
standard verification included — gives ``h(x) ∈ [0, 1]`` for the drafted token ``x`` at each position:

* ``h = predicate(p, q, tokens, features)``, evaluated for every position in one call:
  ``p: [..., V]`` and ``q: [..., V]`` the processed target and draft distributions of the positions,
  ``tokens: [..., K]`` int64, the candidate tokens whose acceptance is wanted (``K = 1`` in ``verify``:
  the drafted token; ``K = V`` in the closed forms: ``tokens[..., k] = k``), ``features: [..., H]`` or
  ``None`` (per-position features, e.g. the judge's hidden states). It returns ``[..., K]`` — a bool
  tensor or floats in ``[0, 1]``; anything else raises ``ValueError``. The predicate must therefore be
  vectorised over the token axis ``K``: the closed forms call it on all ``V`` tokens at once.
* On rejection ``z ~ p`` (the target's own choice; at temperature 0, one-hot ``p``, it is the argmax
  of both sources); a drafted token with ``q(x) = 0`` is rejected; ``u < h`` with ``u ~ U[0, 1)``.
* Law ``P_R = q·h + (1 − β)·p`` with ``β = Σ_x q(x)·h(x)`` (``h`` of every token, 0 where ``q = 0``);
  true baseline: the plain target ``p`` (both papers judge quality against the target). Lossy.

Place in the taxonomy: *other* (``h`` is arbitrary; a predicate that is an indicator of a target set
makes it a truncation-set rule in law — accept iff ``p(x) >= 0.5·max p`` has exactly the law and the
acceptance of ``speccascade:p_base=0.5`` — but the rule cannot know that, nor compute a baseline ``p_A``).

Deliberate differences. (1) Sampling: the sources are greedy; a rejection here samples ``p`` instead of
taking its argmax, which is the same at temperature 0. (2) Features: the closed forms treat ``features``
as fixed per position, the same for every candidate token. A judge whose features depend on the drafted
token itself (AutoJudge reads the target's hidden state *at* the drafted token) has no closed form over
all tokens; ``induced`` then describes a judge that would see the given features whatever the token, and
only ``verify`` (which passes the drafted token's features) is the real mechanism. (3) No training here:
a trained judge is plugged in by registering its predicate with :func:`register_judge`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

import torch

from verispec.params import Param
from verispec.rules.base import (
    PerTokenRule,
    as_float,
    check_pair,
    check_verify_inputs,
    run_chain,
)

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
JUDGE_NAME = Param("name", str, lambda v: bool(_NAME_RE.fullmatch(v)),
                   "a registered judge name (letters, digits, '_', '.', '-'; see verispec.rules.judge.register_judge)",
                   "the registered judge predicate")


class JudgePredicate(Protocol):
    """``(p [..., V], q [..., V], tokens [..., K] int64, features [..., H] | None) -> h [..., K]`` in [0, 1]."""

    def __call__(self, p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor,
                 features: torch.Tensor | None) -> torch.Tensor: ...


_JUDGES: dict[str, JudgePredicate] = {}


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"judge: name must be {JUDGE_NAME.valid_text}, got {name!r}")
    return name


def register_judge(name: str, predicate: JudgePredicate) -> None:
    """Make ``predicate`` available as ``judge:name=<name>``. Registering the same function again is a
    no-op; another function under a taken name raises ``ValueError`` (call :func:`unregister_judge` first)."""
    name = _check_name(name)
    if not callable(predicate):
        raise TypeError(f"judge {name!r}: the predicate must be callable, got {type(predicate).__name__}")
    if name in _JUDGES and _JUDGES[name] is not predicate:
        raise ValueError(f"judge {name!r} is already registered with another predicate; unregister it first")
    _JUDGES[name] = predicate


def unregister_judge(name: str) -> None:
    """Remove a registered judge (``KeyError`` if there is none of that name)."""
    del _JUDGES[name]


def judges() -> list[str]:
    """The registered judge names."""
    return sorted(_JUDGES)


def registered_judge(name: str) -> JudgeRule:
    """The rule of the judge registered as ``name`` (what ``verispec.rules.get("judge:name=…")`` builds)."""
    name = _check_name(name)
    if name not in _JUDGES:
        known = ", ".join(judges()) or "none yet"
        raise ValueError(f"judge: unknown judge {name!r}; registered judges: {known} "
                         "(register one with verispec.rules.judge.register_judge)")
    return JudgeRule(_JUDGES[name], name=name)


class JudgeRule(PerTokenRule):
    """Accept the draft token ``x`` with probability ``predicate(p, q, x, features)``; reject -> sample ``p``.

    ``JudgeRule(predicate, name="…")``: the predicate's contract is :class:`JudgePredicate` (module
    docstring). The spec is ``judge:name=<name>``; it rebuilds the rule only when ``name`` is registered
    (:func:`register_judge`), and rules compare equal by spec, i.e. by judge name. ``verify``,
    ``induced`` and ``acceptance_rate`` take an optional keyword ``features`` (``[B, G, H]`` in
    ``verify``, ``[..., H]`` matching ``p``'s leading dimensions in the closed forms) that is passed to
    the predicate.
    """

    name = "judge"
    family = "judge"
    taxonomy = "other"
    PARAMS = (JUDGE_NAME,)

    def __init__(self, predicate: JudgePredicate, name: str) -> None:
        name = _check_name(name)
        if not callable(predicate):
            raise TypeError(f"judge {name!r}: the predicate must be callable, got {type(predicate).__name__}")
        super().__init__(name=name)
        self.predicate: Callable = predicate
        self.judge_name = name

    def describe(self) -> str:
        return f"trained judge {self.judge_name!r}: accept x with the judge's probability h(x), else sample p"

    # -- h -------------------------------------------------------------------------------------------
    def _judge(self, p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor,
               features: torch.Tensor | None) -> torch.Tensor:
        """The predicate's ``h [..., K]`` for ``tokens [..., K]``, validated and cast to ``p``'s dtype."""
        h = self.predicate(p, q, tokens, features)
        who = f"judge {self.judge_name!r}"
        if not isinstance(h, torch.Tensor):
            raise TypeError(f"{who}: the predicate must return a tensor [..., K], got {type(h).__name__}")
        if h.shape != tokens.shape:
            raise ValueError(f"{who}: the predicate returned shape {tuple(h.shape)}, expected {tuple(tokens.shape)} "
                             "(one acceptance probability per candidate token; it must be vectorised over the "
                             "last, token axis)")
        if h.dtype == torch.bool:
            return h.to(p.dtype)
        if not h.dtype.is_floating_point:
            raise ValueError(f"{who}: the predicate must return bools or floats in [0, 1], got {h.dtype}")
        h = h.to(p.dtype)
        bad = ~((h >= 0) & (h <= 1))                  # NaN is caught here too
        if bad.any():
            raise ValueError(f"{who}: the predicate returned {h[bad].flatten()[0].item()!r}; "
                             "acceptance probabilities must lie in [0, 1]")
        return h

    def accept_prob_at(self, p, q, x, features=None):
        idx = x.unsqueeze(-1)
        h = self._judge(p, q, idx, features)[..., 0]
        return torch.where(q.gather(-1, idx)[..., 0] > 0, h, torch.zeros_like(h))

    def accept_prob_all(self, p, q, features=None):
        tokens = torch.arange(p.shape[-1], device=p.device).expand(p.shape)
        h = self._judge(p, q, tokens, features)
        return torch.where(q > 0, h, torch.zeros_like(h))

    def residual(self, p, q):
        return p

    # -- closed forms --------------------------------------------------------------------------------
    def closed_form(self, p, q, features=None):
        """``q·h + (1 − β)·p``, ``β = Σ q·h``."""
        y = q * self.accept_prob_all(p, q, features)
        return y + (1 - y.sum(-1, keepdim=True)) * p

    def closed_form_acceptance(self, p, q, features=None):
        return (q * self.accept_prob_all(p, q, features)).sum(-1)

    def induced(self, p, q, *, features=None):
        """Exact per-position emitted law ``[..., V]`` (features fixed per position: module docstring)."""
        p, q = check_pair(p, q)
        return self.closed_form(p, q, _check_features(features, p.shape[:-1], "p's leading dimensions"))

    def acceptance_rate(self, p, q, *, features=None):
        p, q = check_pair(p, q)
        return self.closed_form_acceptance(p, q, _check_features(features, p.shape[:-1], "p's leading dimensions"))

    # -- the chain verifier --------------------------------------------------------------------------
    def verify(self, p, q, draft, generator=None, *, features=None):
        """Chain verification (as :meth:`PerTokenRule.verify`, residual ``p``). ``p: [B, G+1, V]``,
        ``q: [B, G, V]``, ``draft: [B, G]``, ``features: [B, G, H]`` or None ->
        ``(n_accepted: [B] int64 in [0, G], next_token: [B] int64)``."""
        p, q, draft = check_verify_inputs(p, q, draft)
        gamma = draft.shape[1]
        features = _check_features(features, draft.shape, "[B, G] of the draft")
        h = self.accept_prob_at(p[:, :gamma], q, draft, features)             # [B, G]
        return run_chain(h, lambda rows, at: p[rows, at], p[:, gamma], generator)


def _check_features(features: torch.Tensor | None, lead: torch.Size, what: str) -> torch.Tensor | None:
    """``features [*lead, H]`` as float, or None."""
    if features is None:
        return None
    if not isinstance(features, torch.Tensor):
        raise TypeError(f"judge: features must be a tensor [..., H] or None, got {type(features).__name__}")
    if features.dim() != len(lead) + 1 or features.shape[:-1] != lead:
        want = ", ".join([*map(str, lead), "H"])
        raise ValueError(f"judge: features must have shape [{want}] (matching {what}), got {tuple(features.shape)}")
    return as_float(features) if features.is_floating_point() else features
