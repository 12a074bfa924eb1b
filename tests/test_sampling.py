"""Tests of the sampling pipeline (``verispec.sampling``).

The property tests compare against a deliberately naive reference written here with numpy and
Python loops over sorted tokens (independent of ``verispec.sampling`` and ``verispec.sets``).
Hugging Face's own warpers are compared too when ``transformers`` is installed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from verispec import sampling, topk
from verispec.sampling import (
    EpsilonCutoff,
    EtaCutoff,
    MinP,
    SamplingConfig,
    Temperature,
    TopK,
    TopP,
)

NEG_INF = float("-inf")
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEAVY = settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# A few values only, so that rows are full of exact ties; -inf entries are masked tokens.
LOGIT_VALUES = [NEG_INF, -3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 2.0, 4.0]
MARGIN = 1e-6


# --------------------------------------------------------------------------------------------------
# naive reference (numpy / loops). Each step returns (new logits, margin): the smallest distance of
# any compared quantity from its threshold; examples within rounding error of a boundary are skipped.


def ref_softmax(x: np.ndarray) -> np.ndarray:
    """float32 softmax computed the same way as the pipeline (so only the set logic is under test)."""
    return torch.softmax(torch.from_numpy(x.astype(np.float32)), -1).double().numpy()


def ref_mask(x, keep):
    return np.where(keep, x, NEG_INF).astype(np.float32)


def ref_temperature(x, t):
    # same float32 op as the implementation; there is no set logic to reimplement here
    return (torch.from_numpy(x) / t).numpy(), math.inf


def ref_top_k(x, k):
    if k >= len(x):
        return x, math.inf
    kth = sorted(x.tolist(), reverse=True)[k - 1]
    return ref_mask(x, np.array([v >= kth for v in x])), math.inf


def ref_top_p(x, top_p):
    p = ref_softmax(x)
    order = sorted(range(len(x)), key=lambda i: -p[i])
    above, kept, margin = 0.0, [], math.inf
    for i in order:
        if p[i] > 0:
            margin = min(margin, abs(above - top_p))
        if above < top_p and p[i] > 0:
            kept.append(i)
        above += p[i]
    smallest = min(p[i] for i in kept)
    return ref_mask(x, p >= smallest), margin


def ref_min_p(x, min_p):
    p = ref_softmax(x)
    top = p.max()
    keep = [pi >= min_p * top for pi in p]
    margin = min((abs(pi / top - min_p) for pi in p if pi != top), default=math.inf)
    return ref_mask(x, np.array(keep)), margin


def _keep_first_argmax(keep, p):
    keep = list(keep)
    keep[int(np.argmax(p))] = True
    return np.array(keep)


def ref_eta(x, eps, delta=None):
    p = ref_softmax(x)
    h = -sum(pi * math.log(pi) for pi in p if pi > 0)
    d = math.sqrt(eps) if delta is None else delta
    thr = min(eps, d * math.exp(-h))
    keep = _keep_first_argmax([pi >= thr for pi in p], p)
    margin = min(abs(pi - thr) / thr for pi in p)
    return ref_mask(x, keep), margin


def ref_epsilon(x, eps):
    p = ref_softmax(x)
    keep = _keep_first_argmax([pi >= eps for pi in p], p)
    margin = min(abs(pi - eps) / eps for pi in p)
    return ref_mask(x, keep), margin


def ref_pipeline_row(x: np.ndarray, cfg: SamplingConfig):
    """Reference probabilities of one row, and the margin to the nearest decision boundary."""
    x = x.astype(np.float32)
    if cfg.temperature == 0:
        out = np.zeros(len(x))
        out[int(np.argmax(x))] = 1.0
        return out, math.inf
    margin = math.inf
    steps = []
    if cfg.temperature != 1:
        steps.append(lambda v: ref_temperature(v, cfg.temperature))
    if cfg.top_k:
        steps.append(lambda v: ref_top_k(v, cfg.top_k))
    if cfg.top_p < 1:
        steps.append(lambda v: ref_top_p(v, cfg.top_p))
    if cfg.min_p:
        steps.append(lambda v: ref_min_p(v, cfg.min_p))
    if cfg.eta:
        steps.append(lambda v: ref_eta(v, cfg.eta, cfg.eta_delta))
    if cfg.epsilon:
        steps.append(lambda v: ref_epsilon(v, cfg.epsilon))
    for step in steps:
        x, m = step(x)
        margin = min(margin, m)
    return ref_softmax(x), margin


def ref_pipeline(x: np.ndarray, cfg: SamplingConfig):
    rows = x.reshape(-1, x.shape[-1])
    outs, margins = zip(*(ref_pipeline_row(r, cfg) for r in rows))
    return np.stack(outs).reshape(x.shape), min(margins)


def assert_matches_reference(probs: torch.Tensor, ref: np.ndarray, logits: np.ndarray):
    assert probs.dtype == torch.float32
    assert probs.shape == ref.shape
    got = probs.double().numpy()
    np.testing.assert_array_equal(got > 0, ref > 0)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
    assert (got[np.isneginf(logits)] == 0).all()


# --------------------------------------------------------------------------------------------------
# strategies


@st.composite
def logit_rows(draw, min_v=2, max_v=40, max_rows=4):
    """``[R, V]`` float32 logits from a small value set (many ties), every row with a finite entry."""
    v = draw(st.integers(min_v, max_v))
    r = draw(st.integers(1, max_rows))
    vals = draw(st.lists(st.lists(st.sampled_from(LOGIT_VALUES), min_size=v, max_size=v), min_size=r, max_size=r))
    x = np.array(vals, dtype=np.float32)
    for row in x:
        if np.isneginf(row).all():
            row[draw(st.integers(0, v - 1))] = draw(st.sampled_from(LOGIT_VALUES[1:]))
    # occasionally spread the values so that there are no ties at all
    if draw(st.booleans()):
        x = x * np.float32(draw(st.sampled_from([1.0, 0.37, 2.9])))
        x = x + np.float32(1e-3) * np.arange(v, dtype=np.float32)[None, :] * draw(st.sampled_from([0, 1]))
    return x


temperatures = st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5])
top_ks = st.sampled_from([0, 1, 2, 3, 5, 10, 50])
top_ps = st.sampled_from([1.0, 0.05, 0.3, 0.55, 0.8, 0.95]) | st.floats(0.01, 0.99)
min_ps = st.sampled_from([0.0, 0.05, 0.2, 0.5, 0.9, 1.0]) | st.floats(0.01, 1.0)
etas = st.sampled_from([0.0, 3e-4, 0.02, 0.2]) | st.floats(1e-4, 0.5)
eta_deltas = st.none() | st.sampled_from([0.1, 1.0, 3.0])
epsilons = st.sampled_from([0.0, 3e-4, 0.02, 0.2]) | st.floats(1e-4, 0.9)


@st.composite
def configs(draw):
    return SamplingConfig(
        temperature=draw(temperatures),
        top_k=draw(top_ks),
        top_p=draw(top_ps),
        min_p=draw(min_ps),
        eta=draw(etas),
        eta_delta=draw(eta_deltas),
        epsilon=draw(epsilons),
    )


def run_warper(w, x: np.ndarray) -> np.ndarray:
    out = w(torch.from_numpy(x))
    assert out.dtype == torch.float32 and out.shape == x.shape
    return out.numpy()


def check_single_warper(w, ref_fn, x):
    got = run_warper(w, x)
    refs, margins = zip(*(ref_fn(row) for row in x))
    assume(min(margins) > MARGIN)
    ref = np.stack(refs)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    np.testing.assert_array_equal(got[~np.isneginf(got)], ref[~np.isneginf(ref)])
    assert (~np.isneginf(got)).any(-1).all(), "a row lost every token"


# --------------------------------------------------------------------------------------------------
# single warpers against the reference


@SETTINGS
@given(x=logit_rows(), t=st.sampled_from([0.3, 0.7, 1.0, 2.5]))
def test_temperature_property(x, t):
    got = run_warper(Temperature(t), x)
    np.testing.assert_allclose(got, x / np.float32(t), rtol=1e-6)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(x))


@SETTINGS
@given(x=logit_rows())
def test_temperature_zero_is_greedy_property(x):
    got = run_warper(Temperature(0.0), x)
    expected = np.full_like(x, NEG_INF)
    expected[np.arange(len(x)), np.argmax(x, -1)] = 0.0
    np.testing.assert_array_equal(got, expected)


@SETTINGS
@given(x=logit_rows(), k=st.integers(1, 45))
def test_top_k_property(x, k):
    check_single_warper(TopK(k), lambda r: ref_top_k(r, k), x)


@SETTINGS
@given(x=logit_rows(), p=top_ps)
def test_top_p_property(x, p):
    check_single_warper(TopP(p), lambda r: ref_top_p(r, p), x)


@SETTINGS
@given(x=logit_rows(), m=st.floats(0.001, 1.0))
def test_min_p_property(x, m):
    check_single_warper(MinP(m), lambda r: ref_min_p(r, m), x)


@SETTINGS
@given(x=logit_rows(), e=st.floats(1e-4, 0.9), d=eta_deltas)
def test_eta_property(x, e, d):
    check_single_warper(EtaCutoff(e, d), lambda r: ref_eta(r, e, d), x)


@SETTINGS
@given(x=logit_rows(), e=st.floats(1e-4, 0.99))
def test_epsilon_property(x, e):
    check_single_warper(EpsilonCutoff(e), lambda r: ref_epsilon(r, e), x)


# --------------------------------------------------------------------------------------------------
# the whole pipeline against the reference


@HEAVY
@given(x=logit_rows(), cfg=configs())
def test_pipeline_matches_reference(x, cfg):
    ref, margin = ref_pipeline(x, cfg)
    assume(margin > MARGIN)
    probs = cfg.process(torch.from_numpy(x))
    assert_matches_reference(probs, ref, x)
    assert ((probs > 0).sum(-1) >= 1).all()
    logits = cfg.process_logits(torch.from_numpy(x))
    assert logits.dtype == torch.float32
    np.testing.assert_array_equal(torch.isneginf(logits).numpy(), ref == 0)
    torch.testing.assert_close(torch.softmax(logits, -1), probs, rtol=1e-6, atol=1e-7)


@st.composite
def block_logit_rows(draw):
    """``[R, V]`` logits on a grid (ties, but fewer) for the block path, some ``-inf``.

    Generated from a drawn seed: drawing hundreds of elements one by one is too slow here.
    """
    v = draw(st.integers(24, 120))
    r = draw(st.integers(1, 3))
    levels = draw(st.sampled_from([6, 20, 80]))
    p_inf = draw(st.sampled_from([0.0, 0.2, 0.9]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.integers(-levels, levels + 1, size=(r, v)) * (4.0 / levels)).astype(np.float32)
    x[rng.random((r, v)) < p_inf] = NEG_INF
    x[np.isneginf(x).all(-1), 0] = 0.0
    return x


@st.composite
def block_configs(draw):
    cfg = draw(configs())
    return replace(cfg, top_k=draw(st.sampled_from([1, 2, 3, 4, 6, 9])))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=block_logit_rows(), cfg=block_configs())
def test_block_path_matches_reference(x, cfg):
    """The compact block top-k path (forced on small vocabularies with 4-wide blocks)."""
    ref, margin = ref_pipeline(x, cfg)
    assume(margin > MARGIN)
    with mock.patch.object(topk, "BLOCK", 4), mock.patch.object(topk, "BLOCK_MIN_V", 1):
        probs = cfg.process(torch.from_numpy(x))
        logits = cfg.process_logits(torch.from_numpy(x))
    assert_matches_reference(probs, ref, x)
    np.testing.assert_array_equal(torch.isneginf(logits).numpy(), ref == 0)


@HEAVY
@given(
    x=logit_rows(min_v=2, max_v=30, max_rows=1),
    cfg=configs(),
    b=st.integers(1, 3),
    g=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_batch_dims_row_by_row(x, cfg, b, g, seed):
    rng = np.random.default_rng(seed)
    xs = np.stack([rng.permutation(x[0]) for _ in range(b * g)]).reshape(b, g, -1)
    t = torch.from_numpy(xs)
    out = cfg.process(t)
    out_logits = cfg.process_logits(t)
    assert out.shape == (b, g, xs.shape[-1])
    for i in range(b):
        for j in range(g):
            assert torch.equal(out[i, j], cfg.process(t[i, j]))
            assert torch.equal(out_logits[i, j], cfg.process_logits(t[i, j]))


@HEAVY
@given(x=logit_rows(), cfg=configs())
def test_pipeline_equals_warper_chain(x, cfg):
    y = torch.from_numpy(x)
    for w in cfg.warpers():
        y = w(y)
    torch.testing.assert_close(cfg.process_logits(torch.from_numpy(x)), y, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------
# large vocabulary: block path, its fallback, and the dense top-p window growth


def _chain(cfg, x):
    y = x
    for w in cfg.warpers():
        y = w(y)
    return y


@pytest.mark.parametrize(
    "spec",
    [
        "temperature=0.7,top_k=20,top_p=0.8,min_p=0.1",
        "top_k=1",
        "top_k=5,temperature=1.3",
        "top_k=50,eta=0.002",
        "top_k=300,top_p=0.99,epsilon=0.0001",
        "temperature=0.7,top_p=0.9",
        "min_p=0.05",
        "greedy",
    ],
)
@pytest.mark.parametrize("kind", ["normal", "bf16_ties", "flat", "masked"])
def test_large_vocab_equals_warper_chain(spec, kind):
    cfg = SamplingConfig.parse(spec)
    g = torch.Generator().manual_seed(hash((spec, kind)) % 2**31)
    V = 20_011  # not a multiple of the block size: exercises the tail
    x = torch.randn(2, 3, V, generator=g) * 4
    if kind == "bf16_ties":
        x = (x * 0.5).round() / 0.5  # coarse grid: ties everywhere, also at the top-k boundary
    elif kind == "flat":
        x = torch.randn(2, 3, V, generator=g) * 0.05
    elif kind == "masked":
        x[..., torch.rand(V, generator=g) < 0.999] = NEG_INF
    expected = _chain(cfg, x)
    got = cfg.process_logits(x)
    assert torch.equal(torch.isneginf(got), torch.isneginf(expected))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    probs = cfg.process(x)
    torch.testing.assert_close(probs, torch.softmax(expected, -1), rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))


def test_block_top_k_compact_path_is_taken_and_falls_back_on_ties():
    calls = []
    real = topk.top_k_compact

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    cfg = SamplingConfig(top_k=20, temperature=0.7)
    with mock.patch.object(topk, "top_k_compact", spy):
        x = torch.randn(6, 151_936)
        p1 = cfg.process(x)
        tied = torch.zeros(6, 151_936)
        tied[:, :10] = 1.0  # 10 tokens above, then 151,926 tokens tied at the k-th value
        p2 = cfg.process(tied)
    assert calls == [True, False]
    torch.testing.assert_close(p1, torch.softmax(_chain(cfg, x), -1), rtol=1e-5, atol=1e-8)
    assert (p2 > 0).all()  # every tied token survives top-k
    torch.testing.assert_close(p2, torch.softmax(_chain(cfg, tied), -1))


def test_top_p_window_growth_matches_sort():
    """Nucleus much larger than the first top-p window (and than one growth step)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 30_000, generator=g) * 0.3
    for p in (0.05, 0.5, 0.9):
        got = TopP(p)(x)
        probs = torch.softmax(x, -1).double()
        srt, _ = probs.sort(-1, descending=True)
        above = torch.cumsum(srt, -1) - srt
        n = (above < p).sum(-1, keepdim=True)
        smallest = srt.gather(-1, n - 1)
        expected = probs >= smallest
        assert n.min() > 4 * sampling._TOP_P_WINDOW
        assert torch.equal(~torch.isneginf(got), expected)


