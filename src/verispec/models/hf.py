"""transformers backend: ``AutoModelForCausalLM`` with a ``DynamicCache`` that is cropped on rollback.

Draft trees: the open tree's nodes sit in the cache after the committed prefix, in insertion order. A
tree forward passes a 4-D additive mask ``[1, 1, n_new, n_cached + n_tree + n_new]`` (0 where a node may
attend: the prefix, its ancestors, itself; the dtype's minimum elsewhere), which transformers hands to
the attention as is, and ``position_ids = n_cached + depth``. Commit keeps the prefix plus the path's
cache entries. A chain from the cache end is decoded as ``forward`` (no mask) and committed by cropping.
"""

from __future__ import annotations

import copy
import inspect
import os
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .base import (
    TREE_ROOT,
    check_forward_tokens,
    check_rollback_length,
    check_tree_nodes,
    check_tree_path,
    tree_open_error,
)
from .cpu_linear import cached_plan, linear_mode, resolve_linear_layout

# Token strings that end a turn/sequence in common chat models (added to the configured EOS ids).
_EOG_STRINGS = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
)


_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()
_ANY_TOKENIZER = threading.RLock()


def tokenizer_lock(tokenizer: Any) -> threading.RLock:
    """The lock every call into ``tokenizer`` holds. A fast (Rust) tokenizer is not safe to call from two
    threads at once (an encode that sets truncation or padding borrows it mutably: "Already borrowed"),
    and one tokenizer object is shared by a target, its draft, their batched backends and siblings,
    which a server calls from its engine threads and its event loop: the lock belongs to the object."""
    with _LOCKS_GUARD:
        try:
            lock = _LOCKS.get(tokenizer)
            if lock is None:
                lock = _LOCKS[tokenizer] = threading.RLock()
        except TypeError:       # not weakly referenceable: one lock for all such tokenizers
            return _ANY_TOKENIZER
    return lock


def _as_id_set(x: Any) -> set[int]:
    if x is None:
        return set()
    if isinstance(x, (list, tuple, set, frozenset)):
        return {int(i) for i in x if i is not None}
    if isinstance(x, torch.Tensor):
        return {int(i) for i in x.flatten().tolist()}
    return {int(x)}


