"""Linear layers of a few rows on the CPU: the weight-major product, chosen by measurement.

A verification forward multiplies each weight matrix ``W [out, in]`` by a handful of rows ``x [M, in]``
(M = drafted tokens + 1). ``F.linear`` asks the BLAS for ``x @ W.T``; with the MKL build of torch on
an AMD EPYC VM that product cost about as much as M separate one-row products (the embedded target's
``gate_proj``, float32, 2 threads: 5.5 ms at M = 1, 20.7 ms at M = 6; its output layer 75 ms and
306 ms), so a 6-token verification cost ~3.4 single-token forwards, and speculative decoding could
not pay. The same numbers as ``(W @ x.T).T`` — the weight as the left operand — streamed the weight
once: 7.9 ms and 120 ms at M = 6. ``benchmarks/assisted.py`` prints the effect on whole generations.

Which layout is faster depends on the BLAS and the CPU, so :func:`choose_linear_layout` times both on
one of the model's own weights; :class:`WeightMajorLinear` is a ``TorchFunctionMode`` that computes the
linears of one model call weight-major when their input has 2..``max_rows`` rows on the CPU in
float32 (other calls pass through untouched). It is entered around a backend's model call, never
installed globally, so the model object stays as the user built it.

**A plan per row count.** Neither product is fast for every number of rows, and neither is monotone in
it: on that VM (2 threads) the output layer ``[151936, 1536]`` took 62 ms for one row with either
product, 32 ms for *two* rows weight-major, 243 ms for 15 rows and 152 ms for 16; whole target forwards
followed (two tokens at 0.70-0.78 of one token's time, 16 tokens at 0.55 of 15 tokens'). Memory-bound
products cost what streaming the weight costs, so computing a few zero rows more is free where the
kernel for that row count is the better one. :func:`plan_rows` times both products for every row count
``1 .. max_rows`` on the model's largest linear weight and plans, for each ``n``, the row count ``m >= n``
and product that is fastest (padding the input with ``m − n`` zero rows, dropped from the output); a
plan is used only where it beats the standard product by :data:`PLAN_MARGIN`, so timing noise does not
reroute a call. The rows of the output are those of ``F.linear`` up to float rounding: zero rows change
no other row of a product.

**One thread per block of output rows.** The BLAS multiplied a tall weight by one column on one thread,
and by two columns on one or both threads from call to call (the output layer: 62 ms for one row,
29-75 ms for two). The weight-major product therefore cuts the weight's output rows into one block per
torch thread and multiplies the blocks as one batch (``torch.bmm``, one parallel region): one row
31 ms, ``gate_proj`` 1.8 ms against 4.2 ms (2 threads).

**Measured once per machine and model shape** (:func:`cached_plan`): a few of these products are bimodal
on a VM (the output layer's two-row product took 29 ms in some calls and 60-75 ms in others, in streaks of
seconds), so two loads could time different plans -- one load left one-token forwards unpadded, 45% slower
-- while the cost profile measured with the other plan was reused. The plan is cached under the verispec
cache (``row_plans/``), keyed by the CPU, thread count, torch version and the timed weights' shapes, and the
cost profile's key carries the plan's digest (:func:`plan_digest`), so a profile always prices the plan
in use.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: ``linear_layout`` values a transformers backend accepts
LINEAR_LAYOUTS = ("auto", "standard", "weight-major")
#: most rows a linear input may have to be computed weight-major (a verification block or tree, a
#: short prompt chunk); larger inputs are what the BLAS's standard blocking is made for
MAX_ROWS = 64
#: ``auto`` times the layouts only when the model has a linear weight at least this large: smaller
#: matrices stay in cache, where the layout does not matter (and tiny test models keep one code path)
MIN_TIMED_WEIGHT = 1 << 22
#: rows of the timed product (a 3-token draft plus the bonus row)
TIMED_ROWS = 4


#: a row count's plan: ``(m, weight_major)``: compute it as ``m >= n`` rows, weight-major or not
RowChoice = tuple[int, bool]
#: a padded or weight-major product must take at most this share of the standard product's time to be used
PLAN_MARGIN = 0.9
#: rounds of the one-row decision (:func:`plan_rows`), its three ways timed in turn; their medians decide
ONE_ROW_ROUNDS = 9
#: part of a cached plan's key: plans measured by an older rule are measured again
PLAN_VERSION = 3

log = logging.getLogger(__name__)


@functools.cache
def default_plan(max_rows: int = MAX_ROWS) -> tuple[RowChoice, ...]:
    """The plan without timing: one row standard, 2..``max_rows`` rows weight-major, nothing padded."""
    return ((1, False),) + tuple((n, True) for n in range(2, max_rows + 1))


class WeightMajorLinear(TorchFunctionMode):
    """Computes ``F.linear(x, W, b)`` of CPU float32 inputs of ``n`` rows (``x``: ``[..., in]``, rows = all
    leading dimensions together) as ``plan[n − 1] = (m, weight_major)`` says: ``m − n`` zero rows appended,
    ``(W @ x2d.T).T + b`` where ``weight_major`` (:func:`_weight_major_product`), the rows of the input
    kept (default plan: weight-major for 2..``max_rows`` rows, :func:`default_plan`); counts the calls it
    reroutes in :attr:`calls`."""

    def __init__(self, max_rows: int = MAX_ROWS, plan: tuple[RowChoice, ...] | None = None) -> None:
        super().__init__()
        self.plan = default_plan(max_rows) if plan is None else plan
        self.max_rows = len(self.plan)
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            out = self._weight_major(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)

    def _weight_major(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
        if weight.dim() != 2 or x.device.type != "cpu":
            return None
        if x.dtype != torch.float32 or weight.dtype != torch.float32:
            return None
        rows = x.numel() // max(x.shape[-1], 1)   # a 1-D input is one row
        if not 1 <= rows <= self.max_rows:
            return None
        m, weight_major = self.plan[rows - 1]
        if m == rows and not weight_major:
            return None
        x2d = x.reshape(rows, x.shape[-1])
        if m > rows:
            x2d = torch.cat([x2d, x2d.new_zeros(m - rows, x2d.shape[1])])
        out = _product(x2d, weight, m, weight_major)[:rows]   # [rows, out], contiguous
        if bias is not None:
            out.add_(bias)
        self.calls += 1
        return out.view(*x.shape[:-1], weight.shape[0])


def _largest_linear_weight(model: torch.nn.Module) -> torch.Tensor | None:
    """The largest 2-D weight of the model's ``nn.Linear`` layers other than the output layer (which
    may be tied to the embedding and is slow to time), or None."""
    out_layer = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    best = None
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module is not out_layer:
            if best is None or module.weight.numel() > best.numel():
                best = module.weight
    return best


def _best_time(fn, repeats: int) -> float:
    fn()   # first call: allocation, thread start-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


@torch.inference_mode()
def choose_linear_layout(model: torch.nn.Module, *, repeats: int = 3) -> str:
    """``"weight-major"`` when that product of :data:`TIMED_ROWS` rows by the model's largest linear
    weight is at least 10% faster than the standard one on this machine, else ``"standard"``; always
    ``"standard"`` off the CPU, outside float32, or for models without a weight of
    :data:`MIN_TIMED_WEIGHT` elements."""
    weight = _largest_linear_weight(model)
    if weight is None or weight.device.type != "cpu" or weight.dtype != torch.float32:
        return "standard"
    if weight.numel() < MIN_TIMED_WEIGHT:
        return "standard"
    x = torch.randn(TIMED_ROWS, weight.shape[1], dtype=weight.dtype,
                    generator=torch.Generator().manual_seed(0))   # the global generator is the user's
    standard = _best_time(lambda: F.linear(x, weight), repeats)
    mode = WeightMajorLinear()
    weight_major = _best_time(lambda: mode._weight_major(x, weight), repeats)
    return "weight-major" if weight_major < 0.9 * standard else "standard"


def _timed_weights(model: torch.nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(largest linear weight, output layer's weight)`` that :func:`plan_rows` times; the first is None
    where the model gets :func:`default_plan` untimed, the second where it has no CPU float32 output layer."""
    weight = _largest_linear_weight(model)
    if weight is None or weight.device.type != "cpu" or weight.dtype != torch.float32 \
            or weight.numel() < MIN_TIMED_WEIGHT:
        weight = None
    out_layer = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out = getattr(out_layer, "weight", None)
    if not (isinstance(out, torch.Tensor) and out.dim() == 2 and out.device.type == "cpu"
            and out.dtype == torch.float32):
        out = None
    return weight, out


