"""llama.cpp backend (GGUF models) through llama-cpp-python's low-level API.

``llama_cpp.Llama`` is used only to load the model, create the context and read metadata. Decoding
goes straight through ``llama_decode`` with per-position output flags, and logits are read as a numpy
view of ``llama_get_logits`` (only the rows of the new block are copied; ``Llama.eval``'s
``n_ctx x n_vocab`` score buffer is never touched). Rollback removes positions from the KV cache with
``llama_memory_seq_rm``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .base import check_forward_tokens, check_rollback_length

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_threads() -> int:
    """``$VERISPEC_THREADS`` if set, else all available cores (llama-cpp-python's default is half)."""
    env = os.environ.get("VERISPEC_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"VERISPEC_THREADS must be a positive integer, got {env!r}") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class LlamaBackend:
    """A GGUF model run by llama.cpp on the CPU, one sequence, with exact KV-cache truncation.

    ``n_ctx``: context (KV cache) size in tokens = ``context_length``. ``n_threads``: decode threads
    (default: ``$VERISPEC_THREADS``, else all cores; on a machine busy with other work, 1 thread can be
    much faster, since llama.cpp's threads synchronise at a spinning barrier after every op).
    ``n_batch``: the largest block decoded at once (longer inputs are split).
    ``seed``: llama.cpp RNG seed (unused by ``forward``; kept for reproducibility of anything sampled
    inside llama.cpp).
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        seed: int = 0,
    ) -> None:
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"GGUF model file not found: {path}")
        try:
            import llama_cpp
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "LlamaBackend needs llama-cpp-python: pip install 'verispec[llama]'"
            ) from e
        self._lc = llama_cpp.llama_cpp if hasattr(llama_cpp, "llama_cpp") else llama_cpp

        threads = int(n_threads) if n_threads else default_threads()
        n_batch = max(1, min(int(n_batch), int(n_ctx)))
        self._llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=int(n_ctx),
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_threads=threads,
            n_threads_batch=threads,
            seed=int(seed),
            logits_all=False,
            verbose=False,
        )
        self.name = f"llama.cpp:{path}"
        self.path = path
        self.n_threads = threads
        self.n_batch = n_batch
        self._ctx = self._llm._ctx
        self._model = self._llm._model
        self._vocab = self._model.vocab
        self._batch = self._llm._batch  # llama_batch with room for n_batch tokens

        self.vocab_size: int = int(self._llm.n_vocab())
        self.tokenizer_size: int = self.vocab_size  # GGUF vocabularies include their padding tokens
        self.context_length: int = int(self._lc.llama_n_ctx(self._ctx.ctx))
        self.eos_token_ids: frozenset[int] = self._find_eog_ids()
        self.add_bos: bool = bool(self._model.add_bos_token())
        self.metadata: dict[str, str] = dict(self._llm.metadata)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._n = 0
        self._ctx.kv_cache_clear()

    # -- metadata --------------------------------------------------------------------------------
    def _find_eog_ids(self) -> frozenset[int]:
        # llama.cpp's end-of-generation set, minus ordinary text tokens it adds by string match
        # (e.g. Qwen's plain "</s>" token 128247): only special (non-NORMAL) tokens, plus EOS/EOT.
        lc, vocab = self._lc, self._vocab
        normal = lc.LLAMA_TOKEN_ATTR_NORMAL
        ids = {
            i
            for i in range(self.vocab_size)
            if lc.llama_vocab_is_eog(vocab, i) and not (lc.llama_vocab_get_attr(vocab, i) & normal)
        }
        for i in (self._model.token_eos(), self._model.token_eot()):
            if 0 <= i < self.vocab_size:
                ids.add(int(i))
        return frozenset(ids)

    # -- text ------------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS if the model wants one. Special-token text
        (e.g. ``<|im_end|>``) is parsed into its special id only by :meth:`chat_prompt`."""
        return self._model.tokenize(text.encode("utf-8"), add_special and self.add_bos, False)

    def _piece_bytes(self, token_id: int, special: bool) -> bytes:
        buf = self._piece_buf
        n = self._lc.llama_token_to_piece(self._vocab, int(token_id), buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lc.llama_token_to_piece(self._vocab, int(token_id), buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, ids: Sequence[int]) -> str:
        return b"".join(self._piece_bytes(i, False) for i in ids).decode("utf-8", errors="replace")

    def token_piece(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            return ""
        if self._lc.llama_vocab_get_attr(self._vocab, int(token_id)) & self._lc.LLAMA_TOKEN_ATTR_UNUSED:
            # llama.cpp renders unused (padding) tokens as "", transformers as their name, e.g. "[PAD151665]"
            return self._model.token_get_text(int(token_id))
        return self._piece_bytes(token_id, True).decode("utf-8", errors="replace")

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        """Render the GGUF's ``tokenizer.chat_template`` (ChatML if absent) and tokenize it, specials parsed."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.metadata.get("tokenizer.chat_template") or CHATML_TEMPLATE
        eos, bos = self._model.token_eos(), self._model.token_bos()
        formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._model.token_get_text(eos) if eos >= 0 else "",
            bos_token=self._model.token_get_text(bos) if bos >= 0 else "",
            add_generation_prompt=True,
        )
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": user_message}
        ]
        text = formatter(messages=messages).prompt
        ids = self._model.tokenize(text.encode("utf-8"), False, True)
        if self.add_bos and bos >= 0 and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    # -- cache -----------------------------------------------------------------------------------
    @property
    def n_cached(self) -> int:
        return self._n

    def reset(self) -> None:
        self._ctx.kv_cache_clear()
        self._n = 0

    def rollback(self, length: int) -> None:
        check_rollback_length(length, self._n)
        # Always ask llama.cpp (cheap), so the cache is right even if something else decoded into it.
        if not self._ctx.kv_cache_seq_rm(0, length, -1):
            raise RuntimeError(f"{self.name}: llama.cpp refused to truncate the KV cache to {length} tokens")
        self._n = length

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> torch.Tensor:
        """Append ``tokens``; float32 logits ``[len(tokens), vocab_size]`` or ``[1, vocab_size]`` (last row)."""
        toks = check_forward_tokens(tokens, self._n, self.context_length, self.vocab_size)
        n_vocab = self.vocab_size
        out = torch.empty((len(toks) if all_logits else 1, n_vocab), dtype=torch.float32)
        out_np = out.numpy()
        b = self._batch.batch
        n0, row = self._n, 0
        for start in range(0, len(toks), self.n_batch):
            chunk = toks[start : start + self.n_batch]
            m = len(chunk)
            last_chunk = start + m == len(toks)
            for i, t in enumerate(chunk):
                b.token[i] = t
                b.pos[i] = self._n + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = all_logits
            b.logits[m - 1] = all_logits or last_chunk
            b.n_tokens = m
            rc = self._lc.llama_decode(self._ctx.ctx, b)
            if rc != 0:
                # Leave the cache as it was before this call (a failed decode may have kept part of it).
                self._ctx.kv_cache_seq_rm(0, n0, -1)
                self._n = n0
                raise RuntimeError(f"{self.name}: llama_decode returned {rc}")
            self._n += m
            if all_logits:
                ptr = self._lc.llama_get_logits(self._ctx.ctx)
                out_np[row : row + m] = np.ctypeslib.as_array(ptr, shape=(m, n_vocab))
                row += m
            elif last_chunk:
                ptr = self._lc.llama_get_logits_ith(self._ctx.ctx, -1)
                out_np[0] = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
        return out

    def close(self) -> None:
        """Free the llama.cpp model and context now (otherwise done at garbage collection)."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            llm.close()

    def __repr__(self) -> str:
        return f"LlamaBackend({str(self.path)!r}, n_ctx={self.context_length}, n_threads={self.n_threads})"
