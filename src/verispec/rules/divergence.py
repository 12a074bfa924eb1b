"""Divergence-gated verification: accept the drafted token, whatever it is, where the target and draft
next-token distributions are close; elsewhere fall back to the target.

Both rules decide from a *row statistic* — a divergence ``D(p, q)`` between the whole distributions at
the position (and, for the KL judge, ``max p``) — so ``h`` does not depend on the drafted token
(``pointwise_acceptance = False``). Per position the gate is either open (accept any drafted token:
``h = 1``) or closed (fall back). The law at a drafted position is therefore

    ``P_R = q  if the gate is open,  p  otherwise``                                        (D.1)

for both rules and every fallback below, while the acceptance differs. True baseline: the plain
target ``p`` (both sources compare with target sampling / standard SD).

Place in the taxonomy: **deferral**. (D.1) is the law of a row-level speculative cascade
(docs/verification-rules.md §3.3: Chow, Diff, OPT defer per position to ``p`` or keep ``q`` on a row
statistic); here the deferral statistic is a divergence. ``kl_judge`` with ``reject=sd`` realises it
exactly as the cascades do (lossless speculative sampling against ``π ∈ {q, p}``); ``fuzzy`` realises the same law with
``h ∈ {0, 1}`` and a rejection that samples ``p``, i.e. with lower acceptance. It is not a truncation
set rule (no token set of ``p``: the decision is per row) nor collaborative (no interpolation of ``p``
and ``q`` inside a row).

Divergences (nats; :func:`divergence`, option ``div``). Every one is 0 iff ``p = q``; identical rows
get exactly 0 and differing rows at least the smallest positive float, so rounding never opens a
``T = 0`` gate (the lossless settings below are exact):

=========  ===============================================  ============================================
``div``    ``D(p, q)``                                      FSD reference code name (``fsd_utils.py``)
=========  ===============================================  ============================================
``js``     ``½KL(p‖m) + ½KL(q‖m)``, ``m = (p + q)/2``;       — (see ``js_rev``)
           in ``[0, ln 2]``; ``ln 2`` for disjoint supports
``kl_qp``  ``KL(q‖p) = Σ q log(q/p)`` (draft relative to     ``kl_div`` (``F.kl_div(log p, q)``)
           target); ``inf`` if ``q > 0`` where ``p = 0``
``kl_pq``  ``KL(p‖q) = Σ p log(p/q)``; ``inf`` if ``p > 0``  ``kl_div_reversed`` (``F.kl_div(log q, p)``)
           where ``q = 0``
``tv``     ``½ Σ |p − q|`` in ``[0, 1]``                     ``tv_div``
``js_rev`` ``½KL(m‖p) + ½KL(m‖q)`` (unbounded; ``inf``       ``js_div`` (``F.kl_div(log p, m)`` computes
           unless ``supp p = supp q``)                      ``KL(m‖p)``, not ``KL(p‖m)``)
=========  ===============================================  ============================================

``fuzzy:T,div=js,on=processed`` — Fuzzy Speculative Decoding (Holsman, Huang, Dhingra, ACL Findings
2025, arXiv 2502.20704; code github.com/maxholsman/fsd, ``fsd_utils.py``,
``_speculative_backoff_sampling``; of the paper only the abstract and introduction were reachable, the
mechanism below is read from the code). At each drafted position accept iff ``D(p, q) <= T``; at the first
failure emit ``z ~ p`` (the processed target at that position — the code samples
``new_logits.softmax()[:, n_matches]``, the warped target logits, not the lossless residual); bonus
``~ p`` when all pass. ``h = 1[D <= T]``, ``r = p``, ``β = 1[D <= T]``, law (D.1). ``T = 0`` is
lossless (the gate opens only where ``p = q``, where ``q = p``; acceptance is then 0 unless ``p = q``).

``kl_judge:tau,confident=0.9,div=kl_pq,reject=sd,on=processed`` — the training-free KL judge of Sun,
Li, et al., *Revisiting Judge Decoding from First Principles via Training-Free Distributional
Divergence* (arXiv 2601.04766). **Only the abstract and a third-party summary of the paper were
reachable** (themoonlight.io review): the method thresholds the token-level (per position) KL divergence
between the draft and target distributions, and a "confidence mask" applies standard speculative
sampling where the target's top-1 probability exceeds 0.9, KL-based relaxation elsewhere. The
direction of the KL, the strictness of the comparisons, what happens when the KL test fails, and
whether the statistics use raw or processed distributions are not confirmed; they are parameters:

* ``confident`` ``c ∈ [0, 1]``: the position is confident iff ``max p > c`` (strict, "exceeds");
  ``c = 1`` disables the mask, ``c = 0`` makes every position confident (plain lossless SD).
* gate open iff not confident and ``D(p, q) < τ`` (strict, "below τ"); ``div`` ``kl_pq`` (default,
  our choice: the target's view, as the judge guards the target's quality) or ``kl_qp``.
* ``reject=sd`` (default; "relaxation" of SD: accept iff the KL test or standard SD accepts):
  closed gate -> ``h = min(1, p/q)``, ``r = norm((p − q)_+)``; ``reject=p`` (judge-style: the target's
  own token replaces the draft, as Judge Decoding / AutoJudge do): closed, non-confident ->
  ``h = 0``, ``r = p``; confident -> standard SD either way.
* Law (D.1) in every case; ``β = 1`` (open), ``1 − d(p, q)`` (closed and SD), ``0`` (closed, ``reject=p``).
  Lossless iff ``τ = 0`` (never open) or ``c = 0`` (always SD).

``on=processed|raw`` (both rules): where the gate's statistics (divergence, ``max p``) are read.
``processed`` (default): the ``p``, ``q`` the rule verifies with — the plain :class:`PerTokenRule` API.
``raw``: the temperature-1, untruncated distributions (``softmax`` of the raw logits), as the FSD
reference code does by default (``new_logits_unprocessed``, ``candidate_logits_unprocessed``); the
rule then has ``needs_raw = True`` and ``verify``, ``induced``, ``acceptance_rate`` (and the mechanism
methods) require the keyword ``raw=(p_raw, q_raw)`` shaped like ``p`` and ``q`` (``[B, G+1, V]`` and
``[B, G, V]`` in ``verify``); ``h``'s fallback, the residual and the law use the processed ``p``, ``q``.
At temperature 0 the processed pair is one-hot, so on ``processed`` a gate below the divergence of
two distinct point masses is exact-match verification, and the KL judge's mask (``max p = 1``) always
selects SD; ``raw`` keeps the relaxation meaningful there.

Deliberate differences from the FSD source. (1) ``js`` is the Jensen–Shannon divergence, as the README
calls ``js_div`` ("JS divergence", the default); the code's ``js_div`` computes ``js_rev`` (argument
order of ``F.kl_div``). The two agree to second order for close distributions (both
``≈ ⅛ Σ (p − q)²/m``) but differ far apart (``js_rev`` is unbounded): to reproduce the paper's
thresholds use ``div=js_rev,on=raw``. (2) The code drafts greedily (its
``FuzzyAssistedCandidateGenerator`` sets the assistant's ``do_sample=False``, as HF 4.44's
``AssistedCandidateGenerator`` does), so an accepted token there is ``argmax q``; here the engine's
drafts (``x ~ q``) are accepted, hence the law ``q`` on open rows. (3) The code's ``*_processed``
divergences smooth both distributions with ``ε = 1e-10`` before the divergence (making KL finite);
``on=processed`` uses exact divergences (``KL = inf`` never passes a finite threshold). (4) The
``top_k_*`` / ``top_p_*`` divergences of the code are not provided.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from verispec.params import Param, in_range, one_of
from verispec.rules.base import (
    InducedForm,
    PerTokenRule,
    as_float,
    check_distribution,
    check_pair,
    check_verify_inputs,
    normalize_or,
    positive_part,
    ratio,
    run_chain,
    total_variation,
)

LN2 = math.log(2.0)


# -- divergences ------------------------------------------------------------------------------------

def _relative_entropy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``Σ a·log(a/b)`` over the last dimension: ``0·log(0/b) = 0``, ``inf`` where ``a > 0 = b``."""
    pos = a > 0
    both = pos & (b > 0)
    safe_a = torch.where(pos, a, torch.ones_like(a))
    safe_b = torch.where(both, b, torch.ones_like(b))
    terms = torch.where(both, a * (safe_a.log() - safe_b.log()), torch.zeros_like(a))
    total = terms.sum(-1)
    return torch.where((pos & ~both).any(-1), torch.full_like(total, math.inf), total)