@pytest.mark.parametrize("V", [5, 8192, 20_000])
def test_greedy_first_argmax_with_ties(V):
    x = torch.full((2, 3, V), -1.0)
    x[0, 0, [3, 4]] = 5.0
    x[0, 1, [V - 1, 0]] = 2.0
    x[1, 2, V - 1] = 9.0
    x[1, 1, :] = 7.0
    cfg = SamplingConfig.parse("greedy")
    probs = cfg.process(x)
    expected = torch.zeros_like(x)
    expected.view(-1, V).scatter_(1, x.view(-1, V).argmax(-1, keepdim=True), 1.0)
    assert torch.equal(probs, expected)
    assert probs[0, 0, 3] == 1 and probs[0, 1, 0] == 1 and probs[1, 2, V - 1] == 1 and probs[1, 1, 0] == 1
    logits = cfg.process_logits(x)
    assert torch.equal(logits, torch.where(expected > 0, 0.0, NEG_INF))


# --------------------------------------------------------------------------------------------------
# hand-computed examples


def log(*p):
    return torch.tensor(p, dtype=torch.float64).log().float()


def kept(t: torch.Tensor) -> list:
    return (~torch.isneginf(t)).nonzero().flatten().tolist()


def test_temperature_example():
    assert Temperature(0.5)(torch.tensor([1.0, 2.0, -3.0])).tolist() == [2.0, 4.0, -6.0]
    assert Temperature(0.0)(torch.tensor([1.0, 3.0, 3.0])).tolist() == [NEG_INF, 0.0, NEG_INF]
    assert Temperature(1.0)(torch.tensor([1.0, 2.0])).tolist() == [1.0, 2.0]


