"""Draft-free drafting by prompt lookup: propose what followed the current suffix earlier in the text.

The same idea as transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram`` proposer and llama.cpp's
lookup decoding, for the SD loop of :mod:`verispec.engine.generate` with no draft model: the longest
suffix n-gram of the committed history (``max_ngram`` down to ``min_ngram`` tokens) that occurred
earlier is looked up, and the tokens that followed it are the draft. A proposal is deterministic, so
its ``q`` row is one-hot on the proposed token.

Tie-break: among the earlier occurrences of the matched n-gram the MOST RECENT one is used. vLLM v1
(``_find_longest_matched_ngram_and_propose_tokens``) and transformers (``PromptLookupCandidateGenerator``)
both take the earliest; the most recent is chosen here because in generated text (code being edited,
lists, repeated answers) the latest repetition is the better predictor of what comes next, and it is
what a dict that is overwritten as the text grows gives for free.

Index invariant: ``_last`` maps every n-gram (``min_ngram <= n <= max_ngram``) that ends before the
end of the history to the end (exclusive) of its most recent such occurrence. The current suffix is
deliberately not in it until the next token arrives, so a lookup of the suffix only finds *earlier*
occurrences. ``extend`` is O(max_ngram) per token and ``propose`` is O(max_ngram + max_tokens).

Usage in a step: ``reset(prompt)`` once, then ``propose(g)`` before verification and
``extend(accepted + [z])`` after it.
"""

from __future__ import annotations

from collections.abc import Sequence


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


class NgramDrafter:
    """Proposes continuations of the current text found earlier in the prompt + generated text."""

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1, max_tokens: int = 5) -> None:
        self.min_ngram = _check_int("min_ngram", min_ngram, 1)
        self.max_ngram = _check_int("max_ngram", max_ngram, 1)
        if max_ngram < min_ngram:
            raise ValueError(f"max_ngram must be >= min_ngram, got max_ngram={max_ngram}, min_ngram={min_ngram}")
        self.max_tokens = _check_int("max_tokens", max_tokens, 1)
        self._history: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self._history)

    def reset(self, tokens: Sequence[int]) -> None:
        """Start over from ``tokens`` (the prompt)."""
        self._history = []
        self._last = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed ``tokens`` to the history."""
        hist, last = self._history, self._last
        lo, hi = self.min_ngram, self.max_ngram
        for tok in tokens:
            # The suffixes ending here stop being the current suffix once tok arrives.
            end = len(hist)
            for n in range(lo, min(hi, end) + 1):
                last[tuple(hist[end - n:])] = end
            hist.append(int(tok))

    def propose(self, max_tokens: int | None = None) -> list[int]:
        """Up to ``max_tokens`` (default: the constructor's) tokens that followed the most recent earlier
        occurrence of the longest matching suffix n-gram; fewer when that continuation reaches the end of
        the history, ``[]`` when no suffix of ``min_ngram`` tokens or more occurred before."""
        return self.propose_match(max_tokens)[0]

    def propose_match(self, max_tokens: int | None = None) -> tuple[list[int], int]:
        """``(tokens, n)``: :meth:`propose`'s tokens and the length ``n`` of the suffix n-gram they
        continue (0 when there is no match), which is what their chance of acceptance depends on most."""
        k = self.max_tokens if max_tokens is None else _check_int("max_tokens", max_tokens, 0)
        hist, last = self._history, self._last
        size = len(hist)
        if k == 0:
            return [], 0
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            end = last.get(tuple(hist[size - n:]))
            if end is not None:
                return hist[end:end + k], n
        return [], 0


def lookup_for(settings, gamma: int) -> NgramDrafter | None:
    """A fresh drafter when model settings (a :class:`~verispec.settings.ModelSettings`, a bench or
    diagnose config, parsed flags) ask for prompt lookup: ``draft = "ngram"`` (alone) or ``lookup``
    (beside the draft model); else None."""
    from verispec.models import is_ngram_draft

    if not (getattr(settings, "lookup", False) or is_ngram_draft(getattr(settings, "draft", None))):
        return None
    return NgramDrafter(max_tokens=max(1, int(gamma)))
