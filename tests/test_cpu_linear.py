"""Weight-major linears for few-row model calls on the CPU (verispec.models.cpu_linear)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model
from verispec.models import cpu_linear
from verispec.models.cpu_linear import MAX_ROWS, WeightMajorLinear, choose_linear_layout, resolve_linear_layout


@pytest.mark.parametrize("shape", [(2, 48), (1, 5, 48), (3, 4, 48), (1, MAX_ROWS, 48)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_weight_major_product_equals_linear(shape, with_bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    w = torch.randn(80, 48, generator=gen)
    b = torch.randn(80, generator=gen) if with_bias else None
    mode = WeightMajorLinear()
    with mode:
        got = F.linear(x, w, b)
    assert mode.calls == 1
    assert got.shape == (*shape[:-1], 80) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["one row", "too many rows", "float64", "1-D input"])
def test_other_linears_pass_through_unchanged(case):
    gen = torch.Generator().manual_seed(1)
    x = {"one row": torch.randn(1, 1, 16, generator=gen), "too many rows": torch.randn(MAX_ROWS + 1, 16, generator=gen),
         "float64": torch.randn(4, 16, generator=gen, dtype=torch.float64),
         "1-D input": torch.randn(16, generator=gen)}[case]
    w = torch.randn(24, 16, generator=gen, dtype=x.dtype)
    mode = WeightMajorLinear()
    with mode:
        got = F.linear(x, w)
    assert mode.calls == 0
    assert torch.equal(got, F.linear(x, w))


def _float32_backend(layout: str, arch: str = "qwen2"):
    from verispec.models.hf import HFBackend

    model = tiny_hf_model(arch, vocab_width=128, hidden=32, seed=1, init_range=0.2).to(torch.float32)
    return HFBackend(model, tokenizer=tiny_char_tokenizer(), linear_layout=layout)


def _recording_modes(monkeypatch, module):
    """Replace ``module.linear_mode`` by one that keeps the modes it hands out."""
    made = []

    def recording(layout, rows):
        ctx = cpu_linear.linear_mode(layout, rows)
        made.append(ctx)
        return ctx

    monkeypatch.setattr(module, "linear_mode", recording)
    return made


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_hf_backend_weight_major_block_and_tree_match_standard(monkeypatch, arch):
    """The backend computes its multi-row calls weight-major (every linear of the model, the output layer
    included) and returns the standard layout's logits up to float32 rounding; one-row calls are untouched."""
    from verispec.models import hf

    made = _recording_modes(monkeypatch, hf)
    fast, plain = _float32_backend("weight-major", arch), _float32_backend("standard", arch)
    assert fast.linear_layout == "weight-major" and plain.linear_layout == "standard"
    n_linears = sum(isinstance(m, torch.nn.Linear) for m in fast.model.modules())
    prompt = [5, 9, 14, 3, 22, 7]
    tree = ([8, 12, 30, 4], [-1, 0, 0, 1])   # nodes 1 and 2 under node 0, node 3 under node 1
    for call, expect_rerouted in ((lambda be: be.forward(prompt), True), (lambda be: be.forward([11]), False),
                                  (lambda be: be.forward_tree(*tree), True)):
        got = call(fast)
        mode = made[-1]
        assert isinstance(mode, WeightMajorLinear) == expect_rerouted
        assert not expect_rerouted or mode.calls == n_linears
        torch.testing.assert_close(got, call(plain), rtol=1e-4, atol=1e-5)


def test_hf_batch_backend_uses_the_single_backends_layout(monkeypatch):
    from verispec.models import batch
    from verispec.models.batch import HFBatchBackend

    made = _recording_modes(monkeypatch, batch)
    fast = HFBatchBackend(_float32_backend("weight-major"), batch_size=2)
    plain = HFBatchBackend(_float32_backend("standard"), batch_size=2)
    rows = [[5, 9, 14], [3, 22]]
    torch.testing.assert_close(fast.forward_rows(rows), plain.forward_rows(rows), rtol=1e-4, atol=1e-5)
    assert any(isinstance(m, WeightMajorLinear) and m.calls > 0 for m in made)


def test_auto_layout_follows_the_measured_times(monkeypatch):
    big = torch.nn.Sequential(torch.nn.Linear(2048, 2048, bias=False))   # 4 Mi weights: timed
    times = iter([])

    def fake_best_time(fn, repeats):
        return next(times)

    monkeypatch.setattr(cpu_linear, "_best_time", fake_best_time)
    times = iter([1.0, 0.5])    # standard, then weight-major
    assert choose_linear_layout(big) == "weight-major"
    times = iter([1.0, 0.95])   # under 10% faster: not worth a second code path
    assert choose_linear_layout(big) == "standard"
    assert choose_linear_layout(big.to(torch.float64)) == "standard"               # float32 only
    assert choose_linear_layout(torch.nn.Sequential(torch.nn.Linear(64, 64))) == "standard"   # small: not timed


def test_auto_on_tiny_models_keeps_standard_and_bad_layouts_are_refused():
    assert _float32_backend("auto").linear_layout == "standard"
    with pytest.raises(ValueError, match="linear_layout must be one of auto, standard, weight-major"):
        resolve_linear_layout("fast", torch.nn.Linear(2, 2))


def test_cost_profiles_of_the_two_layouts_are_cached_apart():
    from verispec.engine.calibrate import profile_identity

    fast, plain = _float32_backend("weight-major"), _float32_backend("standard")
    assert profile_identity(fast, None, 2, 8) != profile_identity(plain, None, 2, 8)
    assert "[weight-major]" in profile_identity(fast, None, 2, 8)
