"""Exact top-k and argmax on long rows through block maxima (the fast path of :mod:`verispec.sampling`).

A row ``[V]`` is viewed as ``nb`` blocks of :data:`BLOCK` consecutive logits plus a shorter tail. One
vectorised pass computes every block's maximum (it also serves as the NaN/inf check and as the
greedy argmax); the blocks with the largest maxima hold every entry that can be among the k largest,
so the exact top-k — ties included — is taken among their entries only. :func:`top_k_compact` returns
the kept tokens as a compact ``[rows, K]`` set (values plus vocabulary indices) or ``None`` when a
token tied with the k-th largest logit could lie in a block not taken (the caller then falls back to
the dense computation).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_NEG_INF = float("-inf")

#: Block width of the block-max decomposition.
BLOCK = 128
#: Rows shorter than this use plain ``torch.topk`` / ``torch.argmax``.
BLOCK_MIN_V = 8192




class Blocks(NamedTuple):
    """Rows ``[R, V]`` viewed as ``nb`` blocks of ``B`` logits plus a tail of ``V - nb·B``."""

    main: torch.Tensor  # [R, nb, B] view
    bmax: torch.Tensor  # [R, nb] block maxima
    tail: torch.Tensor  # [R, r] view, r < B
    row_max: torch.Tensor  # [R]
    block: int


def make_blocks(rows: torch.Tensor, block: int | None = None) -> Blocks:
    block = block or BLOCK
    R, V = rows.shape
    nb = V // block
    main = rows[:, : nb * block].view(R, nb, block)
    bmax = main.amax(-1)
    tail = rows[:, nb * block :]
    row_max = bmax.amax(-1)
    if tail.shape[-1]:
        row_max = torch.maximum(row_max, tail.amax(-1))
    return Blocks(main, bmax, tail, row_max, block)


def first_argmax(rows: torch.Tensor, blocks: Blocks | None) -> torch.Tensor:
    """First index of the row maximum, ``[R, V] -> [R, 1]`` (``torch.argmax`` semantics, no NaN)."""
    if blocks is None:
        return rows.argmax(-1, keepdim=True)
    main, bmax, tail, row_max, B = blocks
    R = rows.shape[0]
    bi = bmax.argmax(-1)  # first block holding the maximum of the main part
    inner = main.gather(1, bi.view(R, 1, 1).expand(R, 1, B)).view(R, B).argmax(-1)
    idx = bi * B + inner
    if tail.shape[-1]:
        # the tail comes after every block, so it only wins with a strictly larger value
        tail_wins = tail.amax(-1) > bmax.amax(-1)
        idx = torch.where(tail_wins, main.shape[1] * B + tail.argmax(-1), idx)
    return idx.unsqueeze(-1)


def block_candidates(blocks: Blocks, n_take: int):
    """Entries of the ``n_take`` blocks with the largest maxima, then the tail.

    Returns ``(values [R, M], taken block ids [R, n_take], best max among the blocks not taken [R])``
    with ``M = n_take·B + r``; :func:`candidate_index` maps candidate positions to vocabulary ids.
    Requires ``n_take < nb``.
    """
    main, bmax, tail, _, B = blocks
    R = main.shape[0]
    bv, bi = torch.topk(bmax, n_take + 1, dim=-1)
    nxt = bv[:, n_take]
    bi = bi[:, :n_take]
    cand = main.gather(1, bi.unsqueeze(-1).expand(R, n_take, B)).reshape(R, n_take * B)
    if tail.shape[-1]:
        cand = torch.cat([cand, tail], dim=1)
    return cand, bi, nxt


def candidate_index(pos: torch.Tensor, bi: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """Vocabulary ids of candidate positions ``pos [R, K]`` from :func:`block_candidates`."""
    B = blocks.block
    n_take = bi.shape[1]
    slot = torch.div(pos, B, rounding_mode="floor")
    in_block = slot < n_take
    idx = bi.gather(1, slot.clamp_(max=n_take - 1)) * B + (pos - slot * B)
    if blocks.tail.shape[-1]:
        tail_idx = pos + (blocks.main.shape[1] - n_take) * B  # tail position j -> nb·B + j
        idx = torch.where(in_block, idx, tail_idx)
    return idx


def topk_values(x: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest values of each row, sorted descending. ``[..., N] -> [..., k]``.

    Exact as a multiset (ties are irrelevant for values): a block whose maximum is not among the k
    largest block maxima cannot hold an entry larger than the k-th largest value, and the k blocks
    taken hold at least k entries that are >= it.
    """
    N = x.shape[-1]
    if N >= BLOCK_MIN_V and N // BLOCK > 4 * k:
        rows = x.reshape(-1, N)
        cand, _, _ = block_candidates(make_blocks(rows), k)
        return torch.topk(cand, k, dim=-1).values.view(*x.shape[:-1], k)
    return torch.topk(x, k, dim=-1).values


def top_k_compact(rows: torch.Tensor, blocks: Blocks, k: int, temperature: float):
    """Top-k of ``rows / temperature`` as a compact set, or ``None`` if ties could spill over.

    Returns ``(values [R, K], vocab indices [R, K])`` with the indices ascending in each row; rows
    keeping fewer than ``K`` tokens are padded with ``-inf`` values at distinct unused indices.
    """
    nb = blocks.main.shape[1]
    n_take = 2 * k
    if n_take >= nb:
        return None
    cand, bi, nxt = block_candidates(blocks, n_take)
    if temperature != 1.0:
        cand = cand / temperature
        nxt = nxt / temperature
    kth = torch.topk(cand, k, dim=-1).values[:, k - 1 :]  # [R, 1]
    # Every entry >= kth lies in a taken block unless a block not taken reaches kth (a tie).
    complete = (nxt < kth[:, 0]) | (nxt == _NEG_INF)
    if not bool(complete.all()):
        return None
    # -inf entries are kept by top-k when a row has fewer than k finite logits, but they keep
    # probability 0 either way, so the compact set carries only the finite ones.
    keep = (cand >= kth) & (cand > _NEG_INF)
    width = int(keep.sum(-1).max())
    vals, pos = torch.topk(cand.masked_fill_(~keep, _NEG_INF), width, dim=-1)
    idx = candidate_index(pos, bi, blocks)
    idx, order = torch.sort(idx, dim=-1)
    return vals.gather(1, order), idx