def _exact_zero(d: torch.Tensor, a: torch.Tensor, b: torch.Tensor, upper: float = math.inf) -> torch.Tensor:
    """``d`` with identical rows set to exactly 0 and differing rows kept in ``[tiny, upper]``: every
    divergence here vanishes iff ``a = b``, so rounding must not turn a positive one into 0 (or below)."""
    same = (a == b).all(-1)
    tiny = torch.finfo(d.dtype).tiny
    return torch.where(same, torch.zeros_like(d), d.clamp(min=tiny, max=upper))


def kl_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``KL(a‖b) = Σ a log(a/b)`` in nats, ``[..., V] -> [...]``; ``inf`` where ``a > 0`` on ``b = 0``."""
    a, b = as_float(a), as_float(b)
    return _exact_zero(_relative_entropy(a, b), a, b)


def js_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence ``½KL(a‖m) + ½KL(b‖m)``, ``m = (a + b)/2``, nats, in ``[0, ln 2]``
    (``scipy.spatial.distance.jensenshannon(a, b)**2``). ``[..., V] -> [...]``."""
    a, b = as_float(a), as_float(b)
    m = 0.5 * (a + b)
    return _exact_zero(0.5 * (_relative_entropy(a, m) + _relative_entropy(b, m)), a, b, upper=LN2)


