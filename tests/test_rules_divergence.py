"""Divergence-gated rules (fuzzy SD, KL judge): divergences against scipy, the law of the gate, the lossless
settings, the confidence mask, the raw-distribution gate, spec text.

The checks every registered rule gets (closed form vs mechanism, sampler, chain semantics, acceptance oracle,
parameters, constructors, spec round trip) run on these rules' settings in tests/test_rule_registry.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy

import verispec.rules as R
from tests.helpers.rule_cases import ALPHA, gof_pvalue, pq_cases, single_position
from tests.helpers.rule_oracles import scipy_divergences
from verispec.rules.base import TAXONOMY
from verispec.rules.divergence import (
    DIVERGENCES,
    Fuzzy,
    KLJudge,
    divergence,
    js_divergence,
    js_reversed,
    kl_divergence,
    tv_distance,
)

CASES = pq_cases()

SPECS = [
    "fuzzy:T=0.2",                          # js: opens dense, near_identical, identical, tail_overshoot
    "fuzzy:T=0.7,div=js",                   # T > ln 2: every row open, disjoint supports included
    "fuzzy:T=0.5,div=tv",
    "fuzzy:T=1,div=kl_qp",
    "fuzzy:T=0.8,div=kl_pq",
    "fuzzy:T=0.3,div=js_rev",
    "fuzzy:T=0",                            # lossless
    "kl_judge:tau=0.8",                     # one_hot_p is confident: SD there
    "kl_judge:tau=1.5,div=kl_qp,reject=p",
    "kl_judge:tau=0.7,confident=0.5",       # dense (max p 0.67) is confident: SD there
    "kl_judge:tau=3,confident=1,reject=p",  # no confidence mask
    "kl_judge:tau=0",                       # lossless
    "kl_judge:tau=2,confident=0",           # lossless (always SD)
]
LOSSLESS_SPECS = ["fuzzy:T=0", "fuzzy:T=0,div=kl_pq", "fuzzy:T=0,div=tv", "kl_judge:tau=0",
                  "kl_judge:tau=0,reject=p", "kl_judge:tau=2,confident=0", "kl_judge:tau=2,confident=0,reject=p"]


def _np(t):
    return t.numpy().astype(float)


def _scipy_reference(p, q):
    return scipy_divergences(_np(p), _np(q))


# --- divergences ---------------------------------------------------------------------------------

def _random_rows(n=20, v=7, seed=3):
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        g = torch._standard_gamma(torch.full((v,), 0.5, dtype=torch.float64), generator=gen)
        rows.append(g / g.sum())
    return rows


def test_divergences_match_scipy():
    """JS = scipy jensenshannon² (nats), KL = scipy entropy in both directions, on every regime."""
    rows = _random_rows()
    pairs = list(CASES.values()) + list(zip(rows[::2], rows[1::2]))
    for p, q in pairs:
        expected = _scipy_reference(p, q)
        for kind, want in expected.items():
            got = divergence(p, q, kind).item()
            if math.isinf(want):
                assert math.isinf(got) and got > 0, (kind, got)
            else:
                assert got == pytest.approx(want, abs=1e-10, rel=1e-9), (kind, got, want)
    # batched: [N, V] in, [N] out, the same values
    ps, qs = torch.stack([p for p, _ in pairs]), torch.stack([q for _, q in pairs])
    for kind in DIVERGENCES:
        batched = divergence(ps, qs, kind)
        assert batched.shape == (len(pairs),)
        single = torch.stack([divergence(p, q, kind) for p, q in pairs])
        assert torch.equal(batched, single)


def test_divergence_directions_match_the_fsd_reference_code():
    """fsd_utils.py: kl_div = F.kl_div(log p, q) = KL(q‖p) -> kl_qp; kl_div_reversed = F.kl_div(log q, p)
    -> kl_pq; js_div = ½F.kl_div(log p, m) + ½F.kl_div(log q, m) -> js_rev (not the JS divergence)."""
    f = torch.nn.functional.kl_div
    for p, q in zip(_random_rows(seed=5)[::2], _random_rows(seed=5)[1::2]):
        m = 0.5 * (p + q)
        assert divergence(p, q, "kl_qp").item() == pytest.approx(f(p.log(), q, reduction="none").sum().item(), rel=1e-9)
        assert divergence(p, q, "kl_pq").item() == pytest.approx(f(q.log(), p, reduction="none").sum().item(), rel=1e-9)
        code_js = (0.5 * f(p.log(), m, reduction="none") + 0.5 * f(q.log(), m, reduction="none")).sum().item()
        assert divergence(p, q, "js_rev").item() == pytest.approx(code_js, rel=1e-9)
        assert divergence(p, q, "js").item() != pytest.approx(code_js, rel=1e-3)   # they do differ


def test_divergence_edge_cases():
    p, q = CASES["disjoint"]
    assert js_divergence(p, q).item() == pytest.approx(math.log(2), abs=1e-12)
    assert js_divergence(p, q).item() <= math.log(2)
    assert tv_distance(p, q).item() == pytest.approx(1.0, abs=1e-12)
    for f in (kl_divergence, js_reversed):
        assert math.isinf(f(p, q).item()) and math.isinf(f(q, p).item())
    # KL is infinite only in the direction whose first argument has mass where the second has none
    p1, q1 = CASES["one_hot_p"]
    assert kl_divergence(p1, q1).item() == pytest.approx(entropy(_np(p1), _np(q1)))
    assert math.isinf(kl_divergence(q1, p1).item())
    # identical rows: exactly 0; rows that differ by one rounding step: > 0 (float32 and float64)
    for dtype in (torch.float32, torch.float64):
        a = CASES["dense"][0].to(dtype)
        b = a.clone()
        b[0] = torch.nextafter(b[0], torch.tensor(2.0, dtype=dtype))
        for kind in DIVERGENCES:
            assert divergence(a, a.clone(), kind).item() == 0.0, kind
            assert divergence(a, b, kind).item() > 0.0, (kind, dtype)
    with pytest.raises(ValueError, match="unknown divergence 'kl'.*js, kl_qp, kl_pq, tv, js_rev"):
        divergence(p, q, "kl")


# --- the law of the gate -------------------------------------------------------------------------

def _oracle_open(spec, p, q):
    """The gate from scipy's divergences (independent of the module)."""
    rule = R.get(spec)
    d = _scipy_reference(p, q)
    if isinstance(rule, Fuzzy):
        return d[rule.div] <= rule.T
    return p.max().item() <= rule.confident and d[rule.div] < rule.tau


