"""Draft trees: their shape, shared by the API and the CLI (``--tree``), and growing a tree with a draft model.

Tree layout (described once, here; :class:`verispec.rules.tree.DraftTree` consumes it): the root is
the last committed token, which neither model has processed yet; node ``i`` has token ``tokens[i]``
and parent ``parents[i]`` (``-1``: a child of the root, else an earlier node); parents come before
children, siblings are listed in the order the verifier tries them (draft rank for deterministic
candidates, draw order for sampled ones). Node ``i`` sits at depth ``depth(i)`` (roots' children: 0),
so its position is ``committed + depth(i)``. A chain of ``γ`` tokens is the tree whose every node is
the child of the previous one: the one code path of :func:`verispec.engine.generate` serves both.

Tree specs (``TreeShape.parse``):

=====================================  =====================================================================
``4,2,2,1`` or ``topk:4,2,2,1``         static: the ``b_d`` most probable draft tokens below every node of
                                       depth ``d`` (deterministic candidates, EAGLE/SGLang style)
``iid:4,2,2,1``                         static, children sampled i.i.d. from the draft (SpecInfer)
``wor:4,2,2,1``                         static, children sampled without replacement (recursive SD)
``dynamic:top_k=10,depth=5,nodes=60``   EAGLE-2: per depth expand the ``top_k`` best nodes by cumulative draft
                                       log-probability, ``top_k`` children each; keep the ``nodes`` best
=====================================  =====================================================================

Deterministic candidates are ranked by the draft's *raw* log-probabilities (softmax of the logits at
temperature 1, no truncation), as EAGLE does: the sampling pipeline's truncation would otherwise drop
candidates the target may well accept. The verifier treats them as point masses (``q = δ_c``), so
their ranking affects speed, never the lossless law. Sampled children are drawn from the processed
draft ``q`` (that is what makes SpecInfer and recursive SD lossless).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from verispec.engine.stats import Section
from verispec.models.base import Backend
from verispec.params import Param, parse_settings
from verispec.rules import Rule
from verispec.rules import tree as rules_tree
from verispec.rules.base import sample_categorical
from verispec.rules.tree import DETERMINISTIC, IID, WITHOUT_REPLACEMENT, Scheme
from verispec.sampling import SamplingConfig
from verispec.tree_nodes import keep_best, layout_by_depth

#: Schemes of :mod:`verispec.rules.tree`, by the word used in a tree shape's text.
SCHEME_WORDS: dict[str, Scheme] = {"topk": DETERMINISTIC, "iid": IID, "wor": WITHOUT_REPLACEMENT,
                                   "without_replacement": WITHOUT_REPLACEMENT, "dynamic": DETERMINISTIC}
#: Where a draft came from: the draft model, prompt lookup or an EAGLE-3 head.
Source = Literal["model", "lookup", "head"]
MODEL: Source = "model"
LOOKUP: Source = "lookup"
HEAD: Source = "head"
#: Largest tree the engine grows (llama.cpp gives every node its own sequence id).
MAX_TREE_NODES = 255

_DYNAMIC_PARAMS = (
    Param("top_k", int, lambda v: 1 <= v <= 64, "an integer in [1, 64]", "children per expanded node", 10),
    Param("depth", int, lambda v: 1 <= v <= 32, "an integer in [1, 32]", "tree depth", 5),
    Param("nodes", int, lambda v: 1 <= v <= MAX_TREE_NODES, f"an integer in [1, {MAX_TREE_NODES}]",
          "nodes kept", 60),
)


@dataclass(frozen=True)
class TreeShape:
    """How to grow a draft tree. ``kind``: ``"static"`` (``branching`` per depth) or ``"dynamic"``."""

    kind: Literal["static", "dynamic"]
    scheme: Scheme                           # how children are proposed
    branching: tuple[int, ...] = ()          # static
    top_k: int = 0                           # dynamic
    depth_limit: int = 0                     # dynamic
    nodes: int = 0                           # dynamic

    @classmethod
    def chain(cls, gamma: int) -> "TreeShape":
        """The chain of ``gamma`` sampled draft tokens (ordinary speculative decoding)."""
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
            raise ValueError(f"a chain needs gamma >= 1 draft tokens, got {gamma!r}")
        return cls("static", IID, (1,) * gamma)

    @classmethod
    def parse(cls, text: str) -> "TreeShape":
        if isinstance(text, TreeShape):
            return text
        raw = str(text).strip().lower()
        if not raw:
            raise ValueError("empty tree shape; e.g. 4,2,2,1 or dynamic:top_k=10,depth=5,nodes=60")
        word, sep, body = raw.partition(":")
        if not sep and word[:1].isdigit():
            word, body = "topk", raw
        if word == "chain":
            try:
                return cls.chain(int(body))
            except ValueError:
                raise ValueError(f"tree chain: give the chain length, e.g. chain:5; got {body!r}") from None
        if word not in SCHEME_WORDS:
            raise ValueError(f"unknown tree kind {word!r}: use topk:B1,B2,..., iid:..., wor:... (branching per "
                             "depth, e.g. 4,2,2,1) or dynamic:top_k=10,depth=5,nodes=60")
        if word == "dynamic":
            values = {p.name: p.default for p in _DYNAMIC_PARAMS}
            values.update(parse_settings(body, _DYNAMIC_PARAMS, owner="tree dynamic", positional=True))
            return cls("dynamic", DETERMINISTIC, top_k=values["top_k"], depth_limit=values["depth"],
                       nodes=values["nodes"])
        try:
            branching = tuple(int(x) for x in body.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"tree {word}: branching must be integers per depth, e.g. {word}:4,2,2,1; "
                             f"got {body!r}") from None
        if not branching or any(b < 1 for b in branching):
            raise ValueError(f"tree {word}: give one branching factor >= 1 per depth, e.g. {word}:4,2,2,1; "
                             f"got {body!r}")
        shape = cls("static", SCHEME_WORDS[word], branching)
        if shape.max_nodes > MAX_TREE_NODES:
            raise ValueError(f"tree {shape.text()} has {shape.max_nodes} nodes; at most {MAX_TREE_NODES} are supported")
        return shape

    @property
    def depth(self) -> int:
        return len(self.branching) if self.kind == "static" else self.depth_limit

    @property
    def max_nodes(self) -> int:
        if self.kind == "dynamic":
            return self.nodes
        total, width = 0, 1
        for b in self.branching:
            width *= b
            total += width
        return total

    @property
    def is_chain(self) -> bool:
        return self.kind == "static" and all(b == 1 for b in self.branching) and self.scheme == IID

    def text(self) -> str:
        """The shape as ``--tree`` writes it (``TreeShape.parse`` reads it back)."""
        if self.kind == "dynamic":
            return f"dynamic:top_k={self.top_k},depth={self.depth_limit},nodes={self.nodes}"
        if self.is_chain:
            return f"chain:{len(self.branching)}"
        word = {DETERMINISTIC: "topk", IID: "iid", WITHOUT_REPLACEMENT: "wor"}[self.scheme]
        return f"{word}:" + ",".join(map(str, self.branching))

    def check_rule(self, rule: Rule) -> None:
        """Refuse, before any decoding, a rule that has no form on the trees of this shape (the rules
        layer checks every call the same way: :func:`verispec.rules.tree.check_tree_rule`)."""
        one_child = self.kind == "static" and all(b == 1 for b in self.branching)
        branching = max(self.branching) if self.kind == "static" else self.top_k
        try:
            rules_tree.check_tree_rule(rule, self.scheme, branching, uniform_chain=one_child)
        except ValueError as exc:
            raise ValueError(f"{exc} (tree {self.text()}: --tree topk:... and dynamic:... are deterministic "
                             "candidates; --gamma drafts a sampled chain)") from None


@dataclass
class DraftProposal:
    """A grown tree. ``q [N+1, V]``: the processed draft at the root (row 0) and after node ``i``
    (row ``i+1``) where the draft model expanded it; other rows are uniform placeholders (leaves: no
    children are drawn from them); None for drafts without a draft distribution (prompt lookup, an
    EAGLE-3 head: deterministic candidates). ``in_draft[i]``: node ``i``'s id in the draft model's open tree,
    or ``-1`` when the draft model never processed it."""

    tokens: list[int]
    parents: list[int]
    q: torch.Tensor | None
    scheme: Scheme
    in_draft: list[int] = field(default_factory=list)
    draft_forwards: int = 0
    expanded: list[bool] = field(default_factory=list)
    source: Source = MODEL         # the draft model, prompt lookup or an EAGLE-3 head
    q_raw: torch.Tensor | None = None   # like ``q``, untruncated at temperature 1 (``grow_tree(keep_raw=True)``)

    @classmethod
    def candidates(cls, tokens: list[int], parents: list[int], source: Source) -> "DraftProposal":
        """Deterministic candidates from a source without a draft distribution (no ``q``, nothing
        processed by the draft model)."""
        n = len(tokens)
        return cls(list(tokens), list(parents), None, DETERMINISTIC, [-1] * n, 0, [False] * n, source)

    @property
    def n_nodes(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """Tokens on the longest root-to-leaf path (a chain's length)."""
        return max(self.depths(), default=-1) + 1

    def depths(self) -> list[int]:
        out: list[int] = []
        for par in self.parents:
            out.append(0 if par < 0 else out[par] + 1)
        return out

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (``-1``: the root) in verification order."""
        return [i for i, par in enumerate(self.parents) if par == node]


def lookup_proposal(tokens: list[int]) -> DraftProposal:
    """A chain proposed without a draft model (prompt lookup): deterministic candidates, so the rules
    see point masses and there is no ``q``."""
    return DraftProposal.candidates(tokens, list(range(-1, len(tokens) - 1)), LOOKUP)


def grow_tree(draft: Backend, pending: list[int], shape: TreeShape, sampling: SamplingConfig, width: int,
              generator: torch.Generator, max_depth: int | None = None, timing=None,
              stop_below: float = 0.0, keep_drafting=None, keep_raw: bool = False) -> DraftProposal:
    """Feed ``pending`` (committed tokens the draft has not seen; the last one is the root) and grow
    the tree ``shape`` below it, at most ``max_depth`` deep. One draft forward per depth that has
    nodes to expand (all of them at once). ``stop_below`` (static trees, chains included): a node
    whose token had draft probability below it is not expanded, so a chain stops drafting at the
    first unconfident token (the decision reads the draft alone, so lossless rules stay exact).
    ``keep_drafting(confidences) -> bool`` (chains only): called with the draft's probabilities of the
    tokens drafted so far, whether to draft another (:meth:`AutoGamma.keep_drafting`). ``keep_raw``: also
    keep the draft's untruncated temperature-1 rows (``q_raw``, static trees and chains), for rules that
    read them.
    ``timing(name)`` is a :meth:`Stats.timing`-like context factory for ``draft_s`` / ``rule_s``."""
    timed = timing or Section
    depth = min(shape.depth, max_depth) if max_depth is not None else shape.depth
    device = generator.device       # the draft's rows are processed and sampled where verification runs
    with timed("draft_s"):
        root_logits = draft.forward(pending, all_logits=False)[:, :width].to(device)
    forwards = 1
    with timed("rule_s"):
        q_root = sampling.process(root_logits)[0]
    tokens: list[int] = []
    parents: list[int] = []
    in_draft: list[int] = []
    q_of: dict[int, torch.Tensor] = {-1: q_root}
    logits_of: dict[int, torch.Tensor] = {-1: root_logits[0]}
    draft_ids = 0

    if keep_drafting is not None and not shape.is_chain:
        raise ValueError("a per-token stop rule decides the length of a chain; it does not apply to a tree")
    confidences: list[float] = []
    if shape.kind == "static":
        frontier = [-1]
        for d in range(depth):
            new: list[int] = []
            with timed("rule_s"):
                for node in frontier:
                    for tok in _children(q_of[node], logits_of[node], shape.branching[d], shape.scheme, generator):
                        tokens.append(tok)
                        parents.append(node)
                        in_draft.append(-1)
                        confidence = float(q_of[node][tok])
                        confidences.append(confidence)
                        if confidence >= stop_below and (keep_drafting is None or keep_drafting(confidences)):
                            new.append(len(tokens) - 1)
            if d == depth - 1 or not new:
                break
            with timed("draft_s"):
                logits = draft.forward_tree([tokens[i] for i in new], [in_draft[parents[i]] if parents[i] >= 0
                                                                        else -1 for i in new])[:, :width].to(device)
            forwards += 1
            with timed("rule_s"):
                probs = sampling.process(logits)
            for row, i in enumerate(new):
                in_draft[i] = draft_ids
                draft_ids += 1
                q_of[i], logits_of[i] = probs[row], logits[row]
            frontier = new
    else:
        tokens, parents, in_draft, q_rows, forwards_more = _grow_dynamic(draft, shape, depth, sampling, width,
                                                                         root_logits[0], timed)
        q_of.update(q_rows)
        forwards += forwards_more

    with timed("rule_s"):
        vocab = q_root.shape[-1]
        uniform = torch.full((vocab,), 1.0 / vocab, dtype=q_root.dtype, device=device)
        q = torch.stack([q_root] + [q_of.get(i, uniform) for i in range(len(tokens))])
    expanded = [i in q_of for i in range(len(tokens))]
    q_raw = None
    if keep_raw:
        if shape.kind != "static":
            raise ValueError("raw draft rows are kept for static trees and chains only")
        with timed("rule_s"):
            rows = [logits_of[-1]] + [logits_of.get(i) for i in range(len(tokens))]
            q_raw = torch.stack([torch.softmax(r.float(), -1) if r is not None else uniform for r in rows])
    return DraftProposal(tokens, parents, q, shape.scheme, in_draft, forwards, expanded, q_raw=q_raw)


def _children(q: torch.Tensor, logits: torch.Tensor, k: int, scheme: Scheme, generator: torch.Generator) -> list[int]:
    """``k`` children below a node: the ``k`` best raw draft tokens (deterministic), ``k`` i.i.d. draws
    from ``q``, or ``k`` draws without replacement (fewer when ``q`` has fewer tokens)."""
    if scheme == DETERMINISTIC:
        return torch.topk(logits, min(k, logits.numel())).indices.tolist()
    if scheme == IID:
        return sample_categorical(q.expand(k, -1), generator).tolist() if k > 1 else \
            sample_categorical(q[None], generator).tolist()
    out: list[int] = []
    rest = q.clone()
    for _ in range(k):
        if float(rest.sum()) <= 0:
            break
        tok = int(sample_categorical(rest[None], generator)[0])
        out.append(tok)
        rest[tok] = 0.0
    return out


def _grow_dynamic(draft: Backend, shape: TreeShape, depth: int, sampling: SamplingConfig, width: int,
                  root_logits: torch.Tensor, timed) -> tuple[list[int], list[int], list[int], dict, int]:
    """EAGLE-2 growth: candidates carry cumulative raw draft log-probabilities; per depth the
    ``top_k`` best candidates of that depth are expanded (one draft forward), each proposing its
    ``top_k`` best children; finally the ``nodes`` best candidates are kept (each with its parent)
    and laid out depth by depth, siblings by rank. Returns the kept nodes' tokens, parents and ids
    in the draft's tree, the processed draft rows of the expanded ones (by kept index), and the
    number of draft forwards."""
    k = shape.top_k
    cand_tok: list[int] = []
    cand_par: list[int] = []
    cand_score: list[float] = []
    cand_draft: list[int] = []
    cand_q: dict[int, torch.Tensor] = {}               # expanded candidates: processed draft row
    logits_of: dict[int, torch.Tensor] = {-1: root_logits}
    forwards = 0

    def propose(node: int, base: float) -> list[int]:
        logp = torch.log_softmax(logits_of[node].double(), -1)
        top = torch.topk(logp, min(k, logp.numel()))
        new = []
        for lp, tok in zip(top.values.tolist(), top.indices.tolist()):
            cand_tok.append(tok)
            cand_par.append(node)
            cand_score.append(base + lp)
            cand_draft.append(-1)
            new.append(len(cand_tok) - 1)
        return new

    with timed("rule_s"):
        level = propose(-1, 0.0)
    draft_ids = 0
    for _ in range(1, depth):
        frontier = sorted(level, key=lambda i: -cand_score[i])[:k]
        with timed("draft_s"):
            parents = [cand_draft[cand_par[i]] if cand_par[i] >= 0 else -1 for i in frontier]
            logits = draft.forward_tree([cand_tok[i] for i in frontier], parents)[:, :width].to(root_logits.device)
        forwards += 1
        with timed("rule_s"):
            probs = sampling.process(logits)
            level = []
            for row, i in enumerate(frontier):
                cand_draft[i] = draft_ids
                draft_ids += 1
                cand_q[i], logits_of[i] = probs[row], logits[row]
                level += propose(i, cand_score[i])

    with timed("rule_s"):
        order, parents = layout_by_depth(keep_best(cand_score, cand_par, shape.nodes), cand_par)
        tokens = [cand_tok[c] for c in order]
        in_draft = [cand_draft[c] for c in order]
        q_rows = {node: cand_q[c] for node, c in enumerate(order) if c in cand_q}
    return tokens, parents, in_draft, q_rows, forwards