def js_reversed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``½KL(m‖a) + ½KL(m‖b)``, ``m = (a + b)/2``: what the FSD reference code computes as ``js_div``.
    Unbounded; ``inf`` unless ``a`` and ``b`` have the same support. ``[..., V] -> [...]``."""
    a, b = as_float(a), as_float(b)
    m = 0.5 * (a + b)
    return _exact_zero(0.5 * (_relative_entropy(m, a) + _relative_entropy(m, b)), a, b)


def tv_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Total variation ``½ Σ |a − b|`` in ``[0, 1]``. ``[..., V] -> [...]``."""
    a, b = as_float(a), as_float(b)
    return _exact_zero(0.5 * (a - b).abs().sum(-1), a, b, upper=1.0)


#: ``div`` option -> ``D(p, q)`` (``p`` the target, ``q`` the draft).
DIVERGENCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "js": js_divergence,
    "kl_qp": lambda p, q: kl_divergence(q, p),
    "kl_pq": kl_divergence,
    "tv": tv_distance,
    "js_rev": js_reversed,
}


def divergence(p: torch.Tensor, q: torch.Tensor, kind: str) -> torch.Tensor:
    """``D(p, q)`` of the ``div`` option ``kind`` (:data:`DIVERGENCES`), ``[..., V] -> [...]``."""
    if kind not in DIVERGENCES:
        raise ValueError(f"unknown divergence {kind!r}; valid: {', '.join(DIVERGENCES)}")
    return DIVERGENCES[kind](p, q)


# -- parameters -------------------------------------------------------------------------------------

FSD_T = Param("T", float, lambda v: v >= 0,
              "a number >= 0 (divergence threshold in nats; js <= ln 2 ≈ 0.693, tv <= 1, KL unbounded)",
              "accept any draft where D(p, q) <= T")
FSD_DIV = Param("div", str, one_of(*DIVERGENCES), "one of " + ", ".join(DIVERGENCES),
                "divergence D(p, q): js, kl_qp = KL(q‖p), kl_pq = KL(p‖q), tv, js_rev = the FSD code's js_div",
                "js")
