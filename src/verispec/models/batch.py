"""Batched backends: ``B`` rows (slots), each one sequence with its own committed length.

Protocol (:class:`BatchBackend`; every implementation here follows it):

- ``batch_size`` rows, numbered ``0 .. B-1``; ``row_length(r)`` = tokens row ``r`` holds.
  ``context_length`` is per row.
- ``forward_rows(tokens, last_only=False)``: ``tokens`` is a list of ``B`` token lists, an empty list
  for a row that does not take part. Appends row ``r``'s tokens after its ``row_length(r)`` tokens
  (positions ``row_length(r) ..``) and returns their logits **packed**, vLLM style: a
  ``[N, vocab_size]`` tensor, ``N = Σ len(tokens[r])``, row ``r``'s block after the blocks of the rows
  before it, its tokens in order (:func:`row_slices` gives each row's ``slice``). With
  ``last_only=True``: ``[number of rows taking part, vocab_size]``, the last token's logits of each
  taking-part row, in row order. Logits are on :attr:`logits_device` (the engine samples and verifies
  there; nothing is copied to the host), float32 (float64 for a float64 transformers model). Checks
  (token ids, context overflow) run on every row before any state changes.
- ``rollback_row(r, length)``: row ``r`` keeps its first ``length`` tokens; ``reset_row(r)`` empties
  it (slot reuse in continuous batching); ``reset()`` empties every row.
- ``one_sequence()`` (optional): a single-sequence :class:`~verispec.models.base.Backend` of the same
  model sharing its weights (its own KV cache), for what batches cannot decode (trees, prompt lookup):
  one copy of the model serves both.
- Text and vocabulary methods (``tokenize``, ``detokenize``, ``token_piece``, ``chat_prompt``,
  ``eos_token_ids``, ``vocab_size``, ``tokenizer_size``, ``name``) are those of the single-sequence
  model, so :func:`verispec.models.base.check_compatible` applies as is.

Implementations:

- :class:`HFBatchBackend` (transformers). One ``DynamicCache`` of batch ``B``. Every forward appends
  the same number ``T = max_r len(tokens[r])`` of cells to every row, the new tokens right-aligned
  (row ``r``'s tokens in the last ``len(tokens[r])`` columns, padding before them, so the last real
  token of every row is column ``T-1`` and ``last_only`` needs the lm_head on one column). Each cell
  carries a position (``-1``: free — padding, rolled back, or reset); a query at position ``P`` of row
  ``r`` attends to row ``r``'s cells with positions ``0..P`` (a 4-D additive mask
  ``[B, 1, T, L+T]``), padding queries to themselves only, so no row ever sees another row's cells or
  a free cell and padding never yields NaN. ``position_ids`` are per row. Rolling back frees cells (no
  copy). Why this layout: a ``DynamicCache`` can only grow at its end for all rows at once, so rows of
  different lengths leave holes; keeping per-cell positions makes rollback free and exact, and memory
  stays bounded by **compaction**: before a forward, trailing columns free in every row are cropped
  (with ``B = 1`` that is all a rollback ever needs: the cache is then that of :class:`HFBackend`),
  and when the cache is longer than the longest row by more than ``compact_slack`` columns, every
  row's cells are gathered to the front (one copy of the cache, the cost of one ``torch.cat`` the
  cache makes at every forward anyway). Long inputs are run in column chunks of ``max_block`` (the
  mask is ``B x T x (L+T)``). Sliding-window cache layers are refused.
- :class:`LlamaBatchBackend` (llama.cpp). One context with ``n_seq_max = B`` sequences sharing one
  KV buffer (``kv_unified``; ``B x n_ctx`` cells): row ``r`` is llama.cpp sequence ``r``, whose cells
  only its own queries attend to; a forward is one ``llama_batch`` holding every row's tokens (split
  in ``n_batch`` blocks), ``rollback_row`` = ``llama_memory_seq_rm(r, length, -1)``. The context is
  built by :class:`~verispec.models.llama.LlamaBackend` with ``max_tree_nodes = B - 1`` (that is exactly
  a context of ``B`` sequences on one shared buffer); its single-sequence API is never used.
  Quantised kernels differ between batch sizes, so a row's logits are close to, not bitwise equal to,
  those of a single-sequence run (``n_ubatch=1`` makes every token's numerics those of one-token decoding).
- :class:`RowsOfBackends`: ``B`` single-sequence backends, one per row, run one after another (the
  reference implementation; tests run it on fake models, and it batches any :class:`Backend`).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from .base import Backend, check_forward_tokens, check_rollback_length
from .cpu_linear import linear_mode

#: Default number of free columns the transformers cache may carry before it is compacted.
COMPACT_SLACK = 64
#: Default largest number of columns one transformers forward appends (longer inputs are chunked).
MAX_BLOCK = 512


@runtime_checkable
class BatchBackend(Protocol):
    """``B`` rows of one causal LM, each with its own KV cache state (see the module docstring)."""

    name: str
    vocab_size: int
    eos_token_ids: frozenset[int]
    context_length: int  # per row
    batch_size: int

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]: ...

    def detokenize(self, ids: Sequence[int]) -> str: ...

    def token_piece(self, token_id: int) -> str: ...

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]: ...

    def row_length(self, row: int) -> int:
        """Tokens row ``row`` holds."""
        ...

    def forward_rows(self, tokens: Sequence[Sequence[int]], *, last_only: bool = False) -> torch.Tensor:
        """Append ``tokens[r]`` to row ``r`` (empty: row idle); packed logits ``[N, V]`` (``last_only``:
        ``[rows taking part, V]``)."""
        ...

    def rollback_row(self, row: int, length: int) -> None:
        """Row ``row`` keeps its first ``length`` tokens."""
        ...

    def reset_row(self, row: int) -> None:
        """Empty row ``row``."""
        ...

    def reset(self) -> None:
        """Empty every row."""
        ...


def row_slices(tokens: Sequence[Sequence[int]], *, last_only: bool = False) -> list[slice | None]:
    """Where each row's logits sit in the packed output of ``forward_rows(tokens)``: a ``slice`` per
    row taking part, None for an idle row."""
    out: list[slice | None] = []
    at = 0
    for toks in tokens:
        if not toks:
            out.append(None)
            continue
        n = 1 if last_only else len(toks)
        out.append(slice(at, at + n))
        at += n
    return out


def one_sequence_views(target_rows: Any, draft_rows: Any | None) -> tuple[Any, Any | None] | None:
    """Single-sequence views ``(target, draft or None)`` of batched backends on their own weights
    (``one_sequence()``), for what batches cannot decode; None where a backend cannot lend one (then a
    caller loads a single-sequence pair of its own)."""
    if not all(rows is None or hasattr(rows, "one_sequence") for rows in (target_rows, draft_rows)):
        return None
    try:
        target = target_rows.one_sequence()
    except NotImplementedError:
        return None
    if draft_rows is None:
        return target, None
    try:
        return target, draft_rows.one_sequence()
    except NotImplementedError:
        close = getattr(target, "close", None)
        if close is not None:
            close()
        return None


def _check_rows(backend, tokens: Sequence[Sequence[int]]) -> list[list[int]]:
    """Validate a ``forward_rows`` argument on every row before any state changes."""
    if len(tokens) != backend.batch_size:
        raise ValueError(f"{backend.name}: forward_rows needs one token list per row ({backend.batch_size}), "
                         f"got {len(tokens)}")
    out = [check_forward_tokens(t, backend.row_length(r), backend.context_length, backend.vocab_size) if len(t) else []
           for r, t in enumerate(tokens)]
    if not any(out):
        raise ValueError(f"{backend.name}: forward_rows got no tokens in any row")
    return out


def _check_row(backend, row: int) -> int:
    if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < backend.batch_size:
        raise ValueError(f"{backend.name}: row must be an integer in 0..{backend.batch_size - 1}, got {row!r}")
    return row


def _check_batch_size(batch_size: int, limit: int | None = None) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if limit is not None and batch_size > limit:
        raise ValueError(f"batch_size must be at most {limit} here (llama.cpp's sequence limit), got {batch_size}")
    return batch_size


class _TextOf:
    """Text and vocabulary methods delegated to the single-sequence backend ``self.single``."""

    single: Any

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return self.single.tokenize(text, add_special=add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.single.detokenize(ids)

    def token_piece(self, token_id: int) -> str:
        return self.single.token_piece(token_id)

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        return self.single.chat_prompt(user_message, system)


# --------------------------------------------------------------------------------------------------
# transformers


class HFBatchBackend(_TextOf):
    """``B`` rows of a transformers causal LM in one batched ``DynamicCache`` (module docstring).

    ``model``: an :class:`~verispec.models.hf.HFBackend` (its model and tokenizer are shared, its own
    cache is left alone) or anything ``HFBackend`` accepts (then built with ``tokenizer``, ``device``,
    ``dtype``). ``compact_slack``: free columns tolerated before the cache is compacted.
    ``max_block``: most columns appended by one model call.
    """

    def __init__(self, model: Any, *, batch_size: int, tokenizer: Any = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype | str | None = None, compact_slack: int = COMPACT_SLACK,
                 max_block: int = MAX_BLOCK) -> None:
        from .hf import HFBackend

        single = model if isinstance(model, HFBackend) else HFBackend(model, tokenizer=tokenizer, device=device,
                                                                      dtype=dtype)
        self.single = single
        self.batch_size = _check_batch_size(batch_size)
        if isinstance(compact_slack, bool) or not isinstance(compact_slack, int) or compact_slack < 0:
            raise ValueError(f"compact_slack must be an integer >= 0, got {compact_slack!r}")
        if isinstance(max_block, bool) or not isinstance(max_block, int) or max_block < 1:
            raise ValueError(f"max_block must be an integer >= 1, got {max_block!r}")
        self.compact_slack, self.max_block = compact_slack, max_block
        self.model = single.model
        self.name = f"{single.name} (batch {self.batch_size})"
        self.device, self.dtype, self.logits_device = single.device, single.dtype, single.logits_device
        self.vocab_size, self.tokenizer_size = single.vocab_size, single.tokenizer_size
        self.context_length, self.eos_token_ids = single.context_length, single.eos_token_ids
        self._out_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self.compactions = 0
        self.reset()

    def one_sequence(self) -> Any:
        """A single-sequence backend on this model's module and tokenizer (:meth:`HFBackend.sibling`)."""
        return self.single.sibling()

    # -- rows ------------------------------------------------------------------------------------
    def reset(self) -> None:
        self._cache = None
        #: per row: the cache column of each of its tokens, in position order
        self._cells: list[list[int]] = [[] for _ in range(self.batch_size)]
        #: per cache cell [B, L]: its position in its row, -1 when free
        self._pos = torch.empty((self.batch_size, 0), dtype=torch.long, device=self.device)

    def row_length(self, row: int) -> int:
        return len(self._cells[row])

    @property
    def cache_columns(self) -> int:
        """Columns of the cache (the longest row plus free columns)."""
        return int(self._pos.shape[1])

    @torch.inference_mode()
    def rollback_row(self, row: int, length: int) -> None:
        cells = self._cells[_check_row(self, row)]
        check_rollback_length(length, len(cells))
        if length < len(cells):
            del cells[length:]
            self._pos[row].masked_fill_(self._pos[row] >= length, -1)

    def reset_row(self, row: int) -> None:
        self.rollback_row(row, 0)

    # -- cache layout ------------------------------------------------------------------------------
    def _layers(self) -> list[Any]:
        layers = getattr(self._cache, "layers", None)
        if layers is None:
            raise NotImplementedError(f"{self.name}: batched rows need a transformers 5 DynamicCache (cache.layers)")
        if any(getattr(layer, "is_sliding", False) for layer in layers):
            raise NotImplementedError(f"{self.name}: batched rows do not support sliding-window cache layers")
        return [layer for layer in layers if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4]

    def _select_columns(self, index: torch.Tensor | int) -> None:
        """Keep the cache columns ``index`` (``[B, L']`` per row, gathered) or the first ``index`` columns."""
        for layer in self._layers():
            if isinstance(index, int):
                layer.keys, layer.values = layer.keys[..., :index, :], layer.values[..., :index, :]
            else:
                b, h, _, d = layer.keys.shape
                idx = index.to(layer.keys.device)[:, None, :, None].expand(b, h, index.shape[1], d)
                layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)

    def _tidy(self) -> None:
        """Crop the columns free in every row off the end; compact when the holes exceed the slack."""
        longest = max(len(c) for c in self._cells)
        if longest == 0:
            self.reset()
            return
        end = max(c[-1] + 1 for c in self._cells if c)
        if end < self.cache_columns:
            self._select_columns(end)
            self._pos = self._pos[:, :end]
        if end - longest > self.compact_slack:
            index = torch.zeros((self.batch_size, longest), dtype=torch.long)
            for r, cells in enumerate(self._cells):
                index[r, : len(cells)] = torch.tensor(cells, dtype=torch.long)
            self._select_columns(index)
            ar = torch.arange(longest)
            lengths = torch.tensor([len(c) for c in self._cells])[:, None]
            self._pos = torch.where(ar < lengths, ar, -1).to(self.device)
            self._cells = [list(range(len(c))) for c in self._cells]
            self.compactions += 1

    def _ensure_cache(self) -> None:
        if self._cache is None:
            from transformers import DynamicCache

            try:
                self._cache = DynamicCache(config=self.model.config)
            except TypeError:  # older transformers: no config argument
                self._cache = DynamicCache()
            try:
                self._layers()    # refuse sliding-window layers before they crop the cache on their own
            except NotImplementedError:
                self._cache = None
                raise

    # -- forward ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward_rows(self, tokens: Sequence[Sequence[int]], *, last_only: bool = False) -> torch.Tensor:
        """Packed logits of the rows' new tokens (module docstring)."""
        toks = _check_rows(self, tokens)
        self._tidy()
        width = max(len(t) for t in toks)
        if width <= self.max_block:
            return self._run(toks, "last" if last_only else "all")
        per_row: list[list[torch.Tensor]] = [[] for _ in toks]
        for start in range(0, width, self.max_block):     # column chunks of the right-aligned block
            stop = min(start + self.max_block, width)
            chunk = [t[max(0, start - width + len(t)): max(0, stop - width + len(t))] for t in toks]
            if last_only:
                logits = self._run(chunk, "last" if stop == width else None)
            else:
                logits = self._run(chunk, "all")
                for r, where in enumerate(row_slices(chunk)):
                    if where is not None:
                        per_row[r].append(logits[where])
        return logits if last_only else torch.cat([x for pieces in per_row for x in pieces])

    def _run(self, toks: list[list[int]], wanted: str | None) -> torch.Tensor | None:
        """One model call appending ``toks`` (right-aligned in ``T = max len`` columns) to the rows;
        packed logits of every new token (``wanted="all"``), of each row's last one (``"last"``), or None."""
        batch, t_new = self.batch_size, max(len(t) for t in toks)
        self._ensure_cache()
        n_old = self.cache_columns
        input_ids = torch.zeros((batch, t_new), dtype=torch.long)
        q_pos = torch.full((batch, t_new), -1, dtype=torch.long)             # -1: padding
        for r, t in enumerate(toks):
            if t:
                n = len(self._cells[r])
                input_ids[r, t_new - len(t):] = torch.tensor(t, dtype=torch.long)
                q_pos[r, t_new - len(t):] = torch.arange(n, n + len(t))
        input_ids, q_pos = input_ids.to(self.device), q_pos.to(self.device)
        k_pos = torch.cat([self._pos, q_pos], dim=1)                          # [B, L+T]
        # A query at position P sees its row's cells at positions 0..P; every query sees itself.
        visible = (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] <= q_pos[:, :, None])   # [B, T, L+T]
        cols = torch.arange(t_new, device=self.device)
        visible[:, cols, n_old + cols] = True
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        kwargs: dict[str, Any] = {self._cache_kw: self._cache, "use_cache": True,
                                  "position_ids": q_pos.clamp_min(0), "attention_mask": mask[:, None]}
        if self._keep_kw is not None and wanted != "all":
            kwargs[self._keep_kw] = 1   # right-aligned: every row's last token is the last column
        try:
            with linear_mode(self.single.linear_layout, batch * t_new, self.single.row_plan):
                out = self.model(input_ids=input_ids, **kwargs)
        except BaseException:
            self._select_columns(n_old)   # layers may have been extended unevenly
            raise
        self._pos = k_pos
        for r, t in enumerate(toks):
            self._cells[r].extend(range(n_old + t_new - len(t), n_old + t_new))
        if wanted is None:
            return None
        logits = out.logits                     # [B, T or 1, V]
        # Rows of the packed output, gathered by indices built on the host (a boolean mask would sync).
        if wanted == "last":
            index = [r for r, t in enumerate(toks) if t]
            flat = logits[:, -1]
        else:
            index = [r * t_new + c for r, t in enumerate(toks) for c in range(t_new - len(t), t_new)]
            flat = logits.reshape(batch * t_new, logits.shape[-1])
        if len(index) < flat.shape[0]:
            flat = flat.index_select(0, torch.tensor(index, dtype=torch.long).to(flat.device, non_blocking=True))
        return flat.to(dtype=self._out_dtype)

    def __repr__(self) -> str:
        return f"HFBatchBackend({self.single.name!r}, batch_size={self.batch_size}, dtype={self.dtype})"


