"""Draft sources of one generation and the bookkeeping each needs to stay in step with the text.

A step's draft comes from, in this order of preference:

* **prompt lookup** (:class:`~verispec.engine.ngram.NgramDrafter`, ``lookup``): the continuation of the
  text's suffix found earlier in it, a chain of deterministic candidates (point masses);
* **an EAGLE-3 head** (:class:`~verispec.models.eagle3.Eagle3Drafter`, ``head``): an EAGLE-2 dynamic
  tree grown from the target's own hidden states (deterministic candidates);
* **a draft model** (a :class:`~verispec.models.base.Backend`, ``draft``): a chain of sampled tokens
  or a tree of ``shape`` (:func:`~verispec.engine.tree.grow_tree`).

No proposal means a plain target step. Caches: the target holds every committed token but the last
(the *root* of the next draft). The draft model lacks ``pending`` (the root, plus accepted nodes it
never processed and tokens of steps it did not draft); where the generation's plan expects only plain
steps (a cost model that finds no draft length paying, :attr:`DraftPlan.defers_draft`) its prefill of
the prompt waits for its first draft, so such a generation never runs the draft model at all. The head
has observed every committed token but the root, with the target's hidden states at them
(``target.last_hidden`` after each target forward); the lookup index has seen the whole text.
"""

from __future__ import annotations

import torch

from verispec.engine.ngram import NgramDrafter
from verispec.engine.stats import Stats
from verispec.engine.tree import HEAD, MODEL, DraftProposal, TreeShape, grow_tree, lookup_proposal
from verispec.models.base import Backend
from verispec.sampling import SamplingConfig
from verispec.tree_nodes import ancestor_closed