@pytest.mark.parametrize("spec", SPECS)
def test_law_is_q_where_the_gate_opens_and_p_elsewhere(spec):
    """(D.1) against the gate computed from scipy's divergences (the acceptance rate against the same gate is
    tests/test_rule_registry.py::test_acceptance_rate_matches_an_independent_oracle)."""
    rule = R.get(spec)
    for name, (p, q) in CASES.items():
        is_open = _oracle_open(spec, p, q)
        assert torch.equal(rule.induced(p, q), q if is_open else p), (spec, name)


def test_sampler_test_has_power():
    """Where the law is q (gate open) the emitted tokens are clearly not distributed as p, and vice versa: the
    sampler test of tests/test_rule_registry.py (40,000 rows, the same chi-square) tells the two laws apart."""
    p, q = CASES["dense"]
    first, _, _ = single_position(R.get("fuzzy:T=0.2"), p, q, 40_000, seed=11)     # open: law q
    counts = np.bincount(first.numpy(), minlength=p.numel())
    assert gof_pvalue(counts, _np(q)) > ALPHA and gof_pvalue(counts, _np(p)) < 1e-12
    first, _, _ = single_position(R.get("fuzzy:T=0.1"), p, q, 40_000, seed=12)     # closed: law p
    counts = np.bincount(first.numpy(), minlength=p.numel())
    assert gof_pvalue(counts, _np(p)) > ALPHA and gof_pvalue(counts, _np(q)) < 1e-12


