"""Measuring a :class:`~verispec.engine.costs.CostProfile` on this machine, and the cache that keeps it.

:func:`measure_profile` times the model calls after a prefill and the engine's own work per step on
short real generations; :func:`measure_costs` is the cheap version for one fixed γ (forwards only).
:func:`cached_profile` returns the profile stored for this machine and model pair (``costs/<key>.json``
in the verispec cache, ``~/.cache/verispec`` by default), measuring and storing it when there is none or
when asked to refresh (``verispec calibrate``).  The key covers the CPU model, the core count, the thread
count, the backends' names, devices and (transformers) linear layouts, their model files' sizes and
mtimes, and the llama.cpp / torch versions, so that a profile is never reused where its costs would
differ.

A profile measured while other work shared the CPU carries that work's slow-down in every time it holds,
unevenly (a stall that hits the one-token forward and not the two-token one makes ``v(1) < 1``), and it
was kept for good. :class:`OtherLoad` therefore measures the share of the machine's CPU time that other
processes (and the hypervisor, as steal time) took while the profile was measured, from ``/proc/stat``
less this process's own CPU time; the profile records it (``busy``). A cached profile measured with
``busy > BUSY_LIMIT`` is measured again as soon as a call finds the machine quiet (a half-second
sample); while the machine stays busy it is used with a warning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from verispec.engine.costs import DEFAULT_G_MAX, CostProfile
from verispec.engine.generate import generate, generate_target_only
from verispec.engine.ngram import NgramDrafter
from verispec.models.base import Backend, check_compatible
from verispec.models.cpu_linear import plan_digest
from verispec.models.embedded import default_cache_dir
from verispec.rules.base import sample_categorical
from verispec.runtime import cpu_model
from verispec.sampling import SamplingConfig
from verispec.settings import MAX_GAMMA

_log = logging.getLogger("verispec.costs")

#: a profile measured while other work took more than this share of the machine's CPU is measured again
#: once the machine is quiet (:func:`cached_profile`)
BUSY_LIMIT = 0.2
#: seconds :func:`other_load_now` watches the machine for
QUIET_SAMPLE_S = 0.5


def _cpu_snapshot() -> tuple[float, float, float] | None:
    """``(busy, total, own)`` seconds: every CPU's non-idle time (steal included) and all time from
    ``/proc/stat``, and this process's CPU time; None where ``/proc/stat`` cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        hz = float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError):
        return None
    if len(fields) < 4:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)     # idle + iowait
    total = sum(fields[:8])                                        # guest time is counted within user
    own = os.times()
    return (total - idle) / hz, total / hz, own.user + own.system


class OtherLoad:
    """Context manager: the share of the machine's CPU time (0..1, all cores) that other work took while it
    was open, in :attr:`share` (None where ``/proc/stat`` is absent): every CPU's busy time, hypervisor
    steal included, less this process's own CPU time."""

    share: float | None = None

    def __enter__(self) -> OtherLoad:
        self._start = _cpu_snapshot()
        return self

    def __exit__(self, *exc) -> None:
        end = _cpu_snapshot()
        if self._start is None or end is None or end[1] <= self._start[1]:
            self.share = None
            return
        busy, total, own = (b - a for a, b in zip(self._start, end))
        self.share = min(max((busy - own) / total, 0.0), 1.0)


def other_load_now(seconds: float = QUIET_SAMPLE_S) -> float | None:
    """The share of the CPU other work takes now (watched for ``seconds`` while this process sleeps)."""
    with OtherLoad() as load:
        time.sleep(seconds)
    return load.share


#: Receives one line per stage of a measurement (``verispec calibrate`` prints them: a long one is seen working).
Progress = Callable[[str], None]
#: seconds between two progress lines within one round of timed forwards
PROGRESS_EVERY_S = 15.0


