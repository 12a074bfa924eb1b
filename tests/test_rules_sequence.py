"""Sequence-level rules: the published HSD variants, FLy, and the exact block law that judges them (its
limits, the Monte-Carlo fallback, expected tokens, the clever forced stop, edge cases, FLy's deferral).

``verify`` against the exact block law, the lossless flag against the exact joint law, whole SD runs, and the
checks every registered rule gets (parameters, specs, verify's API) are in tests/test_rule_registry.py."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import verispec.rules as R
from verispec.rules.base import Rule
from verispec.rules.block_law import ToyModel, enumerate_blocks, expected_tokens_per_block, joint_law, outcome_law
from verispec.rules.fly import top_k_entropy
from verispec.rules.hsd_variants import MIN_CAP, NO_CAP, VARIANTS, hierarchical_outcome_law

V = 4
VARIANT_SPECS = [cls.name for cls in VARIANTS] + ["hsd_mincap:ell=0.6", "hsd_nocap:ell=0.6"]
FLY_SPECS = ["fly:theta=0.3,window=1", "fly:theta=0,window=2"]


def _pair(seed: int, conc: float = 0.5) -> tuple[ToyModel, ToyModel]:
    return ToyModel(V, seed, conc), ToyModel(V, 100 + seed, conc)


# --- the exact law -----------------------------------------------------------------------------------

def test_block_law_detects_a_lossy_per_token_rule_and_orders_expected_tokens():
    target, draft = _pair(4)
    lenient = joint_law(R.get("lenience:ell=0.3"), target, draft, vocab=V, gamma=3, length=3)
    assert lenient.max_abs_deviation > 1e-3
    e = {s: expected_tokens_per_block(R.get(s), target, draft, vocab=V, gamma=3) for s in ["lossless", "block", "hsd"]}
    assert e["block"] >= e["lossless"] - 1e-12
    assert e["hsd"] == pytest.approx(e["block"], abs=1e-12)


def test_hsd_variants_accept_at_least_as_much_as_block_verification():
    """The uncapped final ratio accepts the whole block more often than the lossless cap."""
    for seed in [1, 2, 3]:
        target, draft = _pair(seed)
        e_block = expected_tokens_per_block(R.get("block"), target, draft, vocab=V, gamma=3)
        for spec in [cls.name for cls in VARIANTS]:
            assert expected_tokens_per_block(R.get(spec), target, draft, vocab=V, gamma=3) >= e_block - 1e-12


def test_forced_stop_of_the_clever_code_never_changes_the_law():
    """Fast-HSD's ``clever`` forced stop (and its accept-without-resampling) is a no-op, ties included."""
    target, draft = _pair(7, conc=0.3)
    blocks, p, q, _ = enumerate_blocks(target, draft, (), 3, V)
    one_hot = lambda t: torch.nn.functional.one_hot(t.argmax(-1), V).double()  # noqa: E731
    tied_1, tied_2 = p.clone(), p.clone()
    tied_1[:, 0], tied_2[:, 1] = q[:, 0], q[:, 1]
    cases = [(p, q), (tied_1, q), (tied_2, q), (one_hot(p), one_hot(q)), (one_hot(p), q)]
    for pp, qq in cases:
        drawable = (qq.gather(-1, blocks[..., None])[..., 0] > 0).all(-1)
        for cap in [MIN_CAP, NO_CAP]:
            args = (pp[drawable], qq[drawable], blocks[drawable])
            plain = hierarchical_outcome_law(*args, cap=cap, final_capped=False, forced_stop=False)
            forced = hierarchical_outcome_law(*args, cap=cap, final_capped=False, forced_stop=True)
            assert torch.allclose(plain, forced, atol=1e-12, rtol=0)


def test_monte_carlo_fallback_is_labelled_and_close():
    class Opaque(Rule):            # a rule block_law knows nothing about
        name = "opaque"
        per_token = False

        def verify(self, p, q, draft, generator=None):
            return R.get("block").verify(p, q, draft, generator)

    target, draft = _pair(5)
    with pytest.raises(ValueError, match="mc_samples"):
        joint_law(Opaque(), target, draft, vocab=V, gamma=2, length=2)
    mc = joint_law(Opaque(), target, draft, vocab=V, gamma=2, length=2, mc_samples=2000, seed=1)
    assert not mc.exact and not mc.is_lossless()
    assert mc.max_abs_deviation < 6 * mc.std_error + 1e-3


def test_enumeration_limits_raise_clear_errors():
    target, draft = _pair(1)
    with pytest.raises(ValueError, match="V\\^γ"):
        joint_law(R.get("lossless"), target, draft, vocab=V, gamma=4, length=3)
    with pytest.raises(ValueError, match="vocabulary"):
        ToyModel(9, 0)


# --- HSD variants: edge cases --------------------------------------------------------------------------

@pytest.mark.parametrize("spec", VARIANT_SPECS)
def test_hsd_variants_on_identical_and_one_hot_inputs(spec):
    rule = R.get(spec)
    gen = torch.Generator().manual_seed(0)
    b, g, v = 5, 3, 6
    q = torch.softmax(torch.randn(b, g, v, generator=gen), -1)
    p = torch.cat([q, torch.softmax(torch.randn(b, 1, v, generator=gen), -1)], 1)
    draft = torch.multinomial(q.view(-1, v), 1, generator=gen).view(b, g)
    n, _ = rule.verify(p, q, draft, generator=gen)
    assert (n == g).all()                           # p = q: the whole block is accepted (ℓ <= 1 only helps)
    # Temperature 0: one-hot p and q reduce every variant to exact prefix matching.
    for trial in range(30):
        targets = torch.randint(0, v, (g + 1,), generator=gen)
        block = torch.where(torch.rand(g, generator=gen) < 0.7, targets[:g], torch.randint(0, v, (g,), generator=gen))
        p1 = torch.nn.functional.one_hot(targets, v).double()[None]
        q1 = torch.nn.functional.one_hot(block, v).double()[None]
        n1, z1 = rule.verify(p1, q1, block[None], generator=gen)
        expect = int((block == targets[:g]).long().cumprod(0).sum())
        assert n1.item() == expect and z1.item() == targets[expect].item(), trial


