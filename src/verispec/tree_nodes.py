"""Choosing and ordering the nodes of a draft tree (pure Python, shared by every tree grower).

A grower proposes *candidates* ``0..C-1``, each with a parent (``-1``: a child of the root, else an
earlier candidate), then keeps some and lays the kept ones out as the tree the verifier reads
(:class:`verispec.rules.tree.DraftTree`): parents before children, depth by depth, the children of
each node grouped under it in node order, siblings by candidate index (a grower lists a node's children
best first, so candidate order is rank order). The EAGLE-2 growers (:func:`verispec.engine.tree.grow_tree`,
:meth:`verispec.models.eagle3.Eagle3Drafter.grow`) keep the best candidates by score
(:func:`keep_best`); the engine drops nodes it cannot verify with their subtrees (:func:`ancestor_closed`).
"""

from __future__ import annotations

from collections.abc import Sequence


def keep_best(scores: Sequence[float], parents: Sequence[int], n: int) -> list[int]:
    """The ``n`` best candidates by score (ties: the lower index) whose ancestors are all kept, ascending.

    Candidates are taken best first and one whose parent was not taken is skipped, so the result is
    ancestor-closed. With scores that never exceed the parent's (cumulative log-probabilities) this is
    exactly the top ``n``."""
    kept: set[int] = set()
    for i in sorted(range(len(scores)), key=lambda i: (-scores[i], i)):
        if len(kept) >= n:
            break
        if parents[i] < 0 or parents[i] in kept:
            kept.add(i)
    return sorted(kept)


def ancestor_closed(parents: Sequence[int], wanted: Sequence[bool]) -> list[int]:
    """The candidates ``wanted`` whose ancestors are all wanted too, ascending (parents come first)."""
    kept = [False] * len(parents)
    for i, par in enumerate(parents):
        kept[i] = bool(wanted[i]) and (par < 0 or kept[par])
    return [i for i, k in enumerate(kept) if k]


def layout_by_depth(kept: Sequence[int], parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """``(order, node_parents)``: the kept candidates (ascending, ancestor-closed) as tree nodes, depth by
    depth, children grouped under their parents in node order, siblings by candidate index; ``order[j]``
    is node ``j``'s candidate and ``node_parents[j]`` its parent node (``-1``: the root)."""
    depth: dict[int, int] = {}
    for c in kept:                       # parents have lower indices, so are already placed
        par = parents[c]
        if par >= 0 and par not in depth:
            raise ValueError(f"candidate {c} is kept without its parent {par}")
        depth[c] = 0 if par < 0 else depth[par] + 1
    node_of: dict[int, int] = {}
    order: list[int] = []
    for d in range(max(depth.values(), default=-1) + 1):
        level = [c for c in kept if depth[c] == d]
        level.sort(key=lambda c: (node_of.get(parents[c], -1), c))
        for c in level:
            node_of[c] = len(order)
            order.append(c)
    return order, [node_of[parents[c]] if parents[c] >= 0 else -1 for c in order]