ON = Param("on", str, one_of("processed", "raw"), "one of processed, raw",
           "distributions the gate reads: the processed p, q or the raw (temperature 1, untruncated) ones",
           "processed")
TAU = Param("tau", float, lambda v: v >= 0, "a number >= 0 (KL threshold in nats)", "accept any draft where KL < τ")
CONFIDENT = Param("confident", float, in_range(0, 1), "a number with 0 <= confident <= 1",
                  "standard SD where max p > confident (1: never, 0: always)", 0.9)
KL_DIV = Param("div", str, one_of("kl_pq", "kl_qp"), "one of kl_pq, kl_qp",
               "KL direction: kl_pq = KL(p‖q) (target‖draft), kl_qp = KL(q‖p)", "kl_pq")
REJECT = Param("reject", str, one_of("sd", "p"), "one of sd, p",
               "when the KL test fails: standard SD (sd) or reject and sample p (p)", "sd")


# -- the shared mechanism ---------------------------------------------------------------------------

class DivergenceGated(PerTokenRule):
    """A per-token rule whose acceptance is a row-level gate (module docstring).

    Subclasses implement :meth:`gate_stats` ``(pd, qd) -> (open, sd)``, bool ``[...]`` each, from the
    distributions the gate reads (``pd, qd`` = processed or raw): ``open`` — accept any drafted token;
    ``sd`` — where not open, fall back to lossless SD (``min(1, p/q)``, residual ``norm((p − q)_+)``)
    instead of rejecting and sampling ``p``.

    Every method that evaluates ``h`` takes the keyword ``raw=(p_raw, q_raw)``: required when
    ``needs_raw`` (``on=raw``), refused otherwise.
    """

    taxonomy = "deferral"
    pointwise_acceptance = False
    #: ``True`` on ``on=raw``: the caller must pass the raw distributions (``raw=`` keyword).
    needs_raw: bool = False

    def _set_on(self, on: str) -> str:
        on = ON.check(self.name, on)
        self.on = on
        self.needs_raw = on == "raw"
        return on

    def gate_stats(self, pd: torch.Tensor, qd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    # -- the gate, from processed or raw rows ------------------------------------------------------
    def _gate_inputs(self, p: torch.Tensor, q: torch.Tensor, raw) -> tuple[torch.Tensor, torch.Tensor]:
        """The pair the gate reads: ``raw`` (validated, shaped like ``p`` and ``q``) or ``(p, q)``."""
        if not self.needs_raw:
            if raw is not None:
                raise ValueError(f"{self.name}: raw distributions were given but the rule has on=processed "
                                 f"(its gate reads p and q); build it with on=raw to use them ({self.spec()})")
            return p, q
        if raw is None:
            raise ValueError(f"{self.name}: on=raw needs the raw (temperature 1, untruncated) distributions: pass "
                             "raw=(p_raw, q_raw) shaped like p and q")
        _check_pair_type(self.name, raw)
        p_raw, q_raw = (as_float(t) for t in raw)
        for name, t, like in (("p_raw", p_raw, p), ("q_raw", q_raw, q)):
            if t.shape != like.shape:
                raise ValueError(f"{self.name}: {name} must have the shape of {name[0]}, "
                                 f"{tuple(like.shape)}, got {tuple(t.shape)}")
            check_distribution(t, f"raw {name}")
        return p_raw, q_raw

    def gate(self, p: torch.Tensor, q: torch.Tensor, *, raw=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(open, sd)``, bool ``[...]``, at positions ``p, q: [..., V]`` (``raw`` as the module says)."""
        return self.gate_stats(*self._gate_inputs(p, q, raw))

    @staticmethod
    def _h(px: torch.Tensor, qx: torch.Tensor, open_: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
        """``h [..., K]`` of tokens with probabilities ``px, qx [..., K]`` under the gate ``[...]``."""
        sd_h = torch.clamp(ratio(px, qx), max=1.0)
        h = torch.where(sd.unsqueeze(-1), sd_h, torch.zeros_like(sd_h))
        h = torch.where(open_.unsqueeze(-1), torch.ones_like(h), h)
        return torch.where(qx > 0, h, torch.zeros_like(h))         # a token the draft cannot propose

    @staticmethod
    def _residual(p: torch.Tensor, q: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
        lossless = normalize_or(positive_part(p - q), p)
        return torch.where(sd.unsqueeze(-1), lossless, p)

    # -- PerTokenRule API (with the raw keyword) ---------------------------------------------------
    def accept_prob(self, p, q, px, qx):
        open_, sd = self.gate(p, q)
        return self._h(px, qx, open_, sd)

    def accept_prob_at(self, p, q, x, raw=None):
        idx = x.unsqueeze(-1)
        open_, sd = self.gate(p, q, raw=raw)
        return self._h(p.gather(-1, idx), q.gather(-1, idx), open_, sd)[..., 0]

    def accept_prob_all(self, p, q, raw=None):
        open_, sd = self.gate(p, q, raw=raw)
        return self._h(p, q, open_, sd)

    def residual(self, p, q, raw=None):
        return self._residual(p, q, self.gate(p, q, raw=raw)[1])

    def yield_and_acceptance(self, p, q, raw=None):
        y = q * self.accept_prob_all(p, q, raw=raw)
        return y, y.sum(-1)

    def induced_mechanism(self, p, q, *, raw=None):
        """``P_R = y + (1 − β)·r`` from the rule's own ``(h, r)``."""
        p, q = check_pair(p, q)
        y, beta = self.yield_and_acceptance(p, q, raw=raw)
        return y + (1 - beta).clamp_min(0).unsqueeze(-1) * self.residual(p, q, raw=raw)

    def closed_form(self, p, q, raw=None):
        """(D.1): ``q`` where the gate is open, ``p`` elsewhere."""
        open_, _ = self.gate(p, q, raw=raw)
        return torch.where(open_.unsqueeze(-1), q, p)

    def closed_form_acceptance(self, p, q, raw=None):
        """``1`` (open), ``1 − d(p, q)`` (closed, SD fallback), ``0`` (closed, reject -> p)."""
        open_, sd = self.gate(p, q, raw=raw)
        one = torch.ones_like(open_, dtype=p.dtype)
        return torch.where(open_, one, torch.where(sd, 1 - total_variation(p, q), torch.zeros_like(one)))

    def induced(self, p, q, *, raw=None):
        """Exact per-position emitted law ``[..., V]``, (D.1)."""
        p, q = check_pair(p, q)
        return self.closed_form(p, q, raw=raw)

    def acceptance_rate(self, p, q, *, raw=None):
        p, q = check_pair(p, q)
        return self.closed_form_acceptance(p, q, raw=raw)

    def induced_form(self):
        return InducedForm("target") if self.is_lossless else InducedForm("other")

    # -- the chain verifier ------------------------------------------------------------------------
    def _drafted_raw(self, raw, p: torch.Tensor, gamma: int):
        """``raw`` of a ``verify`` call cut to the G drafted positions (``p_raw [B, G+1, V] -> [B, G, V]``);
        anything but a well-shaped pair on an ``on=raw`` rule is passed on for :meth:`gate` to refuse."""
        if not self.needs_raw or raw is None:
            return raw
        _check_pair_type(self.name, raw)
        if raw[0].shape != p.shape:
            raise ValueError(f"{self.name}: p_raw must be [B, G+1, V] = {list(p.shape)} like p, "
                             f"got {list(raw[0].shape)}")
        return raw[0][:, :gamma], raw[1]

    def verify(self, p, q, draft, generator=None, *, raw=None):
        """Chain verification. ``p: [B, G+1, V]``, ``q: [B, G, V]``, ``draft: [B, G]``, and on ``on=raw``
        ``raw=(p_raw [B, G+1, V], q_raw [B, G, V])`` -> ``(n_accepted: [B] int64 in [0, G], next_token: [B])``."""
        p, q, draft = check_verify_inputs(p, q, draft)
        gamma = draft.shape[1]
        open_, sd = self.gate(p[:, :gamma], q, raw=self._drafted_raw(raw, p, gamma))         # [B, G] each
        idx = draft.unsqueeze(-1)
        h = self._h(p[:, :gamma].gather(-1, idx), q.gather(-1, idx), open_, sd)[..., 0]   # [B, G]
        return run_chain(h, lambda rows, at: self._residual(p[rows, at], q[rows, at], sd[rows, at]),
                         self.bonus(p[:, gamma]), generator)


def _check_pair_type(owner: str, raw: object) -> None:
    if not (isinstance(raw, (tuple, list)) and len(raw) == 2 and all(isinstance(t, torch.Tensor) for t in raw)):
        raise TypeError(f"{owner}: raw must be a pair of tensors (p_raw, q_raw), got {type(raw).__name__}")


# -- the rules --------------------------------------------------------------------------------------

class Fuzzy(DivergenceGated):
    """Fuzzy Speculative Decoding: accept any drafted token where ``D(p, q) <= T``, else sample ``p``."""

    name = "fuzzy"
    family = "fuzzy"
    PARAMS = (FSD_T, FSD_DIV, ON)

    def __init__(self, T: float, div: str = "js", on: str = "processed") -> None:   # T: the paper's name
        T = FSD_T.check(self.name, T)
        div = FSD_DIV.check(self.name, div)
        on = self._set_on(on)
        super().__init__(T=T, div=div, on=on)
        self.T, self.div = T, div

    @property
    def is_lossless(self) -> bool:  # type: ignore[override]
        # T = 0 opens the gate only where the gate's pair is equal; on the processed pair that is p = q.
        return self.T == 0.0 and self.on == "processed"

    def describe(self) -> str:
        return (f"fuzzy SD T={self.T:g} ({self.div} on {self.on} p, q): accept any draft where D(p, q) <= T, "
                "else sample p; law q or p per position")

    def gate_stats(self, pd, qd):
        open_ = divergence(pd, qd, self.div) <= self.T
        return open_, torch.zeros_like(open_)


class KLJudge(DivergenceGated):
    """Training-free KL judge: accept any drafted token where ``KL < τ`` unless the target is confident
    (``max p > confident``: lossless SD); a failed KL test falls back to SD or to sampling ``p``."""

    name = "kl_judge"
    family = "kl_judge"
    PARAMS = (TAU, CONFIDENT, KL_DIV, REJECT, ON)

    def __init__(self, tau: float, confident: float = 0.9, div: str = "kl_pq", reject: str = "sd",
                 on: str = "processed") -> None:
        tau = TAU.check(self.name, tau)
        confident = CONFIDENT.check(self.name, confident)
        div = KL_DIV.check(self.name, div)
        reject = REJECT.check(self.name, reject)
        on = self._set_on(on)
        super().__init__(tau=tau, confident=confident, div=div, reject=reject, on=on)
        self.tau, self.confident, self.div, self.reject = tau, confident, div, reject

    @property
    def is_lossless(self) -> bool:  # type: ignore[override]
        # τ = 0: KL < 0 never holds; confident = 0: max p > 0 always holds (plain SD). Either way law p.
        return self.tau == 0.0 or self.confident == 0.0

    def describe(self) -> str:
        direction = "KL(p‖q)" if self.div == "kl_pq" else "KL(q‖p)"
        fallback = "standard SD" if self.reject == "sd" else "sample p"
        return (f"KL judge τ={self.tau:g}: accept any draft where {direction} < τ on {self.on} p, q unless "
                f"max p > {self.confident:g} (then standard SD); otherwise {fallback}")

    def gate_stats(self, pd, qd):
        confident = pd.amax(-1) > self.confident
        open_ = ~confident & (divergence(pd, qd, self.div) < self.tau)
        sd = confident | torch.full_like(confident, self.reject == "sd")
        return open_, sd