class HFBackend:
    """A transformers causal LM (batch 1) with an incrementally extended, croppable KV cache.

    ``model_or_id``: a hub id, a local directory, a GGUF file (directory/id plus ``gguf_file=``, or
    a path to a ``.gguf`` file directly), or an already-built ``PreTrainedModel``. ``tokenizer``: a
    tokenizer object, a hub id / directory to load one from, or None (then loaded alongside the model
    when ``model_or_id`` is a string; stays None for a model object and ``tokenize`` raises).

    ``dtype``: torch dtype (or its name, e.g. ``"float64"``) to convert the model to; None keeps the
    loaded dtype. Logits are returned as float32, or float64 when the model runs in float64, on
    :attr:`logits_device` (the device of the output layer): the engine samples and verifies there and
    copies only token ids and counts to the host.

    ``device_map``: placement of a model loaded by name over several devices (``"auto"``,
    ``"balanced"`` or a dict as in transformers' ``from_pretrained``; needs ``accelerate``), for a
    target too large for one GPU; ``device`` is then ignored: inputs go to the embedding layer's
    device, logits come from the output layer's.

    ``linear_layout``: how linear layers of a few input rows (verification blocks, trees) are computed:
    ``"standard"`` (``F.linear``), ``"weight-major"`` (``(W @ x.T).T``, which streams each weight once
    where the BLAS's small-row product does not; see :mod:`verispec.models.cpu_linear`), or ``"auto"``
    (default): timed once on this machine for CPU float32 models, ``"standard"`` otherwise. The
    resolved choice is :attr:`linear_layout`; with ``"weight-major"``, :attr:`row_plan` says how each
    number of rows is computed (timed: some row counts are faster padded with zero rows to a count
    whose kernel is faster, :func:`~verispec.models.cpu_linear.plan_rows`, measured once per machine and
    model shape, :func:`~verispec.models.cpu_linear.cached_plan`; ``row_plan`` given: that plan, e.g.
    another backend's of the same model). The model object is not changed.

    ``capture_hidden``: layer indices as in ``output_hidden_states`` (0 = embedding output, ``L`` = the
    last layer's output after the final norm, negative from the end). Then :attr:`last_hidden` holds the
    hidden states of the tokens of the last ``forward``/``forward_tree`` call at those layers,
    concatenated: ``[len(tokens), len(capture_hidden) * hidden_size]`` float32 on the CPU (None when not
    captured); e.g. the low/mid/high layer states an EAGLE-3 draft head reads.
    """

    def __init__(
        self,
        model_or_id: Any,
        *,
        tokenizer: Any = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        gguf_file: str | os.PathLike | None = None,
        capture_hidden: Sequence[int] | None = None,
        device_map: str | dict | None = None,
        linear_layout: str = "auto",
        row_plan: tuple[tuple[int, bool], ...] | None = None,
    ) -> None:
        import transformers

        dtype = _dtype(dtype)
        self.device = _device(device)

        if isinstance(model_or_id, (str, os.PathLike)):
            src = str(model_or_id)
            if gguf_file is None and src.endswith(".gguf"):
                p = Path(src).expanduser()
                if not p.is_file():
                    raise FileNotFoundError(f"GGUF file not found: {p}")
                src, gguf_file = str(p.parent), p.name
            kw: dict[str, Any] = {}
            if gguf_file is not None:
                kw["gguf_file"] = str(gguf_file)
            placed = {"device_map": device_map} if device_map is not None else {}
            if device_map is not None and dtype is not None:
                placed["dtype"] = dtype      # convert while loading: a split model is not moved afterwards
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(src, **kw, **placed)
                if tokenizer is None:
                    tokenizer = transformers.AutoTokenizer.from_pretrained(src, **kw)
            except (OSError, ValueError, KeyError, TypeError) as exc:   # bad config.json, missing files, offline hub
                raise ValueError(_load_error(src, exc)) from None
            self.name = f"hf:{src}" + (f"/{gguf_file}" if gguf_file is not None else "")
        else:
            if device_map is not None:
                raise ValueError("device_map places a model while loading it: pass a hub id or a directory, "
                                 "or place the model object yourself and leave device_map out")
            model = model_or_id
            cfg = getattr(model, "config", None)
            self.name = f"hf:{getattr(cfg, 'name_or_path', '') or type(model).__name__}"
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer))

        if device_map is None:
            if dtype is not None:
                model = model.to(dtype=dtype)
            model = model.to(self.device)
        else:   # inputs enter at the embedding layer's device
            self.device = model.get_input_embeddings().weight.device
        model.eval()
        self.model = model
        self.tokenizer = tokenizer
        self.dtype: torch.dtype = next(model.parameters()).dtype
        #: "standard" or "weight-major": how this backend's multi-row model calls compute linear layers
        self.linear_layout: str = resolve_linear_layout(linear_layout, model)
        #: with the weight-major layout: per number of rows, the rows computed and whether weight-major
        self.row_plan = None if self.linear_layout != "weight-major" else row_plan or cached_plan(model)
        self._out_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32

        cfg = model.config
        out_emb = model.get_output_embeddings()
        self.vocab_size: int = int(out_emb.weight.shape[0]) if out_emb is not None else int(cfg.vocab_size)
        #: where :meth:`forward` returns logits (the output layer's device; the last one of a split model)
        self.logits_device: torch.device = out_emb.weight.device if out_emb is not None else self.device
        self.tokenizer_size: int = len(tokenizer) if tokenizer is not None else self.vocab_size
        self.context_length: int = int(
            getattr(cfg, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", 4096)
        )
        self.eos_token_ids: frozenset[int] = frozenset(i for i in self._find_eos_ids() if 0 <= i < self.vocab_size)

        params = inspect.signature(model.forward).parameters
        # transformers 5.x renamed ``past_key_values`` to ``cache`` (old name deprecated).
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        n_states = int(cfg.get_text_config(decoder=True).num_hidden_layers) + 1
        self.capture_hidden: list[int] | None = None
        if capture_hidden is not None:
            layers = [int(i) for i in capture_hidden]
            bad = [i for i in layers if not -n_states <= i < n_states]
            if not layers or bad:
                raise ValueError(
                    f"capture_hidden must be a non-empty list of hidden-state indices in {-n_states}..{n_states - 1} "
                    f"(0 = embeddings, {n_states - 1} = last layer), got {list(capture_hidden)}"
                )
            self.capture_hidden = [i % n_states for i in layers]
        self.last_hidden: torch.Tensor | None = None
        self._cache = None
        self._n = 0
        self._drop_tree()

    # -- metadata --------------------------------------------------------------------------------
    def _find_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        ids |= _as_id_set(getattr(self.model.config, "eos_token_id", None))
        gen = getattr(self.model, "generation_config", None)
        if gen is not None:
            ids |= _as_id_set(getattr(gen, "eos_token_id", None))
        tok = self.tokenizer
        if tok is not None:
            ids |= _as_id_set(getattr(tok, "eos_token_id", None))
            # Only special/added tokens count: e.g. "</s>" is an ordinary text token in Qwen's vocabulary.
            added = {str(t): int(i) for i, t in getattr(tok, "added_tokens_decoder", {}).items()}
            for s in _EOG_STRINGS:
                if s in added:
                    ids.add(added[s])
        return ids

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise RuntimeError(
                f"{self.name} was built without a tokenizer; pass tokenizer=... to HFBackend to tokenize text"
            )
        return self.tokenizer

    # -- text ------------------------------------------------------------------------------------
    # Every tokenizer call holds the tokenizer's lock (tokenizer_lock): these run on several threads at once.
    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        tok = self._need_tokenizer()
        with tokenizer_lock(tok):
            return list(tok.encode(text, add_special_tokens=add_special))

    def detokenize(self, ids: Sequence[int]) -> str:
        tok = self._need_tokenizer()
        ids = [int(i) for i in ids]
        with tokenizer_lock(tok):
            return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def token_piece(self, token_id: int) -> str:
        tok = self._need_tokenizer()
        if not 0 <= token_id < self.tokenizer_size:
            return ""
        with tokenizer_lock(tok):
            return tok.decode([int(token_id)], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        tok = self._need_tokenizer()
        if not getattr(tok, "chat_template", None):
            raise ValueError(f"the tokenizer of {self.name} has no chat template")
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": user_message}
        ]
        with tokenizer_lock(tok):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenize(text, add_special=False)

    def sibling(self) -> "HFBackend":
        """Another sequence on the same model object and tokenizer (no second copy of the weights), with
        a KV cache of its own and this backend's settings (linear layout, row plan, hidden capture):
        what a batched backend lends for single-sequence decoding (trees, prompt lookup). Calls on
        different siblings may run on different threads at once (inference only reads the module)."""
        twin = copy.copy(self)
        twin.last_hidden = None
        twin.reset()
        return twin

    # -- cache -----------------------------------------------------------------------------------
    @property
    def n_cached(self) -> int:
        return self._n

    @property
    def n_tree(self) -> int:
        return len(self._t_parent)

    def _drop_tree(self) -> None:
        self._t_parent: list[int] = []  # per open-tree node: parent id (TREE_ROOT for a root)
        self._t_depth: list[int] = []  # per node: depth (roots 0); position = n_cached + depth
        self._t_chain = True  # node i's parent is i - 1 for every node: plain causal decoding applies

    def reset(self) -> None:
        self._cache = None
        self._n = 0
        self._drop_tree()

    def _layers(self) -> list[Any]:
        """The cache's per-layer objects with ``keys``/``values`` ``[batch, heads, seq, head_dim]``."""
        layers = getattr(self._cache, "layers", None)
        if layers is None:  # transformers 4.x: parallel lists
            raise NotImplementedError(f"{self.name}: tree decoding needs a transformers 5 DynamicCache (cache.layers)")
        if any(getattr(layer, "is_sliding", False) for layer in layers):
            raise NotImplementedError(f"{self.name}: tree decoding does not support sliding-window cache layers")
        return list(layers)

    def _cache_length(self) -> int:
        return 0 if self._cache is None else int(self._cache.get_seq_length())

    def _truncate(self, length: int) -> None:
        """Cut every layer of the cache to its first ``length`` entries (layers may differ after an error)."""
        if self._cache is None:
            return
        if length == 0:
            self._cache = None
            return
        layers = getattr(self._cache, "layers", None)
        if layers is None:
            drop = length - self._cache_length()
            if drop:
                self._cache.crop(drop)
            return
        for layer in layers:
            keys = getattr(layer, "keys", None)
            if keys is not None and keys.dim() == 4 and keys.shape[-2] > length:
                layer.keys = keys[..., :length, :]
                layer.values = layer.values[..., :length, :]

    def rollback(self, length: int) -> None:
        check_rollback_length(length, self._n)
        total = self._n + len(self._t_parent)
        self._drop_tree()
        if length == 0:
            self.reset()
        elif length < total:
            self._cache.crop(length - total)  # negative = number of tokens to drop (all versions)
        self._n = length

    def _ensure_cache(self) -> None:
        if self._cache is None:
            from transformers import DynamicCache

            try:
                self._cache = DynamicCache(config=self.model.config)
            except TypeError:  # older transformers: no config argument
                self._cache = DynamicCache()

    def _run(self, toks: list[int], positions: list[int] | range, mask: torch.Tensor | None, last_only: bool):
        """One model call appending ``toks`` to the cache; logits ``[len(toks) or 1, vocab]`` in the model's
        dtype. On an error the cache is cut back to what it held before."""
        self._ensure_cache()
        before = self._cache_length()
        input_ids = torch.tensor([toks], dtype=torch.long, device=self.device)
        position_ids = torch.tensor([list(positions)], dtype=torch.long, device=self.device)
        kwargs: dict[str, Any] = {self._cache_kw: self._cache, "use_cache": True, "position_ids": position_ids}
        if mask is not None:
            kwargs["attention_mask"] = mask
        if last_only and self._keep_kw is not None:
            kwargs[self._keep_kw] = 1
        if self.capture_hidden is not None:
            kwargs["output_hidden_states"] = True
        self.last_hidden = None
        try:
            with linear_mode(self.linear_layout, len(toks), self.row_plan):
                out = self.model(input_ids=input_ids, **kwargs)
        except BaseException:
            self._truncate(before)  # layers may have been extended unevenly
            raise
        if self.capture_hidden is not None:
            states = out.hidden_states
            self.last_hidden = torch.cat([states[i][0] for i in self.capture_hidden], dim=-1).to(
                device="cpu", dtype=torch.float32
            )
        logits = out.logits[0]
        return logits[-1:] if last_only else logits

    @torch.inference_mode()
    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> torch.Tensor:
        """Append ``tokens``; float logits ``[len(tokens), vocab_size]`` or ``[1, vocab_size]`` (last row)."""
        if self._t_parent:
            raise tree_open_error(self.name)
        toks = check_forward_tokens(tokens, self._n, self.context_length, self.vocab_size)
        logits = self._run(toks, range(self._n, self._n + len(toks)), None, last_only=not all_logits)
        self._n += len(toks)
        return logits.to(dtype=self._out_dtype).clone()

    @torch.inference_mode()
    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Append draft-tree nodes (see :mod:`verispec.models.base`); logits ``[len(tokens), vocab_size]``."""
        toks, pars, depths = check_tree_nodes(
            tokens, parents, self._t_depth, self._n, self.context_length, self.vocab_size
        )
        n, n_old, m = self._n, len(self._t_parent), len(toks)
        par = self._t_parent + pars
        chain = self._t_chain and all(par[k] == k - 1 for k in range(n_old, n_old + m))
        if chain:
            mask = None
        else:
            self._ensure_cache()
            self._layers()  # refuse caches whose entries cannot be selected (before any state changes)
            # [1, 1, m, n + n_old + m]: the prefix and each node's ancestors-or-self are visible.
            visible = torch.zeros((m, n + n_old + m), dtype=torch.bool)
            visible[:, :n] = True
            for i in range(m):
                k = n_old + i
                while k != TREE_ROOT:
                    visible[i, n + k] = True
                    k = par[k]
            mask = torch.full(visible.shape, torch.finfo(self.dtype).min, dtype=self.dtype)
            mask.masked_fill_(visible, 0.0)
            mask = mask[None, None].to(self.device)
        logits = self._run(toks, [n + d for d in depths], mask, last_only=False)
        self._t_parent = par
        self._t_depth = self._t_depth + depths
        self._t_chain = chain
        return logits.to(dtype=self._out_dtype).clone()

    def commit_tree_path(self, path: Sequence[int]) -> None:
        """Keep the root-down node ids ``path`` as committed tokens and drop the rest of the open tree."""
        ids = check_tree_path(path, self._t_parent)
        n, total = self._n, self._n + len(self._t_parent)
        if ids == list(range(len(ids))):  # a prefix of the node order, e.g. of a chain: crop
            if n + len(ids) < total:
                if n + len(ids) == 0:
                    self._cache = None
                else:
                    self._cache.crop(n + len(ids) - total)
        else:
            keep = torch.tensor(list(range(n)) + [n + i for i in ids], dtype=torch.long)
            for layer in self._layers():
                keys = getattr(layer, "keys", None)
                if keys is None or keys.dim() != 4:
                    continue
                idx = keep.to(keys.device)
                layer.keys = keys.index_select(-2, idx)
                layer.values = layer.values.index_select(-2, idx)
        self._n = n + len(ids)
        self._drop_tree()

    def __repr__(self) -> str:
        return f"HFBackend({self.name!r}, vocab_size={self.vocab_size}, dtype={self.dtype})"


#: ``--dtype`` values of transformers models
DTYPES = ("float32", "float16", "bfloat16", "float64")


def _dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if not isinstance(dtype, str):
        return dtype
    name = dtype.strip().lower().removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is not a dtype of transformers models here: use one of "
                         f"{', '.join(DTYPES)}")
    return getattr(torch, name)


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {device!r} is not a torch device: use cpu, cuda, cuda:1, mps, ...") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch sees no CUDA GPU (torch {torch.__version__}); "
                         "use --device cpu")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"--device {device}: MPS is not available here; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return dev


def _load_error(src: str, exc: BaseException) -> str:
    """One line: which model could not be loaded, transformers' reason, and what to do."""
    reason = " ".join(str(exc).split())[:300].rstrip(".") or type(exc).__name__
    if Path(src).expanduser().is_dir():
        hint = ("the directory must hold a transformers model: config.json (valid JSON naming its model_type), "
                "the weights (*.safetensors or *.bin) and the tokenizer files")
    else:
        hint = ("a hub id needs network access (or the model in the Hugging Face cache); offline, pass the model's "
                "local directory or a .gguf file")
    return f"cannot load the transformers model {src}: {reason}; {hint}"
