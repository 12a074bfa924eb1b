"""Rules against their closed forms (statistically) and lossless rules against p (exactly in law)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import ALPHA, binom_pvalue, gof_pvalue, pq_cases, single_position

PER_TOKEN_SPECS = [
    "lossless",
    "greedy",
    "lenience:ell=0.3",
    "lenience:ell=0.8",
    "cos_we:lam=0.3",
    "cos_we:lam=0.8",
    "cos_cd:mu=0.1",
    "cos_cd:mu=0.6",
    "ceiling:kappa=2",
    "ceiling:kappa=1.5,base=we,lam=0.3",
    "ceiling:kappa=3,base=cd,mu=0.5",
    "speccascade:p_base=0.1",
    "speccascade:p_base=0.5",
    "speccascade:p_base=0.9",
    "cascade:rule=chow,alpha=0.5",
    "cascade:rule=diff,alpha=0.2",
    "cascade:rule=opt,alpha=0.5",
    "cascade:rule=token_v1,alpha=0.3",
    "cascade:rule=token_v2,alpha=0.3",
    "cascade:rule=token_v3,alpha=0.6",
    "typical:eps=0.05",
    "typical:eps=0.25",
    "typical:eps=0.2,delta=0.9",
]
CASES = pq_cases()
N_SAMPLES = 40_000



@pytest.mark.parametrize("spec", PER_TOKEN_SPECS)
def test_closed_form_matches_mechanism(spec):
    """The spec's closed form equals eq. (0.1) built from the rule's own (h, r), in every regime."""
    rule = R.get(spec)
    for name, (p, q) in CASES.items():
        closed = rule.induced(p, q)
        mech = rule.induced_mechanism(p, q)
        assert torch.allclose(closed, mech, atol=1e-9), (spec, name, closed, mech)
        assert torch.allclose(closed.sum(), torch.tensor(1.0, dtype=closed.dtype), atol=1e-9)
        assert (closed >= -1e-12).all()
        beta_closed = rule.acceptance_rate(p, q)
        beta_mech = (q * rule.accept_prob_all(p, q)).sum()
        assert abs(beta_closed.item() - beta_mech.item()) < 1e-9, (spec, name)


@pytest.mark.parametrize("spec", PER_TOKEN_SPECS)
def test_sampler_matches_induced_distribution(spec):
    """Empirical emitted law of ``verify`` vs ``induced`` (chi-square) and acceptance vs its rate (binomial)."""
    rule = R.get(spec)
    for i, (name, (p, q)) in enumerate(CASES.items()):
        first, accepted, _ = single_position(rule, p, q, N_SAMPLES, seed=1000 + i)
        counts = np.bincount(first.numpy(), minlength=p.numel())
        pval = gof_pvalue(counts, rule.induced(p, q).numpy())
        assert pval > ALPHA, f"{spec} on {name}: emitted law differs from induced (p={pval:.2e})"
        beta = rule.acceptance_rate(p, q).item()
        pb = binom_pvalue(int(accepted.sum()), N_SAMPLES, beta)
        assert pb > ALPHA, f"{spec} on {name}: acceptance {accepted.float().mean():.4f} vs {beta:.4f}"


@pytest.mark.parametrize("spec", [
    "lenience:ell=0.5", "cos_we:lam=0.4", "speccascade:p_base=0.3", "cascade:rule=chow,alpha=0.6", "typical:eps=0.1",
])
def test_chain_semantics(spec):
    """Position 2 (given position 1 accepted) follows P_R(p2, q2); the bonus (all accepted) follows p3."""
    rule = R.get(spec)
    (p1, q1), (p2, q2), (p3, _) = CASES["dense"], CASES["tail_overshoot"], CASES["peaked"]
    n = 60_000
    gen = torch.Generator().manual_seed(7)
    p = torch.stack([p1, p2, p3]).expand(n, 3, -1).contiguous()
    q = torch.stack([q1, q2]).expand(n, 2, -1).contiguous()
    draft = torch.stack([torch.multinomial(q1, n, True, generator=gen), torch.multinomial(q2, n, True, generator=gen)],
                        1)
    n_acc, nxt = rule.verify(p, q, draft, generator=gen)
    second = torch.where(n_acc >= 2, draft[:, 1], nxt)[n_acc >= 1]
    counts = np.bincount(second.numpy(), minlength=p1.numel())
    assert gof_pvalue(counts, rule.induced(p2, q2).numpy()) > ALPHA
    bonus = nxt[n_acc == 2]
    assert gof_pvalue(np.bincount(bonus.numpy(), minlength=p1.numel()), p3.numpy()) > ALPHA
    # P(n >= 1) = β1 and P(n = 2 | n >= 1) = β2: positions decide independently.
    assert binom_pvalue(int((n_acc >= 1).sum()), n, rule.acceptance_rate(p1, q1).item()) > ALPHA
    assert binom_pvalue(int((n_acc == 2).sum()), int((n_acc >= 1).sum()), rule.acceptance_rate(p2, q2).item()) > ALPHA


# --- acceptance-rate oracle table (spec, independent formulas) ---------------------------------------

def _tv(a, b):
    return (a - b).clamp_min(0).sum().item()


def _min_p_set(p, p_base):
    return p >= p_base * p.max()


ORACLES = {
    "lossless": lambda p, q: 1 - _tv(p, q),
    "lenience:ell=0.3": lambda p, q: torch.minimum(q, p / 0.3).sum().item(),
    "lenience:ell=0.7": lambda p, q: 0.5 + 0.5 / 0.7 - 0.5 * (q - p / 0.7).abs().sum().item(),
    "cos_we:lam=0.3": lambda p, q: 1 - 0.3 * _tv(p, q),
    "speccascade:p_base=0.5": lambda p, q: q[_min_p_set(p, 0.5)].sum().item(),
    "cascade:rule=token_v3,alpha=0.5": lambda p, q: (
        q[_min_p_set(p, 0.5)].sum() + torch.minimum(q, (1 - q[_min_p_set(p, 0.5)].sum()) * p)[~_min_p_set(p, 0.5)].sum()
    ).item(),
    "ceiling:kappa=2": lambda p, q: torch.minimum(q, 2 * p).sum().item(),
}


@pytest.mark.parametrize("spec", list(ORACLES))
def test_acceptance_rate_oracle_table(spec):
    rule = R.get(spec)
    for name, (p, q) in CASES.items():
        assert rule.acceptance_rate(p, q).item() == pytest.approx(ORACLES[spec](p, q), abs=1e-9), name


def test_exact_target_acceptance_is_one_minus_tv():
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


# --- sequence level: exact joint law on a context-dependent toy model ----------------------------------

class ToyModel:
    """Distributions that depend on the whole prefix, tabulated for every prefix up to a length."""

    def __init__(self, v: int, max_len: int, seed: int, conc: float) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.v = v
        self.table: dict[tuple[int, ...], torch.Tensor] = {}
        for length in range(max_len + 1):
            for prefix in itertools.product(range(v), repeat=length):
                g = torch._standard_gamma(torch.full((v,), conc, dtype=torch.float64), generator=gen)
                self.table[prefix] = g / g.sum()

    def dist(self, prefixes: list[tuple[int, ...]]) -> torch.Tensor:
        return torch.stack([self.table[pre] for pre in prefixes])


def _generate_prefix_law(rule, target: ToyModel, draft_model: ToyModel, gamma: int, length: int, n: int, seed: int):
    """Run SD (batched over n independent sequences) until each has ``length`` tokens; count outcomes."""
    gen = torch.Generator().manual_seed(seed)
    done: list[tuple[int, ...]] = []
    seqs: list[tuple[int, ...]] = [()] * n
    while seqs:
        drafts = []
        q_rows = []
        cur = list(seqs)
        for _ in range(gamma):
            qd = draft_model.dist(cur)
            tok = torch.multinomial(qd, 1, generator=gen)[:, 0]
            drafts.append(tok)
            q_rows.append(qd)
            cur = [c + (int(t),) for c, t in zip(cur, tok)]
        draft = torch.stack(drafts, 1)
        q = torch.stack(q_rows, 1)
        p_rows = []
        for k in range(gamma + 1):
            p_rows.append(target.dist([s + tuple(int(t) for t in draft[i, :k]) for i, s in enumerate(seqs)]))
        p = torch.stack(p_rows, 1)
        n_acc, nxt = rule.verify(p, q, draft, generator=gen)
        seqs = [s + tuple(int(t) for t in draft[i, : n_acc[i]]) + (int(nxt[i]),) for i, s in enumerate(seqs)]
        done += [s for s in seqs if len(s) >= length]
        seqs = [s for s in seqs if len(s) < length]
    counts: dict[tuple[int, ...], int] = {}
    for s in done:
        counts[s[:length]] = counts.get(s[:length], 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["lossless", "block", "hsd"])
def test_lossless_rules_reproduce_joint_law(spec):
    v, gamma, length = 3, 3, 3
    target = ToyModel(v, length + gamma, seed=11, conc=0.6)
    draft = ToyModel(v, length + gamma, seed=12, conc=0.6)
    counts = _generate_prefix_law(R.get(spec), target, draft, gamma, length, n=30_000, seed=13)
    outcomes = list(itertools.product(range(v), repeat=length))
    probs = np.array([math.prod(target.table[o[:i]][o[i]].item() for i in range(length)) for o in outcomes])
    observed = np.array([counts.get(o, 0) for o in outcomes])
    assert gof_pvalue(observed, probs) > ALPHA


@pytest.mark.slow
def test_lossy_rule_is_detected_by_the_joint_law_test():
    """The joint-law test has power: lenience 0.3 on the same toy models is rejected."""
    v, gamma, length = 3, 3, 3
    target = ToyModel(v, length + gamma, seed=11, conc=0.6)
    draft = ToyModel(v, length + gamma, seed=12, conc=0.6)
    counts = _generate_prefix_law(R.get("lenience:ell=0.3"), target, draft, gamma, length, n=30_000, seed=13)
    outcomes = list(itertools.product(range(v), repeat=length))
    probs = np.array([math.prod(target.table[o[:i]][o[i]].item() for i in range(length)) for o in outcomes])
    assert gof_pvalue(np.array([counts.get(o, 0) for o in outcomes]), probs) < 1e-6


def _enumerate_blocks(target: ToyModel, draft: ToyModel, gamma: int):
    """Every draft block from the empty prefix with its probability under q, as batched tensors."""
    blocks = list(itertools.product(range(target.v), repeat=gamma))
    weights, ps, qs = [], [], []
    for b in blocks:
        q_rows = [draft.table[b[:k]] for k in range(gamma)]
        weights.append(math.prod(q_rows[k][b[k]].item() for k in range(gamma)))
        qs.append(torch.stack(q_rows))
        ps.append(torch.stack([target.table[b[:k]] for k in range(gamma + 1)]))
    return torch.tensor(blocks), torch.stack(ps), torch.stack(qs), torch.tensor(weights, dtype=torch.float64)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_block_never_accepts_less_than_lossless_in_expectation(seed):
    v, gamma = 4, 3
    target, draft = ToyModel(v, gamma + 1, seed=seed, conc=0.5), ToyModel(v, gamma + 1, seed=100 + seed, conc=0.5)
    blocks, p, q, w = _enumerate_blocks(target, draft, gamma)
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
    target, draft = ToyModel(v, gamma + 1, seed=21, conc=0.5), ToyModel(v, gamma + 1, seed=22, conc=0.5)
    blocks, p, q, _ = _enumerate_blocks(target, draft, gamma)
    reps = 300
    gen = torch.Generator().manual_seed(0)
    n_hsd, _ = R.get("hsd").verify(p.repeat(reps, 1, 1), q.repeat(reps, 1, 1), blocks.repeat(reps, 1), generator=gen)
    expected = R.get("block").expected_accepted(p, q, blocks)
    diff = n_hsd.double().view(reps, -1).mean(0) - expected
    assert diff.abs().mean().item() < 0.06


def test_sequence_level_rules_have_no_per_token_law():
    p, q = CASES["dense"]
    for spec in ["block", "hsd"]:
        rule = R.get(spec)
        with pytest.raises(NotImplementedError, match="sequence-level"):
            rule.induced(p, q)
        assert torch.equal(rule.reference(p), p)


# --- batching, reproducibility, errors ----------------------------------------------------------------

@pytest.mark.parametrize(
    "spec", ["lossless", "block", "hsd", "lenience:ell=0.5", "speccascade:p_base=0.3", "cos_cd:mu=0.2"])
def test_batch_rows_are_independent_and_seeded(spec):
    rule = R.get(spec)
    gen = torch.Generator().manual_seed(0)
    b, g, v = 6, 4, 9
    p = torch.softmax(torch.randn(b, g + 1, v, generator=gen), -1)
    q = torch.softmax(torch.randn(b, g, v, generator=gen), -1)
    draft = torch.randint(0, v, (b, g), generator=gen)
    out1 = rule.verify(p, q, draft, generator=torch.Generator().manual_seed(42))
    out2 = rule.verify(p, q, draft, generator=torch.Generator().manual_seed(42))
    assert torch.equal(out1[0], out2[0]) and torch.equal(out1[1], out2[1])
    # Changing the other rows does not change row 0's outcome under the same randomness.
    p2, q2 = p.clone(), q.clone()
    p2[1:] = torch.softmax(torch.randn(b - 1, g + 1, v, generator=gen), -1)
    q2[1:] = torch.softmax(torch.randn(b - 1, g, v, generator=gen), -1)
    out3 = rule.verify(p2, q2, draft, generator=torch.Generator().manual_seed(42))
    assert out3[0][0] == out1[0][0] and out3[1][0] == out1[1][0]


def test_float32_and_float16_inputs_work():
    rule = R.get("lenience:ell=0.5")
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(2, 3, 50, generator=gen), -1)
    q = torch.softmax(torch.randn(2, 2, 50, generator=gen), -1)
    d = torch.randint(0, 50, (2, 2), generator=gen)
    n, z = rule.verify(p.half(), q.half(), d, generator=gen)
    assert n.dtype == torch.int64 and z.dtype == torch.int64 and (n <= 2).all()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda p, q, d: (p.masked_fill(p > 0.2, float("nan")), q, d), "NaN"),
        (lambda p, q, d: (p, q[..., :-1] / q[..., :-1].sum(-1, keepdim=True), d), "vocabulary size mismatch"),
        (lambda p, q, d: (p[:, :1], q[:, :0], d[:, :0]), "G >= 1"),
        (lambda p, q, d: (p, q, d + 100), "outside the vocabulary"),
        (lambda p, q, d: (p.log(), q, d), "negative|sum to 1"),
        (lambda p, q, d: (p[:, :-1], q, d), "G\\+1"),
        (lambda p, q, d: (p, q, d.float()), "integer"),
    ],
)
def test_bad_inputs_raise_clear_errors(mutate, match):
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 4, 10, generator=gen), -1)
    q = torch.softmax(torch.randn(2, 3, 10, generator=gen), -1)
    d = torch.randint(0, 10, (2, 3), generator=gen)
    p, q, d = mutate(p, q, d)
    for spec in ["lossless", "block", "hsd", "typical:eps=0.1"]:
        with pytest.raises((ValueError, TypeError), match=match):
            R.get(spec).verify(p, q, d)


def test_closed_forms_validate_inputs():
    rule = R.get("lenience:ell=0.5")
    p, q = CASES["dense"]
    with pytest.raises(ValueError, match="vocabulary size mismatch"):
        rule.induced(p, q[:-1] / q[:-1].sum())
    with pytest.raises(ValueError, match="NaN"):
        rule.acceptance_rate(p * float("nan"), q)


def test_registry_errors_and_round_trip():
    for spec in PER_TOKEN_SPECS + ["block", "hsd"]:
        rule = R.get(spec)
        assert R.get(rule.spec()) == rule
        assert isinstance(rule.describe(), str) and rule.describe()
    with pytest.raises(ValueError, match="valid rules: lossless"):
        R.get("nonsense")
    with pytest.raises(ValueError, match="valid parameters: ell"):
        R.get("lenience:lam=0.5")
    with pytest.raises(ValueError, match="0 < ell <= 1"):
        R.get("lenience:ell=1.5")
    with pytest.raises(ValueError, match="missing required"):
        R.get("speccascade")
    with pytest.raises(ValueError, match="base=p takes no"):
        R.get("ceiling:kappa=2,lam=0.3")
    assert R.get("lenience:0.5") == R.get("lenience:ell=0.5")
    assert R.get("lossless").is_lossless and not R.get("lenience:ell=0.5").is_lossless
    assert R.get("lenience:ell=1").is_lossless


# --------------------------------------------------------------------------------------------------
# one parameter grammar and one set definition for rules and the sampling pipeline


@pytest.mark.parametrize("spec", ["typical:eps=1", "typical:eps=0", "typical:eps=1.5", "speccascade:p_base=1.01"])
def test_truncation_parameters_outside_their_baseline_range_are_refused(spec):
    with pytest.raises(ValueError, match="must be a number with"):
        R.get(spec)


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
    # the stated forms are the laws: check each against the rule's own closed form
    p, q = CASES["tail_overshoot"]
    for spec, form in forms.items():
        P = R.get(spec).induced(p, q)
        if form.kind == "target":
            torch.testing.assert_close(P, p)
        elif form.kind == "capped":
            torch.testing.assert_close(P, R.get(f"lenience:ell={form.ell!r}").induced(p, q))
        elif form.kind == "mixture":
            torch.testing.assert_close(P, form.lam * p + (1 - form.lam) * q)
        elif form.kind == "min_p_set":
            torch.testing.assert_close(P, R.get(f"speccascade:p_base={form.p_base!r}").induced(p, q))
    pointwise = [s for s in forms if R.get(s).pointwise_acceptance]
    assert pointwise == ["lossless", "lenience:ell=0.4", "ceiling:kappa=2.5", "cos_we:lam=0.3"]


def test_rules_built_directly_validate_like_specs():
    from verispec.rules.collaborative import CeilingOnEnsemble, CosWE, Lenience
    from verispec.rules.truncation import Cascade, SpecCascade, Typical

    for build, match in [
        (lambda: Lenience(2.0), "ell must be"), (lambda: Lenience("0.5"), "ell must be"),
        (lambda: CosWE(-0.1), "lam must be"),
        (lambda: SpecCascade(1.5), "p_base must be"), (lambda: Typical(1.0), "eps must be"),
        (lambda: Typical(0.1, delta=0.0), "delta must be"), (lambda: Cascade("nope", 0.1), "rule must be one of"),
        (lambda: CeilingOnEnsemble(0.5, "we"), "kappa must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            build()
    assert Lenience(1) == R.get("lenience:ell=1") and Lenience(1).is_lossless


@pytest.mark.parametrize("spec", ["lossless", "lenience:ell=0.5", "speccascade:p_base=0.3", "block", "hsd",
                                  "fly:theta=0.2,window=1", "strict", "sglang:single=0.8,acc=0.6",
                                  "fuzzy:T=0.3", "hsd_mincap:ell=0.8", "mentored:D=0.1"])
def test_per_row_generators_make_a_batched_call_equal_row_by_row_calls(spec):
    """verify with one generator per row draws, for each row, exactly what a call on that row alone
    draws: batching never ties a row's randomness to its neighbours (the batched engine relies on it)."""
    rule = R.get(spec)
    gen = torch.Generator().manual_seed(0)
    b, g, v = 5, 3, 7
    p = torch.softmax(torch.randn(b, g + 1, v, generator=gen, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(b, g, v, generator=gen, dtype=torch.float64) * 2, -1)
    x = torch.multinomial(q.reshape(-1, v), 1, generator=gen).view(b, g)
    for trial in range(20):
        gens = [torch.Generator().manual_seed(100 * trial + i) for i in range(b)]
        n, z = rule.verify(p, q, x, gens)
        for i in range(b):
            n_i, z_i = rule.verify(p[i:i + 1], q[i:i + 1], x[i:i + 1], torch.Generator().manual_seed(100 * trial + i))
            assert (int(n[i]), int(z[i])) == (int(n_i), int(z_i))
    with pytest.raises(ValueError, match="one generator per batch row"):
        rule.verify(p, q, x, gens[:2])


def test_the_map_of_rules_lists_every_registered_rule_with_its_place():
    from verispec.rules.base import TAXONOMY
    from verispec.rules.catalogue import catalogue_text, entries

    rows = {e.name: e for e in entries()}
    assert set(rows) == set(R.names())
    assert all(e.taxonomy in TAXONOMY for e in rows.values())
    assert [TAXONOMY.index(e.taxonomy) for e in entries()] == sorted(TAXONOMY.index(e.taxonomy) for e in entries())
    assert rows["lossless"].lossless == "lossless" and rows["lenience"].lossless == "lossy"
    assert rows["speccascade"].baseline == "target with min_p=0.3" and rows["cos_we"].baseline == "p"
    assert not rows["fly"].per_token and rows["fly"].taxonomy == "other"
    assert rows["truncation"].taxonomy == "truncation set" and rows["mentored"].taxonomy == "collaborative"
    text = catalogue_text()
    for name in R.names():
        assert f"\n  {name}" in text


def test_demo_table_measures_every_demo_rule():
    from verispec.demo import DEMO_RULES, _short, demo_table

    text = demo_table()
    for spec in DEMO_RULES:
        assert _short(R.get(spec).spec()) in text
    line = next(x for x in text.splitlines() if x.startswith("lossless "))
    # lossless: acceptance 1 − TV(p, q), no distortion
    assert line.split()[1:5] == ["0.680", "0.0000", "0.0000", "1.00"]
