"""A context-dependent toy target/draft pair and a tiny tree-SD simulator over it.

:class:`ToyLM` tabulates a next-token distribution for every prefix up to a length, each a
deterministic function of the prefix (logits from :class:`tests.helpers.fake_lm.FakeLM`, which seeds
them with a hash of the prefix). :func:`simulate_tree_sd` runs many independent tree-SD generations
at once: every round it grows a full tree (static branching, given depth) below each sequence, with
children sampled from ``q`` with replacement (``iid``), without replacement, or the top-k of ``q``
(``deterministic``), calls :func:`verify_tree`, commits the accepted path and the next token, and
repeats until ``length`` tokens are out. Its counts are compared with :func:`target_joint`.
"""

from __future__ import annotations

import torch

from tests.helpers.fake_lm import FakeLM
from verispec.rules import Rule
from verispec.rules.tree import DraftTree, verify_tree


class ToyLM:
    """Distributions ``[V]`` for every prefix of length ``<= max_len``, indexed by a prefix code.

    A prefix ``t_1..t_n`` has code ``offset[n] + Σ t_i V^{n−i}`` (``offset[n] = Σ_{k<n} V^k``).
    ``logits = scale·FakeLM(seed) + mix·FakeLM(mix_seed)``: a draft built with the target's seed as
    ``mix_seed`` is correlated with the target (deep paths get accepted).
    """

    def __init__(self, vocab: int, max_len: int, seed: int, mix_seed: int | None = None, mix: float = 0.0,
                 temperature: float = 1.0) -> None:
        self.vocab, self.max_len = vocab, max_len
        own = FakeLM(vocab=vocab, seed=seed)
        other = FakeLM(vocab=vocab, seed=mix_seed) if mix_seed is not None else None
        self.offset = [sum(vocab**k for k in range(n)) for n in range(max_len + 2)]
        rows = []
        for n in range(max_len + 1):
            for code in range(vocab**n):
                prefix = [(code // vocab ** (n - 1 - i)) % vocab for i in range(n)]
                logits = own.next_logits(prefix).double()
                if other is not None:
                    logits = logits + mix * other.next_logits(prefix).double()
                rows.append(torch.softmax(logits / temperature, -1))
        self.table = torch.stack(rows)                     # [n_prefixes, V]
        self.offset_t = torch.tensor(self.offset, dtype=torch.long)

    def dist(self, value: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """Distributions at prefixes given by (value, length) tensors of any shape. ``-> [..., V]``."""
        return self.table[self.offset_t[length] + value]

    def prob(self, seq: tuple[int, ...]) -> float:
        """Joint probability of ``seq`` from the empty prefix."""
        out, value = 1.0, 0
        for n, t in enumerate(seq):
            out *= self.table[self.offset[n] + value, t].item()
            value = value * self.vocab + t
        return out


def target_joint(target: ToyLM, length: int) -> torch.Tensor:
    """Exact law of the first ``length`` tokens, ``[V^length]`` indexed by the base-V code."""
    v = target.vocab
    return torch.tensor([target.prob(tuple((c // v ** (length - 1 - i)) % v for i in range(length)))
                         for c in range(v**length)], dtype=torch.float64)


def full_tree_parents(branching: int, depth: int) -> list[int]:
    """Parents of a full ``branching``-ary tree of ``depth`` levels in breadth-first order."""
    n = sum(branching**d for d in range(1, depth + 1))
    return [-1 if i < branching else (i - branching) // branching for i in range(n)]


def simulate_tree_sd(rule: Rule, target: ToyLM, draft: ToyLM, scheme: str, branching: int, depth: int,
                     length: int, n_runs: int, seed: int, propose: str | None = None) -> tuple[torch.Tensor, float]:
    """Counts ``[V^length]`` of the first ``length`` tokens over ``n_runs`` tree-SD generations, and the
    mean number of accepted draft tokens per verification.

    ``propose`` (default: ``scheme``) is how children are actually drawn; a value different from the
    scheme the tree declares is a deliberately wrong pipeline (the power checks use it).
    """
    propose = scheme if propose is None else propose
    assert target.max_len >= length - 1 + depth, "the tables must cover prefix + tree depth"
    v = target.vocab
    gen = torch.Generator().manual_seed(seed)
    parents_list = full_tree_parents(branching, depth)
    n_nodes = len(parents_list)
    seq = torch.zeros(n_runs, length + depth + 1, dtype=torch.long)
    seq_len = torch.zeros(n_runs, dtype=torch.long)
    accepted, verifications = 0, 0
    while True:
        live = (seq_len < length).nonzero().flatten()
        if live.numel() == 0:
            break
        r = live.numel()
        lens = seq_len[live]
        value = torch.zeros(r, dtype=torch.long)
        for k in range(length):
            value = torch.where(k < lens, value * v + seq[live, k], value)
        # grow the tree level by level; nodes of a level are contiguous, children of a parent too
        tokens = torch.zeros(r, n_nodes, dtype=torch.long)
        node_val = torch.zeros(r, n_nodes, dtype=torch.long)
        node_len = torch.zeros(r, n_nodes, dtype=torch.long)
        par_val, par_len = value[:, None], lens[:, None]          # the level above (root first)
        start = 0
        for _level in range(depth):
            n_par = par_val.shape[1]
            q_par = draft.dist(par_val, par_len).reshape(r * n_par, v)
            if propose == "deterministic":
                kids = q_par.topk(branching, -1).indices
            else:
                kids = torch.multinomial(q_par, branching, replacement=propose == "iid", generator=gen)
            kids = kids.reshape(r, n_par * branching)
            stop = start + n_par * branching
            tokens[:, start:stop] = kids
            par_val = par_val.repeat_interleave(branching, 1) * v + kids
            par_len = par_len.repeat_interleave(branching, 1) + 1
            node_val[:, start:stop], node_len[:, start:stop] = par_val, par_len
            start = stop
        tree = DraftTree(tokens, torch.tensor(parents_list).expand(r, n_nodes).contiguous(), scheme)
        all_val = torch.cat([value[:, None], node_val], 1)
        all_len = torch.cat([lens[:, None], node_len], 1)
        p = target.dist(all_val, all_len)
        q = draft.dist(all_val, all_len)
        path, n_acc, nxt = verify_tree(rule, p, q, tree, generator=gen)
        accepted, verifications = accepted + int(n_acc.sum()), verifications + r
        path_tok = tokens.gather(1, path.clamp_min(0))
        for j in range(path.shape[1] + 1):
            tok_j = torch.where(j < n_acc, path_tok[:, j], nxt) if j < path.shape[1] else nxt
            write = j <= n_acc
            seq[live[write], (lens + j)[write]] = tok_j[write]
        seq_len[live] = lens + n_acc + 1
    code = torch.zeros(n_runs, dtype=torch.long)
    for k in range(length):
        code = code * v + seq[:, k]
    return torch.bincount(code, minlength=v**length), accepted / verifications