def test_top_k_examples():
    x = torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0])
    assert kept(TopK(1)(x)) == [1]
    assert kept(TopK(2)(x)) == [1, 2, 3]  # both logits tied with the 2nd largest are kept
    assert kept(TopK(3)(x)) == [1, 2, 3]
    assert kept(TopK(4)(x)) == [0, 1, 2, 3]
    assert kept(TopK(99)(x)) == [0, 1, 2, 3, 4]
    assert TopK(2)(x)[1].item() == 3.0  # kept logits unchanged


def test_top_p_examples():
    x = log(0.5, 0.3, 0.2)
    assert kept(TopP(0.45)(x)) == [0]
    assert kept(TopP(0.55)(x)) == [0, 1]  # mass above token 1 is 0.5 < 0.55
    assert kept(TopP(0.85)(x)) == [0, 1, 2]
    assert kept(TopP(1.0)(x)) == [0, 1, 2]
    # ties at the boundary: mass strictly above each 0.2-token is 0.4 < 0.5, so all are kept
    # (HF keeps the 0.4-token and only one of the 0.2-tokens here)
    assert kept(TopP(0.5)(log(0.2, 0.4, 0.2, 0.2))) == [0, 1, 2, 3]
    assert kept(TopP(0.3)(log(0.2, 0.4, 0.2, 0.2))) == [1]
    # exact boundary: the mass above each 0.25-token is exactly 0.5, which is not < 0.5
    x = torch.tensor([-math.log(2), 0.0, -math.log(2), NEG_INF])
    assert torch.softmax(x, -1).tolist() == [0.25, 0.5, 0.25, 0.0]  # exact in float32
    assert kept(TopP(0.5)(x)) == [1]
    assert kept(TopP(0.5000001)(x)) == [0, 1, 2]
    # a dominant token is always kept, whatever p
    assert kept(TopP(0.01)(log(0.1, 0.9))) == [1]