def _forward_seconds(target: Backend, draft: Backend | None, prompt_ids: Sequence[int], *,
                     draft_sizes: Sequence[int], target_sizes: Sequence[int],
                     repeats: int, progress: Progress | None = None) -> tuple[dict[int, float], dict[int, float]]:
    """Seconds of draft and target forwards of each given number of tokens, measured after a prefill of
    ``prompt_ids`` and rolled back after each call (both caches end holding the prompt; no draft: target
    forwards only): the fastest of ``repeats`` rounds, each round timing every size once (the sizes in
    a rotated order, so that no size always follows the same call). Other work on the machine only
    ever slows a call down, and unevenly -- a stall in one size's calls is what made ``v(1) < 1`` in a
    profile taken under load --, so the fastest time is the estimate of a call's cost that every size
    shares; a median is not, unless most calls ran undisturbed. ``progress`` hears of each round."""
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
    calls = [(who, backend, n) for who, backend, sizes in models for n in sizes]
    stamps: dict[tuple[str, int], list[float]] = {}
    started = said = time.perf_counter()
    for r in range(repeats):
        if progress is not None:
            took = f" ({time.perf_counter() - started:.0f} s so far)" if r else ""
            progress(f"timing forwards: round {r + 1} of {repeats}, target blocks of 1..{max(target_sizes)} "
                     f"tokens{took}")
            said = time.perf_counter()
        shift = (r * len(calls)) // max(repeats, 1)
        for i, (who, backend, n) in enumerate(calls[shift:] + calls[:shift]):
            t = time.perf_counter()
            backend.forward(filler[:n], all_logits=who == "target" and n > 1)
            stamps.setdefault((who, n), []).append(time.perf_counter() - t)
            backend.rollback(base)
            if progress is not None and time.perf_counter() - said > PROGRESS_EVERY_S:   # a long round: still going
                progress(f"timing forwards: round {r + 1} of {repeats}, {i + 1} of {len(calls)} calls "
                         f"({time.perf_counter() - started:.0f} s so far)")
                said = time.perf_counter()
    best = {k: min(v) for k, v in stamps.items()}
    return ({n: best["draft", n] for n in draft_sizes if ("draft", n) in best},
            {n: best["target", n] for n in target_sizes})


