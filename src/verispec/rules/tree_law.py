"""Closed forms of tree verification (docs/verification-rules.md §1.4 and §4): the exact law that
:func:`verispec.rules.tree.verify_tree` samples from.

* :func:`tree_node_law` -- the law emitted at ONE node given its candidate list, the acceptance chance of
  each candidate, by the same node step (:func:`~verispec.rules.tree.node_accept_prob`,
  :func:`~verispec.rules.tree.node_reject`) the sampler runs;
* :func:`sampled_node_law` -- that law averaged over sampled candidates, by exact enumeration (``= p``
  for a lossless rule);
* :func:`tree_path_law` -- the law of a whole tree's outcome ``(path, next token)`` for one batch row.
"""

from __future__ import annotations

import itertools

import torch

from verispec.rules.base import Rule, as_float, check_distribution
from verispec.rules.tree import (
    DETERMINISTIC,
    IID,
    NO_NODE,
    SAMPLED_SCHEMES,
    SCHEMES,
    WITHOUT_REPLACEMENT,
    DraftTree,
    Scheme,
    check_tree_inputs,
    check_tree_rule,
    node_accept_prob,
    node_reject,
)

#: Largest number of candidate tuples :func:`sampled_node_law` enumerates.
MAX_ENUMERATION = 200_000


def tree_node_law(rule: Rule, g: torch.Tensor, candidates: torch.Tensor, q: torch.Tensor | None = None,
                  scheme: Scheme = DETERMINISTIC) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact emitted law at ONE node, given its candidate list.

    ``g: [..., V]`` the processed target at the node; ``candidates: [..., m]`` the children's tokens
    in order (padding ``-1`` allowed at the end); ``q: [..., V]`` the draft at the node (needed for the
    sampled schemes). ``-> (law [..., V]`` = P(the node emits token v, as an accepted child or as the
    correction), ``accept [..., m]`` = P(child k is the accepted one)).

    Sequentially ``P(c_k accepted) = Π_{j<k}(1 − a_j)·a_k`` with ``g`` (and ``q_k``) updated
    deterministically after each rejection, plus ``Π_j (1 − a_j)·rule.bonus(g_final)``. For the sampled
    schemes this is the law *conditional on the drawn candidates*; averaged over the draws it is ``p``
    for a lossless rule (exactly: :func:`sampled_node_law`).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tree scheme {scheme!r}; valid schemes: {', '.join(SCHEMES)}")
    g = as_float(g)
    check_distribution(g, "target g")
    if candidates.dtype.is_floating_point or candidates.dtype == torch.bool:
        raise TypeError(f"candidates must be an integer tensor, got {candidates.dtype}")
    if candidates.shape[:-1] != g.shape[:-1]:
        raise ValueError(f"candidates [..., m] must share the leading shape of g [..., V]; got "
                         f"{tuple(candidates.shape)} and {tuple(g.shape)}")
    vocab, m = g.shape[-1], candidates.shape[-1]
    cand = candidates.reshape(-1, m).long().to(g.device)
    if ((cand < NO_NODE) | (cand >= vocab)).any():
        raise ValueError(f"candidate token ids must lie in [0, {vocab}) (padding -1); got {cand.min()}..{cand.max()}")
    if m > 1 and ((cand[:, :-1] < 0) & (cand[:, 1:] >= 0)).any():
        raise ValueError("candidate padding (-1) must come after all real candidates")
    if scheme == DETERMINISTIC:
        q_flat = None
    else:
        if q is None:
            raise ValueError(f"scheme {scheme!r} samples the candidates from q: pass q [..., V]")
        q = as_float(q).to(g.dtype)
        if q.shape != g.shape:
            raise ValueError(f"q must have the shape of g {tuple(g.shape)}; got {tuple(q.shape)}")
        check_distribution(q, "draft q")
        q_flat = q.reshape(-1, vocab)
        if scheme == WITHOUT_REPLACEMENT:
            same = (cand[:, :, None] == cand[:, None, :]) & (cand[:, :, None] >= 0)
            if (same & ~torch.eye(m, dtype=torch.bool, device=cand.device)).any():
                raise ValueError("scheme 'without_replacement' cannot have duplicate candidates")
    real_per_row = (cand >= 0).long().sum(-1)
    check_tree_rule(rule, scheme, int(real_per_row.max()) if real_per_row.numel() else 0)

    p_node = g.reshape(-1, vocab)
    rows = torch.arange(p_node.shape[0], device=g.device)
    g_k, q_k = p_node, q_flat
    survive = torch.ones(p_node.shape[0], dtype=g.dtype, device=g.device)
    law = torch.zeros_like(p_node)
    accept = torch.zeros(cand.shape, dtype=g.dtype, device=g.device)
    tried = torch.zeros_like(p_node, dtype=torch.bool)
    for k in range(m):
        tok = cand[:, k].clamp_min(0)
        active = cand[:, k] >= 0
        if scheme == DETERMINISTIC:
            active &= ~tried[rows, tok]
        a = torch.where(active, node_accept_prob(rule, scheme, g_k, q_k, tok), torch.zeros_like(survive))
        accept[:, k] = survive * a
        law[rows, tok] += survive * a
        survive = survive * (1 - a)
        g_new, q_new = node_reject(rule, scheme, g_k, q_k, tok, p_node)
        g_k = torch.where(active[:, None], g_new, g_k)
        if q_k is not None:
            q_k = torch.where(active[:, None], q_new, q_k)
        tried[rows[active], tok[active]] = True
    law = law + survive[:, None] * rule.bonus(g_k)
    return law.reshape(g.shape), accept.reshape(candidates.shape)