@torch.inference_mode()
def plan_rows(model: torch.nn.Module, *, repeats: int = 5) -> tuple[RowChoice, ...]:
    """The fastest way to compute a linear of ``n`` rows, for ``n = 1 .. MAX_ROWS`` (see the module): both
    products of every row count timed on the model's largest linear weight, the fastest of ``repeats``
    rounds that each time every product once in a rotated order (so that a slow spell of the machine
    does not hit one row count only); then :func:`plan_from_times`. One row (every decoding step) is
    computed standard, weight-major or as two weight-major rows, whichever is fastest on that weight and
    the output layer together, by the medians of :data:`ONE_ROW_ROUNDS` rounds timing the three in turn
    (the two-row product is bimodal on a VM: the median says what a decoding step typically costs).
    Models without a timed weight (:func:`choose_linear_layout`) get :func:`default_plan`.
    :func:`cached_plan` measures it once."""
    weight, out = _timed_weights(model)
    if weight is None:
        return default_plan()
    x = torch.randn(MAX_ROWS, weight.shape[1], dtype=weight.dtype, generator=torch.Generator().manual_seed(0))
    products = [(m, major) for m in range(1, MAX_ROWS + 1) for major in (False, True)]

    best = dict.fromkeys(products, float("inf"))
    _product(x, weight, MAX_ROWS, True)   # allocation, thread start-up
    for r in range(repeats):
        shift = r * len(products) // repeats
        for m, major in products[shift:] + products[:shift]:
            best[m, major] = min(best[m, major], _seconds(_product, x, weight, m, major))
    plan = plan_from_times([best[m, False] for m in range(1, MAX_ROWS + 1)],
                           [best[m, True] for m in range(1, MAX_ROWS + 1)])
    # one row -- every decoding step -- is decided on the output layer as well, where the ways differ most
    # (on that VM 62 ms standard, 31 ms weight-major, 29-75 ms as two rows), by the median of its rounds
    timed = [w for w in (weight, out) if w is not None]
    rows = [torch.randn(2, w.shape[1], dtype=w.dtype, generator=torch.Generator().manual_seed(1)) for w in timed]
    ways = ((1, False), (1, True), (2, True))
    seconds: dict[RowChoice, list[float]] = {way: [] for way in ways}
    for _ in range(ONE_ROW_ROUNDS):
        for m, major in ways:
            seconds[m, major].append(sum(_seconds(_product, y, w, m, major) for w, y in zip(timed, rows)))
    median = {way: statistics.median(s) for way, s in seconds.items()}
    fastest = min(ways, key=median.get)
    return (fastest if median[fastest] <= PLAN_MARGIN * median[1, False] else (1, False),) + plan[1:]


