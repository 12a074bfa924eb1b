"""Properties of the per-token rule families and of block/HSD: identities between rules, the true baselines,
greedy collapse, block vs token-level acceptance, the shared parameter grammar, the stated forms.

What every registered rule must satisfy (closed form vs mechanism, sampler vs closed form, chain semantics,
acceptance oracles, lossless flags, parameters, specs, verify's API) is in tests/test_rule_registry.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import ALPHA, gof_pvalue, pq_cases, single_position
from verispec.rules.block_law import ToyModel, enumerate_blocks

CASES = pq_cases()


# --- exact-target rules ------------------------------------------------------------------------------

def _tv(a, b):
    return (a - b).clamp_min(0).sum().item()


def test_exact_target_acceptance_is_one_minus_tv():
    """Exact SD against π: acceptance 1 − d(π, q) and law π, with π the rule's own target (``own_target``)."""
    for spec in ["cos_cd:mu=0.3", "ceiling:kappa=2,base=we,lam=0.5", "cascade:rule=diff,alpha=0.1"]:
        rule = R.get(spec)
        for p, q in CASES.values():
            pi = rule.reference(p, q, own_target=True)
            assert rule.acceptance_rate(p, q).item() == pytest.approx(1 - _tv(pi, q), abs=1e-9)
            assert torch.allclose(rule.induced(p, q), pi)


# --- identities from the spec ------------------------------------------------------------------------