class DraftSources:
    """The draft model, prompt lookup and/or EAGLE-3 head of one generation (see the module docstring)."""

    def __init__(self, target: Backend, draft: Backend | None, *, lookup: NgramDrafter | None, head,
                 shape: TreeShape | None, sampling: SamplingConfig, width: int, generator: torch.Generator,
                 stats: Stats, stop_below: float = 0.0, keep_drafting=None, keep_raw: bool = False) -> None:
        self.target, self.draft, self.lookup, self.head = target, draft, lookup, head
        self.stop_below, self.keep_drafting, self.keep_raw = stop_below, keep_drafting, keep_raw
        self.shape, self.sampling, self.width, self.gen, self.stats = shape, sampling, width, generator, stats
        self.pending: list[int] = []
        #: prompt tokens before ``pending`` the draft model has not processed yet (its prefill, deferred)
        self.unfed: list[int] = []
        #: length of the suffix the last lookup proposal continued (0: no match)
        self.lookup_match = 0

    @property
    def root(self) -> int:
        return self.pending[-1]

    @property
    def unseen(self) -> int | None:
        """Tokens the draft model has not fed yet (its first forward of a step feeds them); None without one."""
        return len(self.pending) if self.draft is not None else None

    def prefill(self, ids: list[int], defer_draft: bool = False) -> None:
        """Bring every source to the prompt; the target has just processed ``ids[:-1]``. ``defer_draft``:
        the draft model processes the prompt only before its first draft, if any (:meth:`_feed_prompt`)."""
        if self.draft is not None:
            self.draft.reset()
            self.unfed = list(ids[:-1])
            if not defer_draft and self.unfed:     # the caller times the prefill
                self.draft.forward(self.unfed, all_logits=False)
                self.unfed = []
        if self.lookup is not None:
            self.lookup.reset(ids)
        if self.head is not None:
            self.head.reset()
            self.head.observe(ids[:-1], self._hidden(len(ids) - 1))
        self.pending = [ids[-1]]

    def propose(self, g: int, lookup_cap: int | None = None, choose_lookup=None) -> DraftProposal | None:
        """A draft at most ``g`` deep below the root, or None for a plain target step. Prompt lookup
        goes first, with up to ``lookup_cap`` tokens (default ``g``), of which ``choose_lookup(n,
        match)`` keeps how many to verify (default all; 0: the step goes to the other sources) given
        ``n`` proposed tokens continuing a ``match``-token suffix (kept in :attr:`lookup_match`)."""
        if self.lookup is not None:
            cap = g if lookup_cap is None else lookup_cap
            tokens, self.lookup_match = self.lookup.propose_match(cap)
            if tokens and choose_lookup is not None:
                tokens = tokens[:choose_lookup(len(tokens), self.lookup_match)]
            if tokens:
                self.stats.lookup_steps += 1
                return lookup_proposal(tokens)
        if g < 1:
            return None
        if self.head is not None:
            with self.stats.timing("draft_s"):
                tokens, parents, _ = self.head.grow(self.root)
            self.stats.draft_calls += self.head.depth
            proposal = DraftProposal.candidates(tokens, parents, HEAD)
            # nodes deeper than g, or whose token lies past the shared vocabulary (a head's reduced
            # vocabulary maps into the full lm_head, padding rows included), go with their subtrees
            depths = proposal.depths()
            return _keep(proposal, [d < g and t < self.width for d, t in zip(depths, tokens)])
        if self.draft is None:
            return None
        self._feed_prompt()
        proposal = grow_tree(self.draft, self.pending, self.shape or TreeShape.chain(g), self.sampling, self.width,
                             self.gen, max_depth=g, timing=self.stats.timing, stop_below=self.stop_below,
                             keep_drafting=self.keep_drafting, keep_raw=self.keep_raw)
        self.stats.draft_calls += proposal.draft_forwards
        return proposal

    def _feed_prompt(self) -> None:
        """The draft model's prefill of the prompt (deferred: before its first draft; timed as prefill)."""
        if self.unfed:
            with self.stats.timing("prefill_s"):
                self.draft.forward(self.unfed, all_logits=False)
            self.unfed = []

    def after_plain(self, token: int) -> None:
        """A plain target step over the root emitted ``token``."""
        if self.head is not None:
            self.head.observe([self.root], self._hidden(1))
        if self.lookup is not None:
            self.lookup.extend([token])
        self.pending = self.pending + [token] if self.draft is not None else [token]

    def after_step(self, proposal: DraftProposal, path: list[int], emitted: list[int]) -> None:
        """The target committed the root and ``path``; ``emitted`` = the path's tokens and the next one."""
        if self.head is not None:
            rows = [0] + [i + 1 for i in path]
            self.head.observe([self.root] + emitted[:-1], self._hidden(len(proposal.tokens) + 1)[rows])
        if self.lookup is not None:
            self.lookup.extend(emitted)
        if self.draft is None:
            self.pending = emitted[-1:]
        elif proposal.source != MODEL:              # the draft model saw none of this step
            self.pending = self.pending + emitted
        else:
            seen = 0                                # leading path nodes the draft has processed
            while seen < len(path) and proposal.in_draft[path[seen]] >= 0:
                seen += 1
            self.draft.commit_tree_path([proposal.in_draft[i] for i in path[:seen]])
            self.pending = emitted[seen:]

    def _hidden(self, rows: int) -> torch.Tensor:
        if rows == 0:
            raise ValueError("an EAGLE-3 head pairs each hidden state with the next token: the prompt needs at "
                             "least 2 tokens")
        hidden = getattr(self.target, "last_hidden", None)
        if hidden is None or hidden.shape[0] != rows:
            raise ValueError("an EAGLE-3 head needs the target's hidden states: load the target as "
                             "HFBackend(..., capture_hidden=head.target_layers)")
        return hidden


def _keep(proposal: DraftProposal, wanted: list[bool]) -> DraftProposal | None:
    """The nodes ``wanted`` whose ancestors are all kept too (parents come first, so the kept ones
    keep their order); None when no node is left (a plain target step)."""
    keep = ancestor_closed(proposal.parents, wanted)
    if not keep:
        return None
    index = {old: new for new, old in enumerate(keep)}
    return DraftProposal.candidates([proposal.tokens[i] for i in keep],
                                    [index[proposal.parents[i]] if proposal.parents[i] >= 0 else -1 for i in keep],
                                    proposal.source)
