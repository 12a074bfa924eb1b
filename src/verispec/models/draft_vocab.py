"""A draft model with a reduced output vocabulary (FR-Spec: Zhao et al., 2025, "FR-Spec: Accelerating
Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling").

A small draft spends much of each forward in its output layer: the embedded 0.5B draft's is 151,936 × 896,
a quarter of its weights in float32 and 30% of the bytes its llama.cpp forward reads (Q8_0). Drafting only
from the ``K`` most frequent tokens (32,768 by default) computes ``K`` rows of that layer. The draft's
distribution ``q`` is then zero outside the subset -- its logits are ``-inf`` there -- and every
verification rule stays what it was: a lossless rule still samples the target exactly (the rules never
assume ``q > 0``), only tokens outside the subset are never drafted, which lowers acceptance a little.

Which tokens: :func:`draft_vocabulary` ranks the tokenizer's ids by their count in a corpus -- the files a
user gives (``--draft-vocab-corpus``: text, Markdown, code, or JSONL whose string fields are read), else a
default read at run time from local files every Python installation has (the standard library's sources:
code, comments and docstrings, i.e. English prose and code) -- ties and unseen ids by id (a byte-level BPE
numbers its tokens in merge order, roughly by frequency). The end-of-text ids, the tokenizer's special
tokens and (for subsets of 1,024 tokens or more) the first 256 ids (a byte-level BPE's byte alphabet, so
any text stays expressible) are always kept. The list is cached per tokenizer, corpus and size
(``draft_vocab/`` in the verispec cache).

Backends: :func:`with_draft_vocab` gives a transformers draft (:class:`~verispec.models.hf.HFBackend`) whose
output layer holds the subset's rows only (a new backend over the same model object, which stays as the
user built it), a llama.cpp draft running a GGUF cut to the subset (:mod:`verispec.models.gguf_vocab`), and
wraps any other backend in :class:`RestrictedVocab`, which masks the full logits (the same ``q``, so the
same acceptance, at the full output layer's cost).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sysconfig
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from .embedded import default_cache_dir

#: subset size of FR-Spec's default and of ``--draft-vocab`` without a number
DEFAULT_SIZE = 32768
#: characters of the default corpus read from the standard library's sources
DEFAULT_CORPUS_CHARS = 3_000_000
#: ids always kept (a byte-level BPE's byte alphabet)
BYTE_IDS = 256
#: fewest tokens ``--draft-vocab`` accepts
MIN_SIZE = 16


# ------------------------------------------------------------------------------------------ the subset
def corpus_texts(paths: Sequence[str | os.PathLike] | None = None, max_chars: int = DEFAULT_CORPUS_CHARS
                 ) -> tuple[list[str], str]:
    """``(texts, description)`` of the corpus: the given files (JSONL: each line's string values), else the
    first ``max_chars`` characters of the standard library's ``.py`` files in path order (local on every
    Python installation; no network)."""
    if paths:
        texts, parts = [], []
        for p in paths:
            path = Path(p).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"draft vocabulary corpus file not found: {path}")
            try:
                raw = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"draft vocabulary corpus {path} is not UTF-8 text ({exc.reason} at byte "
                                 f"{exc.start}); give text, Markdown, code or JSONL files") from None
            texts.extend(_jsonl_strings(raw) if path.suffix == ".jsonl" else [raw])
            st = path.stat()
            parts.append(f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}")
        if not any(t.strip() for t in texts):
            raise ValueError(f"the draft vocabulary corpus ({', '.join(map(str, paths))}) holds no text")
        return texts, ";".join(parts)
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for f in sorted(root.rglob("*.py")):
        if "site-packages" in f.parts or "test" in f.parts or "tests" in f.parts:
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text[: max_chars - total])
        total += len(texts[-1])
        if total >= max_chars:
            break
    if not texts:
        raise ValueError(f"no default corpus for the draft vocabulary: no Python sources under {root}; give "
                         "--draft-vocab-corpus FILE")
    return texts, f"stdlib:{root}:{max_chars}"


def _jsonl_strings(raw: str) -> list[str]:
    out: list[str] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        stack = [row]
        while stack:
            x = stack.pop()
            if isinstance(x, str):
                out.append(x)
            elif isinstance(x, dict):
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)
    return out


def rank_tokens(counts: Counter, vocab: int, size: int, keep: Iterable[int] = ()) -> list[int]:
    """The ``size`` ids of ``0 .. vocab - 1`` to draft from, sorted: every id of ``keep`` (in range), then
    the most frequent by ``counts`` (ties and unseen ids: the smaller id first)."""
    if size < 1:
        raise ValueError(f"a draft vocabulary needs at least one token, got {size}")
    chosen = {int(i) for i in keep if 0 <= int(i) < vocab}
    if len(chosen) > size:
        raise ValueError(f"a draft vocabulary of {size} tokens cannot hold the {len(chosen)} tokens always kept "
                         "(end-of-text, special and byte tokens): give a larger size")
    ranked = sorted((i for i in counts if 0 <= i < vocab), key=lambda i: (-counts[i], i))
    for i in ranked:
        if len(chosen) >= size:
            break
        chosen.add(i)
    i = 0
    while len(chosen) < min(size, vocab) and i < vocab:
        chosen.add(i)
        i += 1
    return sorted(chosen)


def _always_kept(backend, size: int) -> set[int]:
    ids = {int(i) for i in getattr(backend, "eos_token_ids", ())}
    if size >= 4 * BYTE_IDS:
        ids |= set(range(BYTE_IDS))
    tok = getattr(backend, "tokenizer", None)
    if tok is not None:
        ids |= {int(i) for i in getattr(tok, "added_tokens_decoder", {})}
        ids |= {int(i) for i in getattr(tok, "all_special_ids", [])}
    return ids


def _tokenizer_identity(backend) -> str:
    n = int(getattr(backend, "tokenizer_size", None) or backend.vocab_size)
    h = hashlib.sha256(str(n).encode())
    for i in range(0, n, max(1, n // 997)):
        h.update(backend.token_piece(i).encode("utf-8", "replace") + b"\0")
    return h.hexdigest()[:16]


def draft_vocabulary(backend, size: int = DEFAULT_SIZE, corpus: Sequence[str | os.PathLike] | None = None, *,
                     cache_dir: str | os.PathLike | None = None) -> list[int]:
    """The ``size`` token ids a reduced draft drafts from (sorted), ranked by their count in ``corpus``
    tokenized by ``backend`` (see the module), from the cache when it was computed before."""
    vocab = int(backend.vocab_size)
    if size >= vocab:
        return list(range(vocab))
    texts, described = corpus_texts(corpus)
    key = hashlib.sha256(f"{_tokenizer_identity(backend)}|{vocab}|{size}|{described}".encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "draft_vocab"
    path = folder / f"{key}.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("size") == size and len(cached.get("ids", ())) == size:
            return [int(i) for i in cached["ids"]]
    except (OSError, ValueError):
        pass
    counts: Counter = Counter()
    for text in texts:
        counts.update(backend.tokenize(text))
    ids = rank_tokens(counts, vocab, size, _always_kept(backend, size))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        seen = sum(counts[i] for i in ids)
        tmp.write_text(json.dumps({"size": size, "corpus": described, "tokens_counted": sum(counts.values()),
                                   "covered": seen, "ids": ids}))
        os.replace(tmp, path)
    except OSError:
        pass    # a read-only cache: computed again next time
    return ids


def parse_size(text: str | int | None) -> int | None:
    """``--draft-vocab``: a number of tokens (>= 16), ``auto`` (:data:`DEFAULT_SIZE`), or ``0`` / ``full`` /
    ``none`` (no reduction: None)."""
    if text is None:
        return None
    word = str(text).strip().lower()
    if word in ("", "0", "full", "none", "off"):
        return None
    if word in ("auto", "default"):
        return DEFAULT_SIZE
    try:
        size = int(word[:-1]) * 1024 if word.endswith("k") else int(word)
    except ValueError:
        raise ValueError(f"--draft-vocab takes a number of tokens (e.g. 32768 or 32k), auto or full; got {text!r}"
                         ) from None
    if size < MIN_SIZE:
        raise ValueError(f"--draft-vocab needs at least {MIN_SIZE} tokens, got {size}")
    return size


# ------------------------------------------------------------------------------------------ backends
class RestrictedVocab:
    """Any backend whose logits are ``-inf`` outside ``token_ids`` (the draft's ``q`` is zero there): the
    acceptance of a reduced vocabulary, computed at the full output layer's cost. Everything else is the
    wrapped backend's."""

    def __init__(self, backend, token_ids: Sequence[int]) -> None:
        self.inner = backend
        self.token_ids = _checked_ids(token_ids, int(backend.vocab_size))
        self._mask = torch.ones(int(backend.vocab_size), dtype=torch.bool)
        self._mask[self.token_ids] = False
        self.name = f"{backend.name}+vocab{len(self.token_ids)}:{_digest(self.token_ids)}"

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def _masked(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.masked_fill(self._mask.to(logits.device), float("-inf"))

    def forward(self, tokens, *, all_logits: bool = True) -> torch.Tensor:
        return self._masked(self.inner.forward(tokens, all_logits=all_logits))

    def forward_tree(self, tokens, parents) -> torch.Tensor:
        return self._masked(self.inner.forward_tree(tokens, parents))

    def __repr__(self) -> str:
        return f"RestrictedVocab({self.inner!r}, {len(self.token_ids)} tokens)"


class _ReducedHead(torch.nn.Module):
    """A transformers causal LM whose output layer computes only the rows ``token_ids``: the decoder of
    ``model``, then ``hidden [.., H] @ W[token_ids].T`` scattered into ``-inf`` logits of the full width.
    Its ``forward`` takes the model's own arguments (the backend reads their names)."""

    def __init__(self, model: torch.nn.Module, token_ids: torch.Tensor) -> None:
        super().__init__()
        cfg = model.config
        for attr in ("final_logit_softcapping", "logit_scale"):
            if getattr(cfg, attr, None) not in (None, 1.0):
                raise ValueError(f"a reduced draft vocabulary needs logits = lm_head(hidden); {cfg.model_type} "
                                 f"models also apply {attr}: drop --draft-vocab for this draft")
        head = model.get_output_embeddings()
        if head is None or getattr(head, "weight", None) is None or model.get_decoder() is None:
            raise ValueError(f"a reduced draft vocabulary needs a causal LM with an output layer and a decoder; "
                             f"{type(model).__name__} has none")
        self.inner = model
        self.config = cfg
        self.generation_config = getattr(model, "generation_config", None)
        self.register_buffer("ids", token_ids.to(head.weight.device), persistent=False)
        self.register_buffer("weight", head.weight.detach()[self.ids].clone(), persistent=False)
        bias = getattr(head, "bias", None)
        self.register_buffer("bias", None if bias is None else bias.detach()[self.ids].clone(), persistent=False)
        self.full_width = int(head.weight.shape[0])
        # the backend reads the argument names of ``forward`` (the cache's keyword, logits_to_keep)
        def forward(*args, **kwargs):
            return self._forward(*args, **kwargs)

        self.forward = functools.wraps(model.forward)(forward)

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()   # the backend reads the full width and the device from it

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def _forward(self, input_ids=None, logits_to_keep=0, num_logits_to_keep=0, output_hidden_states=None, **kwargs):
        if output_hidden_states:
            raise ValueError("a draft with a reduced vocabulary does not capture hidden states")
        out = self.inner.get_decoder()(input_ids=input_ids, **kwargs)
        hidden = out.last_hidden_state
        keep = logits_to_keep or num_logits_to_keep
        if keep:
            hidden = hidden[:, -keep:]
        part = F.linear(hidden, self.weight, self.bias)
        logits = part.new_full((*part.shape[:-1], self.full_width), float("-inf"))
        logits.index_copy_(-1, self.ids, part)
        return SimpleNamespace(logits=logits, hidden_states=None)


def with_draft_vocab(draft, token_ids: Sequence[int]):
    """``draft`` drafting from ``token_ids`` only: a transformers backend whose output layer computes those
    rows alone (same model object, same cache semantics), a llama.cpp backend running a GGUF cut to those
    rows (:class:`~verispec.models.gguf_vocab.ReducedVocabLlama`), else :class:`RestrictedVocab`. Its ``name``
    tells the subset apart (a cached cost profile is per name)."""
    from .hf import HFBackend

    if type(draft).__name__ == "LlamaBackend":
        from .gguf_vocab import ReducedVocabLlama

        return ReducedVocabLlama(draft, _checked_ids(token_ids, int(draft.vocab_size)))

    if isinstance(draft, HFBackend):
        ids = _checked_ids(token_ids, int(draft.vocab_size))
        if draft.capture_hidden is not None:
            raise ValueError("a draft with a reduced vocabulary does not capture hidden states")
        reduced = HFBackend(_ReducedHead(draft.model, torch.tensor(ids, dtype=torch.long)), tokenizer=draft.tokenizer,
                            device=draft.device, linear_layout=draft.linear_layout, row_plan=draft.row_plan)
        reduced.name = f"{draft.name}+vocab{len(ids)}:{_digest(ids)}"
        reduced.token_ids = ids
        return reduced
    return RestrictedVocab(draft, token_ids)


def _checked_ids(token_ids: Sequence[int], vocab: int) -> list[int]:
    ids = sorted({int(i) for i in token_ids})
    if not ids:
        raise ValueError("a draft vocabulary needs at least one token")
    if ids[0] < 0 or ids[-1] >= vocab:
        raise ValueError(f"draft vocabulary ids must lie in 0..{vocab - 1}, got {ids[0]}..{ids[-1]}")
    return ids


def _digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:8]
