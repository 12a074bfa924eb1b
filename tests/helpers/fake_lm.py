"""A fast, exact, context-dependent fake language model implementing the Backend protocol.

Logits at a position are a deterministic function of the whole prefix (seeded by its hash), so the
engine's cache handling (prefill, block forwards, rollbacks) is checked against ground truth that is
cheap to compute: ``FakeLM.next_logits(prefix)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

#: Logits by (seed, scale, vocabulary, bias, prefix): law tests revisit the same few prefixes thousands of
#: times, and computing them (a hash, a generator, a draw) costs more than the engine's step around them.
_LOGITS: dict[tuple, torch.Tensor] = {}
_LOGITS_MAX = 1 << 18


def _logits(seed: int, scale: float, vocab: int, bias: dict[int, float], prefix: Sequence[int]) -> torch.Tensor:
    key = hashlib.sha256(f"{seed}:{','.join(map(str, prefix))}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(key[:8], "little"))
    logits = torch.randn(vocab, generator=gen, dtype=torch.float64) * scale
    for tok, b in bias.items():
        logits[tok] += b
    return logits.float()


class FakeLM:
    def __init__(self, vocab: int = 4, seed: int = 0, scale: float = 1.5, eos: int | None = None,
                 alphabet: str = "abcdefghijklmnopqrstuvwxyz", context_length: int = 512,
                 bias: dict[int, float] | None = None) -> None:
        self.vocab_size = vocab
        self.seed, self.scale = seed, scale
        self.alphabet = alphabet
        self.eos_token_ids = frozenset([eos]) if eos is not None else frozenset()
        self.context_length = context_length
        self.name = f"fake(v={vocab},seed={seed})"
        self.bias = bias or {}
        self.tokens: list[int] = []
        self.tree: list[tuple[int, int]] = []   # open tree: (token, parent id or -1)
        self.forward_calls = 0
        self.forward_sizes: list[int] = []

    # -- text -----------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return [self.alphabet.index(c) for c in text]

    def detokenize(self, ids: Sequence[int]) -> str:
        return "".join(self.alphabet[i] for i in ids if i not in self.eos_token_ids)

    def token_piece(self, token_id: int) -> str:
        return self.alphabet[token_id]

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        return self.tokenize(user_message)

    # -- model ----------------------------------------------------------------------------------
    def next_logits(self, prefix: Sequence[int]) -> torch.Tensor:
        key = (self.seed, self.scale, self.vocab_size, tuple(sorted(self.bias.items())), tuple(prefix))
        logits = _LOGITS.get(key)
        if logits is None:
            logits = _logits(self.seed, self.scale, self.vocab_size, self.bias, prefix)
            if len(_LOGITS) >= _LOGITS_MAX:
                _LOGITS.clear()
            _LOGITS[key] = logits
        return logits.clone()

    def reset(self) -> None:
        self.tokens = []
        self.tree = []

    @property
    def n_cached(self) -> int:
        return len(self.tokens)

    def forward(self, tokens: Sequence[int], *, all_logits: bool = True) -> torch.Tensor:
        toks = [int(t) for t in tokens]
        assert toks, "empty forward"
        if self.tree:
            raise ValueError("a tree is open: commit_tree_path or rollback first")
        self.forward_sizes.append(len(toks))
        assert len(self.tokens) + len(toks) <= self.context_length, "context overflow"
        self.forward_calls += 1
        rows = []
        for t in toks:
            self.tokens.append(t)
            rows.append(self.next_logits(self.tokens))
        out = torch.stack(rows)
        return out if all_logits else out[-1:]

    def rollback(self, length: int) -> None:
        assert 0 <= length <= len(self.tokens), (length, len(self.tokens))
        del self.tokens[length:]
        self.tree = []

    # -- trees (the Backend protocol's forward_tree / commit_tree_path) -------------------------
    @property
    def n_tree(self) -> int:
        return len(self.tree)

    def _path(self, node: int) -> list[int]:
        out = []
        while node >= 0:
            tok, node = self.tree[node]
            out.append(tok)
        return out[::-1]

    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        assert len(tokens) == len(parents) and tokens
        self.forward_calls += 1
        self.forward_sizes.append(len(tokens))
        rows = []
        for t, par in zip(tokens, parents):
            assert -1 <= par < len(self.tree), (par, len(self.tree))
            self.tree.append((int(t), int(par)))
            path = self._path(len(self.tree) - 1)
            assert len(self.tokens) + len(path) <= self.context_length, "context overflow"
            rows.append(self.next_logits(self.tokens + path))
        return torch.stack(rows)

    def commit_tree_path(self, path: Sequence[int]) -> None:
        path = [int(i) for i in path]
        if path:
            assert self._path(path[-1]) == [self.tree[i][0] for i in path], "not a root-down path"
            assert self.tree[path[0]][1] == -1
        self.tokens += [self.tree[i][0] for i in path]
        self.tree = []
