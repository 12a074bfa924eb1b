"""The sampling pipeline: Hugging Face style logits warpers, fast on a CPU.

Order and semantics
-------------------
Warpers always run in Hugging Face's order::

    temperature -> top-k -> top-p -> min-p -> η-cutoff -> ε-cutoff

on logits ``[..., V]`` (any number of leading dimensions, each row independent). A removed token gets
the logit ``-inf``; the final probabilities are the softmax of the warped logits, so removed tokens
have probability exactly 0 and every row keeps at least one token (``min_tokens_to_keep = 1``).

* **temperature** ``T > 0``: ``logits / T``. ``T == 0`` is greedy decoding, a first-class case: the
  result is one-hot at the argmax of the raw logits (the first index on ties, like ``torch.argmax``).
  The other warpers are skipped for greedy rows: every one of them keeps the argmax, so they cannot
  change a one-hot result.
* **top-k** ``k > 0``: keep the tokens whose (tempered) logit is ``>=`` the k-th largest one, so ties at
  the boundary are all kept (as ``TopKLogitsWarper``). ``k >= V`` keeps everything.
* **top-p** ``0 < p < 1``: a token ``x`` is kept iff the probability mass of the tokens strictly more
  probable than ``x`` is ``< p``. Equivalently: walk the tokens by decreasing probability, keep a token
  while the mass ranked strictly above it is ``< p``, then also keep every token whose probability
  equals the smallest kept one. The most probable token is always kept. ``p == 1`` is a no-op.
* **min-p**, **η-cutoff** (threshold ``min(ε, δ·exp(−H(p)))``, ``δ = √ε`` by default) and
  **ε-cutoff**: the keep-masks :func:`verispec.sets.min_p_mask`, :func:`verispec.sets.eta_mask` and
  :func:`verispec.sets.epsilon_mask`, evaluated on the softmax of the current (already masked) logits,
  so that the warpers and the truncation verification rules share one definition.

Post-truncation pass
--------------------
The fields ``post_prob_gap``, ``post_top_k``, ``post_top_p``, ``post_min_p``, ``post_eta`` (with
``post_eta_delta``) and ``post_epsilon`` — all off by default, and then absent from :meth:`~SamplingConfig.spec`,
so existing configs keep their text and run ids — truncate the *processed* probabilities once more,
after the whole pipeline: ``p ← p_A``, the renormalised restriction of ``p`` to
:func:`verispec.sets.truncation_mask` (steps in the order prob-gap -> top-k -> top-p -> min-p -> η -> ε,
each on the renormalised survivors of the previous ones). It exists to sample the true baseline of a
truncation verification rule, whose allowed set is computed on the processed ``p``: ``top_k=5`` in the
pipeline proper runs before top-p / min-p and on the tempered logits, and is not the same as the 5 most
probable tokens of the processed ``p`` (``post_top_k=5``); ``prob_gap`` (keep ``p >= max p − gap``, the
condition of TensorRT-LLM's relaxed acceptance) has no warper. Greedy rows are one-hot and pass
unchanged. :meth:`~SamplingConfig.with_truncation` chooses between the ordinary fields and this pass.

Deliberate differences from Hugging Face (``min_tokens_to_keep = 1``)
---------------------------------------------------------------------
* top-p keeps the whole tie group at the boundary; HF's result there depends on ``torch.sort``'s
  order among equal probabilities. HF's test ``cumsum_ascending <= 1 - p`` is the same set in exact
  arithmetic; our cumulative masses are summed in float64 (HF: float32), so the two can differ only
  when the mass above a token is within rounding error of ``p``.
* η- and ε-cutoff keep only the *first* argmax when the most probable token itself falls below the
  threshold and is tied (the :mod:`verispec.sets` definition); HF keeps every token tied with the max.
* The temperature may be 0 (greedy), which HF refuses (it uses ``do_sample=False`` instead).
* ``eta_delta`` generalises HF's fixed ``δ = √ε``.
* Everything is computed in float32, whatever the input dtype.

Speed
-----
The hot case is a handful of rows (``G + 1`` verification positions) over a ~152k vocabulary on a
small CPU, where a full ``torch.sort`` (tens of ms) or even ``torch.topk`` (~2 ms) over the vocabulary
dominates. :class:`SamplingConfig` therefore runs top-k on a block decomposition of each row
(:mod:`verispec.topk`): one vectorised pass computes the maximum of every block of
:data:`verispec.topk.BLOCK` consecutive logits (that pass
also serves as the NaN/inf check and as the greedy argmax), the best blocks are gathered, and the
exact top-k — ties included — is taken among their entries. The kept tokens are then carried as a
compact ``[rows, K]`` set (values plus vocabulary indices, in vocabulary order) through top-p / min-p
/ η / ε, and scattered back once at the end. When the compact set could miss a token tied with the
k-th largest logit, the pipeline falls back to the plain dense computation. The result equals
applying the warper objects one after the other (softmax sums over a compact row are accumulated in
a different order, so a token whose probability is within float rounding of a threshold could in
principle be decided differently; the tests check exact equality on random and tied logits).

Top-p never sorts a whole row unless it must: it takes the ``k`` most probable tokens (``k = 64``
first, then at least ×4, guided by a lower bound on how many more tokens the nucleus needs) until
the boundary of every row falls inside the window, and sorts fully only when the nucleus is over a
quarter of the row. Input validation uses the row maxima (NaN propagates through ``amax``, ``+inf``
and all-``-inf`` rows show up there), and runs :func:`verispec.checks.check_finite_logits` only
when they are not all finite, so its error messages are the ones raised.

Timings (6 × 151,936 float32 logits, one thread of a loaded 2-core CPU, median of 50 calls):
``temperature=0.7,top_k=20,top_p=0.8,min_p=0.1`` ≈ 1.3–2 ms; greedy ≈ 0.5 ms. Without top-k, on
flat rows, top-p / min-p / η / ε work on the dense rows (several ms to tens of ms).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import NamedTuple

import torch

from . import topk
from .checks import check_finite_logits
from .params import Param, in_range, parse_settings
from .sets import TOP_P_WINDOW as _TOP_P_WINDOW  # noqa: F401  (read by the tests)
from .sets import TRUNCATION_OFF, TRUNCATION_STEPS, epsilon_mask, eta_mask, min_p_mask, truncation_mask
from .sets import top_p_threshold as _top_p_threshold

__all__ = [
    "SamplingConfig",
    "Temperature",
    "TopK",
    "TopP",
    "MinP",
    "EtaCutoff",
    "EpsilonCutoff",
]

_NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------------
# parameter and input validation


def _nonneg(v) -> bool:
    return v >= 0


def _positive(v) -> bool:
    return v > 0


#: The fields of :class:`SamplingConfig` (0 / 1 / None switch a warper off), parsed and validated by
#: the grammar of :mod:`verispec.params`, shared with rule specs.
CONFIG_PARAMS = (
    Param("temperature", float, _nonneg, "a finite number >= 0 (0 = greedy, 1 = off)", default=1.0,
          aliases=("t", "temp")),
    Param("top_k", int, _nonneg, "an integer >= 0 (0 = off)", default=0, aliases=("topk", "k")),
    Param("top_p", float, in_range(0, 1, lo_open=True), "a finite number in (0, 1] (1 = off)", default=1.0,
          aliases=("topp", "p")),
    Param("min_p", float, in_range(0, 1), "a finite number in [0, 1] (0 = off)", default=0.0, aliases=("minp",)),
    Param("eta", float, in_range(0, 1, hi_open=True), "a finite number in [0, 1) (0 = off)", default=0.0,
          aliases=("eta_cutoff",)),
    Param("eta_delta", float, _positive, "a finite number > 0 or None (= sqrt(eta))", default=None, aliases=("delta",),
          nullable=True),
    Param("epsilon", float, in_range(0, 1, hi_open=True), "a finite number in [0, 1) (0 = off)", default=0.0,
          aliases=("eps", "epsilon_cutoff")),
    # the post-truncation pass (see the module docstring), in its order of application
    Param("post_prob_gap", float, in_range(0, 1), "a finite number in [0, 1] (1 = off)", default=1.0),
    Param("post_top_k", int, _nonneg, "an integer >= 0 (0 = off)", default=0),
    Param("post_top_p", float, in_range(0, 1, lo_open=True), "a finite number in (0, 1] (1 = off)", default=1.0),
    Param("post_min_p", float, in_range(0, 1), "a finite number in [0, 1] (0 = off)", default=0.0),
    Param("post_eta", float, in_range(0, 1, hi_open=True), "a finite number in [0, 1) (0 = off)", default=0.0),
    Param("post_eta_delta", float, _positive, "a finite number > 0 or None (= sqrt(post_eta))", default=None,
          nullable=True),
    Param("post_epsilon", float, in_range(0, 1, hi_open=True), "a finite number in [0, 1) (0 = off)", default=0.0),
)
_CONFIG = {p.name: p for p in CONFIG_PARAMS}

#: Prefix of the fields of the post-truncation pass.
POST = "post_"
#: The settings of a truncation applied to processed probabilities (:func:`verispec.sets.truncation_mask`);
#: each is the field ``post_<name>`` of :class:`SamplingConfig`, with the same valid values.
TRUNCATION_SETTINGS = ("prob_gap", "top_k", "top_p", "min_p", "eta", "eta_delta", "epsilon")
#: The truncation settings that are also the last warpers of the pipeline proper, in its order: a
#: truncation made of these alone can be written into the ordinary fields when nothing runs after them.
_TAIL_STEPS = ("min_p", "eta", "epsilon")

#: The parameters of the warper objects, each switched on (so the "off" values are refused).
_TEMPERATURE = Param("temperature", float, _nonneg, "a finite number >= 0 (0 = greedy)")
_TOP_K = Param("top_k", int, _positive, "an integer >= 1")
_TOP_P = _CONFIG["top_p"]
_MIN_P = Param("min_p", float, in_range(0, 1, lo_open=True), "a finite number in (0, 1]")
_ETA = Param("eta", float, in_range(0, 1, lo_open=True, hi_open=True), "a finite number in (0, 1)")
_ETA_DELTA = _CONFIG["eta_delta"]
_EPSILON = Param("epsilon", float, in_range(0, 1, lo_open=True, hi_open=True), "a finite number in (0, 1)")


def _prepare(logits: torch.Tensor, name: str = "logits") -> torch.Tensor:
    """Validate ``logits [..., V]`` and return them as float32 (no copy if they already are)."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"{name} must have shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    if not torch.is_floating_point(logits):
        raise ValueError(f"{name} must be a floating-point tensor, got {logits.dtype}")
    return logits if logits.dtype == torch.float32 else logits.float()


