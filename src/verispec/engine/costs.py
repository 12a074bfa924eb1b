"""What model calls cost on this machine, measured once per (hardware, model pair) and cached.

A :class:`CostProfile` holds the seconds (the fastest of a few calls) of one draft forward of one token
and of two tokens, one target forward of ``g + 1`` tokens for every ``g`` up to ``g_max`` (``g = 0``: a plain
decoding step), and the engine's own work per step outside the model forwards (sampling pipelines,
the rule, bookkeeping). In units of a target decoding step (``t``) that is the cost model of
speculative decoding,

    cost(g) = [(g − 1)·d₁ + α^g·d₂ + (1 − α^g)·d₁ + T(g) + o(g)] / t,   cost(0) = 1 + o₀ / t,

where the draft's first forward of a step also feeds the token it has not seen when the previous
block was accepted whole (probability ``α^g``, two tokens ``d₂``; where the number ``n`` of tokens
the draft has not seen is known, e.g. after plain steps, that forward costs ``d₁ + (n − 1)(d₂ − d₁)``
instead), and ``o(g) = o_a + o_b·g`` is the
time of an SD step drafting ``g`` tokens spent outside the draft's and the target's forwards
(``o₀``: a target-only step's), measured on short real generations (:func:`measure_profile`;
profiles without it fall back to ``(2g + 1)`` rows of one pipeline row's time ``r``, and ``r`` for a
plain step).  With ``α`` and ``o`` left out (``d₂ = d₁``) this is the textbook ``γ·c + v(γ)``
(Leviathan et al. 2023). Drafts that cost nothing to make (prompt lookup) pay only
``verify_cost(g) = [T(g) + o(g)] / t``; a profile measured without a draft model (``draft=None``)
holds only those.

This module holds the profile and its formulas only; measuring one and the per-machine cache are
:mod:`verispec.engine.calibrate`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: Version of the cached file's layout and measurement; a file of another version is re-measured
#: (4: the overheads are medians over rounds, 3's single round could carry a stall; 5: forwards are the fastest
#: of their rounds, and the share of the CPU other work used while measuring is recorded, so that a profile
#: measured on a busy machine is measured again; 6: up to 16 draft tokens, and the transformers backend's forwards
#: run with its per-row-count plan of linear products, :func:`~verispec.models.cpu_linear.plan_rows`).
PROFILE_VERSION = 6
#: the longest draft a profile measures by default (``--gamma auto``'s cap): on the 2-core VM the transformers
#: backend verifies 16 tokens for about what 8 cost (its products of 9..16 rows all run as 16), so where the
#: draft is accepted whole the longest drafts pay most
DEFAULT_G_MAX = 16


@dataclass(frozen=True)
class CostProfile:
    """Seconds per call (the fastest of a few, :func:`~verispec.engine.calibrate.measure_profile`):
    ``target_block[g]`` is one target forward of ``g + 1`` tokens (``g = 0 .. g_max``;
    ``target_block[0]`` is the plain one-token step); ``draft_token`` a draft
    forward of one token (None: a profile of the target alone, for drafts that cost nothing to
    make, i.e. prompt lookup: :meth:`verify_cost`); ``draft_pair`` a draft
    forward of two tokens (default: ``draft_token``); ``row_s`` the sampling pipeline and draw of
    one logits row (default 0); ``step_overhead`` ``(o_a, o_b)``: seconds of an SD step drafting ``g``
    tokens outside the model forwards, ``o_a + o_b·g``, and ``plain_overhead`` a target-only step's
    (None: ``(2g + 1)·row_s`` and ``row_s``); ``busy``: the share of the machine's CPU time that other
    work used while it was measured (0..1; None: not known), and ``measured_at`` when (Unix seconds):
    a profile measured on a busy machine is measured again once it is quiet
    (:func:`~verispec.engine.calibrate.cached_profile`)."""

    draft_token: float | None
    target_block: tuple[float, ...]
    identity: str = ""  # what was measured (machine, threads, models), for the reader
    draft_pair: float | None = None
    row_s: float = 0.0
    step_overhead: tuple[float, float] | None = None
    plain_overhead: float | None = None
    busy: float | None = None
    measured_at: float | None = None

    def __post_init__(self) -> None:
        if len(self.target_block) < 2:
            raise ValueError("a cost profile needs target forwards of 1 and at least 2 tokens")
        if (self.draft_token is not None and self.draft_token <= 0) or any(t <= 0 for t in self.target_block) \
                or self.row_s < 0 or (self.draft_pair is not None and self.draft_pair <= 0):
            raise ValueError(f"cost profile times must be positive, got {self}")
        if self.step_overhead is not None and (len(self.step_overhead) != 2 or min(self.step_overhead) < 0):
            raise ValueError(f"step_overhead must be two seconds >= 0 (o_a, o_b), got {self.step_overhead}")
        if self.plain_overhead is not None and self.plain_overhead < 0:
            raise ValueError(f"plain_overhead must be >= 0, got {self.plain_overhead}")
        if self.busy is not None and not 0.0 <= self.busy <= 1.0:
            raise ValueError(f"busy is a share of the CPU in [0, 1], got {self.busy}")

    @property
    def g_max(self) -> int:
        return len(self.target_block) - 1

    @property
    def target_token(self) -> float:
        return self.target_block[0]

    @property
    def has_draft(self) -> bool:
        """Whether the profile measured a draft model (else it prices free drafts only)."""
        return self.draft_token is not None

    def _draft_token(self) -> float:
        if self.draft_token is None:
            raise ValueError("this cost profile was measured without a draft model (for prompt lookup): "
                             "measure one with the draft model (cached_profile(target, draft, ...))")
        return self.draft_token

    @property
    def c(self) -> float:
        """Draft-to-target cost ratio per token."""
        return self._draft_token() / self.target_token

    def v(self, g: int) -> float:
        """Cost of one target forward of ``g + 1`` tokens in target decoding steps (``v(0) = 1``)."""
        return self.target_block[g] / self.target_token

    def draft_feed(self, n: int) -> float:
        """Seconds of one draft forward of ``n >= 1`` tokens, extrapolated linearly from 1 and 2 tokens."""
        one = self._draft_token()
        pair = one if self.draft_pair is None else self.draft_pair
        return one + (n - 1) * max(pair - one, 0.0)

    def step_cost(self, g: int, alpha: float | None = None, unseen: int | None = None) -> float:
        """Cost of a step that drafts ``g`` tokens and verifies them, in target decoding steps (see
        the module docstring). The draft's first forward feeds the tokens it has not seen: ``unseen``
        of them where known (e.g. after plain steps), else two with probability ``alpha^g`` (the
        previous block accepted whole) and one otherwise."""
        if g == 0:
            return self.verify_cost(0)
        if unseen is not None:
            first = self.draft_feed(max(unseen, 1))
        else:
            full = 0.0 if alpha is None else alpha ** g
            first = full * self.draft_feed(2) + (1.0 - full) * self._draft_token()
        draft = (g - 1) * self._draft_token() + first
        return draft / self.target_token + self.verify_cost(g)

    def verify_cost(self, g: int) -> float:
        """Cost of a step verifying ``g`` drafted tokens that cost nothing to draft (prompt lookup), in
        target decoding steps: the target's ``(g + 1)``-token forward and the engine's work of an SD
        step (``g = 0``: a plain step). The engine time is the one measured with draft-model steps
        (which also process the draft's rows), or with free drafts for a profile without a draft."""
        if g == 0:
            return 1.0 + (self.row_s if self.plain_overhead is None else self.plain_overhead) / self.target_token
        if self.step_overhead is None:
            other = (2 * g + 1) * self.row_s
        else:
            other = self.step_overhead[0] + self.step_overhead[1] * g
        return other / self.target_token + self.v(g)

    def speedup(self, tokens: float, cost: float) -> float:
        """Modelled speedup over target-only sampling of ``tokens`` emitted at ``cost`` (in target
        steps): target-only pays ``1 + r / t`` per token."""
        return tokens * self.step_cost(0) / cost

    def fixed_speedup(self, gamma: int, block_efficiency: float) -> float:
        """The textbook speedup of a fixed ``gamma`` at ``block_efficiency`` tokens per target call,
        ``BE / (γ·c + v(γ))`` (Leviathan et al. 2023: no catch-up, no work outside the models)."""
        if not 1 <= gamma <= self.g_max:
            raise ValueError(f"the cost profile covers γ = 1..{self.g_max}, got {gamma}")
        return block_efficiency / (gamma * self.c + self.v(gamma))

    def to_json(self) -> dict:
        return {"version": PROFILE_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> CostProfile:
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"cost profile version {d.get('version')!r}, expected {PROFILE_VERSION}")
        pair = d.get("draft_pair")
        over, plain = d.get("step_overhead"), d.get("plain_overhead")
        one = d["draft_token"]
        return cls(draft_token=None if one is None else float(one),
                   target_block=tuple(float(t) for t in d["target_block"]),
                   identity=str(d.get("identity", "")), draft_pair=None if pair is None else float(pair),
                   row_s=float(d.get("row_s", 0.0)),
                   step_overhead=None if over is None else (float(over[0]), float(over[1])),
                   plain_overhead=None if plain is None else float(plain),
                   busy=None if d.get("busy") is None else float(d["busy"]),
                   measured_at=None if d.get("measured_at") is None else float(d["measured_at"]))