def sampled_node_law(rule: Rule, g: torch.Tensor, q: torch.Tensor, m: int,
                     scheme: Scheme = IID) -> tuple[torch.Tensor, torch.Tensor]:
    """Law of one node averaged over its ``m`` sampled candidates, by exact enumeration.

    ``g, q: [V]``; ``scheme`` ``"iid"`` (``c_k ~ q`` independently) or ``"without_replacement"``
    (``c_k ~ norm(q·1_{V∖{c_<k}})``). ``-> (law [V], accept [m]`` = P(child k is the accepted one)).
    Enumerates all ``V^m`` candidate tuples (at most :data:`MAX_ENUMERATION`); for a lossless rule
    ``law = p`` exactly.
    """
    if scheme not in SAMPLED_SCHEMES:
        raise ValueError(f"sampled_node_law needs a sampled scheme ({', '.join(SAMPLED_SCHEMES)}); got {scheme!r}")
    if g.dim() != 1 or q.shape != g.shape:
        raise ValueError(f"sampled_node_law expects g: [V] and q: [V]; got {tuple(g.shape)}, {tuple(q.shape)}")
    g, q = as_float(g), as_float(q).to(as_float(g).dtype)
    vocab = g.shape[0]
    if vocab**m > MAX_ENUMERATION:
        raise ValueError(f"sampled_node_law enumerates V^m = {vocab}^{m} tuples, more than {MAX_ENUMERATION}")
    if scheme == WITHOUT_REPLACEMENT and int((q > 0).sum()) < m:
        raise ValueError(f"q has only {int((q > 0).sum())} tokens of positive probability: {m} candidates cannot "
                         "be drawn without replacement")
    tuples = [t for t in itertools.product(range(vocab), repeat=m)
              if scheme == IID or len(set(t)) == m]
    weights = []
    for t in tuples:
        w, left = 1.0, 1.0
        for c in t:
            w *= q[c].item() / left if left > 0 else 0.0
            if scheme == WITHOUT_REPLACEMENT:
                left -= q[c].item()
        weights.append(w)
    weight = torch.tensor(weights, dtype=g.dtype)
    keep = weight > 0
    cand = torch.tensor(tuples, dtype=torch.long).reshape(len(tuples), m)[keep]
    law, accept = tree_node_law(rule, g.expand(len(cand), vocab), cand, q.expand(len(cand), vocab), scheme)
    w = weight[keep][:, None]
    return (w * law).sum(0), (w * accept).sum(0)


def tree_path_law(rule: Rule, p: torch.Tensor, q: torch.Tensor | None,
                  tree: DraftTree, row: int = 0) -> dict[tuple[tuple[int, ...], int], float]:
    """Exact law of ``verify_tree``'s outcome ``(path, next_token)`` for one batch row.

    ``p, q`` as for :func:`verify_tree`. Returns ``{(path as node indices, next token): probability}``
    over the outcomes of positive probability (sums to 1). Per-token rules on non-chain-dispatched
    trees only (the tree form; a sampled uniform chain has the same law through ``rule.verify``).
    """
    p1, q1 = check_tree_inputs(p[row : row + 1], None if q is None else q[row : row + 1],
                                DraftTree(tree.tokens[row : row + 1], tree.parents[row : row + 1], tree.scheme))
    check_tree_rule(rule, tree.scheme, tree.max_branching)
    children = tree.children[row]
    tokens = tree.tokens[row]
    law: dict[tuple[tuple[int, ...], int], float] = {}

    def visit(slot: int, prefix: tuple[int, ...], weight: float) -> None:
        kids = [int(c) for c in children[slot] if c >= 0]
        g = p1[0, slot]
        if not kids:
            dist = rule.bonus(g[None])[0]
            emit, accept = dist, torch.zeros(0, dtype=g.dtype)
        else:
            cand = tokens[kids]
            q_row = None if q1 is None or tree.scheme == DETERMINISTIC else q1[0, slot][None]
            emit, accept = tree_node_law(rule, g[None], cand[None], q_row, tree.scheme)
            emit, accept = emit[0].clone(), accept[0]
            emit.index_add_(0, cand, -accept)          # what is left is the correction's mass
        for z in torch.nonzero(emit > 1e-15).flatten().tolist():
            key = (prefix, z)
            law[key] = law.get(key, 0.0) + weight * emit[z].item()
        for child, a in zip(kids, accept.tolist()):
            if a > 0:
                visit(child + 1, prefix + (child,), weight * a)

    visit(0, (), 1.0)
    return law
