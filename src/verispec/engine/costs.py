"""What model calls cost on this machine, measured once per (hardware, model pair) and cached.

A :class:`CostProfile` holds the median seconds of one draft forward of one token and of two
tokens, one target forward of ``g + 1`` tokens for every ``g`` up to ``g_max`` (``g = 0``: a plain
decoding step), and of the work per logits row outside the models (sampling pipeline and draw).
In units of a target decoding step (``t``) that is the cost model of speculative decoding,

    cost(g) = [(g − 1)·d₁ + α^g·d₂ + (1 − α^g)·d₁ + T(g) + (2g + 1)·r] / t,   cost(0) = 1 + r / t,

where the draft's first forward of a step also feeds the token it has not seen when the previous
block was accepted whole (probability ``α^g``, two tokens ``d₂``), and ``2g + 1`` rows pass the
sampling pipeline (``g`` draft rows, ``g + 1`` target rows).  With ``α`` left out (and ``r = 0``,
``d₂ = d₁``) this is the textbook ``γ·c + v(γ)`` (Leviathan et al. 2023).

:func:`measure_profile` measures it after a prefill (:func:`measure_costs`, the same timing for one
fixed γ); :func:`cached_profile` returns the profile stored for this machine and model pair
(``costs/<key>.json`` in the verispec cache, ``~/.cache/verispec`` by default), measuring and storing
it when there is none or when asked to refresh (``verispec calibrate``).  The key covers the CPU model,
the core count, the thread count, the backends' names and their model files' sizes and mtimes, and
the llama.cpp / torch versions, so that a profile is never reused where its costs would differ.
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

from verispec.engine.stats import CallCosts
from verispec.models.base import Backend
from verispec.models.embedded import default_cache_dir

_log = logging.getLogger("verispec.costs")
#: Version of the cached file's layout; a file of another version is re-measured.
PROFILE_VERSION = 2
DEFAULT_G_MAX = 8


@dataclass(frozen=True)
class CostProfile:
    """Median seconds per call: ``target_block[g]`` is one target forward of ``g + 1`` tokens
    (``g = 0 .. g_max``; ``target_block[0]`` is the plain one-token step); ``draft_pair`` a draft
    forward of two tokens (default: ``draft_token``); ``row_s`` the sampling pipeline and draw of
    one logits row (default 0)."""

    draft_token: float
    target_block: tuple[float, ...]
    identity: str = ""  # what was measured (machine, threads, models), for the reader
    draft_pair: float | None = None
    row_s: float = 0.0

    def __post_init__(self) -> None:
        if len(self.target_block) < 2:
            raise ValueError("a cost profile needs target forwards of 1 and at least 2 tokens")
        if self.draft_token <= 0 or any(t <= 0 for t in self.target_block) or self.row_s < 0 or (
                self.draft_pair is not None and self.draft_pair <= 0):
            raise ValueError(f"cost profile times must be positive, got {self}")

    @property
    def g_max(self) -> int:
        return len(self.target_block) - 1

    @property
    def target_token(self) -> float:
        return self.target_block[0]

    @property
    def c(self) -> float:
        """Draft-to-target cost ratio per token."""
        return self.draft_token / self.target_token

    def v(self, g: int) -> float:
        """Cost of one target forward of ``g + 1`` tokens in target decoding steps (``v(0) = 1``)."""
        return self.target_block[g] / self.target_token

    def step_cost(self, g: int, alpha: float | None = None) -> float:
        """Cost of a step that drafts ``g`` tokens and verifies them, in target decoding steps (see
        the module docstring; ``alpha``: per-position acceptance, for the draft's catch-up)."""
        r = self.row_s / self.target_token
        if g == 0:
            return 1.0 + r
        pair = self.draft_token if self.draft_pair is None else self.draft_pair
        full = 0.0 if alpha is None else alpha ** g
        draft = (g - 1) * self.draft_token + full * pair + (1.0 - full) * self.draft_token
        return draft / self.target_token + self.v(g) + (2 * g + 1) * r

    def speedup(self, tokens: float, cost: float) -> float:
        """Modelled speedup over target-only sampling of ``tokens`` emitted at ``cost`` (in target
        steps): target-only pays ``1 + r / t`` per token."""
        return tokens * self.step_cost(0) / cost

    def call_costs(self, gamma: int) -> CallCosts:
        """The fixed-γ view (:class:`CallCosts`) used by ``Stats.cost_model_speedup``."""
        if not 1 <= gamma <= self.g_max:
            raise ValueError(f"the cost profile covers γ = 1..{self.g_max}, got {gamma}")
        return CallCosts(gamma=gamma, draft_token=self.draft_token, target_token=self.target_token,
                         target_block=self.target_block[gamma])

    def to_json(self) -> dict:
        return {"version": PROFILE_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> CostProfile:
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"cost profile version {d.get('version')!r}, expected {PROFILE_VERSION}")
        pair = d.get("draft_pair")
        return cls(draft_token=float(d["draft_token"]), target_block=tuple(float(t) for t in d["target_block"]),
                   identity=str(d.get("identity", "")), draft_pair=None if pair is None else float(pair),
                   row_s=float(d.get("row_s", 0.0)))


def _forward_medians(target: Backend, draft: Backend, prompt_ids: Sequence[int], *, draft_sizes: Sequence[int],
                     target_sizes: Sequence[int], repeats: int) -> tuple[dict[int, float], dict[int, float]]:
    """Median seconds of draft and target forwards of each given number of tokens, measured after a
    prefill of ``prompt_ids`` and rolled back after each call (both caches end holding the prompt)."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("measuring costs needs a non-empty prompt")
    for backend in (target, draft):
        backend.reset()
        backend.forward(ids, all_logits=False)
    base = len(ids)
    filler = ids[-1:] * max(*draft_sizes, *target_sizes)
    stamps: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for who, backend, sizes in (("draft", draft, draft_sizes), ("target", target, target_sizes)):
            for n in sizes:
                t = time.perf_counter()
                backend.forward(filler[:n], all_logits=who == "target" and n > 1)
                stamps.setdefault((who, n), []).append(time.perf_counter() - t)
                backend.rollback(base)
    med = {k: sorted(v)[len(v) // 2] for k, v in stamps.items()}
    return ({n: med["draft", n] for n in draft_sizes}, {n: med["target", n] for n in target_sizes})


def measure_costs(target: Backend, draft: Backend, prompt_ids: Sequence[int], gamma: int,
                  repeats: int = 5) -> CallCosts:
    """Median seconds of a draft 1-token forward, a target 1-token forward and a target (γ+1)-token
    forward, measured on this hardware after a prefill of ``prompt_ids`` (one fixed γ; for every γ
    at once see :func:`measure_profile`)."""
    drafts, targets = _forward_medians(target, draft, prompt_ids, draft_sizes=(1,), target_sizes=(1, gamma + 1),
                                       repeats=repeats)
    return CallCosts(gamma=gamma, draft_token=drafts[1], target_token=targets[1], target_block=targets[gamma + 1])


def measure_profile(target: Backend, draft: Backend, prompt_ids: Sequence[int], g_max: int = DEFAULT_G_MAX,
                    repeats: int = 5) -> CostProfile:
    """Median seconds of draft forwards of one and two tokens, of target forwards of 1..``g_max + 1``
    tokens, measured after a prefill of ``prompt_ids`` (both caches are left holding the prompt),
    and of one logits row through a typical sampling pipeline (temperature, top-k, top-p) and a draw."""
    if g_max < 1:
        raise ValueError(f"g_max must be >= 1, got {g_max}")
    drafts, targets = _forward_medians(target, draft, prompt_ids, draft_sizes=(1, 2),
                                       target_sizes=range(1, g_max + 2), repeats=repeats)
    return CostProfile(draft_token=drafts[1], target_block=tuple(targets[n] for n in range(1, g_max + 2)),
                       draft_pair=drafts[2], row_s=_row_seconds(int(target.vocab_size), repeats))


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
def _model_identity(backend: Backend) -> str:
    name = str(getattr(backend, "name", type(backend).__name__))
    device = getattr(backend, "device", None)
    if device is not None:
        name += f"@{device}"
    path = getattr(backend, "path", None) or name.split(":", 1)[-1]
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


def profile_identity(target: Backend, draft: Backend, n_threads: int | None, g_max: int) -> str:
    """What a cached profile is valid for (one line, human-readable)."""
    return (f"cpu={_cpu_model()};cores={os.cpu_count()};threads={n_threads};machine={platform.machine()};"
            f"g_max={g_max};target={_model_identity(target)};draft={_model_identity(draft)};{_versions()}")


def default_costs_dir() -> Path:
    return default_cache_dir() / "costs"


def cached_profile(target: Backend, draft: Backend, prompt_ids: Sequence[int], *, n_threads: int | None = None,
                   g_max: int = DEFAULT_G_MAX, cache_dir: str | os.PathLike | None = None,
                   refresh: bool = False) -> tuple[CostProfile, bool]:
    """``(profile, measured_now)``: the profile stored for this machine and pair, else a fresh
    measurement (stored for next time).  An unreadable or stale file is measured again, with a
    warning on the ``verispec.costs`` logger; a cache that cannot be written only logs."""
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