@pytest.mark.parametrize("kappa", [1.0, 1.25, 2.0, 5.0])
def test_ceiling_on_p_is_lenience(kappa):
    ceiling, lenience = R.get(f"ceiling:kappa={kappa}"), R.get(f"lenience:ell={1 / kappa}")
    for p, q in CASES.values():
        assert torch.allclose(ceiling.induced(p, q), lenience.induced(p, q), atol=1e-12)
        assert torch.allclose(ceiling.residual(p, q), lenience.residual(p, q), atol=1e-12)
        assert ceiling.acceptance_rate(p, q).item() == pytest.approx(lenience.acceptance_rate(p, q).item(), abs=1e-12)
    # Same randomness, same decisions.
    p, q = CASES["tail_overshoot"]
    a = single_position(ceiling, p, q, 5000, seed=3)
    b = single_position(lenience, p, q, 5000, seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("p_base", [0.0, 0.1, 0.3, 0.5, 0.9, 1.0])
def test_speccascade_equals_token_v3_in_law(p_base):
    sc, v3 = R.get(f"speccascade:p_base={p_base}"), R.get(f"cascade:rule=token_v3,alpha={1 - p_base}")
    for p, q in CASES.values():
        assert torch.allclose(sc.induced(p, q), v3.induced(p, q), atol=1e-12)
        assert torch.allclose(sc.reference(p), v3.reference(p), atol=1e-12)
        # SpecCascade accepts less often than the original algorithm with the same law.
        assert sc.acceptance_rate(p, q).item() <= v3.acceptance_rate(p, q).item() + 1e-12


def test_cos_we_residual_is_lossless_residual():
    we, ll = R.get("cos_we:lam=0.35"), R.get("lossless")
    for p, q in CASES.values():
        pi = 0.35 * p + 0.65 * q
        direct = (pi - q).clamp_min(0)
        if direct.sum() > 0:
            assert torch.allclose(we.residual(p, q), direct / direct.sum(), atol=1e-12)
        assert torch.allclose(we.residual(p, q), ll.residual(p, q), atol=1e-12)


def test_lenience_closed_form_properties():
    """Eq. (2.3): P_R <= p/ℓ (bounded ratio), ℓ = 1 is lossless, overshoot tokens capped at p/ℓ."""
    for ell in [0.2, 0.5, 0.9]:
        rule = R.get(f"lenience:ell={ell}")
        for p, q in CASES.values():
            out = rule.induced(p, q)
            assert (out <= p / ell + 1e-12).all()
            severe = q >= p / ell
            assert torch.allclose(out[severe], (p / ell)[severe])
    for p, q in CASES.values():
        assert torch.allclose(R.get("lenience:ell=1").induced(p, q), p, atol=1e-12)


def test_cos_we_has_no_ceiling():
    p, q = CASES["tail_overshoot"]
    out = R.get("cos_we:lam=0.5").induced(p, q)
    assert (out / p).max() > 10  # λ + (1−λ) q/p grows without bound as p → 0


def test_truncation_reference_is_truncated_target():
    p, q = CASES["peaked"]
    rule = R.get("speccascade:p_base=0.3")
    ref = rule.reference(p)
    keep = p >= 0.3 * p.max()
    assert torch.allclose(ref, torch.where(keep, p, 0) / p[keep].sum())
    typ = R.get("typical:eps=0.2")
    h = -(p[p > 0] * p[p > 0].log()).sum()
    theta = min(0.2, math.sqrt(0.2) * math.exp(-h.item()))
    keep = (p >= theta) | (p == p.max())
    assert torch.allclose(typ.reference(p), torch.where(keep, p, 0) / p[keep].sum())
    assert typ.baseline_truncation() == {"eta": 0.2}
    assert R.get("typical:eps=0.2,delta=0.5").baseline_truncation() == {"eta": 0.2, "eta_delta": 0.5}
    assert rule.baseline_truncation() == {"min_p": 0.3}
    assert R.get("lenience:ell=0.5").baseline_truncation() == {}


# --- greedy collapse -------------------------------------------------------------------------------

COLLAPSING = ["lossless", "greedy", "block", "hsd", "lenience:ell=0.3", "ceiling:kappa=4", "speccascade:p_base=0.2",
              "typical:eps=0.1"]


@pytest.mark.parametrize("spec", COLLAPSING)
def test_greedy_collapses_to_exact_match(spec):
    """With one-hot p and q (temperature 0) these rules accept iff draft == argmax p and correct to it."""
    rule = R.get(spec)
    v, gamma = 6, 4
    gen = torch.Generator().manual_seed(5)
    for trial in range(40):
        targets = torch.randint(0, v, (gamma + 1,), generator=gen)
        draft = torch.where(torch.rand(gamma, generator=gen) < 0.7, targets[:gamma],
                            torch.randint(0, v, (gamma,), generator=gen))
        p = torch.nn.functional.one_hot(targets, v).double()[None]
        q = torch.nn.functional.one_hot(draft, v).double()[None]
        n, z = rule.verify(p, q, draft[None], generator=gen)
        expect_n = int((draft == targets[:gamma]).long().cumprod(0).sum())
        assert n.item() == expect_n, (spec, trial)
        assert z.item() == targets[expect_n].item(), (spec, trial)


# --- block verification and HSD on every draft block of a context-dependent toy pair --------------------

@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_block_never_accepts_less_than_lossless_in_expectation(seed):
    v, gamma = 4, 3
    target, draft = ToyModel(v, seed, conc=0.5), ToyModel(v, 100 + seed, conc=0.5)
    blocks, p, q, w = enumerate_blocks(target, draft, (), gamma, v)
    block = R.get("block")
    e_block = (block.expected_accepted(p, q, blocks) * w).sum().item()
    ratios = (p[:, :gamma].gather(-1, blocks[..., None])[..., 0] / q.gather(-1, blocks[..., None])[..., 0]).clamp(max=1)
    e_token = (ratios.cumprod(-1).sum(-1) * w).sum().item()
    assert e_block >= e_token - 1e-12
    # The exact expectation is what the sampler realises.
    reps = 400
    gen = torch.Generator().manual_seed(seed)
    n_acc, _ = block.verify(p.repeat(reps, 1, 1), q.repeat(reps, 1, 1), blocks.repeat(reps, 1), generator=gen)
    empirical = (n_acc.double().view(reps, -1).mean(0) * w).sum().item()
    per_block_var = (gamma**2) / 4
    assert abs(empirical - e_block) < 5 * math.sqrt(per_block_var / reps)


def test_hsd_and_block_have_the_same_acceptance_law():
    v, gamma = 4, 3
    target, draft = ToyModel(v, 21, conc=0.5), ToyModel(v, 22, conc=0.5)
    blocks, p, q, _ = enumerate_blocks(target, draft, (), gamma, v)
    reps = 300
    gen = torch.Generator().manual_seed(0)
    n_hsd, _ = R.get("hsd").verify(p.repeat(reps, 1, 1), q.repeat(reps, 1, 1), blocks.repeat(reps, 1), generator=gen)
    expected = R.get("block").expected_accepted(p, q, blocks)
    diff = n_hsd.double().view(reps, -1).mean(0) - expected
    assert diff.abs().mean().item() < 0.06


# --------------------------------------------------------------------------------------------------
# one parameter grammar and one set definition for rules and the sampling pipeline


@pytest.mark.parametrize("spec", [
    "typical:eps=1e-9", "typical:eps=0.999999", "typical:eps=0.5,delta=40", "speccascade:p_base=0",
    "speccascade:p_base=1",
    "cascade:rule=token_v3,alpha=0", "cascade:rule=token_v3,alpha=1",
])
def test_every_accepted_truncation_rule_has_a_valid_baseline(spec):
    """A rule the registry accepts can always be benchmarked beside its true baseline."""
    from verispec.sampling import SamplingConfig

    rule = R.get(spec)
    base = SamplingConfig.parse("temperature=0.7,top_k=20").with_truncation(**rule.baseline_truncation())
    assert SamplingConfig.parse(base.spec()) == base


def test_rule_and_sampling_errors_share_one_grammar():
    from verispec.sampling import SamplingConfig

    for parse, text, match in [
        (R.get, "lenience:ell=0.5,ell=0.4", "'ell' given more than once"),
        (SamplingConfig.parse, "top_p=0.8,p=0.9", "'top_p' given more than once"),
        (R.get, "lenience:ell=", "missing value for ell"),
        (SamplingConfig.parse, "top_p=", "missing value for top_p"),
        (R.get, "lenience:ell=0.5=1", "malformed setting"),
        (SamplingConfig.parse, "top_p=0.5=1", "malformed setting"),
        (R.get, "lenience:ell=abc", "lenience: ell must be a number with 0 < ell <= 1, got 'abc'"),
        (SamplingConfig.parse, "top_p=abc", r"sampling: top_p must be a finite number in \(0, 1\]"),
        (R.get, "lenience:ell=nan", "ell must be"),
        (SamplingConfig.parse, "eta=inf", "eta must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse(text)
    # keys are case-insensitive and '-' may replace '_' on both sides
    assert R.get("ceiling:KAPPA=2,Base=we") == R.get("ceiling:kappa=2,base=we")
    assert SamplingConfig.parse("Top-P=0.5") == SamplingConfig(top_p=0.5)


def test_typical_sampler_and_law_agree_on_tied_maxima_above_the_threshold():
    """δ > 1 can put the η threshold above max p; the η set then keeps only the first argmax
    (verispec.sets.eta_mask, as the η warper does), and the sampler must accept exactly that set."""
    rule = R.get("typical:eps=0.9,delta=5")
    p = torch.tensor([0.05, 0.3, 0.3, 0.2, 0.15], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.5, 0.1, 0.1], dtype=torch.float64)
    from verispec import sets

    assert sets.eta_threshold(p, 0.9, 5.0).item() > p.max().item()
    assert rule.accept_prob_all(p, q).tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]   # token 2 ties token 1 but is out
    n = 40_000
    gen = torch.Generator().manual_seed(11)
    draft = torch.multinomial(q, n, replacement=True, generator=gen)[:, None]
    n_acc, z = rule.verify(p.expand(n, 2, 5), q.expand(n, 1, 5), draft, generator=gen)
    emitted = torch.where(n_acc == 1, draft[:, 0], z)
    counts = np.bincount(emitted.numpy(), minlength=5)
    assert gof_pvalue(counts, rule.induced(p, q).numpy()) > ALPHA
    # the rejected tied token (q = 0.5) is emitted only through the rejection draw from p
    assert abs(counts[2] / n - (1 - 0.2) * 0.3) < 0.02


def test_each_rule_states_the_form_of_its_law():
    """The form each rule states (the bounds on compressed records dispatch on it) and which are pointwise."""
    forms = {spec: R.get(spec).induced_form() for spec in [
        "lossless", "greedy", "lenience:ell=0.4", "ceiling:kappa=2.5", "cos_we:lam=0.3", "speccascade:p_base=0",
        "speccascade:p_base=0.3", "typical:eps=0.2", "cascade:rule=token_v3,alpha=0.7", "cascade:rule=token_v3,alpha=1",
        "cascade:rule=chow,alpha=0.5", "cos_cd:mu=0.2", "ceiling:kappa=2,base=we,lam=0.5"]}
    assert forms["lossless"].kind == "target" and forms["greedy"].kind == "argmax"
    assert (forms["lenience:ell=0.4"].kind, forms["lenience:ell=0.4"].ell) == ("capped", 0.4)
    assert (forms["ceiling:kappa=2.5"].kind, forms["ceiling:kappa=2.5"].ell) == ("capped", 0.4)
    assert (forms["cos_we:lam=0.3"].kind, forms["cos_we:lam=0.3"].lam) == ("mixture", 0.3)
    assert forms["speccascade:p_base=0"] == forms["cascade:rule=token_v3,alpha=1"] == R.InducedForm("mixture", lam=0.0)
    assert forms["speccascade:p_base=0.3"] == R.InducedForm("min_p_set", p_base=0.3)
    assert forms["typical:eps=0.2"] == R.InducedForm("eta_set", eps=0.2, delta=math.sqrt(0.2))
    token_v3 = forms["cascade:rule=token_v3,alpha=0.7"]
    assert token_v3.kind == "min_p_set" and token_v3.p_base == pytest.approx(0.3)
    assert not token_v3.acceptance_is_set_mass
    for spec in ("cascade:rule=chow,alpha=0.5", "cos_cd:mu=0.2", "ceiling:kappa=2,base=we,lam=0.5"):
        assert forms[spec].kind == "other"
    # that each stated form is the law: tests/test_rule_registry.py::test_lossless_flag_and_stated_form_are_the_law
    pointwise = [s for s in forms if R.get(s).pointwise_acceptance]
    assert pointwise == ["lossless", "lenience:ell=0.4", "ceiling:kappa=2.5", "cos_we:lam=0.3"]


def test_demo_table_measures_every_demo_rule():
    from verispec.demo import DEMO_RULES, _short, demo_table

    text = demo_table()
    for spec in DEMO_RULES:
        assert _short(R.get(spec).spec()) in text
    line = next(x for x in text.splitlines() if x.startswith("lossless "))
    # lossless: acceptance 1 − TV(p, q), no distortion
    assert line.split()[1:5] == ["0.680", "0.0000", "0.0000", "1.00"]