def measure_costs(target: Backend, draft: Backend, prompt_ids: Sequence[int], gamma: int,
                  repeats: int = 5) -> CostProfile:
    """The profile of one fixed γ, cheaply: seconds of draft forwards of one and two tokens and of
    target forwards of 1..γ+1 tokens after a prefill of ``prompt_ids``, without the engine's own time
    per step (:func:`measure_profile` measures that too, on short generations)."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    drafts, targets = _forward_seconds(target, draft, prompt_ids, draft_sizes=(1, 2),
                                       target_sizes=range(1, gamma + 2), repeats=repeats)
    return CostProfile(draft_token=drafts[1], target_block=tuple(targets[n] for n in range(1, gamma + 2)),
                       draft_pair=drafts[2])


def measure_profile(target: Backend, draft: Backend | None, prompt_ids: Sequence[int],
                    g_max: int = DEFAULT_G_MAX, repeats: int = 5, progress: Progress | None = None) -> CostProfile:
    """Seconds of draft forwards of one and two tokens, of target forwards of 1..``g_max + 1``
    tokens (the fastest of ``repeats``, :func:`_forward_seconds`), measured after a prefill of
    ``prompt_ids`` (both caches are left holding the prompt), of
    one logits row through a typical sampling pipeline (temperature, top-k, top-p) and a draw, and
    the engine's time per step outside the model forwards (:func:`measure_overheads`). ``draft``
    None: a profile of the target alone, for prompt lookup. The share of the CPU other work took meanwhile
    is recorded (``busy``, :class:`OtherLoad`). ``g_max`` is at most :data:`~verispec.settings.MAX_GAMMA`:
    the time grows with its square. ``progress`` hears of each stage."""
    if isinstance(g_max, bool) or not isinstance(g_max, int) or not 1 <= g_max <= MAX_GAMMA:
        raise ValueError(f"g_max must be an integer in [1, {MAX_GAMMA}], got {g_max!r}")
    started = time.time()
    with OtherLoad() as load:
        drafts, targets = _forward_seconds(target, draft, prompt_ids, draft_sizes=(1, 2),
                                           target_sizes=range(1, g_max + 2), repeats=repeats, progress=progress)
        if progress is not None:
            progress("timing the engine's own work per step (short generations)")
        step, plain = measure_overheads(target, draft, prompt_ids)
        row = _row_seconds(int(target.vocab_size), repeats)
    return CostProfile(draft_token=drafts.get(1), target_block=tuple(targets[n] for n in range(1, g_max + 2)),
                       draft_pair=drafts.get(2), row_s=row, step_overhead=step, plain_overhead=plain,
                       busy=None if load.share is None else round(load.share, 4), measured_at=round(started, 1))


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
    for backend in (target, draft):   # leave the caches as _forward_seconds does: the prompt
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
        plan = getattr(backend, "row_plan", None)        # and its plan per row count (cpu_linear.plan_rows)
        name += f"[{layout}{'' if plan is None else ':' + plan_digest(plan)}]"
    try:
        st = os.stat(path)
        return f"{name}|{st.st_size}|{int(st.st_mtime)}"
    except (OSError, TypeError, ValueError):
        return name


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
    return (f"cpu={cpu_model()};cores={os.cpu_count()};threads={n_threads};machine={platform.machine()};"
            f"g_max={g_max};target={_model_identity(target)};draft={_model_identity(draft)};{_versions()}")


def _measured_busy(prof: CostProfile) -> bool:
    return prof.busy is not None and prof.busy > BUSY_LIMIT


def default_costs_dir() -> Path:
    return default_cache_dir() / "costs"


def cached_profile(target: Backend, draft: Backend | None, prompt_ids: Sequence[int], *, n_threads: int | None = None,
                   g_max: int = DEFAULT_G_MAX, cache_dir: str | os.PathLike | None = None,
                   refresh: bool = False, progress: Progress | None = None) -> tuple[CostProfile, bool]:
    """``(profile, measured_now)``: the profile stored for this machine and pair, else a fresh
    measurement (stored for next time).  An unreadable or stale file is measured again, with a
    warning on the ``verispec.costs`` logger; a cache that cannot be written only logs. ``draft``
    None: the target's profile alone (prompt lookup). ``progress`` hears of each stage of a measurement."""
    threads = n_threads if n_threads is not None else getattr(target, "n_threads", None)
    identity = profile_identity(target, draft, threads, g_max)
    folder = Path(cache_dir) if cache_dir is not None else default_costs_dir()
    path = folder / (hashlib.sha256(identity.encode()).hexdigest()[:16] + ".json")
    if not refresh and path.is_file():
        try:
            prof = CostProfile.from_json(json.loads(path.read_text()))
            if prof.identity == identity and prof.g_max >= g_max:
                if not _measured_busy(prof):
                    return prof, False
                now = other_load_now()
                if now is None or now > BUSY_LIMIT:
                    _log.warning("cost profile %s was measured while other work took %.0f%% of the CPU, and the "
                                 "machine is still busy (%s): using it; it is measured again once the machine is "
                                 "quiet (or run `verispec calibrate` then)", path, 100 * prof.busy,
                                 "unknown" if now is None else f"{100 * now:.0f}%")
                    return prof, False
                _log.warning("cost profile %s was measured while other work took %.0f%% of the CPU; the machine "
                             "is quiet now: measuring again", path, 100 * prof.busy)
            else:
                _log.warning("cost profile %s was measured for another setting; measuring again", path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            _log.warning("cost profile %s is unreadable (%s); measuring again", path, e)
    prof = measure_profile(target, draft, prompt_ids, g_max=g_max, progress=progress)
    prof = dataclasses.replace(prof, identity=identity)
    if _measured_busy(prof):
        _log.warning("the cost profile was measured while other work took %.0f%% of the CPU: its times may be off; "
                     "it is measured again once the machine is quiet (or run `verispec calibrate` then)",
                     100 * prof.busy)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(prof.to_json(), indent=1))
        os.replace(tmp, path)
    except OSError as e:
        _log.warning("cannot store the cost profile in %s (%s); it will be measured again next time", folder, e)
    return prof, True
