"""Weight-major linears for few-row model calls on the CPU (verispec.models.cpu_linear)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model
from verispec.models import cpu_linear
from verispec.models.cpu_linear import (
    MAX_ROWS,
    WeightMajorLinear,
    choose_linear_layout,
    default_plan,
    describe_plan,
    plan_from_times,
    resolve_linear_layout,
)


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


@pytest.mark.parametrize("rows", [1, 3, 5])
@pytest.mark.parametrize("weight_major", [False, True])
def test_padded_products_equal_linear(rows, weight_major):
    """A row count computed as more rows (zero rows appended, dropped from the output) gives F.linear's rows."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, rows, 48, generator=gen)
    w, b = torch.randn(80, 48, generator=gen), torch.randn(80, generator=gen)
    plan = list(default_plan(8))
    plan[rows - 1] = (rows + 3, weight_major)
    mode = WeightMajorLinear(plan=tuple(plan))
    with mode:
        got = F.linear(x, w, b)
    assert mode.calls == 1
    assert got.shape == (1, rows, 80) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_plan_pads_to_a_faster_row_count_and_keeps_noise_out():
    """The times of that VM's output layer (ms, both products; see the module docstring): 1 row is computed
    as 2 weight-major, 15 rows as 16; a product within the margin of the standard one is not rerouted."""
    standard = [62.0, 138.0, 150.0, 161.0, 150.0, 150.0, 150.0, 146.0, 150.0, 150.0, 160.0, 165.0, 170.0, 172.0,
                174.0, 178.0]
    major = [62.5, 32.0, 60.0, 77.0, 80.0, 85.0, 95.0, 108.0, 120.0, 130.0, 160.0, 200.0, 220.0, 230.0, 243.0,
             152.0]
    plan = plan_from_times(standard, major)
    assert plan[0] == (2, True)                       # one row: two rows weight-major, twice as fast
    assert plan[1] == (2, True) and plan[3] == (4, True)
    assert plan[14] == (16, True) and plan[15] == (16, True)     # 15 rows: 16 weight-major (152 < 174 < 243)
    assert plan[10] == (11, False)                    # 160 vs 160: nothing gained, F.linear as is
    assert plan[11] == (12, False)                    # 16 rows' 152 is not 10% under 12 rows' standard 165
    assert all(m >= n for n, (m, _) in enumerate(plan, 1))
    assert plan_from_times([1.0, 1.0], [0.95, 1.0]) == ((1, False), (2, False))   # 5% faster: noise
    assert describe_plan(plan) == "10 row counts weight-major, padded 1→2w 13→16w 14→16w 15→16w"
    assert describe_plan(None) == "standard"


class _WithOutputLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(2048, 2048, bias=False)   # 4 Mi weights: timed
        self.head = torch.nn.Linear(2048, 64, bias=False)

    def get_output_embeddings(self):
        return self.head


SLOW, FAST = [0.9], [0.2]


@pytest.mark.parametrize("standard_s, major_s, two_rows_s, first", [
    ([1.0], [0.5], [0.1], (2, True)),
    ([1.0], [0.1], [0.5], (1, True)),
    ([0.1], [1.0], [1.0], (1, False)),
    ([0.6], [0.58], [1.0], (1, False)),          # 3% faster: noise, not a reason to reroute every step
    # the two-row product is bimodal on a VM: its typical (median) time decides, not a streak of slow calls ...
    ([0.6], [0.6], SLOW * 3 + FAST * 6, (2, True)),
    # ... nor a few fast ones
    ([0.6], [0.6], FAST * 3 + SLOW * 6, (1, False)),
], ids=["two-rows", "weight-major", "standard", "within-margin", "mostly-faster", "mostly-slower"])
def test_one_row_is_decided_on_the_output_layer_too(monkeypatch, standard_s, major_s, two_rows_s, first):
    """Every decoding step is a one-row call: it is computed standard, weight-major or as two weight-major rows,
    whichever is fastest on the largest linear and the output layer together, by the median of the rounds (here
    the output layer's times decide)."""
    model = _WithOutputLayer()
    rounds = {(1, False): iter(standard_s * 9), (1, True): iter(major_s * 9), (2, True): iter(two_rows_s * 9)}

    def fake_seconds(fn, x, w, m, major):
        return next(rounds[m, major]) if w is model.head.weight and x.shape[0] == 2 else 0.01

    monkeypatch.setattr(cpu_linear, "_seconds", fake_seconds)
    plan = cpu_linear.plan_rows(model, repeats=1)
    assert plan[0] == first and len(plan) == MAX_ROWS and all(m >= n for n, (m, _) in enumerate(plan, 1))