def _check_row_max(x: torch.Tensor, row_max: torch.Tensor, name: str = "logits") -> None:
    """Fast equivalent of :func:`check_finite_logits` given the row maxima of ``x``.

    ``amax`` propagates NaN, equals ``+inf`` if any entry is ``+inf`` and ``-inf`` for an all ``-inf``
    row, so the logits are acceptable iff every row maximum is finite. Only on failure is the full
    :func:`check_finite_logits` run, which raises with the project-wide wording.
    """
    if row_max.numel() and not bool(torch.isfinite(row_max).all()):
        check_finite_logits(x, name)
        raise ValueError(f"{name} contain NaN or infinite values")  # pragma: no cover (safety net)


def _remove(x: torch.Tensor, drop: torch.Tensor, inplace: bool) -> torch.Tensor:
    return x.masked_fill_(drop, _NEG_INF) if inplace else x.masked_fill(drop, _NEG_INF)


# --------------------------------------------------------------------------------------------------
# warpers


class _Warper:
    """Base class: ``__call__`` validates and converts, ``_apply`` does the work on float32 rows."""

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [..., V]`` -> warped float32 logits ``[..., V]`` (``-inf`` for removed tokens)."""
        x = _prepare(logits)
        if x.numel():
            _check_row_max(x, x.amax(-1))
        return self._apply(x, inplace=False)

    def _apply(self, x: torch.Tensor, inplace: bool) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(vars(self).items()))))


class Temperature(_Warper):
    """``logits / T`` for ``T > 0``; ``T == 0`` is greedy: 0 at the first argmax, ``-inf`` elsewhere."""

    def __init__(self, temperature: float):
        self.temperature = _TEMPERATURE.check("", temperature)

    def _apply(self, x: torch.Tensor, inplace: bool) -> torch.Tensor:
        if self.temperature == 0.0:
            out = torch.full_like(x, _NEG_INF)
            return out.scatter_(-1, x.argmax(-1, keepdim=True), 0.0)
        if self.temperature == 1.0:
            return x
        return x.div_(self.temperature) if inplace else x / self.temperature

    def describe(self) -> str:
        if self.temperature == 0.0:
            return "temperature=0: greedy, one-hot at the first argmax"
        return f"temperature={self.temperature:g}: divide the logits by {self.temperature:g}"


class TopK(_Warper):
    """Keep the tokens whose logit is ``>=`` the k-th largest (boundary ties kept); ``k >= V``: no-op."""

    def __init__(self, top_k: int):
        self.top_k = _TOP_K.check("", top_k)

    def _apply(self, x: torch.Tensor, inplace: bool) -> torch.Tensor:
        if self.top_k >= x.shape[-1]:
            return x
        kth = torch.topk(x, self.top_k, dim=-1).values[..., -1:]
        return _remove(x, x < kth, inplace)

    def describe(self) -> str:
        return f"top_k={self.top_k}: keep the {self.top_k} largest logits (ties at the boundary kept)"


class TopP(_Warper):
    """Nucleus: keep a token iff the mass of strictly more probable tokens is ``< top_p``.

    ``top_p`` in ``(0, 1]``; 1 is a no-op. Ties with the least probable kept token are kept.
    """

    def __init__(self, top_p: float):
        self.top_p = _TOP_P.check("", top_p)

    def _apply(self, x: torch.Tensor, inplace: bool) -> torch.Tensor:
        if self.top_p >= 1.0:
            return x
        probs = torch.softmax(x, dim=-1)
        threshold = _top_p_threshold(probs, self.top_p)
        return _remove(x, probs < threshold, inplace)

    def describe(self) -> str:
        return f"top_p={self.top_p:g}: keep the most probable tokens up to mass {self.top_p:g} (ties kept)"


class MinP(_Warper):
    """Keep ``{x : p(x) >= min_p · max p}`` (:func:`verispec.sets.min_p_mask`); ``min_p`` in ``(0, 1]``."""

    def __init__(self, min_p: float):
        self.min_p = _MIN_P.check("", min_p)

    def _apply(self, x: torch.Tensor, inplace: bool) -> torch.Tensor:
        keep = min_p_mask(torch.softmax(x, dim=-1), self.min_p)
        return _remove(x, ~keep, inplace)

    def describe(self) -> str:
        return f"min_p={self.min_p:g}: keep tokens with p >= {self.min_p:g} * max p"


class EtaCutoff(_Warper):
    """η-sampling: keep ``{x : p(x) >= min(ε, δ·exp(−H(p)))}`` plus the argmax (:func:`verispec.sets.eta_mask`).

    ``epsilon`` in ``(0, 1)``; ``delta`` > 0 or ``None`` for ``√ε`` (Hewitt et al.; HF's choice).
    """

    def __init__(self, epsilon: float, delta: float | None = None):
        self.epsilon = _ETA.check("", epsilon)
        self.delta = _ETA_DELTA.check("", delta)

    def _apply(self, x: torch.Tensor, inplace: bool) -> torch.Tensor:
        keep = eta_mask(torch.softmax(x, dim=-1), self.epsilon, self.delta)
        return _remove(x, ~keep, inplace)

    def describe(self) -> str:
        d = "sqrt(eps)" if self.delta is None else f"{self.delta:g}"
        return f"eta={self.epsilon:g}: keep tokens with p >= min({self.epsilon:g}, {d}*exp(-H(p))) and the argmax"


class EpsilonCutoff(_Warper):
    """ε-cutoff: keep ``{x : p(x) >= ε}`` plus the argmax (:func:`verispec.sets.epsilon_mask`); ε in ``(0, 1)``."""

    def __init__(self, epsilon: float):
        self.epsilon = _EPSILON.check("", epsilon)

    def _apply(self, x: torch.Tensor, inplace: bool) -> torch.Tensor:
        keep = epsilon_mask(torch.softmax(x, dim=-1), self.epsilon)
        return _remove(x, ~keep, inplace)

    def describe(self) -> str:
        return f"epsilon={self.epsilon:g}: keep tokens with p >= {self.epsilon:g} and the argmax"


# --------------------------------------------------------------------------------------------------
# configuration


def _fmt(value) -> str:
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class _Out(NamedTuple):
    """Pipeline result before materialisation: dense ``vals [R, V]`` (``idx is None``), a compact
    set ``vals [R, K]`` at ``idx [R, K]``, or greedy (``vals is None``, ``idx [R, 1]`` the argmax)."""

    shape: torch.Size
    vals: torch.Tensor | None
    idx: torch.Tensor | None


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters and the warper pipeline they define (see the module docstring).

    Fields and valid values: ``temperature >= 0`` (0 = greedy, 1 = off), ``top_k >= 0`` (0 = off),
    ``top_p`` in ``(0, 1]`` (1 = off), ``min_p`` in ``[0, 1]`` (0 = off), ``eta`` in ``[0, 1)`` (0 = off),
    ``eta_delta > 0`` or ``None`` (= ``√eta``), ``epsilon`` in ``[0, 1)`` (0 = off); the post-truncation
    pass ``post_prob_gap`` in ``[0, 1]`` (1 = off) and ``post_top_k`` … ``post_epsilon`` with the valid
    values of their namesakes, all off by default.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    eta: float = 0.0
    eta_delta: float | None = None
    epsilon: float = 0.0
    post_prob_gap: float = 1.0
    post_top_k: int = 0
    post_top_p: float = 1.0
    post_min_p: float = 0.0
    post_eta: float = 0.0
    post_eta_delta: float | None = None
    post_epsilon: float = 0.0

    def __post_init__(self) -> None:
        for param in CONFIG_PARAMS:
            object.__setattr__(self, param.name, param.check("", getattr(self, param.name)))

    # ---- text form ---------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> "SamplingConfig":
        """Parse ``"temperature=0.7,top_p=0.8,min_p=0.1"`` (the grammar of :mod:`verispec.params`).

        Keys: ``temperature`` (aliases ``t``, ``temp``), ``top_k`` (``k``, ``topk``), ``top_p``
        (``p``, ``topp``), ``min_p`` (``minp``), ``eta`` (``eta_cutoff``), ``eta_delta`` (``delta``;
        value ``none`` allowed), ``epsilon`` (``eps``, ``epsilon_cutoff``), and the post-truncation pass
        ``post_prob_gap``, ``post_top_k``, ``post_top_p``, ``post_min_p``, ``post_eta``,
        ``post_eta_delta``, ``post_epsilon``; ``-`` may replace ``_``.
        The bare word ``greedy`` means ``temperature=0``; ``""`` is the default config.
        """
        if not isinstance(text, str):
            raise TypeError(f"SamplingConfig.parse expects a string, got {type(text).__name__}")
        values = parse_settings(text, CONFIG_PARAMS, owner="sampling", noun="key",
                                words={"greedy": {"temperature": "0"}})
        return cls(**values)

    def spec(self) -> str:
        """Canonical text: non-default fields only, in field order; ``parse(c.spec()) == c``."""
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            if v != f.default:
                parts.append(f"{f.name}={_fmt(v)}")
        return ",".join(parts)

    def __str__(self) -> str:
        return self.spec() or "temperature=1"

    # ---- pipeline ----------------------------------------------------------------------------

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def with_truncation(self, **fields) -> "SamplingConfig":
        """This config followed by a truncation of its processed probabilities (a rule's true baseline).

        ``fields``: the keys of :meth:`verispec.rules.base.Rule.baseline_truncation` — ``min_p``,
        ``eta``, ``eta_delta``, ``epsilon`` and the ``post_*`` fields; ``None`` (or the off value)
        requests nothing, ``eta_delta`` is the δ of the requested η step (``None``: ``√eta``). The
        result samples ``p_A``, ``p`` (this config's law) restricted to the set of
        :func:`verispec.sets.truncation_mask` with these settings and renormalised. Ordinary fields
        are written in place when that is exactly this (the requested steps are off here and no
        active min-p / η / ε / post step of this config would run after them: the usual case, e.g.
        ``temperature=0.7,top_k=20`` + ``min_p=0.3``); otherwise, and for ``post_*`` requests, the
        truncation goes to the post-truncation pass. A config whose post pass is already in use
        cannot take a second one (``ValueError``).
        """
        post_names = {POST + k for k in TRUNCATION_SETTINGS}
        unknown = sorted(set(fields) - post_names - set(_TAIL_STEPS) - {"eta_delta"})
        if unknown:
            raise TypeError(f"with_truncation: unknown field(s) {', '.join(unknown)}; valid fields: "
                            f"{', '.join(_TAIL_STEPS)}, eta_delta, {', '.join(POST + k for k in TRUNCATION_SETTINGS)}")
        requested: dict[str, object] = {}
        for key, value in fields.items():
            if value is None:
                continue
            name = key[len(POST):] if key.startswith(POST) else key
            if name in requested:
                raise ValueError(f"with_truncation: {name} requested twice ({name} and {POST + name})")
            requested[name] = _CONFIG[key].check("sampling", value)
        if "eta_delta" in requested and requested.get("eta", 0.0) == 0.0:
            raise ValueError("with_truncation: eta_delta is the δ of the requested η step; request eta too")
        steps = [s for s in TRUNCATION_STEPS if s in requested and requested[s] != TRUNCATION_OFF[s]]
        if not steps:
            return self
        truncation = {s: requested[s] for s in steps}
        if "eta" in truncation:
            truncation["eta_delta"] = requested.get("eta_delta")
        via_post = any(k.startswith(POST) for k, v in fields.items() if v is not None)
        if not via_post and self._tail_is_free(steps):
            return replace(self, **truncation)
        if self.post_truncation:
            raise ValueError(
                f"sampling config {self} already truncates after its pipeline "
                f"({', '.join(f'{k}={v}' for k, v in self.post_truncation.items())}); it cannot take a second "
                f"post-truncation ({', '.join(f'{k}={v}' for k, v in truncation.items())})")
        return replace(self, **{POST + k: v for k, v in truncation.items()})

    def _tail_is_free(self, steps: list[str]) -> bool:
        """Whether the steps (a subset of min-p / η / ε) can be written into the ordinary fields exactly."""
        if not set(steps) <= set(_TAIL_STEPS) or self.post_truncation:
            return False
        first = min(_TAIL_STEPS.index(s) for s in steps)
        return all(getattr(self, s) == TRUNCATION_OFF[s] for s in _TAIL_STEPS[first:])

    @cached_property
    def post_truncation(self) -> dict:
        """The active settings of the post-truncation pass, as :func:`verispec.sets.truncation_mask`
        keywords (``{}``: no post pass)."""
        out = {s: getattr(self, POST + s) for s in TRUNCATION_STEPS if getattr(self, POST + s) != TRUNCATION_OFF[s]}
        if "eta" in out and self.post_eta_delta is not None:
            out["eta_delta"] = self.post_eta_delta
        return out

    def warpers(self) -> list:
        """The active warpers, in application order (greedy: just ``Temperature(0.0)``)."""
        return list(self._warpers)

    @cached_property
    def _warpers(self) -> tuple:
        if self.is_greedy:
            return (Temperature(0.0),)
        ws: list = []
        if self.temperature != 1.0:
            ws.append(Temperature(self.temperature))
        if self.top_k > 0:
            ws.append(TopK(self.top_k))
        if self.top_p < 1.0:
            ws.append(TopP(self.top_p))
        if self.min_p > 0.0:
            ws.append(MinP(self.min_p))
        if self.eta > 0.0:
            ws.append(EtaCutoff(self.eta, self.eta_delta))
        if self.epsilon > 0.0:
            ws.append(EpsilonCutoff(self.epsilon))
        return tuple(ws)

    @cached_property
    def _post_topk(self) -> tuple:
        return tuple(w for w in self._warpers if not isinstance(w, (Temperature, TopK)))

    def _run(self, logits: torch.Tensor) -> _Out:
        x = _prepare(logits)
        shape = x.shape
        V = shape[-1]
        rows = x.reshape(-1, V)
        if rows.shape[0] == 0:
            return _Out(shape, rows, None)
        blocks = topk.make_blocks(rows) if V >= max(topk.BLOCK_MIN_V, 2 * topk.BLOCK) else None
        _check_row_max(rows, blocks.row_max if blocks is not None else rows.amax(-1))
        if self.is_greedy:
            return _Out(shape, None, topk.first_argmax(rows, blocks))

        t = self.temperature
        vals, idx, owned = None, None, False
        if 0 < self.top_k < V:
            if blocks is not None:
                compact = topk.top_k_compact(rows, blocks, self.top_k, t)
                if compact is not None:
                    (vals, idx), owned = compact, True
            if vals is None:
                vals = rows / t if t != 1.0 else rows.clone()
                vals = TopK(self.top_k)._apply(vals, inplace=True)
                owned = True
        else:
            vals, owned = (rows / t, True) if t != 1.0 else (rows, False)
        for w in self._post_topk:
            vals = w._apply(vals, inplace=owned)
            owned = True
        if self.post_truncation:
            # on the compact set when there is one: the tokens outside it have probability 0, which no
            # truncation step keeps or counts
            keep = truncation_mask(torch.softmax(vals, dim=-1), **self.post_truncation)
            vals = vals.masked_fill(~keep, _NEG_INF)
        return _Out(shape, vals, idx)

    def process_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [..., V]`` -> warped float32 logits ``[..., V]``, ``-inf`` for removed tokens.

        Greedy: 0 at the first argmax, ``-inf`` elsewhere. When no warper is active the float32
        input itself may be returned (do not modify the result in place).
        """
        shape, vals, idx = self._run(logits)
        if vals is None:
            out = torch.full(shape, _NEG_INF, dtype=torch.float32, device=idx.device)
            return out.view(-1, shape[-1]).scatter_(1, idx, 0.0).view(shape)
        if idx is None:
            return vals.view(shape)
        out = torch.full(shape, _NEG_INF, dtype=torch.float32, device=idx.device)
        return out.view(-1, shape[-1]).scatter_(1, idx, vals).view(shape)

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [..., V]`` -> float32 probabilities ``[..., V]``: rows sum to 1, removed tokens 0.

        Greedy: one-hot at the first argmax of the logits.
        """
        shape, vals, idx = self._run(logits)
        if vals is None:
            out = torch.zeros(shape, dtype=torch.float32, device=idx.device)
            return out.view(-1, shape[-1]).scatter_(1, idx, 1.0).view(shape)
        if idx is None:
            return torch.softmax(vals, dim=-1).view(shape)
        out = torch.zeros(shape, dtype=torch.float32, device=idx.device)
        return out.view(-1, shape[-1]).scatter_(1, idx, torch.softmax(vals, dim=-1)).view(shape)
