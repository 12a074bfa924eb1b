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
"""

from __future__ import annotations

import contextlib
import time

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


class WeightMajorLinear(TorchFunctionMode):
    """Computes ``F.linear(x, W, b)`` as ``(W @ x2d.T).T + b`` for CPU float32 inputs of 2..``max_rows``
    rows (``x``: ``[..., in]``, rows = all leading dimensions together); counts them in :attr:`calls`."""

    def __init__(self, max_rows: int = MAX_ROWS) -> None:
        super().__init__()
        self.max_rows = max_rows
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
        if not 2 <= rows <= self.max_rows:
            return None
        out = torch.mm(weight, x.reshape(rows, x.shape[-1]).t()).t().contiguous()   # [rows, out]
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


def resolve_linear_layout(layout: str, model: torch.nn.Module) -> str:
    """``layout`` checked against :data:`LINEAR_LAYOUTS`, with ``auto`` decided by measurement."""
    if layout not in LINEAR_LAYOUTS:
        raise ValueError(f"linear_layout must be one of {', '.join(LINEAR_LAYOUTS)}, got {layout!r}")
    return choose_linear_layout(model) if layout == "auto" else layout


def linear_mode(layout: str, rows: int) -> contextlib.AbstractContextManager:
    """The context to run a model call of ``rows`` input rows in (a no-op unless it computes linears
    weight-major)."""
    if layout == "weight-major" and 2 <= rows <= MAX_ROWS:
        return WeightMajorLinear()
    return contextlib.nullcontext()
