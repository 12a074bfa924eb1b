"""BatchSession: rows with their own rule, sampling, γ, stop strings and seed (or none: target-only) share
batched steps, and each row's output is that of one-at-a-time decoding with its own settings and seed;
rows join, stream their committed tokens, are cancelled and leave at any step."""

from __future__ import annotations

import pytest

from tests.helpers.fake_lm import FakeLM
from verispec.engine import generate, generate_target_only
from verispec.engine.session import BatchSession, RowRequest
from verispec.models.batch import RowsOfBackends
from verispec.sampling import SamplingConfig

T1 = SamplingConfig.parse("temperature=1")
T07 = SamplingConfig.parse("temperature=0.7,top_k=3")
GREEDY = SamplingConfig.parse("temperature=0")
TARGET, DRAFT = dict(vocab=6, seed=1, eos=5), dict(vocab=6, seed=2, eos=5)


def rows(batch: int, **kw) -> RowsOfBackends:
    return RowsOfBackends([FakeLM(**kw) for _ in range(batch)])


#: (prompt, rule or None, sampling, gamma, stop, seed): every kind of row at once
MIXED = [
    ([0, 1], "lossless", T1, 3, [], 11),
    ([2], "lenience:ell=0.5", T07, 2, ["cb"], 12),
    ([3, 3, 1], None, T1, 0, [], 13),                      # target-only
    ([1], "block", GREEDY, 4, [], 14),
    ([4, 0], "speccascade:p_base=0.3", T1, 1, [], 15),
    ([0], None, T07.with_truncation(min_p=0.3), 0, ["aa"], 16),   # a true baseline's sampling
    ([2, 2], "lossless", GREEDY, 5, [], 17),
]


def reference(prompt, rule, sampling, gamma, stop, seed, max_new=14):
    if rule is None:
        return generate_target_only(FakeLM(**TARGET), prompt, sampling=sampling, max_new_tokens=max_new, stop=stop,
                                    seed=seed)
    return generate(FakeLM(**TARGET), FakeLM(**DRAFT), prompt, rule=rule, sampling=sampling, gamma=gamma,
                    max_new_tokens=max_new, stop=stop, seed=seed)


@pytest.mark.parametrize("batch", [1, 3, 7])
def test_mixed_rows_each_equal_one_at_a_time(batch):
    """Rules, pipelines, γ, stop strings and target-only rows mixed in one session, slots refilled: every
    row's tokens, text and counts are those of generate / generate_target_only with its own seed."""
    session = BatchSession(rows(batch, **TARGET), rows(batch, **DRAFT))
    done = []
    handles = [session.admit(RowRequest(p, 14, s, rule=r, gamma=g or 5, stop=st, seed=seed,
                                        on_done=lambda h: done.append(h.request.tag), tag=i))
               for i, (p, r, s, g, st, seed) in enumerate(MIXED)]
    session.run()
    assert sorted(done) == list(range(len(MIXED))) and not session.busy
    for h, case in zip(handles, MIXED):
        ref = reference(*case)
        assert h.state == "done"
        assert (h.result.tokens, h.result.text) == (ref.tokens, ref.text), case
        for f in ("target_calls", "draft_calls", "accepted_hist", "gamma_hist", "new_tokens", "stop_reason", "mode"):
            assert getattr(h.result.stats, f) == getattr(ref.stats, f), (case, f)


def test_rows_join_mid_run_stream_their_tokens_and_cancel_frees_the_slot():
    """Two slots: a request admitted while others decode joins at the next step; on_commit sees a growing
    prefix of the final tokens; cancelling an active row frees its slot at once for the queued one, and no
    callback fires for it."""
    target, draft = dict(vocab=6, seed=1), dict(vocab=6, seed=2)      # no EOS: rows run to their budget
    session = BatchSession(rows(2, **target), rows(2, **draft))
    seen: dict[int, list[list[int]]] = {}

    def commit(h):
        seen.setdefault(h.request.tag, []).append(list(h.tokens))

    def request(i, prompt, **kw):
        return RowRequest(prompt, 30, T1, rule="lossless", gamma=3, seed=100 + i, on_commit=commit, tag=i, **kw)

    a = session.admit(request(0, [0, 1]))
    b = session.admit(request(1, [2]))
    session.step()
    assert a.state == b.state == "active" and session.free_slots == 0
    c = session.admit(request(2, [3, 1]))
    session.step()
    assert c.state == "queued"
    slot = b.slot
    assert session.cancel(b) and b.state == "cancelled" and session.free_slots == 1
    assert not session.cancel(b)
    session.step()
    assert c.state == "active" and c.slot == slot
    session.run()
    for h, prompt in ((a, [0, 1]), (c, [3, 1])):
        ref = generate(FakeLM(**target), FakeLM(**draft), prompt, rule="lossless", sampling=T1, gamma=3,
                       max_new_tokens=30, seed=100 + h.request.tag)
        assert h.result.tokens == ref.tokens
        prefixes = seen[h.request.tag]
        assert all(len(x) < len(y) for x, y in zip(prefixes, prefixes[1:]))
        assert all(p == ref.tokens[:len(p)] for p in prefixes)
    assert b.result is None and 1 in seen


def test_cancel_a_queued_request_and_fail_all():
    session = BatchSession(rows(1, **TARGET), rows(1, **DRAFT))
    a = session.admit(RowRequest([0], 5, T1, rule="lossless", gamma=2))
    b = session.admit(RowRequest([1], 5, T1, rule="lossless", gamma=2))
    assert session.cancel(b) and b.state == "cancelled"
    session.step()
    dropped = session.fail_all()
    assert dropped == [a] and a.state == "cancelled" and not session.busy
    assert not session.step()


def test_admission_refusals():
    target_only = BatchSession(rows(2, **TARGET))
    with pytest.raises(ValueError, match="no draft model"):
        target_only.admit(RowRequest([0], 4, T1, rule="lossless"))
    with pytest.raises(ValueError, match="empty"):
        target_only.admit(RowRequest([], 4, T1))
    with pytest.raises(ValueError, match="context"):
        target_only.admit(RowRequest([0] * 600, 4, T1))
    both = BatchSession(rows(2, **TARGET), rows(2, **DRAFT))
    with pytest.raises(ValueError, match="gamma"):
        both.admit(RowRequest([0], 4, T1, rule="lossless", gamma=0))
    with pytest.raises(ValueError, match="unknown rule"):
        both.admit(RowRequest([0], 4, T1, rule="nope"))
    assert not target_only.busy and not both.busy
    with pytest.raises(TypeError, match="batched backend"):
        BatchSession(FakeLM(**TARGET))
