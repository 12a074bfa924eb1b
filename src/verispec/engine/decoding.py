"""What every decoding loop shares: the checked prompt, the generator, the output with exact EOS /
stop-string / budget handling, the statistics and the result; and :class:`VerifiedStep`, what observers
of speculative decoding see after each verification."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from verispec.engine.stats import Stats
from verispec.engine.tree import MODEL, DraftProposal
from verispec.models.base import Backend, logits_device
from verispec.rules.base import sample_categorical
from verispec.rules.tree import IID


@dataclass
class VerifiedStep:
    """One verification, chain or tree: ``p [N+1, V]`` the processed target at the root and after every
    node, the draft ``proposal`` (tokens, parents, ``q [N+1, V]``), the accepted ``path`` (node
    indices from the root down) and the ``next_token`` emitted after it."""

    p: torch.Tensor
    proposal: DraftProposal
    path: list[int]
    next_token: int

    @classmethod
    def from_chain(cls, p: torch.Tensor, q: torch.Tensor, tokens: Sequence[int], n_accepted: int,
                   next_token: int) -> VerifiedStep:
        """A verified chain of the draft model: ``p [G+1, V]``, ``q [G, V]`` (row ``i``: the distribution
        token ``i`` was drawn from), ``tokens [G]``; ``q`` gets the uniform placeholder row after the last
        token, as a :class:`DraftProposal` has."""
        g, vocab = len(tokens), q.shape[-1]
        q = torch.cat([q, q.new_full((1, vocab), 1.0 / vocab)])
        proposal = DraftProposal(list(tokens), list(range(-1, g - 1)), q, IID, list(range(g)), g, [True] * g)
        return cls(p, proposal, list(range(n_accepted)), next_token)

    @property
    def n_accepted(self) -> int:
        return len(self.path)

    def chain(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None:
        """``(p [G+1, V], q [G, V], draft [G], n_accepted)`` for a chain drafted by the draft model (what
        per-position records read: ``q[i]`` is the distribution draft token ``i`` was drawn from), else None
        (a tree, prompt lookup, an EAGLE-3 head)."""
        prop = self.proposal
        if prop.source != MODEL or prop.scheme != IID or prop.parents != list(range(-1, prop.n_nodes - 1)):
            return None
        g = prop.n_nodes
        return self.p, prop.q[:g], torch.tensor(prop.tokens), self.n_accepted

    def on_host(self) -> VerifiedStep:
        """This step with ``p`` and the draft rows on the CPU (what observers get)."""
        prop = self.proposal
        if prop.q is not None and prop.q.device.type != "cpu":
            prop = replace(prop, q=prop.q.cpu())
        return replace(self, p=self.p.cpu(), proposal=prop)


#: observer(step) called after every verification.
Observer = Callable[[VerifiedStep], None]


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stats: Stats


class _Output:
    """Committed tokens with exact EOS / stop-string / budget handling."""

    def __init__(self, backend: Backend, stop: Sequence[str], max_new_tokens: int) -> None:
        self.backend, self.stop, self.max_new = backend, tuple(s for s in stop if s), max_new_tokens
        self.tokens: list[int] = []
        self.text = ""
        self.stop_reason = ""

    @property
    def remaining(self) -> int:
        return self.max_new - len(self.tokens)

    def extend(self, new: Sequence[int]) -> bool:
        """Append ``new``; returns True when the generation is over (EOS, stop string or budget)."""
        for tok in new:
            if tok in self.backend.eos_token_ids:
                self.stop_reason = "eos"
                break
            self.tokens.append(int(tok))
            if self.stop and self._cut_at_stop():
                self.stop_reason = "stop"
                break
            if len(self.tokens) >= self.max_new:
                self.stop_reason = "length"
                break
        if self.stop_reason:
            self.text = self._text_without_stop()
            return True
        return False

    def _cut_at_stop(self) -> bool:
        # Only the tail can contain a stop string that the last token completed.
        window = max(len(s) for s in self.stop) + 32
        tail = self.backend.detokenize(self.tokens[-window:])
        return any(s in tail for s in self.stop)

    def _text_without_stop(self) -> str:
        text = self.backend.detokenize(self.tokens)
        if self.stop_reason == "stop":
            cut = min((text.find(s) for s in self.stop if s in text), default=-1)
            if cut >= 0:
                text = text[:cut]
        return text

    def finish(self) -> str:
        if not self.stop_reason:
            self.text = self.backend.detokenize(self.tokens)
        return self.text


def check_prompt(backend: Backend, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("the prompt is empty: give at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(ids) >= backend.context_length:
        raise ValueError(
            f"the prompt has {len(ids)} tokens but {backend.name} has a context of {backend.context_length}: "
            "shorten the prompt or raise the context length (--n-ctx)"
        )
    return ids


def _budget(backend: Backend, n_prompt: int, max_new_tokens: int, gamma: int) -> int:
    # A verification forward may hold γ+1 tokens beyond the committed ones.
    room = backend.context_length - n_prompt - gamma - 1
    return max(1, min(max_new_tokens, room))


class Decoding:
    """What both loops share: the checked prompt, the generator, the statistics and the output, and
    the epilogue that fills the totals. The wall clock starts after the prefill (:meth:`start`)."""

    def __init__(self, target: Backend, prompt_ids: Sequence[int], *, stats: Stats, max_new_tokens: int,
                 stop: Sequence[str], seed: int, gamma: int) -> None:
        self.ids = check_prompt(target, prompt_ids, max_new_tokens)
        self.max_new_tokens = max_new_tokens
        # sampling and verification run where the target's logits are, with a generator there
        self.device = logits_device(target)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.stats = stats
        self.out = _Output(target, stop, _budget(target, len(self.ids), max_new_tokens, gamma))
        self.t_start = 0.0

    def check_prompt(self, other: Backend) -> None:
        """Check the prompt against a second model (the draft) too."""
        check_prompt(other, self.ids, self.max_new_tokens)

    def start(self) -> None:
        self.t_start = time.perf_counter()

    def sample(self, probs: torch.Tensor) -> int:
        """One token from ``probs [1, V]`` with this generation's generator."""
        return int(sample_categorical(probs, self.gen)[0])

    def result(self) -> GenerationResult:
        stats, out = self.stats, self.out
        stats.wall_s = time.perf_counter() - self.t_start
        stats.new_tokens = len(out.tokens) + (out.stop_reason == "eos")
        stats.stop_reason = out.stop_reason
        return GenerationResult(out.finish(), out.tokens, stats)