def test_min_p_examples():
    x = log(0.05, 0.5, 0.3, 0.15)
    assert kept(MinP(0.5)(x)) == [1, 2]  # threshold 0.25
    assert kept(MinP(0.2)(x)) == [1, 2, 3]  # threshold 0.1
    assert kept(MinP(1.0)(x)) == [1]
    assert kept(MinP(1.0)(log(0.4, 0.4, 0.2))) == [0, 1]


def test_eta_examples():
    x = log(0.6, 0.3, 0.1)
    h = -(0.6 * math.log(0.6) + 0.3 * math.log(0.3) + 0.1 * math.log(0.1))
    assert math.sqrt(0.2) * math.exp(-h) == pytest.approx(0.1822, abs=1e-4)
    assert kept(EtaCutoff(0.2)(x)) == [0, 1]  # threshold min(0.2, 0.1822)
    assert kept(EtaCutoff(0.05)(x)) == [0, 1, 2]  # threshold 0.05
    assert kept(EtaCutoff(0.2, delta=0.1)(x)) == [0, 1, 2]  # threshold min(0.2, 0.0407)
    assert kept(EtaCutoff(0.9, delta=10.0)(x)) == [0]  # threshold 0.9 > max p: argmax only


def test_epsilon_examples():
    x = log(0.3, 0.6, 0.1)
    assert kept(EpsilonCutoff(0.2)(x)) == [0, 1]
    assert kept(EpsilonCutoff(0.05)(x)) == [0, 1, 2]
    assert kept(EpsilonCutoff(0.9)(x)) == [1]  # nothing reaches ε: the argmax is kept
    assert kept(EpsilonCutoff(0.9)(log(0.25, 0.25, 0.25, 0.25))) == [0]  # first argmax on ties


