"""The published variants of hierarchical speculative decoding (HSD) that differ from ``hsd``.

``hsd`` (:mod:`verispec.rules.hsd`) is a lossless transcription: running-max cap ``M_k`` on the
branch masses and the same cap ``M_{G−1}`` on the final joint ratio. None of the published code
paths caps the final ratio, and several cap the branches differently. Each published chain variant
with a law of its own is a rule here, one registry name each. All are sequence-level
(``per_token = False``) and, as the exact block law of :mod:`verispec.rules.block_law` shows on toy
models, all are **lossy**.

Sources (HSD: Zhou et al., arXiv 2601.05724; the repositories read at the commits named):

* [HSD] ``github.com/ZhouYuxuanYX/Hierarchical-Speculative-Decoding`` @ ``f3adf7f`` (2025-10-15),
  ``transformers/generation/utils.py``, ``_speculative_sampling`` (from line 5273), ``backward``
  branch, first draft (``b == 0``): running max as a loop at lines 5395–5441, walk 5447–5516, final
  ratio ``probability_ratio`` at line 5519 — the code behind the README's ``--backward --clever``
  run. ``3b1ae00`` (2026-01-15) and the newest ``b8575e2`` (2026-04-14) replace the loop by
  ``torch.cummax`` (same law) in tab-indented lines that make the file fail to parse (``TabError``).
* [FH] ``github.com/ZhouYuxuanYX/Fast-HSD`` @ ``00ffcd7`` (2025-09-11) (= ``d409d62`` for this
  function), ``transformers/generation/utils.py``, ``_speculative_sampling``, ``backward`` branch,
  lines 5204–5540 (the first pass, ``hist_length = 0``); also ``clever_version/…`` @ ``739746e``.
* [FA] Fast-HSD @ ``00ffcd7``, ``chain-of-thought-hub/gsm8k/algorithm.py``, ``_speculative_sampling``
  (lines 1–172) — identical to HSD's first ``algorithm.py`` @ ``be6289a`` (2025-05-16).
* [FS] Fast-HSD @ ``e0f15ba`` (2025-09-07), ``simulation/algorithm.py``: ``clever_old`` (lines 8–162),
  ``clever`` (164–292), ``FastHSD`` (407–476, with ``lenience``) and ``FastHSD_new`` (478–560).

Common mechanism (the notation of :mod:`verispec.rules.hsd`; ``P_k = Π_{i<=k} p_i(x_i)``,
``Q_k = Π_{i<=k} q_i(x_i)``, branch ``k`` = prefix ``x_{1:k}`` then a token at position ``k+1``)::

    A_k(v) = C_k·p_{k+1}(v),   B_k(v) = Q_k·q_{k+1}(v)                k = 0..G−1
    D⁺_k = Σ(A_k − B_k)_+,  D⁻_k = Σ(B_k − A_k)_+,  Z_k = max(D⁺_k, D⁻_k)
    ρ_k = (A_k − B_k)_+ / Z_k,   s_k = 1 − D⁺_k/Z_k   (Z_k = 0: ρ_k = 0, s_k = 1, the sources' nan_to_num)
    accept all G with prob a_G -> bonus ~ p_{G+1}
    else walk k = G−1 .. 0: step back with prob s_k, otherwise emit x_{1:k}, z ~ norm(ρ_k), stop

with, per variant:

=====================  ========================  ============================  ==========================
name                   branch mass ``C_k``       whole block, ``a_G``          source
=====================  ========================  ============================  ==========================
``hsd`` (lossless)     ``P_k/M_k`` (running max) ``min(1, P_G/(M_{G−1}Q_G))``  verispec's fix
``hsd_uncapped_final`` ``P_k/M_k`` (running max) ``min(1, P_G/Q_G)``           [HSD]
``hsd_mincap``         ``min(P_k, ℓ^k Q_k)``     ``min(1, P_G/(ℓ^G Q_G))``     [FH]; [FA]; [FS] clever_old
``hsd_nocap``          ``P_k``                   ``min(1, P_G/(ℓ^G Q_G))``     [FH], [FA] approxi; [FS]
=====================  ========================  ============================  ==========================

([FH] with ``--clever``, adding ``--approxi`` for ``hsd_nocap``; [FA] with ``clever``; [FS] ``clever``
and ``FastHSD`` are ``hsd_nocap`` — ``clever``'s active branch is ``if True: if True:`` "do not cap
the previous ratio".)

(``M_k = max(1, max_{j<=k} P_j/Q_j)``.) In [FH] the draft's joint mass carries the lenience
``ℓ`` (``q_i * lenience``, so ``Q_k -> ℓ^k Q_k`` in the cap, in ``B_k`` and in the final ratio;
``ℓ = 1`` by default): parameter ``ell`` of ``hsd_mincap`` and ``hsd_nocap``.

[FA] and [FS] add a "forced stop" (``if clever: step_back_probs[(p_i/q_i).cumprod(1) >= 1] = 0``:
``s_k = 0`` wherever ``P_{k+1} >= Q_{k+1}``) and accept the draft token, without resampling, at a
stop whose ``ρ_k`` has no mass (``n_matches += 1``). Neither changes the law. For ``k = G−1``,
``P_G >= Q_G`` already gives ``a_G = 1``; a walk reaches a lower ``k`` only by stepping back at
``k+1``, and with ``P_{k+1} >= Q_{k+1}`` both caps give ``C_{k+1} >= Q_{k+1}``, hence
``s_{k+1} = 0`` unless ``p_{k+2} = q_{k+2}``, which carries ``P_{k+2} >= Q_{k+2}`` up the block
until ``a_G = 1`` and no walk happens. So [FA]/[FS] are ``hsd_mincap``/``hsd_nocap`` (``ell = 1``);
``hierarchical_outcome_law(…, forced_stop=True)`` keeps the mechanism and the tests check the
equality, one-hot and tied rows included.

Why they are lossy: with the running max, ``C_k/Q_k`` is block verification's weight ``w_k``, and
block verification accepts the whole block with ``w_G = min(1, P_G/(M_{G−1} Q_G))``; the uncapped
``P_G/Q_G`` accepts it too often whenever a prefix had ``P_j > Q_j`` (``hsd_uncapped_final``).
``min(P_k, Q_k)`` and no cap also give the branches the wrong masses. ``hsd_mincap`` and
``hsd_nocap`` stop at the same place with the same probabilities (both give ``s_k = 0`` where
``P_k >= Q_k``) and differ only in the token resampled there; at ``G = 2``, ``hsd_mincap`` and
``hsd_uncapped_final`` coincide. The size of the distortion on toy models is in
``benchmarks/sequence_rules.py``.

Taxonomy: **other** — meant as lossless block verification, they are lossy relaxations of it that
fit none of the per-token families (acceptance depends on the whole block).

Published variants not made rules: the recursive forward resampling of ``--backward`` without
``--clever`` ([FH] ``hist_lengths`` loop, several verify calls per step; first pass = ``hsd_nocap``);
multi-draft (``multidraft > 1``); [FS] ``FastHSD_new`` (``hsd_nocap`` that also drops the bonus
token after a fully accepted block: ``n_matches -= 1`` without an EOS check); the EAGLE-3 tree path
([HSD] ``EAGLE-3H/eagle/model/utils.py``, ``evaluate_posterior``: one-hot ``q``, ``min`` cap, forced
stop on ``P_k >= Q_k``); and the top-level
``algorithm.py`` @ ``436676d`` (2025-09-28), a listing that cannot run (``hist_length``, ``t``,
``ind`` undefined) whose running-max loop assigns ``P_k/M_k`` only where the maximum grows (``1``
elsewhere), an indentation slip relative to [HSD].

Deliberate differences from the sources, all in cases the sources crash on or never reach:
``Z_k = 0`` gives ``s_k = 1`` everywhere ([HSD] has no ``nan_to_num`` on this path: NaN); a walk
that steps back past ``k = 0`` (it needs ``p_1 = q_1``, among other ties) emits ``z ~ p_1`` with
nothing accepted ([HSD]: resampling from NaN; [FH]/[FA]/[FS]: stop at ``G − 1``), as ``hsd`` does;
a zero ``ρ_k`` at a stop (impossible in exact arithmetic) falls back to ``p_{k+1}``; ``u < a_G``
(the sources: ``r <= ratio``, the same law). Batch rows are independent (the sources assume one
row).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from verispec.params import Param, in_range
from verispec.rules.base import Rule, check_verify_inputs, normalize_or, positive_part, sample_categorical, uniform
from verispec.rules.block import log_ratios

#: Cap kinds: the scale of the joint target mass ``P_k`` in branch ``k``.
RUNNING_MAX, MIN_CAP, NO_CAP = "running_max", "min", "none"

ELL = Param("ell", float, in_range(0, 1, lo_open=True), "a number with 0 < ell <= 1",
            "lenience ℓ on the draft's joint mass (Fast-HSD's q_i * lenience; 1 = none)", 1.0)


def sequence_level_error(name: str, lossless: bool) -> NotImplementedError:
    """The error ``induced`` / ``acceptance_rate`` raise for a rule without a per-position law."""
    law = ("its emitted sequence law is exactly the target p (use reference(p))" if lossless else
           "its exact block law on small models is verispec.rules.block_law.outcome_law / joint_law; "
           "on real models measure it with `verispec bench`")
    return NotImplementedError(
        f"{name} is a sequence-level rule: whether a draft token is accepted depends on other positions of "
        f"the block, so it has no per-position induced distribution or acceptance rate; {law}")


def hierarchical_walk(
    p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, *, cap: str, final_capped: bool,
    forced_stop: bool, log_ell: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The quantities of one HSD-style block, ``p: [B, G+1, V]``, ``q: [B, G, V]``, ``draft: [B, G]``.

    Returns ``(accept_all [B], step_back [B, G], corr [B, G, V], zero_corr [B, G])``: the probability
    of accepting the whole block, ``s_k``, the normalised correction ``norm(ρ_k)`` (fallback
    ``p_{k+1}``) and where ``ρ_k`` has no mass. Masses are taken relative to ``max(Q_k, C_k)`` in log
    space, so no ratio overflows (``C_k/Q_k`` can be huge without a cap).
    """
    batch, gamma = draft.shape
    zero = torch.zeros(batch, 1, dtype=p.dtype, device=p.device)
    # log P_k/(ℓ^k Q_k), k = 0..G (ℓ only in the Fast-HSD lenience; log_ell = 0 otherwise)
    steps = torch.arange(gamma + 1, dtype=p.dtype, device=p.device)
    log_pq = torch.cat([zero, log_ratios(p, q, draft).cumsum(-1)], dim=-1) - steps * log_ell
    log_m = log_pq.cummax(-1).values.clamp_min(0)                                   # log M_k
    if cap == RUNNING_MAX:
        log_c = log_pq - log_m
    elif cap == MIN_CAP:
        log_c = log_pq.clamp_max(0)
    elif cap == NO_CAP:
        log_c = log_pq
    else:
        raise ValueError(f"unknown cap {cap!r}; valid: {RUNNING_MAX}, {MIN_CAP}, {NO_CAP}")
    log_c = log_c[:, :gamma]                                                         # log C_k/Q_k
    a_rel = torch.exp(log_c.clamp_max(0))[..., None] * p[:, :gamma]                  # A_k / max(C_k, Q_k)
    b_rel = torch.exp(-log_c.clamp_min(0))[..., None] * q                            # B_k / max(C_k, Q_k)
    excess = positive_part(a_rel - b_rel)
    d_plus = excess.sum(-1)
    d_minus = positive_part(b_rel - a_rel).sum(-1)
    z = torch.maximum(d_plus, d_minus)
    ok = z > 0
    step_back = torch.where(ok, 1 - d_plus / torch.where(ok, z, torch.ones_like(z)), torch.ones_like(z))
    if forced_stop:
        step_back = torch.where(log_pq[:, 1:] >= 0, torch.zeros_like(step_back), step_back)
    corr = normalize_or(excess, p[:, :gamma])
    zero_corr = ~(d_plus > 0)
    log_final = log_pq[:, gamma] - (log_m[:, gamma - 1] if final_capped else 0.0)
    accept_all = torch.exp(log_final.clamp_max(0))
    return accept_all, step_back, corr, zero_corr


