"""The backend protocol every model wrapper implements, and the vocabulary compatibility check.

Conventions (all backends):

- Batch size is always 1 and there is exactly one sequence per backend; the backend owns its KV cache.
- ``forward(tokens)`` appends ``tokens`` to the cache and returns logits of shape
  ``[len(tokens), vocab_size]`` (row ``i`` = next-token logits after ``tokens[i]``), or ``[1, vocab_size]``
  (the last row only) with ``all_logits=False``. Logits are float32 tensors (an HF model run in
  float64 returns float64) on the backend's ``logits_device`` (optional attribute; CPU when absent, as
  for llama.cpp; the output layer's device for transformers): the engine samples and verifies there.
  The returned tensor is owned by the caller (never a view of a buffer the backend will overwrite).
- ``rollback(length)`` truncates the cache to its first ``length`` tokens; the next ``forward``
  continues from position ``length``.
- ``vocab_size`` is the logits width, which may exceed the tokenizer's size (padded lm_head rows);
  :func:`check_compatible` returns the width the engine should slice both models' logits to.

Draft trees (one verify forward over many candidate continuations):

- Besides its ``n_cached`` committed tokens a backend may hold an open tree of ``n_tree`` nodes, ids
  ``0 .. n_tree-1`` in insertion order. ``forward_tree(tokens, parents)`` appends nodes: ``parents[i] = -1``
  (:data:`TREE_ROOT`) makes node ``i`` a child of the last committed token, otherwise ``parents[i]`` is the
  id of an earlier node of the open tree (from this call or an earlier ``forward_tree`` since the last
  commit). A node at depth ``d`` (roots: ``d = 0``) has position ``n_cached + d`` and attends to the
  committed prefix and its own ancestors only. Returns logits ``[len(tokens), vocab_size]``, row ``i`` =
  next-token logits after node ``i``'s path; may be called several times to grow the tree.
- ``commit_tree_path(path)`` keeps the nodes ``path`` (ids from a root down, each the parent of the next;
  may be empty) as committed tokens (``n_cached += len(path)``) and drops every other node.
- ``rollback(length)`` also drops the open tree; ``forward`` while a tree is open raises ``ValueError``.
- Bad parents and context overflow (``n_cached + max depth + 1 > context_length``) raise ``ValueError``
  before any state changes; after a backend error the state is consistent (as for ``forward``).
- A chain (every node's parent the previous node, ``-1`` first, across calls) costs what ``forward``
  costs and leaves the same cache; committing a prefix of it is a rollback.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Backend(Protocol):
    """A causal LM with a single-sequence KV cache that can be extended and truncated."""

    name: str  # human-readable, e.g. "llama.cpp:/path/x.gguf"
    vocab_size: int  # width of the returned logits rows
    eos_token_ids: frozenset[int]  # every end-of-sequence / end-of-turn id
    context_length: int  # maximum number of tokens the cache can hold

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS etc. as the model's tokenizer would."""
        ...

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special/control tokens are not rendered)."""
        ...

    def token_piece(self, token_id: int) -> str:
        """Text of a single token, special tokens rendered (e.g. ``"<|im_end|>"``); for vocab comparison."""
        ...

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn chat with the model's template applied and the generation prompt appended."""
        ...

    def reset(self) -> None:
        """Empty the KV cache."""
        ...

    @property
    def n_cached(self) -> int:
        """Number of tokens currently in the KV cache."""
        ...

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> torch.Tensor:
        """Append ``tokens`` to the cache; logits ``[len(tokens), vocab_size]`` (or ``[1, vocab_size]``)."""
        ...

    def rollback(self, length: int) -> None:
        """Truncate the cache to its first ``length`` tokens (``0 <= length <= n_cached``); drops an open tree."""
        ...

    @property
    def n_tree(self) -> int:
        """Number of nodes in the open draft tree (0 when none)."""
        ...

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Append tree nodes below the committed prefix (``parents[i]``: -1 or an earlier node id); logits
        ``[len(tokens), vocab_size]``, row ``i`` = next-token logits after node ``i``'s path."""
        ...

    def commit_tree_path(self, path: Sequence[int]) -> None:
        """Commit the root-down node ids ``path`` (``n_cached += len(path)``) and drop the rest of the tree."""
        ...