# --- lossless settings ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec", LOSSLESS_SPECS)
def test_lossless_settings_emit_p_bit_for_bit_and_say_so(spec):
    """The closed gate returns p itself (not a rounding of it), and the lossless settings state the form "target"."""
    rule = R.get(spec)
    assert rule.is_lossless and rule.induced_form().kind == "target"
    for name, (p, q) in CASES.items():
        assert torch.equal(rule.induced(p, q), p), (spec, name)


def test_fuzzy_at_zero_threshold_accepts_only_equal_distributions():
    rule = R.get("fuzzy:T=0")
    assert rule.acceptance_rate(*CASES["identical"]).item() == 1.0
    for name in ("near_identical", "dense", "tail_overshoot"):
        assert rule.acceptance_rate(*CASES[name]).item() == 0.0, name


def test_lossy_settings_are_not_flagged_lossless():
    for spec in ["fuzzy:T=0.01", "fuzzy:T=0,on=raw", "kl_judge:tau=0.01", "kl_judge:tau=1,confident=0.01"]:
        rule = R.get(spec)
        assert not rule.is_lossless and rule.induced_form().kind == "other", spec
    # on=raw, T = 0: the gate reads the raw pair, which may be equal where the processed pair is not
    p, q = CASES["dense"]
    r = CASES["peaked"][0]
    assert torch.equal(R.get("fuzzy:T=0,on=raw").induced(p, q, raw=(r, r.clone())), q)


# --- the confidence mask and the comparisons of the KL judge -------------------------------------

def test_kl_judge_confidence_mask():
    p = torch.tensor([0.95, 0.03, 0.02], dtype=torch.float64)
    q = torch.tensor([0.90, 0.06, 0.04], dtype=torch.float64)
    kl = entropy(_np(p), _np(q))
    assert kl < 0.05 and p.max() > 0.9
    tv = 0.5 * (p - q).abs().sum().item()
    masked = R.get("kl_judge:tau=0.5")                    # max p > 0.9: standard SD, law p
    assert torch.equal(masked.induced(p, q), p)
    assert masked.acceptance_rate(p, q).item() == pytest.approx(1 - tv)
    assert R.get("kl_judge:tau=0.5,reject=p").acceptance_rate(p, q).item() == pytest.approx(1 - tv)
    unmasked = R.get("kl_judge:tau=0.5,confident=0.96")   # not confident: the KL test passes
    assert torch.equal(unmasked.induced(p, q), q) and unmasked.acceptance_rate(p, q).item() == 1.0


def test_threshold_comparisons():
    """fuzzy accepts D <= T (the reference code's ``divs <= div_threshold``); the KL judge accepts
    KL < τ ("below τ") and masks max p > confident ("exceeds")."""
    p, q = CASES["dense"]
    d = js_divergence(p, q).item()
    assert R.get(Fuzzy(d).spec()).acceptance_rate(p, q).item() == 1.0
    kl = kl_divergence(p, q).item()
    assert KLJudge(kl, confident=1.0, reject="p").acceptance_rate(p, q).item() == 0.0
    assert KLJudge(math.nextafter(kl, math.inf), confident=1.0, reject="p").acceptance_rate(p, q).item() == 1.0
    at_max = p.max().item()
    assert KLJudge(5.0, confident=at_max).acceptance_rate(p, q).item() == 1.0          # max p = c: not confident
    assert KLJudge(5.0, confident=math.nextafter(at_max, 0.0)).acceptance_rate(p, q).item() < 1.0


