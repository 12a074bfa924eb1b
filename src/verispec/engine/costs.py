"""What model calls cost on this machine, measured once per (hardware, model pair) and cached.

A :class:`CostProfile` holds the median seconds of one draft forward of one token and of two
tokens, one target forward of ``g + 1`` tokens for every ``g`` up to ``g_max`` (``g = 0``: a plain
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

:func:`measure_profile` measures it after a prefill (:func:`measure_costs`, the same timing for one
fixed γ); :func:`cached_profile` returns the profile stored for this machine and model pair
(``costs/<key>.json`` in the verispec cache, ``~/.cache/verispec`` by default), measuring and storing
it when there is none or when asked to refresh (``verispec calibrate``).  The key covers the CPU model,
the core count, the thread count, the backends' names, devices and (transformers) linear layouts,
their model files' sizes and mtimes, and the llama.cpp / torch versions, so that a profile is never
reused where its costs would differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from verispec.engine.ngram import NgramDrafter
from verispec.engine.stats import CallCosts
from verispec.models.base import Backend
from verispec.models.embedded import default_cache_dir

_log = logging.getLogger("verispec.costs")
#: Version of the cached file's layout and measurement; a file of another version is re-measured
#: (4: the overheads are medians over rounds, 3's single round could carry a stall).
PROFILE_VERSION = 4
DEFAULT_G_MAX = 8


@dataclass(frozen=True)
class CostProfile:
    """Median seconds per call: ``target_block[g]`` is one target forward of ``g + 1`` tokens
    (``g = 0 .. g_max``; ``target_block[0]`` is the plain one-token step); ``draft_token`` a draft
    forward of one token (None: a profile of the target alone, for drafts that cost nothing to
    make, i.e. prompt lookup: :meth:`verify_cost`); ``draft_pair`` a draft
    forward of two tokens (default: ``draft_token``); ``row_s`` the sampling pipeline and draw of
    one logits row (default 0); ``step_overhead`` ``(o_a, o_b)``: seconds of an SD step drafting ``g``
    tokens outside the model forwards, ``o_a + o_b·g``, and ``plain_overhead`` a target-only step's
    (None: ``(2g + 1)·row_s`` and ``row_s``)."""

    draft_token: float | None
    target_block: tuple[float, ...]
    identity: str = ""  # what was measured (machine, threads, models), for the reader
    draft_pair: float | None = None
    row_s: float = 0.0
    step_overhead: tuple[float, float] | None = None
    plain_overhead: float | None = None

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

    def call_costs(self, gamma: int) -> CallCosts:
        """The fixed-γ view (:class:`CallCosts`) used by ``Stats.cost_model_speedup``."""
        if not 1 <= gamma <= self.g_max:
            raise ValueError(f"the cost profile covers γ = 1..{self.g_max}, got {gamma}")
        return CallCosts(gamma=gamma, draft_token=self._draft_token(), target_token=self.target_token,
                         target_block=self.target_block[gamma])

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
                   plain_overhead=None if plain is None else float(plain))


def _forward_medians(target: Backend, draft: Backend | None, prompt_ids: Sequence[int], *,
                     draft_sizes: Sequence[int], target_sizes: Sequence[int],
                     repeats: int) -> tuple[dict[int, float], dict[int, float]]:
    """Median seconds of draft and target forwards of each given number of tokens, measured after a
    prefill of ``prompt_ids`` and rolled back after each call (both caches end holding the prompt;
    no draft: target forwards only)."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("measuring costs needs a non-empty prompt")
    models = [("target", target, target_sizes)]
    if draft is not None:
        models.insert(0, ("draft", draft, draft_sizes))
    for _, backend, _ in models:
        backend.reset()
        backend.forward(ids, all_logits=False)
    base = len(ids)
    filler = ids[-1:] * max(*draft_sizes, *target_sizes)
    stamps: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for who, backend, sizes in models:
            for n in sizes:
                t = time.perf_counter()
                backend.forward(filler[:n], all_logits=who == "target" and n > 1)
                stamps.setdefault((who, n), []).append(time.perf_counter() - t)
                backend.rollback(base)
    med = {k: sorted(v)[len(v) // 2] for k, v in stamps.items()}
    return ({n: med["draft", n] for n in draft_sizes if ("draft", n) in med},
            {n: med["target", n] for n in target_sizes})


def measure_costs(target: Backend, draft: Backend, prompt_ids: Sequence[int], gamma: int,
                  repeats: int = 5) -> CallCosts:
    """Median seconds of a draft 1-token forward, a target 1-token forward and a target (γ+1)-token
    forward, measured on this hardware after a prefill of ``prompt_ids`` (one fixed γ; for every γ
    at once see :func:`measure_profile`)."""
    drafts, targets = _forward_medians(target, draft, prompt_ids, draft_sizes=(1,), target_sizes=(1, gamma + 1),
                                       repeats=repeats)
    return CallCosts(gamma=gamma, draft_token=drafts[1], target_token=targets[1], target_block=targets[gamma + 1])


def measure_profile(target: Backend, draft: Backend | None, prompt_ids: Sequence[int],
                    g_max: int = DEFAULT_G_MAX, repeats: int = 5) -> CostProfile:
    """Median seconds of draft forwards of one and two tokens, of target forwards of 1..``g_max + 1``
    tokens, measured after a prefill of ``prompt_ids`` (both caches are left holding the prompt), of
    one logits row through a typical sampling pipeline (temperature, top-k, top-p) and a draw, and
    the engine's time per step outside the model forwards (:func:`measure_overheads`). ``draft``
    None: a profile of the target alone, for prompt lookup."""
    if g_max < 1:
        raise ValueError(f"g_max must be >= 1, got {g_max}")
    drafts, targets = _forward_medians(target, draft, prompt_ids, draft_sizes=(1, 2),
                                       target_sizes=range(1, g_max + 2), repeats=repeats)
    step, plain = measure_overheads(target, draft, prompt_ids)
    return CostProfile(draft_token=drafts.get(1), target_block=tuple(targets[n] for n in range(1, g_max + 2)),
                       draft_pair=drafts.get(2), row_s=_row_seconds(int(target.vocab_size), repeats),
                       step_overhead=step, plain_overhead=plain)


#: the sampling of the overhead runs (the pipeline most runs use: temperature, top-k, top-p)
_OVERHEAD_SAMPLING = "temperature=0.7,top_k=20,top_p=0.8"


def measure_overheads(target: Backend, draft: Backend | None, prompt_ids: Sequence[int], *, tokens: int = 12,
                      gammas: tuple[int, int] = (1, 4), repeats: int = 3) -> tuple[tuple[float, float], float]:
    """``((o_a, o_b), o₀)``: seconds per step spent outside the model forwards (the generation's wall
    time less its draft and target forward time, over its target calls), from short real generations
    of ``prompt_ids``: lossless chain SD at the two ``gammas`` (``o_a + o_b·g`` fitted through both,
    clipped at 0; without a draft model, free drafts that repeat the last token, verified like prompt
    lookup's) and target-only sampling (``o₀``). Each is the median over ``repeats`` rounds of
    the three generations: one stall of a few hundred ms in a 12-token run (a busy hypervisor) would
    otherwise add tens of ms to every modelled step. Both caches are left holding the prompt."""
    from verispec.engine.generate import generate, generate_target_only
    from verispec.models import check_compatible
    from verispec.sampling import SamplingConfig

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sampling = SamplingConfig.parse(_OVERHEAD_SAMPLING)
    width = check_compatible(target, draft) if draft is not None else None

    def per_step(stats) -> float:
        return stats.other_s / max(stats.target_calls, 1)

    rounds: list[tuple[float, float, float]] = []
    for seed in range(repeats):
        plain = per_step(generate_target_only(target, prompt_ids, sampling=sampling, max_new_tokens=tokens,
                                              seed=seed, vocab_width=width).stats)
        o_lo, o_hi = (per_step(generate(target, draft, prompt_ids, rule="lossless", sampling=sampling, gamma=g,
                                        seed=seed, max_new_tokens=tokens, vocab_width=width,
                                        lookup=None if draft is not None else _RepeatLast(max_tokens=g)).stats)
                      for g in gammas)
        rounds.append((plain, o_lo, o_hi))
    plain, o_lo, o_hi = (sorted(col)[len(col) // 2] for col in zip(*rounds))
    lo, hi = gammas
    slope = max((o_hi - o_lo) / (hi - lo), 0.0)
    for backend in (target, draft):   # leave the caches as _forward_medians does: the prompt
        if backend is not None:
            backend.rollback(min(backend.n_cached, len(prompt_ids)))
    return (max(o_lo - slope * lo, 0.0), slope), plain


class _RepeatLast(NgramDrafter):
    """A free draft in every step (the last token, repeated): times the engine's work of lookup steps."""

    def propose_match(self, max_tokens: int | None = None) -> tuple[list[int], int]:
        k = self.max_tokens if max_tokens is None else max_tokens
        return self._history[-1:] * k, 1


def _row_seconds(vocab: int, repeats: int) -> float:
    """Median seconds of one logits row through temperature / top-k / top-p and one draw."""
    import torch

    from verispec.rules.base import sample_categorical
    from verispec.sampling import SamplingConfig

    pipeline = SamplingConfig.parse("temperature=0.7,top_k=20,top_p=0.8")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, vocab, generator=gen) * 3
    times = []
    for _ in range(max(3, repeats)):
        t = time.perf_counter()
        sample_categorical(pipeline.process(logits), gen)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


# ------------------------------------------------------------------------------------------ cache
def _model_identity(backend: Backend | None) -> str:
    if backend is None:
        return "none"
    name = str(getattr(backend, "name", type(backend).__name__))
    path = getattr(backend, "path", None) or name.split(":", 1)[-1]
    device = getattr(backend, "device", None)
    if device is not None:
        name += f"@{device}"
    layout = getattr(backend, "linear_layout", None)   # the transformers backend's product layout
    if layout is not None:
        name += f"[{layout}]"
    try:
        st = os.stat(path)
        return f"{name}|{st.st_size}|{int(st.st_mtime)}"
    except (OSError, TypeError, ValueError):
        return name


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> str:
    out = []
    for mod in ("llama_cpp", "torch", "transformers"):
        try:
            out.append(f"{mod}={__import__(mod).__version__}")
        except Exception:  # noqa: BLE001 - not installed or broken: not part of the identity
            continue
    return ",".join(out)


def profile_identity(target: Backend, draft: Backend | None, n_threads: int | None, g_max: int) -> str:
    """What a cached profile is valid for (one line, human-readable)."""
    return (f"cpu={_cpu_model()};cores={os.cpu_count()};threads={n_threads};machine={platform.machine()};"
            f"g_max={g_max};target={_model_identity(target)};draft={_model_identity(draft)};{_versions()}")


def default_costs_dir() -> Path:
    return default_cache_dir() / "costs"


def cached_profile(target: Backend, draft: Backend | None, prompt_ids: Sequence[int], *, n_threads: int | None = None,
                   g_max: int = DEFAULT_G_MAX, cache_dir: str | os.PathLike | None = None,
                   refresh: bool = False) -> tuple[CostProfile, bool]:
    """``(profile, measured_now)``: the profile stored for this machine and pair, else a fresh
    measurement (stored for next time).  An unreadable or stale file is measured again, with a
    warning on the ``verispec.costs`` logger; a cache that cannot be written only logs. ``draft``
    None: the target's profile alone (prompt lookup)."""
    threads = n_threads if n_threads is not None else getattr(target, "n_threads", None)
    identity = profile_identity(target, draft, threads, g_max)
    folder = Path(cache_dir) if cache_dir is not None else default_costs_dir()
    path = folder / (hashlib.sha256(identity.encode()).hexdigest()[:16] + ".json")
    if not refresh and path.is_file():
        try:
            prof = CostProfile.from_json(json.loads(path.read_text()))
            if prof.identity == identity and prof.g_max >= g_max:
                return prof, False
            _log.warning("cost profile %s was measured for another setting; measuring again", path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            _log.warning("cost profile %s is unreadable (%s); measuring again", path, e)
    prof = measure_profile(target, draft, prompt_ids, g_max=g_max)
    prof = dataclasses.replace(prof, identity=identity)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(prof.to_json(), indent=1))
        os.replace(tmp, path)
    except OSError as e:
        _log.warning("cannot store the cost profile in %s (%s); it will be measured again next time", folder, e)
    return prof, True