@pytest.mark.parametrize("out_rows", [12, 13])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_the_weight_major_product_in_blocks_per_thread_equals_linear(out_rows, threads, rows):
    """The weight's output rows cut into one block per thread (where they divide evenly; else one product)."""
    gen = torch.Generator().manual_seed(threads * 10 + rows)
    weight, x = torch.randn(out_rows, 7, generator=gen), torch.randn(rows, 7, generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_linear._weight_major_product(x, weight)
    finally:
        torch.set_num_threads(before)
    assert got.shape == (rows, out_rows) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_the_plan_is_measured_once_per_machine_and_model_shape(monkeypatch, tmp_path, caplog):
    """:func:`cached_plan` times a plan once and reads it back; another weight shape, ``refresh`` or a damaged
    file measure it again; untimed (small) models get the default plan and write nothing."""
    measured = []

    def fake_plan(model, repeats=5):
        measured.append(model)
        return ((2, True),) + tuple((n, True) for n in range(2, MAX_ROWS + 1))

    monkeypatch.setattr(cpu_linear, "plan_rows", fake_plan)
    model = _WithOutputLayer()
    first = cpu_linear.cached_plan(model, cache_dir=tmp_path)
    assert first[0] == (2, True) and len(measured) == 1
    assert cpu_linear.cached_plan(model, cache_dir=tmp_path) == first and len(measured) == 1     # read back
    assert cpu_linear.cached_plan(model, cache_dir=tmp_path, refresh=True) == first and len(measured) == 2
    other = _WithOutputLayer()
    other.head = torch.nn.Linear(2048, 96, bias=False)       # another output layer: another key
    cpu_linear.cached_plan(other, cache_dir=tmp_path)
    assert len(measured) == 3 and len(list(tmp_path.glob("*.json"))) == 2
    for path in tmp_path.glob("*.json"):
        path.write_text("{not json")
    with caplog.at_level("WARNING"):
        assert cpu_linear.cached_plan(model, cache_dir=tmp_path) == first
    assert len(measured) == 4 and "unreadable" in caplog.text
    small = tiny_hf_model("qwen2", vocab_width=128, hidden=32, seed=1).to(torch.float32)
    assert cpu_linear.cached_plan(small, cache_dir=tmp_path / "small") == default_plan()
    assert not (tmp_path / "small").exists() and len(measured) == 4


def _float32_backend(layout: str, arch: str = "qwen2"):
    from verispec.models.hf import HFBackend

    model = tiny_hf_model(arch, vocab_width=128, hidden=32, seed=1, init_range=0.2).to(torch.float32)
    return HFBackend(model, tokenizer=tiny_char_tokenizer(), linear_layout=layout)


def _recording_modes(monkeypatch, module):
    """Replace ``module.linear_mode`` by one that keeps the modes it hands out."""
    made = []

    def recording(layout, rows, plan=None):
        ctx = cpu_linear.linear_mode(layout, rows, plan)
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


def test_hf_backend_follows_its_row_plan(monkeypatch):
    """A backend given a plan computes one-token calls as two rows weight-major and three-token calls as four
    standard rows, with the standard layout's logits; copies made for a reduced vocabulary keep the plan."""
    from verispec.models import hf
    from verispec.models.draft_vocab import with_draft_vocab
    from verispec.models.hf import HFBackend

    made = _recording_modes(monkeypatch, hf)
    plan = list(default_plan(8))
    plan[0], plan[2] = (2, True), (4, False)
    model = tiny_hf_model("qwen2", vocab_width=128, hidden=32, seed=1, init_range=0.2).to(torch.float32)
    fast = HFBackend(model, tokenizer=tiny_char_tokenizer(), linear_layout="weight-major", row_plan=tuple(plan))
    plain = _float32_backend("standard")
    assert fast.row_plan == tuple(plan) and plain.row_plan is None
    n_linears = sum(isinstance(m, torch.nn.Linear) for m in fast.model.modules())
    for toks in ([5, 9, 14], [11]):
        got = fast.forward(toks)
        assert isinstance(made[-1], WeightMajorLinear) and made[-1].calls == n_linears
        torch.testing.assert_close(got, plain.forward(toks), rtol=1e-4, atol=1e-5)
    assert with_draft_vocab(fast, list(range(64))).row_plan == fast.row_plan


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
    assert "[weight-major:" in profile_identity(fast, None, 2, 8)
    # the profile prices the plan in use: another plan of the same model, another profile
    padded = _float32_backend("weight-major")
    padded.row_plan = ((2, True),) + padded.row_plan[1:]
    assert profile_identity(padded, None, 2, 8) != profile_identity(fast, None, 2, 8)


def test_calibrate_times_the_row_plan_again_before_the_profile(monkeypatch, capsys):
    """``verispec calibrate`` measures the plan per row count again (a cached plan timed in a slow spell
    would otherwise stay), and then the profile, whose key carries the new plan."""
    import verispec.engine
    import verispec.models
    from verispec.cli import main
    from verispec.engine import CostProfile

    target = _float32_backend("weight-major")
    new_plan = ((1, True),) + default_plan()[1:]
    refreshed, profiled_with = [], []
    monkeypatch.setattr(verispec.models, "load_pair", lambda args: (target, None, 128))
    monkeypatch.setattr(cpu_linear, "cached_plan", lambda model, refresh=False: refreshed.append(
        (model, refresh)) or new_plan)

    def fake_profile(backend, draft, prompt, **kw):
        profiled_with.append(backend.row_plan)
        return CostProfile(draft_token=None, target_block=(0.05, 0.06, 0.07)), True

    monkeypatch.setattr(verispec.engine, "cached_profile", fake_profile)
    assert main(["calibrate", "--draft", "ngram"]) == 0
    assert refreshed == [(target.model, True)] and profiled_with == [new_plan]
    assert "linear products per row count: 64 row counts weight-major" in capsys.readouterr().out
