"""llama.cpp backend (GGUF models) through llama-cpp-python's low-level API.

``llama_cpp.Llama`` is used only to load the model, create the context and read metadata. Decoding
goes straight through ``llama_decode`` with per-position output flags, and logits are read as a numpy
view of ``llama_get_logits`` (only the rows of the new block are copied; ``Llama.eval``'s
``n_ctx x n_vocab`` score buffer is never touched). Rollback removes positions from the KV cache with
``llama_memory_seq_rm``.

Draft trees use llama.cpp's sequence ids, which mask attention: a batch token tagged with sequence ids
``[s, ...]`` is stored in a KV cell carrying all of them, and a query attends to the cells carrying its
*first* id at positions ``<=`` its own. The committed prefix is sequence 0. Tree nodes that extend a
single chain from the cache end also live in sequence 0 (decoded exactly as ``forward`` would); every
other ("branch") node ``k`` gets its own sequence ``s_k``, first filled by ``llama_memory_seq_cp`` with
what its nearest already-decoded ancestor sees, and added to the id lists of its ancestors decoded in
the same batch. So the cells tagged ``s_k`` are exactly the prefix, ``k``'s ancestors and ``k``.
Commit copies the kept path into sequence 0 and ``llama_memory_seq_keep(0)`` drops everything else.
This needs a context with ``n_seq_max > max_tree_nodes`` and one KV buffer shared by all sequences
(``kv_unified``; otherwise llama.cpp splits the cache per sequence).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from verispec.runtime import env_threads

from .base import (
    TREE_ROOT,
    check_forward_tokens,
    check_rollback_length,
    check_tree_nodes,
    check_tree_path,
    tree_open_error,
)
from .gguf_check import check_gguf

#: bytes of the buffer a token's text is written into (a longer piece gets a buffer of its own size)
PIECE_BYTES = 256
CHAIN_SEQ = 0  # llama.cpp sequence of the committed prefix and of tree nodes that extend it as one chain

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_threads() -> int:
    """``$VERISPEC_THREADS`` if set (checked: :func:`verispec.runtime.env_threads`), else all available cores
    (llama-cpp-python's default is half)."""
    threads = env_threads()
    if threads is not None:
        return threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class LlamaBackend:
    """A GGUF model run by llama.cpp on the CPU, one sequence, with exact KV-cache truncation.

    ``n_ctx``: context (KV cache) size in tokens = ``context_length``. ``n_threads``: decode threads
    (default: ``$VERISPEC_THREADS``, else all cores; on a machine busy with other work, 1 thread can be
    much faster, since llama.cpp's threads synchronise at a spinning barrier after every op).
    ``n_batch``: the largest block decoded at once (longer inputs are split). ``n_ubatch``: the largest
    block llama.cpp computes in one graph (default ``n_batch``; 1 makes every token's numerics those of
    one-token decoding, since the quantised kernels differ between batch sizes).
    ``seed``: llama.cpp RNG seed (unused by ``forward``; kept for reproducibility of anything sampled
    inside llama.cpp).
    ``max_tree_nodes``: most branch nodes (tree nodes off the single chain) an open draft tree may hold,
    at most ``llama_max_parallel_sequences() - 1`` (255). The KV cache gets that many extra cells, so a
    tree fits whenever its deepest path does; the context keeps one logits row per sequence (about
    ``0.6 MB x max_tree_nodes`` for a 152k vocabulary). 0: chains only, with a plain one-sequence context.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        n_ubatch: int | None = None,
        seed: int = 0,
        max_tree_nodes: int = 255,
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
        from llama_cpp import _internals

        self._lc = llama_cpp.llama_cpp if hasattr(llama_cpp, "llama_cpp") else llama_cpp
        max_seqs = int(self._lc.llama_max_parallel_sequences())
        if not 0 <= int(max_tree_nodes) < max_seqs:
            raise ValueError(
                f"max_tree_nodes must be in 0..{max_seqs - 1} (llama.cpp's sequence limit), got {max_tree_nodes}"
            )
        self.max_tree_nodes = int(max_tree_nodes)

        if isinstance(n_ctx, bool) or int(n_ctx) < 1:
            raise ValueError(f"n_ctx must be a positive number of tokens, got {n_ctx}")
        info = check_gguf(path)     # a damaged or foreign file: say why, before llama.cpp sees it
        threads = int(n_threads) if n_threads else default_threads()
        # llama.cpp keeps one logits row per sequence at least: n_batch >= n_seq_max (else GGML_ASSERT aborts)
        n_batch = max(1, min(int(n_batch), int(n_ctx) + self.max_tree_nodes), self.max_tree_nodes + 1)
        n_ubatch = max(1, min(int(n_ubatch), n_batch)) if n_ubatch else n_batch
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=int(n_ctx) + self.max_tree_nodes,
                n_batch=n_batch,
                n_ubatch=n_ubatch,
                n_threads=threads,
                n_threads_batch=threads,
                seed=int(seed),
                logits_all=False,
                verbose=False,
            )
            if self.max_tree_nodes:
                # Llama(...) has no arguments for these: rebuild its context with one sequence per branch node
                # (plus the chain's) sharing a single KV buffer.
                params = self._llm.context_params
                params.n_seq_max = self.max_tree_nodes + 1
                params.kv_unified = True
                self._llm._ctx.close()
                self._llm._ctx = _internals.LlamaContext(model=self._llm._model, params=params, verbose=False)
        except ValueError as exc:   # "Failed to load model from file" / "Failed to create llama_context"
            whole = f"a whole GGUF v{info.version} file, architecture {info.architecture or 'unknown'}"
            if "context" in str(exc):
                trained = f"; {path.name} was trained on {info.context_length}" if info.context_length else ""
                raise ValueError(f"llama.cpp could not create a context of {n_ctx} tokens for {path} ({exc}): its "
                                 f"KV cache may not fit in memory; pass a smaller --n-ctx{trained}") from None
            raise ValueError(f"llama.cpp could not load {path} ({whole}): {exc}; its architecture may be newer than "
                             "this llama.cpp (pip install -U llama-cpp-python)") from None
        self.name = f"llama.cpp:{path}"
        self.path = path
        self.n_threads = threads
        self.n_batch = n_batch
        self._ctx = self._llm._ctx
        self._mem = self._lc.llama_get_memory(self._ctx.ctx)
        self._model = self._llm._model
        self._vocab = self._model.vocab
        # Room for n_batch tokens, each in up to max_tree_nodes + 1 sequences.
        self._batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=self.max_tree_nodes + 1, verbose=False)

        self.vocab_size: int = int(self._llm.n_vocab())
        #: width of llama.cpp's logits rows (a reduced-vocabulary draft, models/gguf_vocab.py, widens them)
        self.n_logits: int = self.vocab_size
        self.tokenizer_size: int = self.vocab_size  # GGUF vocabularies include their padding tokens
        self.context_length: int = min(int(n_ctx), int(self._lc.llama_n_ctx(self._ctx.ctx)) - self.max_tree_nodes)
        self.eos_token_ids: frozenset[int] = self._find_eog_ids()
        self.add_bos: bool = bool(self._model.add_bos_token())
        self.metadata: dict[str, str] = dict(self._llm.metadata)
        self._n = 0
        self._drop_tree()
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
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS if the model wants one. Special-token text
        (e.g. ``<|im_end|>``) is parsed into its special id only with ``parse_special`` (as transformers'
        tokenizers always do) and by :meth:`chat_prompt`; otherwise it is tokenized as plain text."""
        return self._model.tokenize(text.encode("utf-8"), add_special and self.add_bos, bool(parse_special))

    def _piece_bytes(self, token_id: int, special: bool, buf) -> bytes:
        n = self._lc.llama_token_to_piece(self._vocab, int(token_id), buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lc.llama_token_to_piece(self._vocab, int(token_id), buf, len(buf), 0, special)
        return buf.raw[:n]

    # The text methods are called from several threads at once (a server's engine and event loop): each
    # call writes into its own buffer, never one kept on the backend. llama.cpp's own tokenizer and
    # piece tables are read-only after loading.
    def detokenize(self, ids: Sequence[int]) -> str:
        buf = ctypes.create_string_buffer(PIECE_BYTES)
        return b"".join(self._piece_bytes(i, False, buf) for i in ids).decode("utf-8", errors="replace")

    def token_piece(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            return ""
        if self._lc.llama_vocab_get_attr(self._vocab, int(token_id)) & self._lc.LLAMA_TOKEN_ATTR_UNUSED:
            # llama.cpp renders unused (padding) tokens as "", transformers as their name, e.g. "[PAD151665]"
            return self._model.token_get_text(int(token_id))
        return self._piece_bytes(token_id, True, ctypes.create_string_buffer(PIECE_BYTES)).decode(
            "utf-8", errors="replace")

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

    @property
    def n_tree(self) -> int:
        return len(self._t_parent)

    def _drop_tree(self) -> None:
        self._t_parent: list[int] = []  # per open-tree node: parent id (TREE_ROOT for a root)
        self._t_depth: list[int] = []  # per node: depth (roots 0); position = n_cached + depth
        self._t_seq: list[int] = []  # per node: CHAIN_SEQ, or its own branch sequence 1..max_tree_nodes
        self._chain_tail = TREE_ROOT  # deepest node in CHAIN_SEQ (TREE_ROOT: the chain is empty)
        self._n_branch = 0  # branch nodes (= highest branch sequence in use)

    def reset(self) -> None:
        self._ctx.kv_cache_clear()
        self._n = 0
        self._drop_tree()

    def rollback(self, length: int) -> None:
        check_rollback_length(length, self._n)
        if self._n_branch:
            self._lc.llama_memory_seq_keep(self._mem, CHAIN_SEQ)
        # Always ask llama.cpp (cheap), so the cache is right even if something else decoded into it;
        # this also drops the chain part of an open tree.
        if not self._ctx.kv_cache_seq_rm(CHAIN_SEQ, length, -1):
            raise RuntimeError(f"{self.name}: llama.cpp refused to truncate the KV cache to {length} tokens")
        self._n = length
        self._drop_tree()

    def _put_token(self, batch, i: int, token: int) -> None:
        """Batch slot ``i`` holds ``token`` (a reduced-vocabulary draft writes its embedding instead)."""
        batch.token[i] = token

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> torch.Tensor:
        """Append ``tokens``; float32 logits ``[len(tokens), vocab_size]`` or ``[1, vocab_size]`` (last row)."""
        if self._t_parent:
            raise tree_open_error(self.name)
        toks = check_forward_tokens(tokens, self._n, self.context_length, self.vocab_size)
        n_vocab = self.n_logits
        out = torch.empty((len(toks) if all_logits else 1, n_vocab), dtype=torch.float32)
        out_np = out.numpy()
        b = self._batch.batch
        n0, row = self._n, 0
        for start in range(0, len(toks), self.n_batch):
            chunk = toks[start : start + self.n_batch]
            m = len(chunk)
            last_chunk = start + m == len(toks)
            for i, t in enumerate(chunk):
                self._put_token(b, i, t)
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

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Append draft-tree nodes (see :mod:`verispec.models.base`); float32 logits ``[len(tokens), vocab_size]``.

        Nodes are decoded in order of depth (parents before children, positions never decreasing within a
        sequence), in blocks of ``n_batch``. A chain from the cache end is the same batch as ``forward``.
        """
        toks, pars, depths = check_tree_nodes(
            tokens, parents, self._t_depth, self._n, self.context_length, self.vocab_size
        )
        lc, mem, n = self._lc, self._mem, self._n
        n_old = len(self._t_parent)
        par, dep, seq = self._t_parent + pars, self._t_depth + depths, list(self._t_seq)
        tail, n_branch = self._chain_tail, self._n_branch
        for k in range(n_old, n_old + len(toks)):
            if par[k] == tail:  # extends the chain (a root only while the chain is empty)
                seq.append(CHAIN_SEQ)
                tail = k
            else:
                n_branch += 1
                seq.append(n_branch)
        if n_branch > self.max_tree_nodes:
            raise ValueError(
                f"{self.name}: the tree would have {n_branch} branch nodes (nodes off the single chain); this "
                f"backend holds at most max_tree_nodes={self.max_tree_nodes}"
            )

        n_vocab = self.n_logits
        out = torch.empty((len(toks), n_vocab), dtype=torch.float32)
        out_np = out.numpy()
        b = self._batch.batch
        order = sorted(range(n_old, n_old + len(toks)), key=lambda k: (dep[k], k))
        try:
            for start in range(0, len(order), self.n_batch):
                block = order[start : start + self.n_batch]
                in_block = set(block)
                seq_ids = {k: [seq[k]] for k in block}
                for k in block:
                    if seq[k] == CHAIN_SEQ:
                        continue
                    a = par[k]
                    while a in in_block:  # ancestors decoded together with k carry k's sequence too
                        seq_ids[a].append(seq[k])
                        a = par[a]
                    # k sees what its nearest already-decoded ancestor a sees, and a itself
                    if a == TREE_ROOT:
                        lc.llama_memory_seq_cp(mem, CHAIN_SEQ, seq[k], -1, n)
                    elif seq[a] == CHAIN_SEQ:
                        lc.llama_memory_seq_cp(mem, CHAIN_SEQ, seq[k], -1, n + dep[a] + 1)
                    else:
                        lc.llama_memory_seq_cp(mem, seq[a], seq[k], -1, -1)
                for i, k in enumerate(block):
                    self._put_token(b, i, toks[k - n_old])
                    b.pos[i] = n + dep[k]
                    ids = seq_ids[k]
                    b.n_seq_id[i] = len(ids)
                    for j, s in enumerate(ids):
                        b.seq_id[i][j] = s
                    b.logits[i] = True
                b.n_tokens = len(block)
                rc = lc.llama_decode(self._ctx.ctx, b)
                if rc != 0:
                    raise RuntimeError(f"{self.name}: llama_decode returned {rc}")
                rows = np.ctypeslib.as_array(lc.llama_get_logits(self._ctx.ctx), shape=(len(block), n_vocab))
                out_np[np.asarray(block) - n_old] = rows
        except BaseException:
            # Forget this call's nodes: its chain cells and its branch sequences.
            old_chain = dep[self._chain_tail] + 1 if self._chain_tail != TREE_ROOT else 0
            lc.llama_memory_seq_rm(mem, CHAIN_SEQ, n + old_chain, -1)
            for s in range(self._n_branch + 1, n_branch + 1):
                lc.llama_memory_seq_rm(mem, s, -1, -1)
            raise
        self._t_parent, self._t_depth, self._t_seq = par, dep, seq
        self._chain_tail, self._n_branch = tail, n_branch
        return out

    def commit_tree_path(self, path: Sequence[int]) -> None:
        """Keep the root-down node ids ``path`` as committed tokens and drop the rest of the open tree."""
        ids = check_tree_path(path, self._t_parent)
        lc, mem, n = self._lc, self._mem, self._n
        n_chain = 0  # the path's chain part is a prefix of it: a branch node has no chain descendants
        while n_chain < len(ids) and self._t_seq[ids[n_chain]] == CHAIN_SEQ:
            n_chain += 1
        lc.llama_memory_seq_rm(mem, CHAIN_SEQ, n + n_chain, -1)
        if len(ids) > n_chain:
            # The last node's sequence holds its whole path: move the branch part into the chain.
            lc.llama_memory_seq_cp(mem, self._t_seq[ids[-1]], CHAIN_SEQ, n + n_chain, n + len(ids))
        if self._n_branch:
            lc.llama_memory_seq_keep(mem, CHAIN_SEQ)
        self._n = n + len(ids)
        self._drop_tree()

    def sibling(self, *, n_ctx: int | None = None, max_tree_nodes: int | None = None) -> "LlamaBackend":
        """Another sequence on the same loaded model: a fresh context sharing the model's weights (no
        second copy in memory), with this one's settings (threads, ``n_batch``, ``n_ubatch``, ...) and, by
        default, its ``n_ctx`` and tree sequences; ``n_ctx`` / ``max_tree_nodes`` size it otherwise (e.g.
        a one-sequence context with trees beside a batch's context of ``B`` sequences). Its logits are
        bitwise those a backend loaded with the same settings computes for the same calls: a context only
        holds a KV cache and buffers. Contexts of one model may decode on different threads at once.
        ``close`` the siblings before the backend that loaded the model."""
        from llama_cpp import _internals

        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin._owner = self
        params = type(self._llm.context_params).from_buffer_copy(self._llm.context_params)
        if n_ctx is not None or max_tree_nodes is not None:
            max_seqs = int(self._lc.llama_max_parallel_sequences())
            nodes = self.max_tree_nodes if max_tree_nodes is None else int(max_tree_nodes)
            if not 0 <= nodes < max_seqs:
                raise ValueError(f"max_tree_nodes must be in 0..{max_seqs - 1} (llama.cpp's sequence limit), "
                                 f"got {max_tree_nodes}")
            tokens = self.context_length if n_ctx is None else int(n_ctx)
            if isinstance(n_ctx, bool) or tokens < 1:
                raise ValueError(f"n_ctx must be a positive number of tokens, got {n_ctx}")
            # as __init__ sizes its context: n_batch >= n_seq_max, the tree's cells beyond n_ctx
            n_batch = max(1, min(int(params.n_batch), tokens + nodes), nodes + 1)
            params.n_ctx, params.n_batch = tokens + nodes, n_batch
            params.n_ubatch = max(1, min(int(params.n_ubatch), n_batch))
            params.n_seq_max, params.kv_unified = nodes + 1, bool(nodes) or bool(params.kv_unified)
            twin.max_tree_nodes, twin.n_batch = nodes, n_batch
        twin._ctx = _internals.LlamaContext(model=self._model, params=params, verbose=False)
        twin.context_length = min(int(n_ctx or self.context_length),
                                  int(self._lc.llama_n_ctx(twin._ctx.ctx)) - twin.max_tree_nodes)
        twin._mem = self._lc.llama_get_memory(twin._ctx.ctx)
        twin._batch = _internals.LlamaBatch(n_tokens=twin.n_batch, embd=0, n_seq_max=twin.max_tree_nodes + 1,
                                            verbose=False)
        twin._n = 0
        twin._drop_tree()
        twin._ctx.kv_cache_clear()
        return twin

    def close(self) -> None:
        """Free the llama.cpp model and context now (otherwise done at garbage collection); a
        :meth:`sibling` frees its own context only."""
        llm, self._llm = getattr(self, "_llm", None), None
        batch, self._batch = getattr(self, "_batch", None), None
        if batch is not None:
            batch.close()
        if getattr(self, "_owner", None) is not None:
            ctx, self._ctx = getattr(self, "_ctx", None), None
            if ctx is not None:
                ctx.close()
            return
        if llm is not None:
            llm._ctx.close()  # the context we built is not on llm's own exit stack
            llm.close()

    def __repr__(self) -> str:
        return f"LlamaBackend({str(self.path)!r}, n_ctx={self.context_length}, n_threads={self.n_threads})"