# --------------------------------------------------------------------------------------------------
# llama.cpp


class LlamaBatchBackend(_TextOf):
    """``B`` rows of a GGUF model in one llama.cpp context, row ``r`` = sequence ``r`` (module docstring).

    ``n_ctx``: context per row (the shared KV buffer holds ``B x n_ctx`` cells). ``n_threads``,
    ``n_batch``, ``n_ubatch`` as for :class:`~verispec.models.llama.LlamaBackend`.

    ``invariant=True``: batch-invariant rows. Each row is its own single-sequence context on the one
    loaded model (:meth:`~verispec.models.llama.LlamaBackend.sibling`, the context of ``batch_size=1``),
    and a forward decodes the rows one after another, one ``llama_decode`` per row. A row's logits are
    then bitwise those of the same row at ``batch_size=1``, whatever its neighbours: outputs do not
    depend on the batch size. The cost: no batched matrix products (a step costs the sum of the rows'
    single-sequence forwards; ``benchmarks/batch_invariance.py`` measures it) and one context (KV cache,
    logits buffer) per row; the weights are loaded once.
    """

    def __init__(self, model_path: str | os.PathLike, *, batch_size: int, n_ctx: int = 4096,
                 n_threads: int | None = None, n_batch: int = 512, n_ubatch: int | None = None,
                 invariant: bool = False) -> None:
        from .llama import LlamaBackend

        try:
            import llama_cpp
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("LlamaBatchBackend needs llama-cpp-python: pip install 'verispec[llama]'") from e
        lc = llama_cpp.llama_cpp if hasattr(llama_cpp, "llama_cpp") else llama_cpp
        self.batch_size = _check_batch_size(batch_size, int(lc.llama_max_parallel_sequences()))
        if isinstance(n_ctx, bool) or int(n_ctx) < 1:
            raise ValueError(f"n_ctx must be a positive number of tokens per row, got {n_ctx}")
        self.invariant = bool(invariant)
        if self.invariant:      # the context of batch_size=1, once per row, on one model
            self.single = LlamaBackend(model_path, n_ctx=int(n_ctx), n_threads=n_threads, n_batch=n_batch,
                                       n_ubatch=n_ubatch, max_tree_nodes=0)
            self._rows: RowsOfBackends | None = RowsOfBackends(
                [self.single] + [self.single.sibling() for _ in range(self.batch_size - 1)])
        else:
            # LlamaBackend's tree context: n_seq_max = max_tree_nodes + 1 sequences on one (unified) KV buffer.
            self.single = LlamaBackend(model_path, n_ctx=self.batch_size * int(n_ctx), n_threads=n_threads,
                                       n_batch=n_batch, n_ubatch=n_ubatch, max_tree_nodes=self.batch_size - 1)
            self._rows = None
        s = self.single
        self._lc, self._ctx, self._batch = s._lc, s._ctx, s._batch
        self.n_batch, self.n_threads, self.path = s.n_batch, s.n_threads, s.path
        self.name = f"{s.name} (batch {self.batch_size}{', invariant' if self.invariant else ''})"
        self.vocab_size, self.tokenizer_size, self.eos_token_ids = s.vocab_size, s.tokenizer_size, s.eos_token_ids
        self.context_length = int(n_ctx)
        self.logits_device = torch.device("cpu")
        self._n = [0] * self.batch_size

    def row_length(self, row: int) -> int:
        return self._rows.row_length(row) if self._rows is not None else self._n[row]

    def one_sequence(self, max_tree_nodes: int = 255) -> Any:
        """A single-sequence :class:`~verispec.models.llama.LlamaBackend` of ``n_ctx`` tokens and draft trees
        of up to ``max_tree_nodes`` branch nodes, a context of its own on the loaded model (no second copy
        of the weights); its calls compute what a backend loaded alone with those settings computes."""
        return self.single.sibling(n_ctx=self.context_length, max_tree_nodes=max_tree_nodes)

    def reset(self) -> None:
        if self._rows is not None:
            self._rows.reset()
            return
        self._ctx.kv_cache_clear()
        self._n = [0] * self.batch_size

    def rollback_row(self, row: int, length: int) -> None:
        if self._rows is not None:
            self._rows.rollback_row(row, length)
            return
        check_rollback_length(length, self._n[_check_row(self, row)])
        if not self._ctx.kv_cache_seq_rm(row, length, -1):
            raise RuntimeError(f"{self.name}: llama.cpp refused to truncate row {row} to {length} tokens")
        self._n[row] = length

    def reset_row(self, row: int) -> None:
        self.rollback_row(row, 0)

    def forward_rows(self, tokens: Sequence[Sequence[int]], *, last_only: bool = False) -> torch.Tensor:
        """Packed float32 CPU logits of the rows' new tokens (module docstring)."""
        if self._rows is not None:
            return self._rows.forward_rows(tokens, last_only=last_only)
        toks = _check_rows(self, tokens)
        entries = [(r, k, t) for r, row in enumerate(toks) for k, t in enumerate(row)]
        n_out = sum(1 for r, k, _ in entries if not last_only or k == len(toks[r]) - 1)
        n_vocab = self.vocab_size
        out = torch.empty((n_out, n_vocab), dtype=torch.float32)
        out_np = out.numpy()
        lc, ctx, b = self._lc, self._ctx.ctx, self._batch.batch
        before, filled = list(self._n), 0
        try:
            for start in range(0, len(entries), self.n_batch):
                block = entries[start: start + self.n_batch]
                wanted = 0
                for i, (r, k, t) in enumerate(block):
                    b.token[i] = t
                    b.pos[i] = before[r] + k
                    b.n_seq_id[i] = 1
                    b.seq_id[i][0] = r
                    flag = not last_only or k == len(toks[r]) - 1
                    b.logits[i] = flag
                    wanted += flag
                b.n_tokens = len(block)
                rc = lc.llama_decode(ctx, b)
                if rc != 0:
                    raise RuntimeError(f"{self.name}: llama_decode returned {rc}")
                if wanted:
                    rows = np.ctypeslib.as_array(lc.llama_get_logits(ctx), shape=(wanted, n_vocab))
                    out_np[filled: filled + wanted] = rows
                    filled += wanted
        except BaseException:
            for r, n in enumerate(before):      # forget this call's cells (a failed decode may keep some)
                self._ctx.kv_cache_seq_rm(r, n, -1)
            raise
        self._n = [n + len(t) for n, t in zip(before, toks)]
        return out

    def close(self) -> None:
        if self._rows is not None:
            for be in self._rows.rows[1:]:     # the siblings before the backend holding the model
                be.close()
        self.single.close()

    def __repr__(self) -> str:
        return (f"LlamaBatchBackend({str(self.path)!r}, batch_size={self.batch_size}, n_ctx={self.context_length}"
                + (", invariant=True)" if self.invariant else ")"))