def hierarchical_outcome_law(
    p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, *, cap: str, final_capped: bool,
    forced_stop: bool, log_ell: float = 0.0,
) -> torch.Tensor:
    """Exact law of ``(n_accepted, next_token)`` of the walk, ``[B, G+1, V]`` (see :func:`hierarchical_walk`).

    ``P(all) = a_G``; ``P(stop at k) = (1 − a_G)(1 − s_k)Π_{j>k} s_j``; walking out (``Π s_j``) emits
    ``z ~ p_1`` with ``n = 0``.
    """
    p, q, draft = check_verify_inputs(p, q, draft)
    p, q = p.double(), q.double()
    gamma = draft.shape[1]
    accept_all, step_back, corr, zero_corr = hierarchical_walk(
        p, q, draft, cap=cap, final_capped=final_capped, forced_stop=forced_stop, log_ell=log_ell)
    ones = torch.ones_like(step_back[:, :1])
    above = torch.flip(torch.cumprod(torch.flip(step_back, [-1]), -1), [-1])        # Π_{j>=k} s_j
    above_strict = torch.cat([above[:, 1:], ones], dim=-1)                           # Π_{j>k} s_j
    reject = (1 - accept_all)[:, None]
    stop = reject * (1 - step_back) * above_strict                                   # [B, G]
    if forced_stop:
        draft_hot = torch.nn.functional.one_hot(draft, p.shape[-1]).to(p.dtype)
        corr = torch.where(zero_corr[..., None], draft_hot, corr)
    law = torch.zeros(p.shape[0], gamma + 1, p.shape[-1], dtype=p.dtype, device=p.device)
    law[:, :gamma] = stop[..., None] * corr
    law[:, 0] += (reject[:, 0] * above[:, 0])[:, None] * p[:, 0]                     # walked out
    law[:, gamma] = accept_all[:, None] * p[:, gamma]
    return law