def _product(x: torch.Tensor, weight: torch.Tensor, m: int, weight_major: bool) -> torch.Tensor:
    """``F.linear(x[:m], weight)`` ([m, out], contiguous), computed weight-major or standard."""
    return _weight_major_product(x[:m], weight) if weight_major else F.linear(x[:m], weight)


def _weight_major_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` ([m, out], contiguous) with the weight as the left operand. With ``T`` torch threads the
    weight's output rows are cut into ``T`` blocks multiplied as one batch: the BLAS ran the product of a tall
    weight by one column on one thread (the embedded target's output layer: 62 ms; as two blocks 31 ms) and by
    two columns on one or both threads from call to call (29-75 ms)."""
    parts = torch.get_num_threads()
    n_out, k = weight.shape
    if parts > 1 and n_out % parts == 0 and weight.is_contiguous():
        blocks = torch.bmm(weight.view(parts, n_out // parts, k), x.t().unsqueeze(0).expand(parts, -1, -1))
        return blocks.view(n_out, -1).t().contiguous()     # [parts, n_out / parts, m] -> [m, n_out]
    return torch.mm(weight, x.t()).t().contiguous()


def _seconds(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def plan_digest(plan: tuple[RowChoice, ...]) -> str:
    """A short digest of a plan: part of the key of a cost profile measured with it."""
    return hashlib.sha256(json.dumps([list(c) for c in plan]).encode()).hexdigest()[:12]


def cached_plan(model: torch.nn.Module, *, cache_dir: str | os.PathLike | None = None,
                refresh: bool = False) -> tuple[RowChoice, ...]:
    """:func:`plan_rows`'s plan of ``model`` on this machine, measured once and then read from the cache
    (``<cache_dir>/`` or the verispec cache's ``row_plans/``), keyed by the CPU, its core count, torch's
    thread count and version, and the shapes of the timed weights; ``refresh``: measure it again. Models
    :func:`plan_rows` does not time get :func:`default_plan` (nothing cached)."""
    weight, out = _timed_weights(model)
    if weight is None:
        return default_plan()
    from verispec.models.embedded import default_cache_dir
    from verispec.outputs import OutputError, atomic_path
    from verispec.runtime import cpu_model

    key = (f"v{PLAN_VERSION};cpu={cpu_model()};cores={os.cpu_count()};threads={torch.get_num_threads()};"
           f"torch={torch.__version__};rows={MAX_ROWS};margin={PLAN_MARGIN};weight={list(weight.shape)};"
           f"out={None if out is None else list(out.shape)}")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "row_plans"
    path = folder / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")
    if not refresh:
        try:
            data = json.loads(path.read_text())
            plan = tuple((int(m), bool(wm)) for m, wm in data["plan"])
            if data.get("key") == key and len(plan) == MAX_ROWS and all(n <= m <= MAX_ROWS
                                                                        for n, (m, _) in enumerate(plan, 1)):
                return plan
            log.warning("cached row plan %s does not fit this model and machine: measuring it again", path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("cached row plan %s is unreadable (%s): measuring it again", path, exc)
    plan = plan_rows(model)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps({"key": key, "plan": [list(c) for c in plan], "described": describe_plan(plan)}))
    except (OSError, OutputError) as exc:     # a read-only cache: the plan still serves this load
        log.warning("could not cache the row plan in %s (%s)", folder, exc)
    return plan


def plan_from_times(standard: list[float], major: list[float]) -> tuple[RowChoice, ...]:
    """:func:`plan_rows`'s choice from the seconds of each product of ``1 .. len(standard)`` rows."""
    best = [min(s, w) for s, w in zip(standard, major)]
    plan = []
    for n in range(1, len(best) + 1):
        fastest = min(best[n - 1:])
        m = next(m for m in range(n, len(best) + 1) if best[m - 1] <= 1.05 * fastest)
        if best[m - 1] <= PLAN_MARGIN * standard[n - 1]:
            plan.append((m, major[m - 1] < standard[m - 1]))
        else:
            plan.append((n, False))
    return tuple(plan)


def describe_plan(plan: tuple[RowChoice, ...] | None) -> str:
    """The plan in a few words: the row counts computed otherwise than as given, e.g. ``1→2w 15→16w``."""
    if plan is None:
        return "standard"
    moved = [f"{n}→{m}{'w' if wm else 's'}" for n, (m, wm) in enumerate(plan, 1) if m != n]
    major = sum(wm and m == n for n, (m, wm) in enumerate(plan, 1))
    return f"{major} row counts weight-major" + (f", padded {' '.join(moved)}" if moved else "")


def resolve_linear_layout(layout: str, model: torch.nn.Module) -> str:
    """``layout`` checked against :data:`LINEAR_LAYOUTS`, with ``auto`` decided by measurement."""
    if layout not in LINEAR_LAYOUTS:
        raise ValueError(f"linear_layout must be one of {', '.join(LINEAR_LAYOUTS)}, got {layout!r}")
    return choose_linear_layout(model) if layout == "auto" else layout


def linear_mode(layout: str, rows: int, plan: tuple[RowChoice, ...] | None = None) -> contextlib.AbstractContextManager:
    """The context to run a model call of ``rows`` input rows in (a no-op unless it computes linears
    weight-major or padded): ``plan`` the backend's (:func:`plan_rows`; None: :func:`default_plan`)."""
    if layout != "weight-major":
        return contextlib.nullcontext()
    plan = default_plan() if plan is None else plan
    if 1 <= rows <= len(plan) and plan[rows - 1] != (rows, False):
        return WeightMajorLinear(plan=plan)
    return contextlib.nullcontext()