def test_greedy_processed_is_exact_match():
    """At temperature 0 (one-hot p, q) the processed gate sees ln 2 (js) between distinct point masses."""
    p = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    same, other = p.clone(), torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    rule = R.get("fuzzy:T=0.5")
    assert rule.acceptance_rate(p, same).item() == 1.0 and rule.acceptance_rate(p, other).item() == 0.0
    assert torch.equal(rule.induced(p, other), p)
    assert R.get("fuzzy:T=0.7").acceptance_rate(p, other).item() == 1.0              # T > ln 2: anything goes


# --- the raw gate ---------------------------------------------------------------------------------

def test_raw_gate_decides_and_processed_pair_is_emitted():
    """on=raw: the gate reads raw=(p_raw, q_raw); the fallback and the law use the processed p, q."""
    p, q = CASES["tail_overshoot"]                       # processed js 0.188: closed at T = 0.1
    r_open = (CASES["near_identical"][0], CASES["near_identical"][1])      # raw js 2e-4: open
    r_closed = CASES["disjoint"]                          # raw js ln 2: closed
    processed, raw = R.get("fuzzy:T=0.1"), R.get("fuzzy:T=0.1,on=raw")
    assert raw.needs_raw and not processed.needs_raw and not Fuzzy.needs_raw
    assert processed.acceptance_rate(p, q).item() == 0.0
    assert torch.equal(raw.induced(p, q, raw=r_open), q) and raw.acceptance_rate(p, q, raw=r_open).item() == 1.0
    assert torch.equal(raw.induced(p, q, raw=r_closed), p) and raw.acceptance_rate(p, q, raw=r_closed).item() == 0.0
    for r in (r_open, r_closed):
        assert torch.allclose(raw.induced_mechanism(p, q, raw=r), raw.induced(p, q, raw=r), atol=1e-12)
    # the opposite: processed pair equal (open on processed), raw pair disjoint (closed)
    pp = CASES["identical"]
    assert processed.acceptance_rate(*pp).item() == 1.0
    assert raw.acceptance_rate(*pp, raw=r_closed).item() == 0.0


def test_raw_gate_in_verify_rows_and_positions():
    """verify: each row and position follows its own raw pair; closed rows emit from p."""
    rule = R.get("fuzzy:T=0.1,on=raw")
    p1, q1 = CASES["tail_overshoot"]
    p2, q2 = CASES["dense"]
    p3 = CASES["peaked"][0]
    opened, closed = CASES["near_identical"], CASES["disjoint"]
    n, gen = 20_000, torch.Generator().manual_seed(5)
    p = torch.stack([p1, p2, p3]).expand(n, 3, -1).contiguous()
    q = torch.stack([q1, q2]).expand(n, 2, -1).contiguous()
    draft = torch.stack([torch.multinomial(q1, n, True, generator=gen),
                         torch.multinomial(q2, n, True, generator=gen)], 1)
    # rows 0::2: raw open at both positions; rows 1::2: raw open at position 1, closed at position 2
    row_open = torch.arange(n) % 2 == 0
    p_raw = torch.stack([opened[0], opened[0], opened[0]]).expand(n, 3, -1).clone()
    q_raw = torch.stack([opened[1], opened[1]]).expand(n, 2, -1).clone()
    p_raw[~row_open, 1], q_raw[~row_open, 1] = closed[0], closed[1]
    n_acc, nxt = rule.verify(p, q, draft, generator=gen, raw=(p_raw, q_raw))
    assert torch.equal(n_acc[row_open], torch.full_like(n_acc[row_open], 2))
    assert torch.equal(n_acc[~row_open], torch.full_like(n_acc[~row_open], 1))
    counts = np.bincount(nxt[~row_open].numpy(), minlength=p1.numel())        # rejected at position 2: ~ p2
    assert gof_pvalue(counts, _np(p2)) > ALPHA and gof_pvalue(counts, _np(q2)) < 1e-12
    counts = np.bincount(nxt[row_open].numpy(), minlength=p1.numel())         # bonus: ~ p3
    assert gof_pvalue(counts, _np(p3)) > ALPHA
    # the processed gate would have rejected position 1 (js 0.188 > 0.1) everywhere
    n_proc, _ = R.get("fuzzy:T=0.1").verify(p, q, draft, generator=gen)
    assert int(n_proc.max()) == 0