class HSDVariant(Rule):
    """A published HSD chain variant; subclasses fix the cap and whether the final ratio is capped."""

    per_token = False
    family = "hsd"
    taxonomy = "other"
    cap: ClassVar[str]
    final_capped: ClassVar[bool] = False
    source: ClassVar[str]
    PARAMS: ClassVar[tuple[Param, ...]] = ()

    def _log_ell(self) -> float:
        return math.log(self.params.get("ell", 1.0))

    def describe(self) -> str:
        return f"HSD variant ({self.source}); lossy"

    def verify(self, p, q, draft, generator=None):
        """``p: [B, G+1, V]``, ``q: [B, G, V]``, ``draft: [B, G]`` -> ``(n_accepted [B], next_token [B])``."""
        p, q, draft = check_verify_inputs(p, q, draft)
        batch, gamma = draft.shape
        accept_all, step_back, corr, _ = hierarchical_walk(
            p, q, draft, cap=self.cap, final_capped=self.final_capped, forced_stop=False, log_ell=self._log_ell())
        u = uniform((batch, gamma + 1), generator, dtype=p.dtype, device=p.device)
        all_ok = u[:, gamma] < accept_all
        stops = u[:, :gamma] >= step_back                                             # did not step back
        idx = torch.arange(gamma, device=p.device)
        stop_k = torch.where(stops, idx, torch.full_like(idx, -1)).amax(-1)           # -1: walked out
        walked_out = stop_k < 0
        k = stop_k.clamp_min(0)
        rows = torch.arange(batch, device=p.device)
        dist = torch.where(walked_out[:, None], p[:, 0], corr[rows, k])
        dist = torch.where(all_ok[:, None], p[:, gamma], dist)
        token = sample_categorical(dist, generator)
        n_accepted = torch.where(all_ok, torch.full_like(k, gamma), k)
        return n_accepted, token

    def outcome_law(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """Exact ``P(n_accepted = k, next_token = v)`` per block ``[B, G+1, V]`` (float64)."""
        return hierarchical_outcome_law(p, q, draft, cap=self.cap, final_capped=self.final_capped,
                                        forced_stop=False, log_ell=self._log_ell())

    def induced(self, p, q):
        raise sequence_level_error(self.name, lossless=False)

    def acceptance_rate(self, p, q):
        raise sequence_level_error(self.name, lossless=False)


class HSDUncappedFinal(HSDVariant):
    """HSD's official chain code: running-max cap, final joint ratio ``min(1, P_G/Q_G)`` uncapped."""

    name = "hsd_uncapped_final"
    cap = RUNNING_MAX
    source = "HSD repo: running-max cap, final ratio P_G/Q_G not capped by M_{G-1}"


class HSDMinCap(HSDVariant):
    """Fast-HSD ``--backward --clever`` (and ``algorithm.py`` ``clever``): branch mass ``min(P_k, ℓ^k Q_k)``."""

    name = "hsd_mincap"
    cap = MIN_CAP
    source = "Fast-HSD clever: cap min(P_k, Q_k), final ratio uncapped"
    PARAMS = (ELL,)

    def __init__(self, ell: float = 1.0) -> None:
        super().__init__(ell=ELL.check(self.name, ell))


class HSDNoCap(HSDVariant):
    """Fast-HSD ``--backward --clever --approxi`` ("Fast HSD"; ``simulation`` ``clever``): branch mass ``P_k``."""

    name = "hsd_nocap"
    cap = NO_CAP
    source = "Fast-HSD clever+approxi: no cap on P_k, final ratio uncapped"
    PARAMS = (ELL,)

    def __init__(self, ell: float = 1.0) -> None:
        super().__init__(ell=ELL.check(self.name, ell))


#: Every variant, for the registry and the tests.
VARIANTS: tuple[type[HSDVariant], ...] = (HSDUncappedFinal, HSDMinCap, HSDNoCap)
