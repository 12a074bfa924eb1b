"""EAGLE-2 dynamic draft trees grown with an EAGLE-3 head, beside the target's committed text (see
:mod:`verispec.models.eagle3`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from verispec.models.eagle3.config import ROOT
from verispec.models.eagle3.head import Eagle3Head
from verispec.tree_nodes import keep_best, layout_by_depth


def _stable_top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row of ``x`` and their indices, ties to the lower index."""
    values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


class Eagle3Drafter:
    """Draft source for a transformers target: keeps the head's own KV cache in step with the committed text.

    The committed text is ``tokens`` (observed with the target's hidden states) plus, after
    :meth:`grow`, the root. The head's cache holds the entries whose token pair is committed: entry
    ``t`` pairs hidden state ``t`` with token ``t + 1`` (the last observed hidden state pairs with the
    root). Drafted tree entries never enter it, so an ordinary round needs no rollback:

    1. ``observe(prompt[:-1], hidden)``, ``grow(prompt[-1])``;
    2. after verification: ``observe([root] + accepted, hidden at those tree rows)``, ``grow(next_token)``.

    :meth:`commit` shortens the committed text (the engine undid tokens); :meth:`reset` forgets it.
    ``target_embeddings`` embeds tokens when the head ships no ``embed_tokens`` (as published).
    """

    def __init__(self, head: Eagle3Head, target_embeddings: nn.Embedding | None, *, top_k: int = 10,
                 depth: int = 5, nodes: int = 60) -> None:
        c = head.config
        for name, value, lo, hi in (("top_k", top_k, 1, c.draft_vocab_size), ("depth", depth, 1, None),
                                    ("nodes", nodes, 1, None)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
                raise ValueError(f"{name} must be an integer in [{lo}, {hi if hi is not None else 'inf'}), "
                                 f"got {value!r}")
        embed = head.embed_tokens if head.embed_tokens is not None else target_embeddings
        if embed is None:
            raise ValueError("the head has no embed_tokens: pass the target's input embeddings")
        weight = embed.weight
        if tuple(weight.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(f"the embeddings are {tuple(weight.shape)} but the head needs "
                             f"[vocab_size, hidden_size] = ({c.vocab_size}, {c.hidden_size})")
        self.head = head.eval()
        self._embed = weight
        self.top_k, self.depth, self.nodes = top_k, depth, nodes
        self.root_logprobs: torch.Tensor | None = None  # draft log-probs after the last root (diagnostics)
        self.reset()

    # -- state -----------------------------------------------------------------------------------
    def reset(self) -> None:
        h = self.head
        c = h.config
        empty = torch.zeros(c.num_key_value_heads, 0, c.head_dim, dtype=h.dtype, device=h.device)
        self._tokens: list[int] = []
        self._fused = torch.zeros(0, c.hidden_size, dtype=h.dtype, device=h.device)   # fc(hidden) per token
        self._k, self._v = empty, empty.clone()   # head cache, entries 0.._m-1
        self._m = 0
        self._root: int | None = None
        self._root_out: torch.Tensor | None = None

    @property
    def n_committed(self) -> int:
        """Tokens of committed text the drafter knows (observed tokens, plus the root after :meth:`grow`)."""
        return len(self._tokens) + (self._root is not None)

    @property
    def n_cached(self) -> int:
        """Entries in the head's KV cache."""
        return self._m

    def _embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids.to(self._embed.device), self._embed).to(device=self.head.device, dtype=self.head.dtype)

    @torch.no_grad()
    def observe(self, tokens: Sequence[int], target_hidden: torch.Tensor) -> None:
        """Committed ``tokens`` that the target processed, with its captured hidden states at them
        (``[len(tokens), 3 * target_hidden]``, in :attr:`Eagle3Head.target_layers` order). After a
        :meth:`grow`, the first token must be that root."""
        toks = [int(t) for t in tokens]
        c = self.head.config
        hid = target_hidden[0] if target_hidden.dim() == 3 and target_hidden.shape[0] == 1 else target_hidden
        if hid.dim() != 2 or hid.shape[0] != len(toks) or hid.shape[1] != 3 * c.target_hidden_size:
            raise ValueError(f"observe: expected hidden states [{len(toks)}, {3 * c.target_hidden_size}] for "
                             f"{len(toks)} tokens, got {tuple(target_hidden.shape)}")
        if not toks:
            return
        bad = [t for t in toks if not 0 <= t < c.vocab_size]
        if bad:
            raise ValueError(f"observe: token id {bad[0]} is out of range for a vocabulary of {c.vocab_size}")
        if self._root is not None:
            if toks[0] != self._root:
                raise ValueError(f"observe: the first token must be the root {self._root} given to grow, "
                                 f"got {toks[0]} (call commit() first to replace the root)")
            self._root = None
        self._tokens += toks
        self._fused = torch.cat((self._fused, self.head.fuse(hid)))

    def commit(self, n_committed: int) -> None:
        """Shorten the committed text to its first ``n_committed`` tokens (the root counts). Cache
        entries whose token pair is no longer committed are dropped."""
        total = self.n_committed
        if isinstance(n_committed, bool) or not isinstance(n_committed, int) or not 0 <= n_committed <= total:
            raise ValueError(f"commit: n_committed must be an integer in [0, {total}], got {n_committed!r}")
        if n_committed == total:
            return
        if n_committed == 0:
            self.reset()
            return
        n_obs = len(self._tokens)
        if n_committed <= n_obs:
            self._root = None
            del self._tokens[n_committed:]
            self._fused = self._fused[:n_committed]
        keep = min(self._m, n_committed - 1)  # entry t needs token t + 1
        if keep < self._m:
            self._k, self._v = self._k[:, :keep], self._v[:, :keep]
            self._m = keep
            self._root_out = None

    # -- drafting --------------------------------------------------------------------------------
    @torch.no_grad()
    def _advance(self, root: int) -> torch.Tensor:
        """Bring the cache up to the root's entry; return its output hidden state ``[hidden]``."""
        n = len(self._tokens)
        if n == 0:
            raise RuntimeError("grow: observe at least one committed token with the target's hidden states first")
        if self._root is not None and self._root != root and self._m == n:
            self._k, self._v, self._m = self._k[:, : n - 1], self._v[:, : n - 1], n - 1
        if self._m == n and self._root_out is not None:
            return self._root_out
        m = self._m
        pair = torch.tensor(self._tokens[m + 1:] + [root], dtype=torch.long)
        positions = torch.arange(m, n, device=self.head.device)
        out, k, v = self.head(self._fused[m:n], self._embed_ids(pair), positions, past=(self._k, self._v))
        self._k, self._v = torch.cat((self._k, k), dim=1), torch.cat((self._v, v), dim=1)
        self._m = n
        self._root_out = out[-1]
        return self._root_out

    @torch.no_grad()
    def grow(self, root_token: int) -> tuple[list[int], list[int], torch.Tensor]:
        """EAGLE-2 dynamic tree below ``root_token`` (committed, not yet processed by the target).

        Returns ``(tokens [N], parents [N], draft_logprob [N])``: target-vocabulary ids, parent node
        indices (``-1``: a child of the root; parents come before children, siblings in draft-rank
        order, nodes depth by depth), and cumulative draft log-probabilities (float32 CPU, float64 for
        a float64 head). ``N <= nodes``; depth ``<= depth``; ``<= top_k`` children per node.
        """
        root = int(root_token)
        head, k = self.head, self.top_k
        if not 0 <= root < head.config.vocab_size:
            raise ValueError(f"grow: root token {root} is out of range for a vocabulary of {head.config.vocab_size}")
        root_out = self._advance(root)
        self._root = root
        dev = head.device

        lp = head.draft_logprobs(root_out[None])[0]
        self.root_logprobs = lp
        s, d = _stable_top(lp, k)
        scores, draft_ids, parents = [s], [d], [torch.full((k,), ROOT, dtype=torch.long, device=dev)]
        # The frontier: the candidates expanded at the next level, with their parents' outputs.
        f_idx, f_score, f_tok = torch.arange(k, device=dev), s, d
        f_hidden = root_out[None].expand(k, -1)
        ancestors = torch.zeros(k, 0, dtype=torch.bool, device=dev)  # frontier x earlier tree entries
        tree_k = self._k.new_zeros(self._k.shape[0], 0, self._k.shape[2])
        tree_v = tree_k.clone()
        n_past, offset = self._m, k
        eye = torch.eye(k, dtype=torch.bool, device=dev)
        for level in range(2, self.depth + 1):
            mask = torch.cat((torch.ones(k, n_past, dtype=torch.bool, device=dev), ancestors, eye), dim=1)
            positions = torch.full((k,), n_past - 1 + level - 1, device=dev)
            out, nk, nv = head(f_hidden, self._embed_ids(head.target_ids(f_tok)), positions,
                               past=(torch.cat((self._k, tree_k), dim=1), torch.cat((self._v, tree_v), dim=1)),
                               mask=mask)
            tree_k, tree_v = torch.cat((tree_k, nk), dim=1), torch.cat((tree_v, nv), dim=1)
            child_lp, child_ids = _stable_top(head.draft_logprobs(out), k)                # [k, k]
            cum = (f_score[:, None] + child_lp.clamp(max=0.0)).reshape(-1)               # never above the parent
            scores.append(cum)
            draft_ids.append(child_ids.reshape(-1))
            parents.append(f_idx.repeat_interleave(k))
            if level == self.depth:
                break
            f_score, sel = _stable_top(cum, k)
            row = sel // k
            f_idx, f_tok, f_hidden = offset + sel, child_ids.reshape(-1)[sel], out[row]
            ancestors = torch.cat((ancestors, eye), dim=1)[row]
            offset += k * k

        all_scores, all_parents = torch.cat(scores), torch.cat(parents)
        all_tokens = head.target_ids(torch.cat(draft_ids))
        kept = keep_best(all_scores.tolist(), all_parents.tolist(), self.nodes)
        order, parents = layout_by_depth(kept, all_parents.tolist())
        return all_tokens[order].tolist(), parents, all_scores[order].cpu()


def load_head_pair(target_spec: str, head_path: str | os.PathLike, *, device: str = "cpu", dtype: Any = None,
                   top_k: int = 10, depth: int = 5, nodes: int = 60):
    """``(target, drafter)``: a transformers target (an :class:`~verispec.models.hf.HFBackend` capturing
    the hidden states the head fuses) and an :class:`Eagle3Drafter` over the head at ``head_path``, from
    local files or hub ids. This is what ``verispec generate --draft-head PATH`` runs."""
    from transformers import AutoConfig

    from verispec.models.hf import HFBackend

    if target_spec is None or str(target_spec).endswith(".gguf"):
        raise ValueError("an EAGLE-3 head drafts for a transformers target: pass --target as a model directory "
                         "or hub id (not the embedded GGUF pair)")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    head = Eagle3Head.from_pretrained(head_path, target_config=AutoConfig.from_pretrained(str(target_spec)),
                                      device=device, dtype=dtype)
    target = HFBackend(str(target_spec), device=device, dtype=dtype, capture_hidden=head.target_layers)
    drafter = Eagle3Drafter(head, target.model.get_input_embeddings(), top_k=top_k, depth=depth, nodes=nodes)
    return target, drafter
