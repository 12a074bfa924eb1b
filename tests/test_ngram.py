"""NgramDrafter: agreement with a brute-force scan, incremental semantics, truncation, validation."""

from __future__ import annotations

import random

import pytest

from verispec.engine.ngram import NgramDrafter


def seeded(tokens, **kwargs) -> NgramDrafter:
    drafter = NgramDrafter(**kwargs)
    drafter.reset(tokens)
    return drafter


def brute_force(history: list[int], min_ngram: int, max_ngram: int, k: int) -> list[int]:
    """Longest suffix n-gram first; its most recent occurrence that ends before the end of history."""
    size = len(history)
    for n in range(max_ngram, min_ngram - 1, -1):
        suffix = history[size - n:] if n <= size else None
        for start in range(size - n - 1, -1, -1):
            if history[start:start + n] == suffix:
                return history[start + n:start + n + k]
    return []


@pytest.mark.parametrize("min_ngram,max_ngram", [(1, 1), (1, 3), (2, 4), (3, 3)])
def test_agrees_with_brute_force_on_random_streams(min_ngram, max_ngram):
    outcomes = {"empty": 0, "truncated": 0, "full": 0}
    for seed in range(40):
        rng = random.Random(seed * 100 + max_ngram * 10 + min_ngram)
        vocab = rng.choice([2, 3, 5, 8])
        k = rng.randint(1, 7)
        drafter = NgramDrafter(min_ngram=min_ngram, max_ngram=max_ngram, max_tokens=k)
        history = [rng.randrange(vocab) for _ in range(rng.randint(0, 6))]
        drafter.reset(history)
        assert drafter.propose() == brute_force(history, min_ngram, max_ngram, k)
        while len(history) < 120:
            chunk = [rng.randrange(vocab) for _ in range(rng.randint(0, 4))]
            drafter.extend(chunk)
            history += chunk
            assert len(drafter) == len(history)
            expected = brute_force(history, min_ngram, max_ngram, k)
            assert drafter.propose() == expected
            outcomes["empty" if not expected else "truncated" if len(expected) < k else "full"] += 1
            k2 = rng.randint(0, 9)
            assert drafter.propose(k2) == brute_force(history, min_ngram, max_ngram, k2)
    assert min(outcomes.values()) >= 20, outcomes   # the comparison covered every kind of answer


def test_prefers_the_longest_suffix_ngram():
    # (1, 2) occurred once, followed by 9; (2,) occurred more recently, followed by 4.
    history = [5, 1, 2, 9, 3, 2, 4, 1, 2]
    assert seeded(history, max_ngram=2, max_tokens=5).propose() == [9, 3, 2, 4, 1]
    assert seeded(history, max_ngram=1, max_tokens=5).propose() == [4, 1, 2]


def test_tie_break_is_the_most_recent_occurrence():
    history = [1, 2, 7, 1, 2, 8, 1, 2]
    drafter = seeded(history, min_ngram=2, max_ngram=2, max_tokens=5)
    assert drafter.propose() == [8, 1, 2]   # the earliest occurrence would give [7, 1, 2, 8, 1]


def test_continuation_is_truncated_where_it_runs_into_the_current_suffix():
    drafter = seeded([4, 5, 4, 5, 4], min_ngram=3, max_ngram=3, max_tokens=5)
    # (4, 5, 4) occurred at 0; what followed it is all that exists: [5, 4], not 5 tokens.
    assert drafter.propose() == [5, 4]
    drafter.extend([5])
    assert drafter.propose() == [4, 5]
    assert drafter.propose(1) == [4]


def test_no_match_gives_empty_list():
    assert NgramDrafter().propose() == []                            # nothing seen
    assert seeded([7]).propose() == []                 # a lone token has no earlier occurrence
    assert seeded([1, 2, 3, 4]).propose() == []        # all distinct
    assert seeded([1, 2, 3, 2], min_ngram=2).propose() == []  # only a 1-gram repeats
    assert seeded([1, 2, 1]).propose(0) == []


def test_extend_matches_reset_on_the_concatenation():
    rng = random.Random(7)
    tokens = [rng.randrange(4) for _ in range(60)]
    whole = seeded(tokens)
    pieces = seeded(tokens[:10])
    for i in range(10, 60, 7):
        pieces.extend(tokens[i:i + 7])
    pieces.extend([])
    assert len(pieces) == len(whole) == 60
    assert pieces.propose() == whole.propose() == brute_force(tokens, 1, 3, 5)


def test_reset_forgets_the_previous_history():
    drafter = seeded([1, 2, 3, 9, 9], max_tokens=3)
    drafter.reset([1])
    assert len(drafter) == 1
    assert drafter.propose() == []
    drafter.extend([2])
    assert drafter.propose() == []     # (1, 2) and (2,) were only in the forgotten history
    drafter.extend([1])
    assert drafter.propose() == [2, 1]


def test_accepts_any_integer_sequence():
    torch = pytest.importorskip("torch")
    drafter = NgramDrafter()
    drafter.reset(torch.tensor([3, 4, 5]))
    drafter.extend((3, 4))
    drafter.extend(range(5, 6))
    assert drafter.propose() == [3, 4, 5]
    assert all(type(t) is int for t in drafter.propose())


@pytest.mark.parametrize("kwargs,message", [
    ({"min_ngram": 0}, "min_ngram must be an integer >= 1, got 0"),
    ({"max_ngram": 0}, "max_ngram must be an integer >= 1, got 0"),
    ({"max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
    ({"max_tokens": 2.0}, "max_tokens must be an integer >= 1, got 2.0"),
    ({"max_ngram": True}, "max_ngram must be an integer >= 1, got True"),
    ({"min_ngram": 3, "max_ngram": 2}, "max_ngram must be >= min_ngram, got max_ngram=2, min_ngram=3"),
])
def test_constructor_rejects_bad_parameters_with_what_was_expected(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        NgramDrafter(**kwargs)


def test_propose_rejects_a_negative_max_tokens():
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 0, got -1"):
        NgramDrafter().propose(-1)