def logits_device(backend) -> torch.device:
    """Where ``backend`` returns its logits (CPU unless it says otherwise)."""
    return torch.device(getattr(backend, "logits_device", "cpu"))


def check_rollback_length(length: int, n_cached: int) -> None:
    if not isinstance(length, int) or isinstance(length, bool):
        raise TypeError(f"rollback length must be an int, got {type(length).__name__}")
    if length < 0 or length > n_cached:
        raise ValueError(f"cannot roll back to {length} tokens: the cache holds {n_cached}")


def check_forward_tokens(tokens: Sequence[int], n_cached: int, context_length: int, vocab: int) -> list[int]:
    toks = [int(t) for t in tokens]
    if not toks:
        raise ValueError("forward needs at least one token")
    if n_cached + len(toks) > context_length:
        raise ValueError(
            f"context overflow: {n_cached} cached + {len(toks)} new tokens exceed the context length {context_length}"
        )
    bad = [t for t in toks if t < 0 or t >= vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range for a vocabulary of {vocab}")
    return toks


TREE_ROOT = -1  # parents[i] of a root node: a child of the last committed token


def check_tree_nodes(
    tokens: Sequence[int],
    parents: Sequence[int],
    depths: Sequence[int],
    n_cached: int,
    context_length: int,
    vocab: int,
) -> tuple[list[int], list[int], list[int]]:
    """Validate ``forward_tree`` arguments against the open tree whose node depths are ``depths``.

    Returns ``(tokens, parents, depths of the new nodes)``; raises ``ValueError`` on an empty call,
    mismatched lengths, a parent that is neither -1 nor an earlier node, a bad token id, or a node whose
    path would not fit the context (``n_cached + depth + 1 > context_length``).
    """
    toks = [int(t) for t in tokens]
    pars = [int(p) for p in parents]
    if not toks:
        raise ValueError("forward_tree needs at least one node")
    if len(pars) != len(toks):
        raise ValueError(f"forward_tree got {len(toks)} tokens but {len(pars)} parents")
    n_old = len(depths)
    new_depths: list[int] = []
    for i, p in enumerate(pars):
        if p == TREE_ROOT:
            new_depths.append(0)
        elif 0 <= p < n_old + i:
            new_depths.append((depths[p] if p < n_old else new_depths[p - n_old]) + 1)
        else:
            raise ValueError(
                f"bad parent {p} for tree node {n_old + i}: must be {TREE_ROOT} (a root) or the id of an earlier "
                f"node (0..{n_old + i - 1})"
            )
    bad = [t for t in toks if t < 0 or t >= vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range for a vocabulary of {vocab}")
    deepest = max(new_depths)
    if n_cached + deepest + 1 > context_length:
        raise ValueError(
            f"context overflow: {n_cached} cached tokens + a tree path of {deepest + 1} nodes exceed the context "
            f"length {context_length}"
        )
    return toks, pars, new_depths


def check_tree_path(path: Sequence[int], parents: Sequence[int]) -> list[int]:
    """Validate a ``commit_tree_path`` argument: node ids of the open tree from a root down."""
    ids = [int(i) for i in path]
    prev = TREE_ROOT
    for i in ids:
        if not 0 <= i < len(parents):
            raise ValueError(f"tree path node {i} is not in the open tree of {len(parents)} nodes")
        if parents[i] != prev:
            raise ValueError(
                f"tree path {ids} is not a root-down path: node {i}'s parent is {parents[i]}, not {prev}"
            )
        prev = i
    return ids


def tree_open_error(name: str) -> ValueError:
    return ValueError(f"{name}: a draft tree is open; commit_tree_path(...) or rollback(...) before forward")


# Pieces of ids that only pad a tokenizer / embedding matrix up to a round size.
_PADDING_PIECE = re.compile(r"^(\[PAD\d*\]|<pad_?\d*>|<\|?unused_?\d*\|?>|<extra_?id_?\d+>|\[unused\d+\]|)$", re.I)


def _is_padding(piece: str) -> bool:
    return bool(_PADDING_PIECE.match(piece.strip()))


def tokenizer_size(backend: Backend) -> int:
    """Number of ids the backend's tokenizer knows (``<= vocab_size``); falls back to ``vocab_size``."""
    n = getattr(backend, "tokenizer_size", None)
    return int(n) if n is not None else int(backend.vocab_size)


def _norm_piece(s: str) -> str:
    # SentencePiece's word marker and HF's single-token decode stripping a leading space are cosmetic.
    return s.replace("\u2581", " ").strip()


def _sample_ids(n: int, k: int = 200) -> list[int]:
    if n <= k:
        return list(range(n))
    step = (n - 1) / (k - 1)
    return sorted({round(i * step) for i in range(k)} | set(range(min(n, 16))))


def check_compatible(target: Backend, draft: Backend) -> int:
    """Check that ``target`` and ``draft`` share a vocabulary; return the logits width to slice both to.

    Compares the token strings (:meth:`Backend.token_piece`) on a deterministic sample of ~200 ids
    spread across the common id range plus both models' EOS ids, and the tokenizers' sizes. Ids that
    only one tokenizer has must look like padding (``[PAD123]``, empty, ...). Differences in logits
    width alone (e.g. an HF ``lm_head`` padded to a multiple of 64 vs llama.cpp's ``n_vocab``) are fine.

    Returns ``min(target.vocab_size, draft.vocab_size)``; rows wider than that are padding. Raises
    ``ValueError`` naming both models and the first differing token otherwise.
    """
    tn, dn = tokenizer_size(target), tokenizer_size(draft)
    common = min(tn, dn)
    width = min(int(target.vocab_size), int(draft.vocab_size))
    who = f"target {target.name!r} and draft {draft.name!r}"
    if common <= 0:
        raise ValueError(f"{who}: empty vocabulary")

    ids = set(_sample_ids(common))
    ids |= {i for i in (set(target.eos_token_ids) | set(draft.eos_token_ids)) if i < common}
    for i in sorted(ids):
        pt, pd = target.token_piece(i), draft.token_piece(i)
        if pt != pd and _norm_piece(pt) != _norm_piece(pd) and not (_is_padding(pt) and _is_padding(pd)):
            raise ValueError(
                f"{who} do not share a vocabulary: token {i} is {pt!r} in the target but {pd!r} in the draft"
            )

    for i in sorted(set(target.eos_token_ids) ^ set(draft.eos_token_ids)):
        # An EOS id of one model must at least exist in the other with the same text.
        if i >= common:
            owner = "target" if i in target.eos_token_ids else "draft"
            raise ValueError(
                f"{who} do not share a vocabulary: the {owner}'s EOS id {i} is outside the other's vocabulary"
            )

    if tn != dn:
        bigger, big_n, label = (target, tn, "target") if tn > dn else (draft, dn, "draft")
        extra = _sample_ids(big_n - common, 64)
        for off in extra:
            i = common + off
            piece = bigger.token_piece(i)
            if not _is_padding(piece):
                raise ValueError(
                    f"{who} do not share a vocabulary: tokenizer sizes differ (target {tn}, draft {dn}) and the "
                    f"{label} has real token {i} = {piece!r} that the other lacks"
                )

    if width < common:
        small = target if target.vocab_size < draft.vocab_size else draft
        raise ValueError(
            f"{who}: {small.name!r} returns only {small.vocab_size} logits but the shared tokenizer has {common} tokens"
        )
    return width