def test_pipeline_example():
    # temperature 0.5 squares the probabilities: [0.5,0.3,0.15,0.05] -> ∝ [.25,.09,.0225,.0025]
    x = log(0.5, 0.3, 0.15, 0.05)
    cfg = SamplingConfig(temperature=0.5, top_k=3, top_p=0.9)
    q = np.array([0.25, 0.09, 0.0225])
    q = q / q.sum()  # [0.6812, 0.2452, 0.0613]: mass above the third is 0.926 >= 0.9
    expected = np.array([q[0], q[1], 0, 0]) / (q[0] + q[1])
    np.testing.assert_allclose(cfg.process(x).numpy(), expected, rtol=1e-5)
    assert cfg.process(x)[2:].tolist() == [0.0, 0.0]


# --------------------------------------------------------------------------------------------------
# invariants, dtypes, validation


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes_give_float32(dtype):
    x = torch.randn(2, 50).to(dtype)
    cfg = SamplingConfig(temperature=0.7, top_k=10)
    p = cfg.process(x)
    assert p.dtype == torch.float32
    torch.testing.assert_close(p, cfg.process(x.float()))
    assert cfg.process_logits(x).dtype == torch.float32
    assert SamplingConfig().process_logits(x).dtype == torch.float32


def test_input_not_modified():
    x = torch.randn(3, 9000)
    x0 = x.clone()
    for spec in ["temperature=0.7,top_k=20,top_p=0.8,min_p=0.1", "top_p=0.5", "min_p=0.2", "greedy", "top_k=4000"]:
        SamplingConfig.parse(spec).process(x)
        SamplingConfig.parse(spec).process_logits(x)
    for w in SamplingConfig.parse("temperature=0.7,top_k=20,top_p=0.8,min_p=0.1,eta=0.01,epsilon=0.001").warpers():
        w(x)
    assert torch.equal(x, x0)