def test_kl_judge_raw_gate_reads_raw_confidence():
    """The confidence mask reads the same (raw) distributions as the KL test."""
    p, q = CASES["one_hot_p"]                            # processed max p = 1: confident
    r = CASES["near_identical"]                           # raw: max p 0.32, KL 7e-4
    assert torch.equal(R.get("kl_judge:tau=0.5").induced(p, q), p)
    rule = R.get("kl_judge:tau=0.5,on=raw")
    assert torch.equal(rule.induced(p, q, raw=r), q) and rule.acceptance_rate(p, q, raw=r).item() == 1.0
    raw_rows = (r[0].expand(5000, 2, -1), r[1].expand(5000, 1, -1))
    first, accepted, _ = single_position(rule, p, q, 5000, seed=4, raw=raw_rows)
    assert bool(accepted.all())


def test_raw_argument_errors():
    p, q = CASES["dense"]
    raw_rule, processed = R.get("fuzzy:T=0.1,on=raw"), R.get("kl_judge:tau=0.3")
    with pytest.raises(ValueError, match="on=raw needs the raw"):
        raw_rule.induced(p, q)
    with pytest.raises(ValueError, match="on=raw needs the raw"):
        raw_rule.acceptance_rate(p, q)
    with pytest.raises(ValueError, match="on=processed"):
        processed.induced(p, q, raw=(p, q))
    with pytest.raises(TypeError, match="pair of tensors"):
        raw_rule.induced(p, q, raw=p)
    with pytest.raises(ValueError, match="q_raw must have the shape"):
        raw_rule.induced(p, q, raw=(p, q[:-1]))
    with pytest.raises(ValueError, match="raw p_raw rows must sum to 1"):
        raw_rule.induced(p, q, raw=(p * 2, q))
    ps, qs = p.expand(4, 3, -1).contiguous(), q.expand(4, 2, -1).contiguous()
    draft = torch.zeros(4, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="on=raw needs the raw"):
        raw_rule.verify(ps, qs, draft)
    with pytest.raises(ValueError, match=r"p_raw must be \[B, G\+1, V\]"):
        raw_rule.verify(ps, qs, draft, raw=(qs, qs))
    with pytest.raises(ValueError, match="on=processed"):
        processed.verify(ps, qs, draft, raw=(ps, qs))


# --- spec text and identity ----------------------------------------------------------------------

def test_spec_text_and_identity():
    assert R.get("fuzzy:0.25,kl_pq,raw").spec() == "fuzzy:T=0.25,div=kl_pq,on=raw"
    assert R.get("kl_judge:tau=0.5").spec() == "kl_judge:tau=0.5,confident=0.9,div=kl_pq,reject=sd,on=processed"
    assert R.get("fuzzy:T=0.4") == Fuzzy(0.4, div="js", on="processed")
    assert R.split_specs("fuzzy:T=0.3,div=tv,on=raw,kl_judge:tau=1,reject=p,lossless") == [
        "fuzzy:T=0.3,div=tv,on=raw", "kl_judge:tau=1,reject=p", "lossless"]
    for spec, family in [("fuzzy:T=0.4", "fuzzy"), ("kl_judge:tau=0.5", "kl_judge")]:
        rule = R.get(spec)
        assert rule.taxonomy == "deferral" and rule.taxonomy in TAXONOMY
        assert rule.family == family and rule.per_token and not rule.pointwise_acceptance
        assert isinstance(rule.describe(), str) and rule.describe()
        p, q = CASES["dense"]
        assert torch.equal(rule.reference(p, q), p)          # true baseline: the plain target
    assert "T=0.4" in R.get("fuzzy:T=0.4").describe()
    assert "τ=0.5" in R.get("kl_judge:tau=0.5").describe()
