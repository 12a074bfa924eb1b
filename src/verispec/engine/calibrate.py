"""Measuring a :class:`~verispec.engine.costs.CostProfile` on this machine, and the cache that keeps it.

:func:`measure_profile` times the model calls after a prefill and the engine's own work per step on
short real generations; :func:`measure_costs` is the cheap version for one fixed γ (forwards only).
:func:`cached_profile` returns the profile stored for this machine and model pair (``costs/<key>.json``
in the verispec cache, ``~/.cache/verispec`` by default), measuring and storing it when there is none or
when asked to refresh (``verispec calibrate``).  The key covers the CPU model, the core count, the thread
count, the backends' names, devices and (transformers) linear layouts, their model files' sizes and
mtimes, and the llama.cpp / torch versions, so that a profile is never reused where its costs would
differ.
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
from pathlib import Path

import torch

from verispec.engine.costs import DEFAULT_G_MAX, CostProfile
from verispec.engine.generate import generate, generate_target_only
from verispec.engine.ngram import NgramDrafter
from verispec.models.base import Backend, check_compatible
from verispec.models.embedded import default_cache_dir
from verispec.rules.base import sample_categorical
from verispec.sampling import SamplingConfig

_log = logging.getLogger("verispec.costs")


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
                  repeats: int = 5) -> CostProfile:
    """The profile of one fixed γ, cheaply: median seconds of draft forwards of one and two tokens and of
    target forwards of 1..γ+1 tokens after a prefill of ``prompt_ids``, without the engine's own time
    per step (:func:`measure_profile` measures that too, on short generations)."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    drafts, targets = _forward_medians(target, draft, prompt_ids, draft_sizes=(1, 2),
                                       target_sizes=range(1, gamma + 2), repeats=repeats)
    return CostProfile(draft_token=drafts[1], target_block=tuple(targets[n] for n in range(1, gamma + 2)),
                       draft_pair=drafts[2])


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