@pytest.mark.parametrize("spec", VARIANT_SPECS + FLY_SPECS)
def test_a_token_the_target_cannot_emit_is_never_accepted(spec):
    rule = R.get(spec)
    gen = torch.Generator().manual_seed(3)
    b, g, v = 400, 3, 5
    p = torch.softmax(torch.randn(b, g + 1, v, generator=gen), -1)
    p[:, :, 0] = 0.0
    p = p / p.sum(-1, keepdim=True)
    q = torch.softmax(torch.randn(b, g, v, generator=gen), -1)
    draft = torch.multinomial(q.reshape(-1, v), 1, generator=gen).view(b, g)
    n, z = rule.verify(p, q, draft, generator=gen)
    accepted_zero = (draft == 0) & (torch.arange(g) < n[:, None])
    assert not accepted_zero.any() and not (z == 0).any()


# --- FLy --------------------------------------------------------------------------------------------

def test_fly_deferral_on_near_greedy_inputs():
    """Draft one-hot, target almost one-hot (the draft token keeps 1e-9 at a mismatch, so it is natively
    rejected and may be deferred): a mismatch followed by W matches is accepted; one whose window leaves
    the block, or is followed by a mismatch, is rejected and the target's token emitted."""
    v = 6
    def run(spec, block, targets):
        p = torch.nn.functional.one_hot(torch.tensor(targets), v).double()
        for i, (x, t) in enumerate(zip(block, targets)):
            if x != t:
                p[i, x] = 1e-9
        p = (p / p.sum(-1, keepdim=True))[None]
        q = torch.nn.functional.one_hot(torch.tensor(block), v).double()[None]
        n, z = R.get(spec).verify(p, q, torch.tensor(block)[None], generator=torch.Generator().manual_seed(0))
        return n.item(), z.item()
    open_gate = "fly:theta=0,window=1"
    assert run(open_gate, [1, 2, 3], [0, 2, 5, 4]) == (2, 5)         # 1 deferred (2 matches); 3: no room
    assert run(open_gate, [1, 2, 3], [0, 0, 3, 4]) == (0, 0)         # the next token mismatches too
    assert run(open_gate, [1, 2, 3], [1, 2, 3, 4]) == (3, 4)         # all match: bonus
    assert run(open_gate, [1, 2, 3, 3], [0, 2, 0, 3, 4]) == (4, 4)   # two deferrals, each with its own window
    assert run("fly:theta=0,window=2", [1, 2, 3, 3], [0, 2, 3, 0, 4]) == (3, 0)
    # A near one-hot row has top-3 entropy ~1e-8: any θ above that is exact matching.
    assert run("fly:theta=0.01,window=1", [1, 2, 3], [0, 2, 5, 4]) == (0, 0)
    # Exactly one-hot p (temperature 0 after the sampling pipeline): p(x) = 0 at every mismatch, never deferred.
    p = torch.nn.functional.one_hot(torch.tensor([0, 2, 5, 4]), v).double()[None]
    q = torch.nn.functional.one_hot(torch.tensor([1, 2, 3]), v).double()[None]
    n, z = R.get(open_gate).verify(p, q, torch.tensor([[1, 2, 3]]))
    assert (n.item(), z.item()) == (0, 0)


def test_fly_top3_entropy_and_gate():
    p = torch.tensor([[0.5, 0.3, 0.1, 0.1], [1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    expected = [-(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.1 * math.log(0.1)), 0.0, -3 * 0.25 * math.log(0.25)]
    assert torch.allclose(top_k_entropy(p), torch.tensor(expected, dtype=torch.float64))


def test_fly_with_a_closed_gate_or_no_room_is_token_level_lossless():
    target, draft = _pair(3)
    blocks, p, q, _ = enumerate_blocks(target, draft, (), 3, V)
    lossless, _ = outcome_law(R.get("lossless"), p, q, blocks)
    for spec in ["fly:theta=1.1,window=1", "fly:theta=0,window=3", "fly"]:    # log 3 < 1.1; W = G leaves no room
        law, _ = outcome_law(R.get(spec), p, q, blocks)
        assert torch.allclose(law, lossless, atol=1e-14, rtol=0), spec
    opened, _ = outcome_law(R.get("fly:theta=0,window=1"), p, q, blocks)
    assert (opened - lossless).abs().max() > 1e-2


def test_fly_accepts_more_as_the_gate_opens():
    target, draft = _pair(6)
    e = [expected_tokens_per_block(R.get(f"fly:theta={t},window=1"), target, draft, vocab=V, gamma=3)
         for t in [1.2, 0.8, 0.4, 0.0]]
    assert all(a <= b + 1e-12 for a, b in zip(e, e[1:])) and e[-1] > e[0]


# --- the enumeration -----------------------------------------------------------------------------------

def test_every_draft_block_is_enumerated():
    target, draft = _pair(1)
    blocks, p, q, weight = enumerate_blocks(target, draft, (2,), 2, V)
    assert blocks.shape == (V**2, 2) and set(map(tuple, blocks.tolist())) == set(itertools.product(range(V), repeat=2))
    assert weight.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert torch.equal(p[5, 1], target((2, int(blocks[5, 0]))))
