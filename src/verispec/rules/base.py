"""Common machinery of every verification rule: input checks, the batched chain verifier, guards.

Conventions (see ``docs/verification-rules.md`` §0):

* ``p``, ``q`` are next-token distributions **after** the sampling pipeline. Shapes entering
  ``verify``: ``p: [B, G+1, V]`` (target at the G drafted positions plus the bonus position),
  ``q: [B, G, V]`` (draft), ``draft: [B, G]`` int64. Closed forms take any ``[..., V]``.
* A per-token rule is the pair ``(h, r)``: the draft token ``x`` is accepted with probability
  ``h(x)``; on rejection the emitted token is drawn from ``r``. Yield ``y = q·h``, acceptance
  ``β = Σ y``, induced law ``P_R = y + (1 − β)·r`` (eq. 0.1).
* Chain semantics: accept the longest prefix of successes; at the first failure emit ``z ~ r``;
  when all G are accepted emit a bonus ``z ~ p_{G+1}`` (for every rule, as the reference code does).
* Numerics: computations in float32 at least (float64 kept if given); ratios in log space; residual
  normalisation guarded (zero mass falls back to the rule's fallback distribution); ``u < h`` with
  ``u ~ U[0, 1)`` so ``h = 0`` never accepts; a drafted token with ``q(x) = 0`` is a rejection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from verispec.checks import MASS_EPS

#: Tolerance on the row sums of probability inputs.
ROW_SUM_ATOL = 1e-3


def as_float(t: torch.Tensor) -> torch.Tensor:
    """Upcast half precision to float32; keep float32/float64 as they are."""
    if t.dtype in (torch.float32, torch.float64):
        return t
    return t.float()


def positive_part(t: torch.Tensor) -> torch.Tensor:
    return t.clamp_min(0.0)


def normalize_or(mass: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``mass / Σ mass`` per row, or ``fallback`` on rows whose mass is (numerically) zero. ``[..., V]``."""
    total = mass.sum(-1, keepdim=True)
    ok = total > MASS_EPS
    return torch.where(ok, mass / torch.where(ok, total, torch.ones_like(total)), fallback)


def ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` computed as ``exp(log num − log den)``; 0 where ``num = 0`` or ``den = 0``.

    A zero denominator only happens for tokens the draft cannot propose; giving them ratio 0 makes
    such a (numerically impossible) draft a rejection.
    """
    ok = (num > 0) & (den > 0)
    safe_num = torch.where(ok, num, torch.ones_like(num))
    safe_den = torch.where(ok, den, torch.ones_like(den))
    return torch.where(ok, torch.exp(safe_num.log() - safe_den.log()), torch.zeros_like(num))


def total_variation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``d(a, b) = Σ (a − b)_+ = ½‖a − b‖₁`` over the last dimension."""
    return positive_part(a - b).sum(-1)


#: One generator for a whole batch, or one per batch row (a sequence: row ``i`` draws from ``generators[i]``).
Generators = torch.Generator | Sequence[torch.Generator] | None


def uniform(shape: Sequence[int], generator: Generators, *, dtype: torch.dtype,
            device: torch.device | str) -> torch.Tensor:
    """``U[0, 1)`` values of ``shape`` (batch rows first). With one generator per row, row ``i`` draws from
    ``generator[i]`` exactly what a call on row ``i`` alone would (so a batched call with per-row
    generators is bit-identical to calling the rule row by row: rows of a batch stay independent)."""
    shape = tuple(shape)
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand(shape, generator=generator, dtype=dtype, device=device)
    gens = list(generator)
    if len(gens) != shape[0]:
        raise ValueError(f"one generator per batch row: got {len(gens)} generators for {shape[0]} rows")
    return torch.cat([torch.rand((1, *shape[1:]), generator=g, dtype=dtype, device=device) for g in gens])


def sample_categorical(dist: torch.Tensor, generator: Generators) -> torch.Tensor:
    """One draw per row of ``dist: [B, V]`` (rows need not be exactly normalised) ``-> [B]``; or per
    row and position of ``dist: [B, K, V]`` ``-> [B, K]``.

    Inverse-CDF sampling with one uniform per draw, cumulated in float64: a draw depends only on its
    row and its uniform (batch rows are independent and reproducible), and zero-probability tokens can
    never be drawn. ``generator``: one for the batch or one per batch row (:func:`uniform`).
    """
    cdf = dist.double().cumsum(-1)
    u = uniform((*dist.shape[:-1], 1), generator, dtype=torch.float64, device=dist.device)
    idx = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)[..., 0]
    return idx.clamp_max(dist.shape[-1] - 1)


def check_verify_inputs(
    p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate the shapes and values of a ``verify`` call and return float/int64 versions."""
    check_devices(("target p", p), ("draft q", q), ("draft tokens", draft))
    if p.dim() != 3 or q.dim() != 3 or draft.dim() != 2:
        raise ValueError(
            "verify expects p: [B, G+1, V], q: [B, G, V], draft: [B, G]; got "
            f"p {tuple(p.shape)}, q {tuple(q.shape)}, draft {tuple(draft.shape)}"
        )
    batch, gamma = draft.shape
    if gamma < 1:
        raise ValueError(f"the draft block must hold at least one token (G >= 1), got G = {gamma}")
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"vocabulary size mismatch: target p has {p.shape[-1]} tokens, draft q has {q.shape[-1]}"
        )
    if q.shape[:2] != (batch, gamma):
        raise ValueError(f"q must be [B, G, V] = [{batch}, {gamma}, V], got {tuple(q.shape)}")
    if p.shape[:2] != (batch, gamma + 1):
        raise ValueError(
            f"p must be [B, G+1, V] = [{batch}, {gamma + 1}, V] (one extra bonus position), got {tuple(p.shape)}"
        )
    if draft.dtype.is_floating_point or draft.dtype == torch.bool:
        raise TypeError(f"draft tokens must be an integer tensor, got {draft.dtype}")
    vocab = p.shape[-1]
    if ((draft < 0) | (draft >= vocab)).any():
        bad = draft[(draft < 0) | (draft >= vocab)].flatten()[0].item()
        raise ValueError(f"draft token id {bad} is outside the vocabulary [0, {vocab})")
    p, q = as_float(p), as_float(q)
    for name, t in (("target p", p), ("draft q", q)):
        check_distribution(t, name)
    return p, q, draft.long()


def check_devices(*named: tuple[str, torch.Tensor]) -> None:
    """Refuse tensors without values (the ``meta`` device) and tensors on different devices."""
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type == "meta":
            raise ValueError(f"{name} is on the 'meta' device (a shape without values, e.g. a model loaded with "
                             "device='meta' or init_empty_weights): move it to a real device (.to('cpu')) first")
    devices = {t.device for _, t in named}
    if len(devices) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in named)
        raise ValueError(f"the tensors must be on one device, got {where}: move them with .to(device)")


def check_distribution(t: torch.Tensor, name: str) -> None:
    """Refuse NaN/inf, negative entries and rows that do not sum to one (logits passed by mistake)."""
    check_devices((name, t))
    # Two passes over the data: NaN and ±inf propagate into the row sums; one copy to the host decides.
    sums = t.sum(-1)
    if bool(torch.isfinite(sums).all() & (t.amin(-1) >= 0).all() & ((sums - 1).abs() <= ROW_SUM_ATOL).all()):
        return
    if not torch.isfinite(sums).all():
        raise ValueError(f"{name} contains NaN or inf (check the logits feeding the sampling pipeline)")
    if (t.amin(-1) < 0).any():
        raise ValueError(f"{name} contains negative probabilities")
    bad = (sums - 1).abs() > ROW_SUM_ATOL
    if bad.any():
        raise ValueError(
            f"{name} rows must sum to 1 (found {sums[bad].flatten()[0].item():.6g}); "
            "pass probabilities after the sampling pipeline, not logits"
        )


def check_pair(p: torch.Tensor, q: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validate a (p, q) pair for the closed forms (``[..., V]`` each)."""
    p = as_float(p)
    check_distribution(p, "target p")
    if q is not None:
        q = as_float(q)
        if q.shape != p.shape:
            if q.shape[-1] != p.shape[-1]:
                raise ValueError(
                    f"vocabulary size mismatch: target p has {p.shape[-1]} tokens, draft q has {q.shape[-1]}"
                )
            raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
        check_distribution(q, "draft q")
    return p, q


@dataclass(frozen=True)
class InducedForm:
    """Which closed form a per-token rule's induced law has, with the knobs that determine it.

    Code that reasons about the law without evaluating it (the compression-error bounds of
    :mod:`verispec.diagnose.measures`) dispatches on this instead of on rule classes:

    ===============  ===========================================================================
    ``target``       ``P = reference = p`` (lossless)
    ``argmax``       ``P = reference = δ_argmax p`` (greedy)
    ``capped``       eq. (2.3) with ``ell``: ``P <= p/ℓ`` (lenience; the ceiling on p with ℓ = 1/κ)
    ``mixture``      ``P = lam·p + (1 − lam)·q`` (CoS-WE; an allowed set holding every token: lam 0)
    ``min_p_set``    ``P = q·1_A + (1 − q(A))·p``, ``A`` the min-p set of ``p_base``
    ``eta_set``      the same with the η set of ``eps``, ``delta``
    ``other``        none of the above (CoS-CD, ceilings on an ensemble, other cascades)
    ===============  ===========================================================================

    ``acceptance_is_set_mass``: for the set forms, whether ``β = q(A)`` (SpecCascade, typical) or
    not (cascade ``token_v3``: ``β = 1 − d(π, q)``).
    """

    kind: str
    ell: float | None = None
    lam: float | None = None
    p_base: float | None = None
    eps: float | None = None
    delta: float | None = None
    acceptance_is_set_mass: bool = True


#: The families of the map of rules: lossless; accept iff the draft is in a target allowed set; interpolate
#: draft and target (collaborative); defer to a target built from both (deferral); anything else.
TAXONOMY = ("lossless", "truncation set", "collaborative", "deferral", "other")


class Rule:
    """A verification rule. Subclasses set ``name``, ``is_lossless`` and implement the methods.

    Public API (batch-first; processed probabilities in, tensors out):

    * ``verify(p, q, draft, generator=None) -> (n_accepted [B], next_token [B])``
    * ``induced(p, q) -> [..., V]`` exact per-position emitted distribution (per-token rules)
    * ``reference(p, q=None, *, own_target=False) -> [..., V]`` the true baseline
    * ``acceptance_rate(p, q) -> [...]`` closed-form per-position acceptance probability
    * ``baseline_truncation() -> dict`` sampling fields (``min_p``, ``eta``, ``eta_delta``) that turn
      the sampling config into this rule's true baseline (empty: the plain target)
    * ``induced_form() -> InducedForm`` which closed form its law has (see :class:`InducedForm`)

    ``pointwise_acceptance``: ``h(x)`` depends on ``p(x)`` and ``q(x)`` alone (not on row statistics
    such as ``max p`` or the entropy), so it can be evaluated exactly on coarsened rows.
    """

    name: ClassVar[str]
    is_lossless: ClassVar[bool] = False
    per_token: ClassVar[bool] = True
    pointwise_acceptance: ClassVar[bool] = False
    family: ClassVar[str] = ""
    #: Place in the taxonomy of verification rules (``verispec rules`` groups by it); one of
    #: :data:`TAXONOMY`.
    taxonomy: ClassVar[str] = "other"
    #: The rule reads the untruncated temperature-1 distributions too (``verify(..., raw=(p, q))``), which
    #: only chains drafted by a draft model carry; set per instance by rules where it is an option.
    needs_raw: bool = False

    def __init__(self, **params: object) -> None:
        self.params = dict(params)

    # -- identity -------------------------------------------------------------------------------
    def spec(self) -> str:
        """Canonical spec string, e.g. ``lenience:ell=0.5``; ``verispec.rules.get(spec)`` rebuilds it."""
        if not self.params:
            return self.name
        body = ",".join(f"{k}={_fmt(v)}" for k, v in self.params.items())
        return f"{self.name}:{body}"

    def describe(self) -> str:  # pragma: no cover - overridden everywhere
        return self.spec()

    def __repr__(self) -> str:
        return f"Rule({self.spec()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rule) and other.spec() == self.spec()

    def __hash__(self) -> int:
        return hash(self.spec())

    # -- API ------------------------------------------------------------------------------------
    def verify(
        self,
        p: torch.Tensor,
        q: torch.Tensor,
        draft: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def reference(self, p: torch.Tensor, q: torch.Tensor | None = None, *, own_target: bool = False) -> torch.Tensor:
        """Default true baseline: the processed target ``p`` itself."""
        p, _ = check_pair(p, None)
        return p

    def acceptance_rate(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def baseline_truncation(self) -> dict[str, float]:
        return {}

    def induced_form(self) -> InducedForm:
        return InducedForm("other")


class PerTokenRule(Rule):
    """A rule defined position by position by ``(h, r)``; the chain verifier is shared.

    Subclasses implement
      * ``accept_prob(p, q, px, qx) -> h``: ``p, q: [..., V]`` full rows (for row statistics such as
        ``max p`` or the entropy), ``px, qx: [..., K]`` the probabilities of the K tokens whose
        acceptance is wanted (K = V for the closed forms, K = 1 in the chain verifier) — or, when
        ``h`` is read from a token set or index rather than from values (greedy, the truncation rules),
        ``accept_prob_at`` and ``accept_prob_all`` directly;
      * ``residual(p, q) -> r: [..., V]`` the normalised rejection distribution;
      * ``closed_form(p, q)`` the rule's induced law written out as in the spec (not via eq. 0.1),
        and optionally ``closed_form_acceptance(p, q)``; the tests check both against the mechanism.
    """

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor, px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def accept_prob_at(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``h`` at the tokens ``x: [...]`` -> ``[...]``."""
        idx = x.unsqueeze(-1)
        px = p.gather(-1, idx)
        qx = q.gather(-1, idx)
        h = self.accept_prob(p, q, px, qx)[..., 0]
        return torch.where(qx[..., 0] > 0, h, torch.zeros_like(h))

    def accept_prob_all(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``h`` for every token of the vocabulary ``[..., V]`` (0 where ``q = 0``)."""
        h = self.accept_prob(p, q, p, q)
        return torch.where(q > 0, h, torch.zeros_like(h))

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def correction_at(self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The law the next token is drawn from after the drafted token ``x: [...]`` was rejected, ``[..., V]``:
        ``residual(p, q)`` unless the rule's correction depends on the token it rejected."""
        return self.residual(p, q)

    def bonus(self, p_next: torch.Tensor) -> torch.Tensor:
        return p_next

    def closed_form(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- generic (eq. 0.1) ----------------------------------------------------------------------
    def yield_and_acceptance(self, p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = q * self.accept_prob_all(p, q)
        return y, y.sum(-1)

    def induced_mechanism(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``P_R = y + (1 − β)·r`` computed from ``(h, r)`` — the law the sampler realises."""
        p, q = check_pair(p, q)
        y, beta = self.yield_and_acceptance(p, q)
        return y + (1 - beta).clamp_min(0).unsqueeze(-1) * self.residual(p, q)

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Exact per-position emitted distribution ``[..., V]`` (the spec's closed form)."""
        p, q = check_pair(p, q)
        return self.closed_form(p, q)

    def acceptance_rate(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        p, q = check_pair(p, q)
        return self.closed_form_acceptance(p, q)

    def closed_form_acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return self.yield_and_acceptance(p, q)[1]

    # -- the chain verifier ---------------------------------------------------------------------
    def verify(
        self,
        p: torch.Tensor,
        q: torch.Tensor,
        draft: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chain verification. ``p: [B, G+1, V]``, ``q: [B, G, V]``, ``draft: [B, G]`` ->
        ``(n_accepted: [B] int64 in [0, G], next_token: [B] int64)``."""
        p, q, draft = check_verify_inputs(p, q, draft)
        gamma = draft.shape[1]
        h = self.accept_prob_at(p[:, :gamma], q, draft)                      # [B, G]
        return run_chain(h, lambda rows, at: self.correction_at(p[rows, at], q[rows, at], draft[rows, at]),
                         self.bonus(p[:, gamma]), generator)


def run_chain(h: torch.Tensor, rejection_law, bonus: torch.Tensor,
              generator: Generators) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain semantics shared by the per-token verifiers: ``h [B, G]`` the acceptance probability of
    each drafted token; the leading successes are accepted (``u < h``, one uniform per position); the next
    token comes from ``rejection_law(rows [B], fail_at [B]) -> [B, V]`` (the law after a rejection at
    position ``fail_at``; computed for every row, used where a draft was rejected) or, when all ``G`` are
    accepted, from ``bonus [B, V]``. ``-> (n_accepted [B], next_token [B])``."""
    batch, gamma = h.shape
    u = uniform(h.shape, generator, dtype=h.dtype, device=h.device)
    n_accepted = (u < h).long().cumprod(-1).sum(-1)                         # leading successes
    fail_at = n_accepted.clamp(max=gamma - 1)
    residual = rejection_law(torch.arange(batch, device=h.device), fail_at)  # [B, V], only where used
    dist = torch.where((n_accepted == gamma).unsqueeze(-1), bonus, residual)
    return n_accepted, sample_categorical(dist, generator)


class ExactTargetRule(PerTokenRule):
    """Lossless speculative sampling against a rule-specific target ``π(p, q)``.

    ``h = min(1, π/q)``, ``r = norm((π − q)_+)`` (fallback ``π``), ``P_R = π``,
    ``β = 1 − d(π, q)``. Used by CoS-CD, the original cascades and the overshoot ceiling on a
    collaborative base.
    """

    def target(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def accept_prob_at(self, p, q, x):
        idx = x.unsqueeze(-1)
        pi_x = self.target(p, q).gather(-1, idx)[..., 0]
        q_x = q.gather(-1, idx)[..., 0]
        return torch.clamp(ratio(pi_x, q_x), max=1.0)

    def accept_prob_all(self, p, q):
        return torch.clamp(ratio(self.target(p, q), q), max=1.0)

    def residual(self, p, q):
        pi = self.target(p, q)
        return normalize_or(positive_part(pi - q), pi)

    def closed_form(self, p, q):
        return self.target(p, q)

    def closed_form_acceptance(self, p, q):
        return 1 - total_variation(self.target(p, q), q)

    def reference(self, p, q=None, *, own_target=False):
        if own_target:
            if q is None:
                raise ValueError(f"{self.name}: its own target π depends on the draft; pass q")
            p, q = check_pair(p, q)
            return self.target(p, q)
        return super().reference(p, q)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        text = repr(v)
        return text[:-2] if text.endswith(".0") else text
    return str(v)
