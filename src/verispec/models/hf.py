"""transformers backend: ``AutoModelForCausalLM`` with a ``DynamicCache`` that is cropped on rollback."""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .base import check_forward_tokens, check_rollback_length

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
    loaded dtype. Logits are returned as float32, or float64 when the model runs in float64.
    """

    def __init__(
        self,
        model_or_id: Any,
        *,
        tokenizer: Any = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        gguf_file: str | os.PathLike | None = None,
    ) -> None:
        import transformers

        if isinstance(dtype, str):
            dtype = getattr(torch, dtype.removeprefix("torch."))
        self.device = torch.device(device)

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
            model = transformers.AutoModelForCausalLM.from_pretrained(src, **kw)
            if tokenizer is None:
                tokenizer = transformers.AutoTokenizer.from_pretrained(src, **kw)
            self.name = f"hf:{src}" + (f"/{gguf_file}" if gguf_file is not None else "")
        else:
            model = model_or_id
            cfg = getattr(model, "config", None)
            self.name = f"hf:{getattr(cfg, 'name_or_path', '') or type(model).__name__}"
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer))

        if dtype is not None:
            model = model.to(dtype=dtype)
        model = model.to(self.device)
        model.eval()
        self.model = model
        self.tokenizer = tokenizer
        self.dtype: torch.dtype = next(model.parameters()).dtype
        self._out_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32

        cfg = model.config
        out_emb = model.get_output_embeddings()
        self.vocab_size: int = int(out_emb.weight.shape[0]) if out_emb is not None else int(cfg.vocab_size)
        self.tokenizer_size: int = len(tokenizer) if tokenizer is not None else self.vocab_size
        self.context_length: int = int(
            getattr(cfg, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", 4096)
        )
        self.eos_token_ids: frozenset[int] = frozenset(i for i in self._find_eos_ids() if 0 <= i < self.vocab_size)

        params = inspect.signature(model.forward).parameters
        # transformers 5.x renamed ``past_key_values`` to ``cache`` (old name deprecated).
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self._cache = None
        self._n = 0

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
    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return list(self._need_tokenizer().encode(text, add_special_tokens=add_special))

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._need_tokenizer().decode(
            [int(i) for i in ids], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def token_piece(self, token_id: int) -> str:
        tok = self._need_tokenizer()
        if not 0 <= token_id < len(tok):
            return ""
        return tok.decode([int(token_id)], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        tok = self._need_tokenizer()
        if not getattr(tok, "chat_template", None):
            raise ValueError(f"the tokenizer of {self.name} has no chat template")
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": user_message}
        ]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenize(text, add_special=False)

    # -- cache -----------------------------------------------------------------------------------
    @property
    def n_cached(self) -> int:
        return self._n

    def reset(self) -> None:
        self._cache = None
        self._n = 0

    def rollback(self, length: int) -> None:
        check_rollback_length(length, self._n)
        if length == self._n:
            return
        if length == 0:
            self.reset()
            return
        self._cache.crop(length - self._n)  # negative = number of tokens to drop (all versions)
        self._n = length

    @torch.inference_mode()
    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> torch.Tensor:
        """Append ``tokens``; float logits ``[len(tokens), vocab_size]`` or ``[1, vocab_size]`` (last row)."""
        toks = check_forward_tokens(tokens, self._n, self.context_length, self.vocab_size)
        if self._cache is None:
            from transformers import DynamicCache

            try:
                self._cache = DynamicCache(config=self.model.config)
            except TypeError:  # older transformers: no config argument
                self._cache = DynamicCache()
        n = len(toks)
        input_ids = torch.tensor([toks], dtype=torch.long, device=self.device)
        position_ids = torch.arange(self._n, self._n + n, dtype=torch.long, device=self.device).unsqueeze(0)
        kwargs: dict[str, Any] = {self._cache_kw: self._cache, "use_cache": True, "position_ids": position_ids}
        if not all_logits and self._keep_kw is not None:
            kwargs[self._keep_kw] = 1
        try:
            out = self.model(input_ids=input_ids, **kwargs)
        except BaseException:
            self.reset()  # layers may have been extended unevenly; the cache is no longer trustworthy
            raise
        self._n += n
        logits = out.logits[0]
        if not all_logits:
            logits = logits[-1:]
        return logits.to(device="cpu", dtype=self._out_dtype).clone()

    def __repr__(self) -> str:
        return f"HFBackend({self.name!r}, vocab_size={self.vocab_size}, dtype={self.dtype})"
