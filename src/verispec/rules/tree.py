"""Tree (multi-draft) verification: exact, batched (docs/verification-rules.md §1.4 and §4); the closed
forms of what it samples are in :mod:`verispec.rules.tree_law`.

A draft tree is data (:class:`DraftTree`: node tokens and parent indices, one tree per batch row);
:func:`verify_tree` consumes it in one call, and a chain is the degenerate tree.

Per node, with current target distribution ``g`` (initially ``p`` at the node) and children
``c_1..c_m`` tried in index order, each child is accepted with probability ``a_k`` and on rejection
``g`` (and for sampling without replacement ``q``) is updated before the next sibling:

=======================  =============================================  =============================================
scheme                   accept ``c`` (lossless rule)                   on reject
=======================  =============================================  =============================================
``iid`` (SpecInfer)      ``min(1, g(c)/q(c))``                          ``g ← rule.residual(g, q)`` = norm((g − q)_+)
``without_replacement``  ``min(1, g(c)/q_k(c))``                        the same with ``q_k``, then
(recursive SD)                                                          ``q_{k+1} ← norm(q_k·1_{V∖{c}})``
``deterministic``        ``rule.accept_prob_at(g, δ_c, c)`` = ``g(c)``  ``g(c) ← 0``, renormalise (fallback: the
(EAGLE / SGLang top-k)   (lenience ``min(1, g(c)/ℓ)``, …)               node's original ``p``); duplicates skipped
=======================  =============================================  =============================================

A node whose children are all rejected emits ``z ~ rule.bonus(g_final)``: the rule's target-side draw
(``g_final`` itself for every per-token rule, its argmax for ``greedy``). An accepted child with
children is descended into (fresh ``g`` = ``p`` there); an accepted leaf emits the bonus
``z ~ rule.bonus(p_leaf)``. In the sampled schemes the acceptance and the update are the rule's own
``accept_prob_at`` and ``residual``, so a node with one child is exactly one chain position of the
rule (any per-token rule, lossy ones included, is allowed on sampled trees whose nodes have at most
one child). A rejection update whose mass vanishes falls back as the rule's residual does (sampled)
or to the node's ``p`` (deterministic); both happen only through rounding.

Tree forms of the registered rules (``chain`` = every row a chain of the same length without padding,
sampled, or of any scheme for ``block`` / ``hsd``; ``sampled`` = ``iid`` / ``without_replacement`` with
a node of two or more children):

======================  ===============  ==============================================  ============
rule                    chain            deterministic tree                              sampled
======================  ===============  ==============================================  ============
``lossless``            ``rule.verify``  accept ``g(c)``: lossless for any candidates    lossless
``greedy``              ``rule.verify``  accept iff ``c = argmax g``; law δ_argmax p     same law (1)
``block``, ``hsd``      ``rule.verify``  chains only (``q = δ_c``, still lossless)       refused
``lenience:ell``        ``rule.verify``  ``min(1, g(c)/ℓ)`` (§2.1(6), §4)                refused (2)
``ceiling`` base=p      ``rule.verify``  ``min(1, κ·g(c))`` = lenience ``ℓ = 1/κ``       refused (2)
``speccascade``         ``rule.verify``  ``1[c ∈ A_minp(g)]``, zero-and-renormalise (3)  refused (2)
``typical``             ``rule.verify``  ``1[c ∈ A_η(g)]`` hard indicator (3), (4)       refused (2)
``truncation``,         ``rule.verify``  ``1[c ∈ A(g)]``, zero-and-renormalise (3)      refused (2)
``relaxed``, ``bild``
``cos_we``, ``cos_cd``  ``rule.verify``  refused (5)                                     refused (2)
``ceiling`` base=we|cd  ``rule.verify``  refused (5)                                     refused (2)
``cascade``             ``rule.verify``  refused (5)                                     refused (2)
every other lossy rule  ``rule.verify``  refused (5)                                     refused (2)
======================  ===============  ==============================================  ============

(1) On sampled trees greedy accepts iff ``c = argmax p`` and its residual is ``δ_argmax p``, which
    has the same decisions as zeroing the rejected candidate; the emitted token is always argmax p.
(2) Only rules with ``is_lossless`` true (``lossless``, ``greedy``, and the lossless settings
    ``lenience:ell=1``, ``cos_we:lam=1``, ``cos_cd:mu=0``, ``ceiling:kappa=1``) have a defined
    multi-child form for sampled children; a lossy rule there raises ``ValueError`` pointing to
    ``scheme="deterministic"`` (§4) or to chains.
(3) On rejecting a deterministic candidate every rule zeroes ``g(c)`` and renormalises (the §4
    update), whereas the chain residual of ``speccascade`` / ``typical`` samples the full ``p``: a
    rejected candidate is not re-emitted by the correction, which is what makes the next sibling a
    fresh proposal. Hence per-token rules on ``deterministic`` chains take the tree path (so the law
    of a deterministic tree does not depend on whether it branches); sampled chains go to
    ``rule.verify``. For min-p the node emits the first candidate in ``A`` surely (membership is
    invariant under removing non-members); the η set is recomputed on the renormalised ``g``.
(4) Our ``typical`` keeps its chain acceptance, the hard ``1[g(c) >= θ(g)]``; the reference code's
    EAGLE path uses the soft ``min(1, g(c)/θ(g))`` in trees (§4). Candidates with ``g(c) >= θ``
    are accepted surely in both; ours never accepts one below the threshold (except the argmax of
    ``g``, which the η set always keeps).
(5) These rules read the draft's full distribution ``q`` at the node, and a deterministic candidate
    is a point mass ``δ_c``, under which they degenerate: ``cos_we`` accepts the first candidate with
    probability ``>= 1 − λ`` whatever ``p`` says (law ``λp + (1 − λ)δ_c``), ``cos_cd`` (draft floored
    at its smallest positive probability) becomes plain ``lossless`` with ``μ`` ignored, the ceiling on
    an ensemble inherits those, and ``cascade`` chow/diff/opt always defer to the point mass. We refuse
    them with a ``ValueError`` (§1.4: EAGLE-3 has no full ``q``; CoS is not wired in the reference tree
    path) instead of running those degenerate forms; their lossless settings are allowed.

Randomness: one uniform ``u ~ U[0, 1)`` per (depth, sibling rank) for the whole batch (``u < a``
accepts, so ``a = 0`` never does), then one :func:`~verispec.rules.base.sample_categorical` draw per
row for the next token. Rows are vectorised; Python loops run over depth and sibling rank only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch

from verispec.rules.base import (
    PerTokenRule,
    Rule,
    as_float,
    check_distribution,
    normalize_or,
    sample_categorical,
    uniform,
)
from verispec.rules.collaborative import CeilingOnEnsemble, CeilingOnTarget, CosCD, CosWE, Lenience
from verispec.rules.lossless import Greedy, Lossless
from verispec.rules.shipped import SGLangThresholds, Strict
from verispec.rules.truncation import Truncation

#: How a tree's children were proposed (see :class:`DraftTree`).
Scheme = Literal["iid", "without_replacement", "deterministic"]
IID: Scheme = "iid"
WITHOUT_REPLACEMENT: Scheme = "without_replacement"
DETERMINISTIC: Scheme = "deterministic"
SCHEMES = (IID, WITHOUT_REPLACEMENT, DETERMINISTIC)
SAMPLED_SCHEMES = (IID, WITHOUT_REPLACEMENT)

#: ``parents`` value of a padding node (allowed only after all real nodes of its row).
PAD_PARENT = -2
#: ``parents`` value of a child of the root.
ROOT_PARENT = -1
#: Padding in ``path`` and in candidate / children lists.
NO_NODE = -1

#: Per-token rules with a §4 form for point-mass (deterministic) candidates; any instance whose
#: ``is_lossless`` is true is allowed as well (see the module table).
POINT_MASS_RULES = (Lossless, Greedy, Lenience, CeilingOnTarget, Truncation)
#: Rules whose lossless settings accept a point-mass candidate ``c`` with probability ``g(c)``, so those
#: settings are lossless on deterministic trees too. Other lossless settings (``fuzzy:T=0``,
#: ``kl_judge:tau=0``: a point mass is never within a divergence 0 of ``g``) are refused there.
LOSSLESS_AT_POINT_MASS = (CosWE, CosCD, CeilingOnEnsemble, SGLangThresholds, Strict)



@dataclass(frozen=True, eq=False)
class DraftTree:
    """A batch of draft trees below a root (the root = the last committed token; its next-token
    distributions are row 0 of ``p`` and ``q``).

    ``tokens``:  ``[B, N]`` int64 node tokens (padding nodes: any value).
    ``parents``: ``[B, N]`` int64; ``-1`` (:data:`ROOT_PARENT`) for a child of the root, else an index
    ``j < i``; :data:`PAD_PARENT` (``-2``) marks padding nodes, allowed only after all real nodes of
    that row.
    ``scheme``:  how children were proposed: ``"iid"`` (sampled with replacement from ``q`` at the
    parent: SpecInfer), ``"without_replacement"`` (sampled sequentially from ``q`` with earlier
    siblings removed: recursive SD), ``"deterministic"`` (fixed candidates, e.g. top-k: EAGLE /
    SGLang). Siblings are tried in index order.

    Derived (computed once): ``n_nodes [B]``, ``depth [B, N]`` (1 for a child of the root, 0 for
    padding), ``max_depth``, ``is_chain [B]``, ``children [B, N+1, M]`` (slot 0 = the root, slot
    ``i+1`` = node ``i``; children in index order, padded with ``-1``), ``n_children [B, N+1]``,
    ``max_branching`` (= M).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    scheme: Scheme = DETERMINISTIC

    def __post_init__(self) -> None:
        tokens, parents = self.tokens, self.parents
        if not isinstance(tokens, torch.Tensor) or not isinstance(parents, torch.Tensor):
            raise TypeError("DraftTree: tokens and parents must be torch tensors")
        if tokens.dim() != 2 or parents.shape != tokens.shape:
            raise ValueError(
                "DraftTree expects tokens: [B, N] and parents: [B, N] of the same shape; got "
                f"tokens {tuple(tokens.shape)}, parents {tuple(parents.shape)}"
            )
        for name, t in (("tokens", tokens), ("parents", parents)):
            if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                raise TypeError(f"DraftTree: {name} must be an integer tensor, got {t.dtype}")
        if self.scheme not in SCHEMES:
            raise ValueError(f"DraftTree: unknown scheme {self.scheme!r}; valid schemes: {', '.join(SCHEMES)}")
        tokens, parents = tokens.long(), parents.to(device=tokens.device, dtype=torch.long)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)

        n = tokens.shape[1]
        pad = parents == PAD_PARENT
        index = torch.arange(n, device=tokens.device)
        bad = ~pad & ((parents < ROOT_PARENT) | (parents >= index))
        if bad.any():
            b, i = (int(v) for v in bad.nonzero()[0])
            raise ValueError(
                f"DraftTree: node {i} of row {b} has parent {int(parents[b, i])}; a parent must be -1 (the root) "
                f"or an earlier node index 0..{i - 1} (PAD_PARENT = {PAD_PARENT} marks padding)"
            )
        if n > 1 and (pad[:, :-1] & ~pad[:, 1:]).any():
            b = int((pad[:, :-1] & ~pad[:, 1:]).any(-1).nonzero()[0])
            raise ValueError(f"DraftTree: row {b} has a real node after a padding node; padding goes last")
        if (~pad & (tokens < 0)).any():
            b, i = (int(v) for v in (~pad & (tokens < 0)).nonzero()[0])
            raise ValueError(f"DraftTree: node {i} of row {b} has negative token id {int(tokens[b, i])}")
        if self.scheme == WITHOUT_REPLACEMENT:
            dup = self._duplicate_siblings()
            if dup is not None:
                raise ValueError(
                    f"DraftTree: row {dup[0]} has two siblings with token {dup[1]}, impossible when sampling "
                    "without replacement; use scheme 'iid' (with replacement) or remove the duplicate"
                )

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def chain(cls, tokens: torch.Tensor, scheme: Scheme = IID) -> DraftTree:
        """The chain ``x_1..x_G`` of each row: ``tokens [B, G]``, node ``i``'s parent is ``i − 1``."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            raise ValueError(f"DraftTree.chain expects tokens [B, G], got {getattr(tokens, 'shape', type(tokens))}")
        gamma = tokens.shape[1]
        parents = (torch.arange(gamma, device=tokens.device) - 1).expand(tokens.shape[0], gamma)
        return cls(tokens, parents.contiguous(), scheme)

    @classmethod
    def from_rows(cls, tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]],
                  scheme: Scheme = DETERMINISTIC) -> DraftTree:
        """Stack per-row lists of unequal length into a padded batch (padding: token 0, PAD_PARENT)."""
        if len(tokens) != len(parents):
            raise ValueError(f"DraftTree.from_rows: {len(tokens)} token rows but {len(parents)} parent rows")
        width = max((len(t) for t in tokens), default=0)
        tok = torch.zeros(len(tokens), width, dtype=torch.long)
        par = torch.full((len(tokens), width), PAD_PARENT, dtype=torch.long)
        for b, (t, pa) in enumerate(zip(tokens, parents)):
            if len(t) != len(pa):
                raise ValueError(f"DraftTree.from_rows: row {b} has {len(t)} tokens but {len(pa)} parents")
            tok[b, : len(t)] = torch.tensor(list(t), dtype=torch.long)
            par[b, : len(pa)] = torch.tensor(list(pa), dtype=torch.long)
        return cls(tok, par, scheme)

    # -- derived layout -------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def width(self) -> int:
        """N, the number of node slots per row (real nodes and padding)."""
        return self.tokens.shape[1]

    @cached_property
    def is_real(self) -> torch.Tensor:
        """``[B, N]`` bool: not a padding node."""
        return self.parents != PAD_PARENT

    @cached_property
    def n_nodes(self) -> torch.Tensor:
        """``[B]`` number of real nodes per row."""
        return self.is_real.long().sum(-1)

    @cached_property
    def depth(self) -> torch.Tensor:
        """``[B, N]`` number of nodes on the path root → node (1 for a child of the root, 0 for padding)."""
        depth = torch.zeros_like(self.parents)
        for i in range(self.width):
            par = self.parents[:, i]
            above = depth.gather(1, par.clamp_min(0)[:, None])[:, 0]
            depth[:, i] = torch.where(par == ROOT_PARENT, 1, torch.where(par >= 0, above + 1, 0))
        return depth

    @cached_property
    def max_depth(self) -> int:
        """D, the longest root → leaf path in the batch (0 for a batch without nodes)."""
        return int(self.depth.max()) if self.depth.numel() else 0

    @cached_property
    def is_chain(self) -> torch.Tensor:
        """``[B]`` bool: the real nodes form one chain (node ``i``'s parent is ``i − 1``, ``-1`` first)."""
        expect = torch.arange(self.width, device=self.parents.device) - 1
        return ((self.parents == expect) | ~self.is_real).all(-1)

    @cached_property
    def _slots_and_ranks(self) -> tuple[torch.Tensor, torch.Tensor]:
        slot = torch.where(self.is_real, self.parents + 1, -1)   # parent's row in p / q (root: 0)
        rank = torch.zeros_like(slot)
        for i in range(1, self.width):
            rank[:, i] = (slot[:, :i] == slot[:, i : i + 1]).long().sum(-1)
        return slot, rank

    @cached_property
    def n_children(self) -> torch.Tensor:
        """``[B, N+1]`` number of children of the root (slot 0) and of each node (slot ``i+1``)."""
        slot, _ = self._slots_and_ranks
        counts = torch.zeros(self.batch_size, self.width + 2, dtype=torch.long, device=slot.device)
        counts.scatter_add_(1, torch.where(slot >= 0, slot, self.width + 1), torch.ones_like(slot))
        return counts[:, : self.width + 1]

    @cached_property
    def max_branching(self) -> int:
        return int(self.n_children.max()) if self.n_children.numel() else 0

    @cached_property
    def children(self) -> torch.Tensor:
        """``[B, N+1, M]`` node indices of the children of each slot in index order, padded with ``-1``."""
        slot, rank = self._slots_and_ranks
        table = torch.full((self.batch_size, self.width + 1, self.max_branching), NO_NODE,
                           dtype=torch.long, device=slot.device)
        b, i = self.is_real.nonzero(as_tuple=True)
        table[b, slot[b, i], rank[b, i]] = i
        return table

    def _duplicate_siblings(self) -> tuple[int, int] | None:
        """``(row, token)`` of the first pair of siblings with equal tokens, or None."""
        slot, _ = self._slots_and_ranks
        same = (slot[:, :, None] == slot[:, None, :]) & (self.tokens[:, :, None] == self.tokens[:, None, :])
        same &= self.is_real[:, :, None] & self.is_real[:, None, :]
        same &= ~torch.eye(self.width, dtype=torch.bool, device=slot.device)
        if not same.any():
            return None
        b, i, _ = (int(v) for v in same.nonzero()[0])
        return b, int(self.tokens[b, i])

    def is_uniform_chain(self) -> bool:
        """Every row is a chain of all N >= 1 slots (no padding): what ``rule.verify`` takes."""
        return self.width >= 1 and bool(self.is_chain.all()) and bool(self.is_real.all())


# -- which rule has which tree form ----------------------------------------------------------------

def check_tree_rule(rule: Rule, scheme: Scheme, max_branching: int, uniform_chain: bool = False) -> None:
    """Raise ``ValueError`` unless ``rule`` has a tree form for ``scheme`` (see the module table)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tree scheme {scheme!r}; valid schemes: {', '.join(SCHEMES)}")
    if not rule.per_token or not isinstance(rule, PerTokenRule):
        if uniform_chain:
            return
        raise ValueError(
            f"rule {rule.spec()!r} is defined on chains only (a sequence-level rule over one draft block); "
            "pass a DraftTree.chain of equal length in every row, or use a per-token rule (e.g. lossless) on trees"
        )
    if rule.is_lossless and (scheme != DETERMINISTIC or isinstance(rule, POINT_MASS_RULES + LOSSLESS_AT_POINT_MASS)):
        return
    if scheme == DETERMINISTIC:
        if not isinstance(rule, POINT_MASS_RULES):
            raise ValueError(
                f"rule {rule.spec()!r} has no deterministic-tree form: a deterministic candidate is a point mass "
                "δ_c, under which rules that read the draft's full distribution q degenerate (see "
                "verispec.rules.tree). Use it on a sampled chain (DraftTree.chain, scheme 'iid'), or use lossless, "
                "greedy, lenience, ceiling (base=p) or a truncation-set rule (speccascade, typical, truncation, "
                "relaxed, bild) on deterministic trees"
            )
        return
    if max_branching > 1 and not uniform_chain:
        raise ValueError(
            f"rule {rule.spec()!r} is lossy: with {scheme} sampled children it is defined only on chains (one "
            "child per node); for trees with branching > 1 use scheme 'deterministic' (fixed candidates, "
            "docs/verification-rules.md §4), or a lossless rule (lossless, greedy) with sampled children"
        )


# -- the node step, shared by the sampler and the closed forms -------------------------------------

def _point_mass(tok: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like).scatter_(-1, tok[:, None], 1.0)


def node_accept_prob(rule: PerTokenRule, scheme: Scheme, g: torch.Tensor, q_k: torch.Tensor | None,
                 tok: torch.Tensor) -> torch.Tensor:
    """Acceptance probability of candidate ``tok [R]`` at target ``g [R, V]``. ``-> [R]``."""
    draft = _point_mass(tok, g) if scheme == DETERMINISTIC else q_k
    return rule.accept_prob_at(g, draft, tok).clamp(0.0, 1.0)


def node_reject(rule: PerTokenRule, scheme: Scheme, g: torch.Tensor, q_k: torch.Tensor | None, tok: torch.Tensor,
            p_node: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(g, q_k)`` after rejecting ``tok``; rows ``[R, V]``."""
    if scheme == DETERMINISTIC:
        return normalize_or(g.scatter(-1, tok[:, None], 0.0), p_node), None
    g = rule.residual(g, q_k)
    if scheme == WITHOUT_REPLACEMENT:
        q_k = normalize_or(q_k.scatter(-1, tok[:, None], 0.0), q_k)
    return g, q_k


# -- the sampler --------------------------------------------------------------------------------------

def verify_tree(rule: Rule, p: torch.Tensor, q: torch.Tensor | None, tree: DraftTree,
                generator: torch.Generator | None = None,
                raw: tuple[torch.Tensor, torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify a batch of draft trees.

    ``p: [B, N+1, V]`` processed target: row 0 at the root, row ``i+1`` after node ``i``.
    ``q: [B, N+1, V]`` processed draft at the same rows (node ``i``'s children were sampled from row
    ``i+1``, the root's from row 0; rows of leaves and padding are not read), or None for scheme
    ``"deterministic"`` (ignored there: candidates are point masses).
    ``-> (path [B, D] int64`` node indices of the accepted path from the root down, padded with -1,
    ``D = tree.max_depth``; ``n_accepted [B]`` int64 = path length; ``next_token [B]`` int64 = the
    correction or bonus token).

    A sampled chain of equal length in every row, and any chain for a chain-only rule (``block``,
    ``hsd``), goes to ``rule.verify`` unchanged (bit-identical results for the same generator; on a
    deterministic chain the draft is ``q = δ_x``).

    ``raw = (p_raw, q_raw)``, shaped like ``p`` and ``q``: the untruncated temperature-1 distributions, for
    rules that read them (``needs_raw``, e.g. ``fuzzy:...,on=raw``); such rules run on sampled chains only.
    """
    if not isinstance(tree, DraftTree):
        raise TypeError(f"verify_tree expects a DraftTree, got {type(tree).__name__}")
    p, q = check_tree_inputs(p, q, tree)
    uniform_chain = tree.is_uniform_chain()
    check_tree_rule(rule, tree.scheme, tree.max_branching, uniform_chain)
    deterministic = tree.scheme == DETERMINISTIC
    needs_raw = rule.needs_raw
    if needs_raw and (deterministic or not uniform_chain):
        raise ValueError(f"rule {rule.spec()!r} reads the draft's raw distribution: it runs on sampled chains only "
                         "(no tree, no prompt lookup)")
    if uniform_chain and not (deterministic and rule.per_token):
        tokens = tree.tokens.to(p.device)
        q_chain = _point_mass_rows(tokens, p) if deterministic else q[:, : tree.width]
        if needs_raw:
            if raw is None:
                raise ValueError(f"rule {rule.spec()!r} needs raw=(p_raw, q_raw), the untruncated distributions")
            n_accepted, next_token = rule.verify(p, q_chain, tokens, generator,
                                                 raw=(raw[0], raw[1][:, : tree.width]))
        else:
            n_accepted, next_token = rule.verify(p, q_chain, tokens, generator)
        steps = torch.arange(tree.width, device=p.device)
        path = torch.where(steps < n_accepted[:, None], steps, NO_NODE)
        return path, n_accepted, next_token
    return _verify_tree_path(rule, p, q, tree, generator)


def _point_mass_rows(tokens: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """One-hot draft rows ``[B, G, V]`` for chain tokens ``[B, G]``."""
    out = torch.zeros(*tokens.shape, like.shape[-1], dtype=like.dtype, device=like.device)
    return out.scatter_(-1, tokens[..., None], 1.0)


def _verify_tree_path(rule: PerTokenRule, p: torch.Tensor, q: torch.Tensor | None, tree: DraftTree,
                      generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scheme = tree.scheme
    deterministic = scheme == DETERMINISTIC
    batch, vocab, device = p.shape[0], p.shape[-1], p.device
    tokens = tree.tokens.to(device)
    children = tree.children.to(device)                                   # [B, N+1, M]
    n_children = tree.n_children.to(device)                               # [B, N+1]
    depth = tree.max_depth
    rows = torch.arange(batch, device=device)

    path = torch.full((batch, depth), NO_NODE, dtype=torch.long, device=device)
    n_accepted = torch.zeros(batch, dtype=torch.long, device=device)
    final = torch.zeros(batch, vocab, dtype=p.dtype, device=device)       # the next token's law per row
    slot = torch.zeros(batch, dtype=torch.long, device=device)            # current node's row in p / q
    running = torch.ones(batch, dtype=torch.bool, device=device)
    for level in range(depth + 1):
        p_node = p[rows, slot]                                            # [B, V]
        g = p_node
        q_k = None if deterministic else q[rows, slot]
        chosen = torch.full((batch,), NO_NODE, dtype=torch.long, device=device)
        tried = torch.zeros(batch, vocab, dtype=torch.bool, device=device)  # rejected tokens (duplicates)
        for rank in range(children.shape[-1]):
            child = children[rows, slot, rank]
            tok = tokens[rows, child.clamp_min(0)]
            active = running & (chosen == NO_NODE) & (child >= 0)
            if deterministic:
                active &= ~tried[rows, tok]
            if not active.any():
                continue                                                  # e.g. a skipped duplicate
            a = node_accept_prob(rule, scheme, g, q_k, tok)
            u = uniform((batch,), generator, dtype=g.dtype, device=device)
            accepted = active & (u < a)
            rejected = active & ~accepted
            chosen = torch.where(accepted, child, chosen)
            g_new, q_new = node_reject(rule, scheme, g, q_k, tok, p_node)
            g = torch.where(rejected[:, None], g_new, g)
            if q_k is not None:
                q_k = torch.where(rejected[:, None], q_new, q_k)
            if deterministic:
                tried[rows[rejected], tok[rejected]] = True
        gave_up = running & (chosen == NO_NODE)
        final = torch.where(gave_up[:, None], rule.bonus(g), final)
        took = running & (chosen != NO_NODE)
        if level < depth:
            path[:, level] = torch.where(took, chosen, path[:, level])
        n_accepted += took.long()
        slot = torch.where(took, chosen + 1, slot)
        leaf = took & (n_children[rows, slot] == 0)
        final = torch.where(leaf[:, None], rule.bonus(p[rows, slot]), final)
        running = took & ~leaf
        if not running.any():
            break
    return path, n_accepted, sample_categorical(final, generator)


def check_tree_inputs(p: torch.Tensor, q: torch.Tensor | None,
                       tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor | None]:
    batch, width = tree.batch_size, tree.width
    if not isinstance(p, torch.Tensor) or p.dim() != 3:
        raise ValueError(f"verify_tree expects p: [B, N+1, V]; got {tuple(getattr(p, 'shape', ()))}")
    if p.shape[:2] != (batch, width + 1):
        raise ValueError(
            f"p must be [B, N+1, V] = [{batch}, {width + 1}, V] for a tree of N = {width} node slots "
            f"(row 0 at the root, row i+1 after node i); got {tuple(p.shape)}"
        )
    vocab = p.shape[-1]
    if q is None:
        if tree.scheme != DETERMINISTIC:
            raise ValueError(
                f"scheme {tree.scheme!r} samples children from the draft: pass q [B, N+1, V] "
                "(q may be None only for scheme 'deterministic')"
            )
    else:
        if not isinstance(q, torch.Tensor) or q.dim() != 3:
            raise ValueError(f"verify_tree expects q: [B, N+1, V] or None; got {tuple(getattr(q, 'shape', ()))}")
        if q.shape[-1] != vocab:
            raise ValueError(f"vocabulary size mismatch: target p has {vocab} tokens, draft q has {q.shape[-1]}")
        if q.shape != p.shape:
            raise ValueError(f"q must have the shape of p, [{batch}, {width + 1}, {vocab}]; got {tuple(q.shape)}")
    real = tree.is_real.to(p.device)
    tokens = tree.tokens.to(p.device)
    out_of_range = real & (tokens >= vocab)
    if out_of_range.any():
        bad = tokens[out_of_range][0].item()
        raise ValueError(f"draft token id {bad} is outside the vocabulary [0, {vocab})")
    p = as_float(p)
    rows_used = torch.cat([torch.ones(batch, 1, dtype=torch.bool, device=p.device), real], dim=1)  # root + real
    check_distribution(p[rows_used], "target p")
    if q is not None:
        q = as_float(q).to(p.dtype)
        if tree.scheme != DETERMINISTIC:
            has_children = tree.n_children.to(p.device) > 0
            check_distribution(q[has_children], "draft q")
    return p, q