# --------------------------------------------------------------------------------------------------
# one single-sequence backend per row


class RowsOfBackends(_TextOf):
    """``B`` single-sequence backends as the rows of a batch, run one after another (the reference
    implementation of the protocol; any :class:`Backend`, e.g. the fake models of the tests)."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        if not backends:
            raise ValueError("RowsOfBackends needs at least one backend")
        self.rows = list(backends)
        self.single = self.rows[0]
        self.batch_size = len(self.rows)
        self.name = f"{self.single.name} (batch {self.batch_size})"
        self.vocab_size, self.eos_token_ids = self.single.vocab_size, self.single.eos_token_ids
        self.context_length = min(be.context_length for be in self.rows)
        if hasattr(self.single, "tokenizer_size"):
            self.tokenizer_size = self.single.tokenizer_size
        self.logits_device = torch.device(getattr(self.single, "logits_device", "cpu"))

    def row_length(self, row: int) -> int:
        return self.rows[row].n_cached

    def one_sequence(self) -> Any:
        """Another sequence on the first row's model (its ``sibling``), when its backend has one."""
        sibling = getattr(self.single, "sibling", None)
        if sibling is None:
            raise NotImplementedError(f"{self.single.name}: no single-sequence sibling sharing its weights")
        return sibling()

    def reset(self) -> None:
        for be in self.rows:
            be.reset()

    def rollback_row(self, row: int, length: int) -> None:
        self.rows[_check_row(self, row)].rollback(length)

    def reset_row(self, row: int) -> None:
        self.rows[_check_row(self, row)].reset()

    def forward_rows(self, tokens: Sequence[Sequence[int]], *, last_only: bool = False) -> torch.Tensor:
        toks = _check_rows(self, tokens)
        return torch.cat([be.forward(t, all_logits=not last_only) for be, t in zip(self.rows, toks) if t])