@pytest.mark.parametrize("V", [7, 20_000])
@pytest.mark.parametrize("spec", ["", "greedy", "temperature=0.7,top_k=20,top_p=0.8,min_p=0.1", "eta=0.01"])
@pytest.mark.parametrize("bad", ["nan", "posinf", "all_neginf"])
def test_bad_logits_raise(V, spec, bad):
    x = torch.randn(2, 3, V)
    if bad == "nan":
        x[1, 2, V // 2] = float("nan")
        match = "NaN"
    elif bad == "posinf":
        x[0, 1, 0] = float("inf")
        match = r"\+inf"
    else:
        x[1, 0, :] = NEG_INF
        match = "entirely -inf"
    cfg = SamplingConfig.parse(spec)
    with pytest.raises(ValueError, match=match):
        cfg.process(x)
    with pytest.raises(ValueError, match=match):
        cfg.process_logits(x)


@pytest.mark.parametrize(
    "w", [Temperature(0.7), Temperature(0.0), TopK(3), TopP(0.5), MinP(0.1), EtaCutoff(0.01), EpsilonCutoff(0.01)])
def test_warpers_refuse_nan(w):
    with pytest.raises(ValueError, match="NaN"):
        w(torch.tensor([[0.0, float("nan"), 1.0]]))
    assert w.describe() and "\n" not in w.describe()


def test_bad_inputs_shape_and_type():
    cfg = SamplingConfig(top_k=2)
    with pytest.raises(ValueError):
        cfg.process(torch.tensor(1.0))
    with pytest.raises(ValueError):
        cfg.process(torch.zeros(3, 0))
    with pytest.raises(ValueError):
        cfg.process(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(TypeError):
        cfg.process([[0.0, 1.0]])
    assert cfg.process(torch.zeros(0, 5)).shape == (0, 5)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: Temperature(-0.1), "temperature"),
        (lambda: Temperature(float("nan")), "temperature"),
        (lambda: Temperature("0.7"), "temperature"),
        (lambda: TopK(0), "top_k"),
        (lambda: TopK(-3), "top_k"),
        (lambda: TopK(2.5), "top_k"),
        (lambda: TopK(True), "top_k"),
        (lambda: TopP(0.0), "top_p"),
        (lambda: TopP(1.01), "top_p"),
        (lambda: TopP(float("nan")), "top_p"),
        (lambda: MinP(0.0), "min_p"),
        (lambda: MinP(1.5), "min_p"),
        (lambda: EtaCutoff(0.0), "eta"),
        (lambda: EtaCutoff(1.0), "eta"),
        (lambda: EtaCutoff(0.1, delta=0.0), "eta_delta"),
        (lambda: EtaCutoff(0.1, delta=float("inf")), "eta_delta"),
        (lambda: EpsilonCutoff(0.0), "epsilon"),
        (lambda: EpsilonCutoff(1.0), "epsilon"),
        (lambda: SamplingConfig(temperature=-1), "temperature"),
        (lambda: SamplingConfig(temperature=float("inf")), "temperature"),
        (lambda: SamplingConfig(top_k=-1), "top_k"),
        (lambda: SamplingConfig(top_k=2.0), "top_k"),
        (lambda: SamplingConfig(top_p=0.0), "top_p"),
        (lambda: SamplingConfig(top_p=1.5), "top_p"),
        (lambda: SamplingConfig(min_p=-0.1), "min_p"),
        (lambda: SamplingConfig(min_p=1.1), "min_p"),
        (lambda: SamplingConfig(eta=1.0), "eta"),
        (lambda: SamplingConfig(eta=-0.1), "eta"),
        (lambda: SamplingConfig(eta=0.1, eta_delta=-1.0), "eta_delta"),
        (lambda: SamplingConfig(epsilon=1.0), "epsilon"),
        (lambda: SamplingConfig(epsilon=float("nan")), "epsilon"),
    ],
)
def test_invalid_parameters(make, field):
    with pytest.raises(ValueError, match=field):
        make()


