"""A llama.cpp draft with a reduced output vocabulary (:mod:`verispec.models.draft_vocab` for the idea).

llama.cpp ties the shapes of a model's output layer and of its token embedding to the size of its
tokenizer: a GGUF whose ``output.weight`` holds fewer rows is refused ("tensor 'output.weight' has wrong
shape"). So :func:`reduced_gguf` writes a GGUF whose *vocabulary* is the subset -- its tokens, token types
and special ids renumbered ``0 .. K − 1``, the merges kept -- with both tensors cut to the subset's rows
(the embedded 0.5B draft: 491 MB -> 302 MB, its Q8_0 output layer 145 MB -> 31 MB), cached beside the
other verispec files. :class:`ReducedVocabLlama` runs it fed with *input embeddings* instead of token ids
(llama.cpp's ``batch.embd``): the rows of the full model's token embedding (dequantised when a token is
first fed, :class:`TokenEmbeddings`), so that any token of the text -- in the subset or not -- is fed
exactly as the full draft feeds it (its logits on the subset are bitwise the full draft's). Its ``K``
logits per row are scattered into rows of the full width, ``-inf`` elsewhere. Tokenizing, token pieces
and the chat template are those of the full draft, which stays loaded for them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .embedded import default_cache_dir
from .llama import LlamaBackend


def reduced_gguf(src: str | os.PathLike, token_ids: Sequence[int], cache_dir: str | os.PathLike | None = None) -> Path:
    """A GGUF of ``src`` whose vocabulary, token embedding and output layer hold the tokens ``token_ids``
    (sorted; written once, then read from ``cache_dir``, default ``draft_vocab/`` in the verispec cache)."""
    try:
        from gguf import GGUFReader, GGUFValueType, GGUFWriter
    except ImportError as exc:   # pragma: no cover - depends on the environment
        raise ImportError("a llama.cpp draft with a reduced vocabulary needs the gguf package: "
                          "pip install gguf") from exc
    src = Path(src)
    ids = sorted({int(i) for i in token_ids})
    st = src.stat()
    key = hashlib.sha256(f"{src.resolve()}|{st.st_size}|{int(st.st_mtime)}|{','.join(map(str, ids))}".encode())
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "draft_vocab"
    dst = folder / f"{src.stem}.vocab{len(ids)}-{key.hexdigest()[:12]}.gguf"
    if dst.is_file():
        return dst
    reader = GGUFReader(src)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{src} has no tokenizer.ggml.tokens: cannot reduce its vocabulary")
    n_vocab = len(tokens.data)
    if not ids or ids[0] < 0 or ids[-1] >= n_vocab:
        raise ValueError(f"draft vocabulary ids must lie in 0..{n_vocab - 1}")
    index = {t: i for i, t in enumerate(ids)}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(f".tmp{os.getpid()}")
    writer = GGUFWriter(tmp, reader.fields["general.architecture"].contents())
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind, value = f.types[0], f.contents()
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = [value[i] for i in ids]
        elif name.startswith("tokenizer.ggml.") and name.endswith("_token_id"):
            if value not in index:
                continue          # a special token outside the subset: the reduced model has none
            value = index[value]
        if kind == GGUFValueType.ARRAY:
            writer.add_key_value(name, value, kind, sub_type=f.types[-1])
        else:
            writer.add_key_value(name, value, kind)
    rows = np.asarray(ids)
    for t in reader.tensors:
        data = t.data
        if t.name in ("output.weight", "token_embd.weight"):
            data = np.ascontiguousarray(data[rows])
        writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


class TokenEmbeddings:
    """Rows of a GGUF's token embedding, dequantised on first use (float32 ``[n_embd]`` each, kept): a
    generation feeds a few thousand distinct tokens, far fewer than the vocabulary."""

    def __init__(self, src: str | os.PathLike) -> None:
        from gguf import GGUFReader

        tensor = next((t for t in GGUFReader(src).tensors if t.name == "token_embd.weight"), None)
        if tensor is None:
            raise ValueError(f"{src} has no token_embd.weight")
        self._data, self._type = tensor.data, tensor.tensor_type
        self.rows, self.width = int(tensor.shape[-1]), int(tensor.shape[0])
        self._rows: dict[int, np.ndarray] = {}

    def __getitem__(self, token: int) -> np.ndarray:
        row = self._rows.get(token)
        if row is None:
            from gguf.quants import dequantize

            row = np.ascontiguousarray(dequantize(self._data[token:token + 1], self._type)[0], dtype=np.float32)
            self._rows[token] = row
        return row


class ReducedVocabLlama(LlamaBackend):
    """``full`` (a :class:`LlamaBackend`) drafting from ``token_ids`` only, computing only their rows of the
    output layer (see the module). Same context settings as ``full``; the full backend answers text calls."""

    def __init__(self, full: LlamaBackend, token_ids: Sequence[int], *, cache_dir: str | os.PathLike | None = None
                 ) -> None:
        from llama_cpp import _internals

        ids = sorted({int(i) for i in token_ids})
        super().__init__(reduced_gguf(full.path, ids, cache_dir), n_ctx=full.context_length, n_threads=full.n_threads,
                         n_batch=full.n_batch, max_tree_nodes=full.max_tree_nodes)
        self.full, self.token_ids = full, ids
        self._ids = torch.tensor(ids, dtype=torch.long)
        self.n_logits = len(ids)
        self.vocab_size, self.tokenizer_size = full.vocab_size, full.tokenizer_size
        self.eos_token_ids, self.add_bos, self.metadata = full.eos_token_ids, full.add_bos, full.metadata
        self._embd = TokenEmbeddings(full.path)
        if self._embd.rows < self.vocab_size:
            raise ValueError(f"{full.path}: its token embedding has {self._embd.rows} rows, fewer than its "
                             f"{self.vocab_size} tokens")
        self._row_bytes = self._embd.width * 4
        self._batch.close()
        self._batch = _internals.LlamaBatch(n_tokens=self.n_batch, embd=self._embd.width,
                                            n_seq_max=self.max_tree_nodes + 1, verbose=False)
        digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:8]
        self.name = f"{full.name}+vocab{len(ids)}:{digest}"

    def _put_token(self, batch, i: int, token: int) -> None:
        base = ctypes.cast(batch.embd, ctypes.c_void_p).value
        ctypes.memmove(base + i * self._row_bytes, self._embd[token].ctypes.data, self._row_bytes)

    def _widen(self, logits: torch.Tensor) -> torch.Tensor:
        out = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
        return out.index_copy_(1, self._ids, logits)

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> torch.Tensor:
        return self._widen(super().forward(tokens, all_logits=all_logits))

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        return self._widen(super().forward_tree(tokens, parents))

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return self.full.tokenize(text, add_special=add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.full.detokenize(ids)

    def token_piece(self, token_id: int) -> str:
        return self.full.token_piece(token_id)

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        return self.full.chat_prompt(user_message, system=system)

    def sibling(self) -> LlamaBackend:
        raise NotImplementedError("a reduced-vocabulary llama.cpp draft has no siblings (batched decoding): drop "
                                  "--draft-vocab or --batch-size")

    def __repr__(self) -> str:
        return f"ReducedVocabLlama({str(self.full.path)!r}, {len(self.token_ids)} tokens)"