# --------------------------------------------------------------------------------------------------
# configuration: parse / spec / warpers / with_truncation


@SETTINGS
@given(cfg=configs())
def test_parse_spec_round_trip(cfg):
    assert SamplingConfig.parse(cfg.spec()) == cfg
    assert SamplingConfig.parse(cfg.spec()).spec() == cfg.spec()


def test_parse_examples():
    c = SamplingConfig.parse("temperature=0.7,top_p=0.8,min_p=0.1")
    assert c == SamplingConfig(temperature=0.7, top_p=0.8, min_p=0.1)
    assert c.spec() == "temperature=0.7,top_p=0.8,min_p=0.1"
    assert SamplingConfig.parse("") == SamplingConfig()
    assert SamplingConfig.parse("  ") == SamplingConfig()
    assert SamplingConfig().spec() == ""
    g = SamplingConfig.parse("greedy")
    assert g.is_greedy and g.spec() == "temperature=0" and SamplingConfig.parse("temperature=0") == g
    assert SamplingConfig.parse("t=0.5") == SamplingConfig(temperature=0.5)
    assert SamplingConfig.parse(" temp = 0.5 , top-k=20 ") == SamplingConfig(temperature=0.5, top_k=20)
    assert SamplingConfig.parse("eta=0.01,eta_delta=none") == SamplingConfig(eta=0.01)
    assert SamplingConfig.parse("min_p=0.1,temperature=0.7").spec() == "temperature=0.7,min_p=0.1"
    assert SamplingConfig.parse("epsilon=3e-4").spec() == "epsilon=0.0003"
    assert SamplingConfig.parse("top_k=20").top_k == 20 and isinstance(SamplingConfig.parse("top_k=20").top_k, int)
    assert not SamplingConfig(temperature=0.7).is_greedy


@pytest.mark.parametrize(
    "text, match",
    [
        ("tempreature=0.7", "valid keys: temperature, top_k, top_p, min_p, eta, eta_delta, epsilon"),
        ("top_p", "malformed"),
        ("top_p=0.8=0.9", "malformed"),
        ("top_p=", "missing value"),
        ("top_k=abc", "top_k"),
        ("top_k=2.5", "top_k"),
        ("top_p=high", "top_p"),
        ("top_p=0.8,top_p=0.9", "more than once"),
        ("greedy,t=0.7", "more than once"),
        ("top_p=1.5", r"top_p must be .*\(0, 1\]"),
        ("temperature=-1", "temperature"),
    ],
)
def test_parse_errors(text, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig.parse(text)


def test_warpers_list_and_describe():
    c = SamplingConfig(temperature=0.7, top_k=20, top_p=0.8, min_p=0.1, eta=0.01, eta_delta=0.5, epsilon=0.001)
    ws = c.warpers()
    assert [type(w) for w in ws] == [Temperature, TopK, TopP, MinP, EtaCutoff, EpsilonCutoff]
    assert ws[4].delta == 0.5 and ws[4].epsilon == 0.01
    assert all(w.describe() and "\n" not in w.describe() for w in ws)
    assert SamplingConfig().warpers() == []
    assert SamplingConfig.parse("greedy,top_k=5,top_p=0.5").warpers() == [Temperature(0.0)]
    assert [type(w) for w in SamplingConfig(top_p=0.9).warpers()] == [TopP]
    ws.clear()
    assert len(c.warpers()) == 6  # a fresh list each time


def test_with_truncation():
    base = SamplingConfig(temperature=0.7, top_p=0.8)
    t = base.with_truncation(min_p=0.1)
    assert t == SamplingConfig(temperature=0.7, top_p=0.8, min_p=0.1)
    t2 = base.with_truncation(eta=0.01, eta_delta=0.2)
    assert (t2.eta, t2.eta_delta, t2.min_p, t2.temperature) == (0.01, 0.2, 0.0, 0.7)
    assert base.with_truncation() == base
    with pytest.raises(ValueError, match="min_p"):
        base.with_truncation(min_p=2.0)


def test_config_is_hashable_and_frozen():
    c = SamplingConfig(temperature=0.7)
    assert hash(c) == hash(SamplingConfig(temperature=0.7))
    c.process(torch.randn(3))  # caches the warpers; must not break equality
    assert c == SamplingConfig(temperature=0.7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.temperature = 1.0  # type: ignore[misc]


# --------------------------------------------------------------------------------------------------
# Hugging Face's own warpers (optional)


def _hf_cases():
    return [
        ("temperature", 0.7),
        ("temperature", 1.9),
        ("top_k", 1),
        ("top_k", 7),
        ("top_k", 100),
        ("top_p", 0.1),
        ("top_p", 0.5),
        ("top_p", 0.9),
        ("min_p", 0.05),
        ("min_p", 0.3),
        ("eta", 0.0009),
        ("eta", 0.05),
        ("epsilon", 0.001),
        ("epsilon", 0.03),
    ]


@pytest.mark.parametrize("name, value", _hf_cases())
def test_matches_hugging_face(name, value):
    lp = pytest.importorskip("transformers.generation.logits_process")
    hf = {
        "temperature": lambda v: lp.TemperatureLogitsWarper(v),
        "top_k": lambda v: lp.TopKLogitsWarper(v),
        "top_p": lambda v: lp.TopPLogitsWarper(v),
        "min_p": lambda v: lp.MinPLogitsWarper(v),
        "eta": lambda v: lp.EtaLogitsWarper(v),
        "epsilon": lambda v: lp.EpsilonLogitsWarper(v),
    }[name](value)
    cfg = SamplingConfig(**{name: value})
    (ours,) = cfg.warpers()
    g = torch.Generator().manual_seed(0)
    for scale, V in [(1.0, 50), (3.0, 1000), (0.3, 257), (2.0, 20_000)]:
        x = torch.randn(8, V, generator=g) * scale
        expected = hf(None, x.clone())
        for got in (ours(x), cfg.process_logits(x)):
            assert torch.equal(torch.isneginf(got), torch.isneginf(expected)), (name, value, V)
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)


def test_matches_hugging_face_chain():
    lp = pytest.importorskip("transformers.generation.logits_process")
    chain = [
        lp.TemperatureLogitsWarper(0.7),
        lp.TopKLogitsWarper(20),
        lp.TopPLogitsWarper(0.8),
        lp.MinPLogitsWarper(0.1),
        lp.EtaLogitsWarper(0.001),
        lp.EpsilonLogitsWarper(0.0005),
    ]
    cfg = SamplingConfig.parse("temperature=0.7,top_k=20,top_p=0.8,min_p=0.1,eta=0.001,epsilon=0.0005")
    x = torch.randn(6, 151_936, generator=torch.Generator().manual_seed(1)) * 3
    expected = x.clone()
    for w in chain:
        expected = w(None, expected)
    got = cfg.process_logits(x)
    assert torch.equal(torch.isneginf(got), torch.isneginf(expected))
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
