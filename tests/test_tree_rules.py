"""Tree (multi-draft) verification: sampler against the closed forms, lossless schemes against p, chains
against ``rule.verify`` bit for bit, greedy trees, input errors and batching with padding.

Every statistical test runs with fixed seeds at level ``ALPHA`` (tests/helpers/rule_cases.py); the
power checks show that the same statistic on the same counts rejects a deliberately wrong law.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import ALPHA, gof_pvalue, pq_cases
from tests.helpers.toy_tree import ToyLM, simulate_tree_sd, target_joint
from verispec.rules.tree import PAD_PARENT, DraftTree, verify_tree
from verispec.rules.tree_law import sampled_node_law, tree_node_law, tree_path_law

CASES = pq_cases()
V = 7
N_SAMPLES = 20_000
#: A wrong law at least this far (TV) from the true one must be rejected by the power checks.
POWER_TV = 0.05
#: p-value below which a power check counts as a rejection.
POWER_ALPHA = 1e-6

TREE_SPECS = [
    "lossless", "greedy", "lenience:ell=0.3", "lenience:ell=0.8", "ceiling:kappa=2", "cos_we:lam=1",
    "speccascade:p_base=0.1", "speccascade:p_base=0.5", "speccascade:p_base=0.9",
    "typical:eps=0.05", "typical:eps=0.25", "typical:eps=0.2,delta=0.9",
]
LOSSY_TREE_SPECS = [s for s in TREE_SPECS if not R.get(s).is_lossless]


def _candidate_lists(p: torch.Tensor, q: torch.Tensor) -> dict[str, list[int]]:
    """Deterministic candidate lists at one node: draft top-3, worst-first, a duplicate, a single one."""
    top = q.argsort(descending=True).tolist()
    worst = p.argsort().tolist()
    return {
        "top3": top[:3],
        "worst_first": [worst[0], worst[-1], worst[1]],
        "duplicate": [top[0], top[0], top[1], -1],
        "single": top[:1],
    }


def _depth1(cands: list[int], n: int, scheme: str = "deterministic") -> DraftTree:
    real = [c for c in cands if c >= 0]
    tokens = torch.tensor(real + [0] * (len(cands) - len(real))).expand(n, len(cands)).contiguous()
    parents = torch.tensor([-1] * len(real) + [PAD_PARENT] * (len(cands) - len(real))).expand(n, len(cands))
    return DraftTree(tokens, parents.contiguous(), scheme)


def _node_outcomes(path: torch.Tensor, nxt: torch.Tensor, m: int, vocab: int) -> np.ndarray:
    """Counts over the joint outcome: child k accepted (cells 0..m-1) or correction z (cells m + z)."""
    cell = torch.where(path[:, 0] >= 0, path[:, 0], m + nxt)
    return np.bincount(cell.numpy(), minlength=m + vocab)


def _outcome_law(law: torch.Tensor, accept: torch.Tensor, cands: list[int]) -> np.ndarray:
    correction = law.clone()
    for k, c in enumerate(cands):
        if c >= 0:
            correction[c] -= accept[k]
    real = accept[[k for k, c in enumerate(cands) if c >= 0]]
    return torch.cat([real, correction.clamp_min(0)]).numpy()


def _tv(a, b) -> float:
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


# --- 1. per node: sampler vs closed form (deterministic candidates) --------------------------------------

#: The (p, q) regimes of the sampler checks (the exact checks below use every case).
SAMPLER_CASES = ["dense", "peaked", "sparse", "disjoint", "one_hot_p", "tail_overshoot"]


@pytest.mark.parametrize("spec", TREE_SPECS)
def test_deterministic_node_sampler_matches_closed_form(spec):
    """Joint outcome (which child, or which correction) of a depth-1 tree vs tree_node_law; power:
    the same counts reject the law of the reversed candidate order and, for lossy rules, p. The four
    candidate lists of a case run as one padded batch (rows cycle through the lists)."""
    rule = R.get(spec)
    powered = 0
    for i, case in enumerate(SAMPLER_CASES):
        p, q = CASES[case]
        lists = _candidate_lists(p, q)
        real = [[c for c in cands if c >= 0] for cands in lists.values()]
        tree = DraftTree.from_rows(real, [[-1] * len(r) for r in real], "deterministic")
        tree = DraftTree(tree.tokens.repeat(N_SAMPLES, 1), tree.parents.repeat(N_SAMPLES, 1), tree.scheme)
        gen = torch.Generator().manual_seed(1000 + i)
        path, n_acc, nxt = verify_tree(rule, p.expand(tree.batch_size, tree.width + 1, V), None, tree, gen)
        assert torch.equal(n_acc, (path[:, 0] >= 0).long())
        for j, (name, cands) in enumerate(lists.items()):
            m = len(real[j])
            rows = slice(j, None, len(lists))
            counts = _node_outcomes(path[rows], nxt[rows], m, V)
            law, accept = tree_node_law(rule, p, torch.tensor(cands))
            expected = _outcome_law(law, accept, cands)
            assert abs(expected.sum() - 1) < 1e-9
            pval = gof_pvalue(counts, expected)
            assert pval > ALPHA, f"{spec} on {case}/{name}: sampler differs from tree_node_law (p={pval:.2e})"
            # power: a wrong order of the siblings, and p for a lossy rule
            law_r, acc_r = tree_node_law(rule, p, torch.tensor(real[j][::-1]))
            wrong = _outcome_law(law_r, acc_r.flip(0), real[j])
            if _tv(expected, wrong) >= POWER_TV:
                assert gof_pvalue(counts, wrong) < POWER_ALPHA, (spec, case, name)
                powered += 1
            if not rule.is_lossless and _tv(law, p) >= POWER_TV:
                emitted = counts[m:].copy()
                for k, c in enumerate(real[j]):
                    emitted[c] += counts[k]
                assert gof_pvalue(emitted, p.numpy()) < POWER_ALPHA, (spec, case, name)
                assert gof_pvalue(emitted, law.numpy()) > ALPHA
                powered += 1
    assert powered >= 2, f"{spec}: the power checks never applied"


def _spec_accept(spec: str):
    """The §4 acceptance of a point-mass candidate, written from the spec (numpy, independent code)."""
    name, _, arg = spec.partition(":")
    kv = dict(a.split("=") for a in arg.split(",")) if arg else {}
    if name in ("lossless", "cos_we"):
        return lambda g, c: g[c]
    if name == "greedy":
        return lambda g, c: float(c == int(np.argmax(g)))
    if name == "lenience":
        return lambda g, c: min(1.0, g[c] / float(kv["ell"]))
    if name == "ceiling":
        return lambda g, c: min(1.0, float(kv["kappa"]) * g[c])
    if name == "speccascade":
        return lambda g, c: float(g[c] >= float(kv["p_base"]) * g.max())

    eps = float(kv["eps"])
    delta = float(kv.get("delta", math.sqrt(eps)))

    def typical(g, c):
        ent = -sum(x * math.log(x) for x in g if x > 0)
        return float(g[c] >= min(eps, delta * math.exp(-ent)) or c == int(np.argmax(g)))
    return typical


@pytest.mark.parametrize("spec", TREE_SPECS)
def test_deterministic_node_law_follows_the_spec_pseudocode(spec):
    """tree_node_law equals a direct transcription of spec §4 (accept, zero-and-renormalise, sample g)."""
    rule, accept_fn = R.get(spec), _spec_accept(spec)
    for p, q in CASES.values():
        for cands in _candidate_lists(p, q).values():
            g, pn = p.numpy().copy(), p.numpy()
            law, survive, accepts, seen = np.zeros(V), 1.0, [], set()
            for c in cands:
                if c < 0 or c in seen:
                    accepts.append(0.0)
                    continue
                seen.add(c)
                a = accept_fn(g, c)
                accepts.append(survive * a)
                law[c] += survive * a
                survive *= 1 - a
                g = g.copy()
                g[c] = 0.0
                g = g / g.sum() if g.sum() > 1e-12 else pn.copy()
            final = np.eye(V)[int(np.argmax(g))] if spec == "greedy" else g
            law += survive * final
            got_law, got_acc = tree_node_law(rule, p, torch.tensor(cands))
            np.testing.assert_allclose(got_law.numpy(), law, atol=1e-12)
            np.testing.assert_allclose(got_acc.numpy(), accepts, atol=1e-12)


def test_min_p_tree_emits_the_first_allowed_candidate():
    """Spec §4: with min-p, the node emits the first candidate in A surely; lenience accepts g(c) >= ℓ surely."""
    p, q = CASES["tail_overshoot"]
    cands = [5, 4, 1, 0]                                # tail first: 1 is the first allowed one at p_base 0.3
    law, accept = tree_node_law(R.get("speccascade:p_base=0.3"), p, torch.tensor(cands))
    assert accept.tolist() == [0.0, 0.0, 1.0, 0.0] and law[1] == 1.0
    law, accept = tree_node_law(R.get("lenience:ell=0.5"), p, torch.tensor([0, 1]))
    assert accept.tolist() == [1.0, 0.0]               # p(0) = 0.6 >= ℓ


def test_deterministic_lossless_and_greedy_laws_are_their_references():
    for p, q in CASES.values():
        for cands in _candidate_lists(p, q).values():
            law, _ = tree_node_law(R.get("lossless"), p, torch.tensor(cands))
            torch.testing.assert_close(law, p, atol=1e-12, rtol=0)
            law, _ = tree_node_law(R.get("greedy"), p, torch.tensor(cands))
            torch.testing.assert_close(law, R.get("greedy").reference(p))


@pytest.mark.parametrize("spec", ["cos_we:lam=1", "cos_cd:mu=0", "ceiling:kappa=1", "sglang:single=1,acc=1",
                                  "strict", "lenience:ell=1"])
def test_lossless_settings_allowed_on_deterministic_trees_emit_p(spec):
    """Lossless settings that accept a point-mass candidate c with g(c) keep the law p on deterministic trees."""
    from verispec.rules.tree import check_tree_rule

    check_tree_rule(R.get(spec), "deterministic", max_branching=3)
    for p, q in CASES.values():
        for cands in _candidate_lists(p, q).values():
            law, _ = tree_node_law(R.get(spec), p, torch.tensor(cands))
            torch.testing.assert_close(law, p, atol=1e-12, rtol=0)


@pytest.mark.parametrize("spec", ["fuzzy:T=0", "kl_judge:tau=0,reject=p"])
def test_lossless_settings_that_reject_point_masses_are_refused_on_deterministic_trees(spec):
    """A divergence gate at 0 never passes a point mass (D(g, δ_c) > 0): its deterministic-tree law
    is not p, so it is refused there (and allowed on sampled trees, where it is lossless)."""
    from verispec.rules.tree import check_tree_rule

    rule = R.get(spec)
    assert rule.is_lossless
    g = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    point_mass = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    assert float(rule.accept_prob_at(g, point_mass, torch.tensor([0]))[0]) == 0.0   # why it is refused
    with pytest.raises(ValueError, match="no deterministic-tree form"):
        check_tree_rule(rule, "deterministic", max_branching=2)
    check_tree_rule(rule, "iid", max_branching=2)


# --- 2. lossless sampled schemes --------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_lossless_sampled_schemes_emit_p(scheme):
    """Children drawn from q (with / without replacement), verified by the scheme: the emitted law is p,
    exactly (enumeration over candidate tuples) and empirically; power: drawing the children the other
    way while declaring this scheme is rejected."""
    rule, m, n = R.get("lossless"), 3, N_SAMPLES
    other = "without_replacement" if scheme == "iid" else "iid"
    powered = 0
    for i, (case, (p, q)) in enumerate(CASES.items()):
        if (q > 0).sum() < m and scheme == "without_replacement":
            with pytest.raises(ValueError, match="cannot be drawn without replacement"):
                sampled_node_law(rule, p, q, m, scheme)
            continue
        law, accept = sampled_node_law(rule, p, q, m, scheme)
        torch.testing.assert_close(law, p, atol=1e-12, rtol=0)
        assert accept.sum() <= 1 + 1e-12
        gen = torch.Generator().manual_seed(500 + i)
        cands = torch.multinomial(q.expand(n, V), m, replacement=scheme == "iid", generator=gen)
        tree = DraftTree(cands, torch.full((n, m), -1), scheme)
        big_q = q.expand(n, m + 1, V)
        path, _, nxt = verify_tree(rule, p.expand(n, m + 1, V), big_q, tree, gen)
        emitted = torch.where(path[:, 0] >= 0, cands.gather(1, path[:, :1].clamp_min(0))[:, 0], nxt)
        counts = np.bincount(emitted.numpy(), minlength=V)
        assert gof_pvalue(counts, p.numpy()) > ALPHA, (scheme, case)
        first = np.bincount(path[:, 0].clamp_min(-1).numpy() + 1, minlength=m + 1)[1:]
        assert gof_pvalue(np.append(first, n - first.sum()), np.append(accept.numpy(), 1 - accept.sum().item())) > ALPHA
        # power: children drawn the other way, verified as `scheme`
        if (q > 0).sum() < m:
            continue
        wrong_cands = torch.multinomial(q.expand(n, V), m, replacement=other == "iid", generator=gen)
        if scheme == "without_replacement":
            keep = (wrong_cands[:, :, None] != wrong_cands[:, None, :]).sum((1, 2)) == m * m - m
            wrong_cands = wrong_cands[keep]                # duplicates cannot be declared without replacement
        k = wrong_cands.shape[0]
        wrong_tree = DraftTree(wrong_cands, torch.full((k, m), -1), scheme)
        path, _, nxt = verify_tree(rule, p.expand(k, m + 1, V), q.expand(k, m + 1, V), wrong_tree, gen)
        emitted = torch.where(path[:, 0] >= 0, wrong_cands.gather(1, path[:, :1].clamp_min(0))[:, 0], nxt)
        wrong_counts = np.bincount(emitted.numpy(), minlength=V)
        if _tv(wrong_counts / k, p.numpy()) >= POWER_TV:
            assert gof_pvalue(wrong_counts, p.numpy()) < POWER_ALPHA, (scheme, case)
            powered += 1
    assert powered >= 1, f"{scheme}: the power check never applied"


@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_sampled_node_sampler_matches_conditional_closed_form(scheme):
    """Given the drawn candidates, the sampled-scheme node follows tree_node_law (conditional law)."""
    rule, n = R.get("lossless"), N_SAMPLES
    for i, case in enumerate(["dense", "peaked", "tail_overshoot"]):
        p, q = CASES[case]
        cands = q.argsort(descending=True)[:3].tolist()[::-1]     # unlikely drafts first
        tree = _depth1(cands, n, scheme)
        path, _, nxt = verify_tree(rule, p.expand(n, 4, V), q.expand(n, 4, V), tree,
                                   torch.Generator().manual_seed(77 + i))
        law, accept = tree_node_law(rule, p, torch.tensor(cands), q, scheme)
        assert gof_pvalue(_node_outcomes(path, nxt, 3, V), _outcome_law(law, accept, cands)) > ALPHA, (scheme, case)


def test_greedy_on_sampled_trees_emits_the_argmax():
    p, q = CASES["dense"]
    for scheme in ("iid", "without_replacement"):
        law, _ = sampled_node_law(R.get("greedy"), p, q, 3, scheme)
        torch.testing.assert_close(law, R.get("greedy").reference(p), atol=1e-12, rtol=0)


# --- 3. sequence level: exact joint law on a context-dependent toy pair -------------------------------------

LENGTH = 3


@pytest.fixture(scope="module")
def toy_pair():
    depth = 3
    target = ToyLM(4, LENGTH - 1 + depth, seed=1)
    draft = ToyLM(4, LENGTH - 1 + depth, seed=2, mix_seed=1, mix=0.8)
    return target, draft, target_joint(target, LENGTH).numpy()


@pytest.mark.parametrize("scheme, branching, depth", [
    ("iid", 2, 3), ("without_replacement", 3, 2), ("deterministic", 2, 3), ("deterministic", 3, 2),
])
def test_lossless_tree_sd_reproduces_the_target_joint(toy_pair, scheme, branching, depth):
    target, draft, joint = toy_pair
    counts, mean_acc = simulate_tree_sd(R.get("lossless"), target, draft, scheme, branching, depth, LENGTH,
                                        n_runs=60_000, seed=31)
    assert mean_acc > 0.8, "the toy pair should accept deep paths"
    assert gof_pvalue(counts.numpy(), joint) > ALPHA


@pytest.mark.parametrize("spec, scheme, propose", [
    ("lenience:ell=0.5", "deterministic", None),
    ("lossless", "iid", "without_replacement"),     # children drawn without replacement, verified as iid
])
def test_joint_law_test_has_power(toy_pair, spec, scheme, propose):
    target, draft, joint = toy_pair
    counts, _ = simulate_tree_sd(R.get(spec), target, draft, scheme, 2, 3, LENGTH, n_runs=60_000, seed=31,
                                 propose=propose)
    assert gof_pvalue(counts.numpy(), joint) < POWER_ALPHA


# --- 4. chains: bit-identical to rule.verify ---------------------------------------------------------------

CHAIN_SPECS = ["lossless", "greedy", "lenience:ell=0.5", "speccascade:p_base=0.3", "typical:eps=0.1",
               "cos_cd:mu=0.2", "cascade:rule=chow,alpha=0.5", "block", "hsd"]


@pytest.mark.parametrize("spec", CHAIN_SPECS)
@pytest.mark.parametrize("scheme", ["iid", "without_replacement"])
def test_sampled_chain_is_bit_identical_to_rule_verify(spec, scheme):
    rule = R.get(spec)
    gen = torch.Generator().manual_seed(3)
    b, g = 64, 4
    p = torch.softmax(2 * torch.randn(b, g + 1, 9, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(b, g + 1, 9, generator=gen, dtype=torch.float64), -1)
    draft = torch.multinomial(q[:, :g].reshape(-1, 9), 1, generator=gen).view(b, g)
    path, n_acc, nxt = verify_tree(rule, p, q, DraftTree.chain(draft, scheme), torch.Generator().manual_seed(9))
    n_ref, z_ref = rule.verify(p, q[:, :g], draft, torch.Generator().manual_seed(9))
    assert torch.equal(n_acc, n_ref) and torch.equal(nxt, z_ref)
    steps = torch.arange(g)
    assert torch.equal(path, torch.where(steps < n_ref[:, None], steps, -1))
    assert path.shape == (b, g) and n_acc.dtype == nxt.dtype == path.dtype == torch.int64


@pytest.mark.parametrize("spec", ["block", "hsd"])
def test_chain_only_rules_on_deterministic_chains_use_point_mass_drafts(spec):
    rule = R.get(spec)
    gen = torch.Generator().manual_seed(4)
    b, g = 32, 3
    p = torch.softmax(2 * torch.randn(b, g + 1, 6, generator=gen, dtype=torch.float64), -1)
    draft = torch.randint(0, 6, (b, g), generator=gen)
    path, n_acc, nxt = verify_tree(rule, p, None, DraftTree.chain(draft, "deterministic"),
                                   torch.Generator().manual_seed(1))
    one_hot = torch.nn.functional.one_hot(draft, 6).double()
    n_ref, z_ref = rule.verify(p, one_hot, draft, torch.Generator().manual_seed(1))
    assert torch.equal(n_acc, n_ref) and torch.equal(nxt, z_ref)


def test_padded_sampled_chains_keep_the_chain_law():
    """Chains of unequal length (padding) take the tree path; a lossy rule there has its chain law."""
    gen = torch.Generator().manual_seed(8)
    v = 5
    p = torch.softmax(2 * torch.randn(1, 4, v, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(1, 4, v, generator=gen, dtype=torch.float64), -1)
    tree = DraftTree.from_rows([[1, 3, 0], [2]], [[-1, 0, 1], [-1]], "iid")
    p2, q2 = p.expand(2, 4, v).contiguous(), q.expand(2, 4, v).contiguous()
    for spec in ["lenience:ell=0.4", "speccascade:p_base=0.3", "cos_we:lam=0.5"]:
        rule = R.get(spec)
        law = tree_path_law(rule, p2, q2, tree, row=0)
        toks = [1, 3, 0]
        chain, reach = {}, 1.0                          # the chain law, from the rule's (h, r) directly
        for k in range(3):
            h = rule.accept_prob_at(p[0, k], q[0, k], torch.tensor(toks[k])).item()
            r = rule.residual(p[0, k], q[0, k])
            for z in range(v):
                chain[(tuple(range(k)), z)] = reach * (1 - h) * r[z].item()
            reach *= h
        for z in range(v):
            chain[(tuple(range(3)), z)] = reach * p[0, 3, z].item()
        for key in set(law) | set(chain):
            assert law.get(key, 0.0) == pytest.approx(chain.get(key, 0.0), abs=1e-12), (spec, key)
        n = 20_000
        rows = DraftTree(tree.tokens.repeat(n, 1), tree.parents.repeat(n, 1), "iid")
        path, n_acc, nxt = verify_tree(rule, p2.repeat(n, 1, 1), q2.repeat(n, 1, 1), rows,
                                       torch.Generator().manual_seed(2))
        cell = (n_acc * v + nxt)[0::2]
        expected = np.array([law.get((tuple(range(k)), z), 0.0) for k in range(4) for z in range(v)])
        assert gof_pvalue(np.bincount(cell.numpy(), minlength=4 * v), expected) > ALPHA, spec


# --- 5. greedy trees at temperature 0 ------------------------------------------------------------------------

def _random_tree(gen: torch.Generator, n: int, v: int) -> tuple[list[int], list[int]]:
    """Random parents and tokens, distinct tokens among siblings (as a top-k tree has)."""
    parents, tokens = [], []
    for i in range(n):
        par = int(torch.randint(-1, i, (1,), generator=gen))
        used = {tokens[j] for j in range(i) if parents[j] == par}
        free = [t for t in range(v) if t not in used]
        if not free:
            par, free = -1, [t for t in range(v) if t not in {tokens[j] for j in range(i) if parents[j] == -1}]
            if not free:
                break
        parents.append(par)
        tokens.append(free[int(torch.randint(0, len(free), (1,), generator=gen))])
    return tokens, parents


@pytest.mark.parametrize("spec", ["greedy", "lossless", "lenience:ell=0.5", "speccascade:p_base=0.3",
                                  "typical:eps=0.1"])
def test_greedy_tree_accepts_the_longest_matching_path(spec):
    """One-hot p (temperature 0): the accepted path follows the argmax chain as deep as the tree allows,
    and the next token is the argmax after it."""
    rule, v = R.get(spec), 4
    gen = torch.Generator().manual_seed(12)
    rows_tok, rows_par, argmaxes = [], [], []
    for _ in range(200):
        tokens, parents = _random_tree(gen, int(torch.randint(0, 9, (1,), generator=gen)), v)
        rows_tok.append(tokens)
        rows_par.append(parents)
        argmaxes.append(torch.randint(0, v, (9,), generator=gen).tolist())   # argmax p at root, node 0, ...
    tree = DraftTree.from_rows(rows_tok, rows_par, "deterministic")
    p = torch.zeros(len(rows_tok), tree.width + 1, v, dtype=torch.float64)
    for b, am in enumerate(argmaxes):
        p[b, torch.arange(tree.width + 1), torch.tensor(am[: tree.width + 1])] = 1.0
    path, n_acc, nxt = verify_tree(rule, p, None, tree, torch.Generator().manual_seed(0))
    for b, (tokens, parents) in enumerate(zip(rows_tok, rows_par)):
        node, expect = -1, []
        while True:
            match = [i for i, par in enumerate(parents) if par == node and tokens[i] == argmaxes[b][node + 1]]
            if not match:
                break
            node = match[0]
            expect.append(node)
        assert path[b, : len(expect)].tolist() == expect and (path[b, len(expect):] == -1).all(), (spec, b)
        assert n_acc[b] == len(expect) and nxt[b] == argmaxes[b][node + 1], (spec, b)


# --- 6. input errors ---------------------------------------------------------------------------------------

def _small():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 4, 6, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(2, 4, 6, generator=gen, dtype=torch.float64), -1)
    tree = DraftTree.from_rows([[1, 2, 3], [4, 5, 0]], [[-1, -1, 0], [-1, 0, 1]], "iid")
    return p, q, tree


@pytest.mark.parametrize("build, match", [
    (lambda: DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1, 1]])), "parent must be -1"),
    (lambda: DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1, -3]])), "parent must be -1"),
    (lambda: DraftTree(torch.tensor([[1, 2]]), torch.tensor([[PAD_PARENT, -1]])), "padding goes last"),
    (lambda: DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1]])), "same shape"),
    (lambda: DraftTree(torch.tensor([1, 2]), torch.tensor([-1, 0])), r"\[B, N\]"),
    (lambda: DraftTree(torch.tensor([[1.0]]), torch.tensor([[-1]])), "integer"),
    (lambda: DraftTree(torch.tensor([[1]]), torch.tensor([[-1]]), "top_k"), "valid schemes: iid"),
    (lambda: DraftTree(torch.tensor([[-4]]), torch.tensor([[-1]])), "negative token"),
    (lambda: DraftTree(torch.tensor([[3, 3]]), torch.tensor([[-1, -1]]), "without_replacement"),
     "two siblings with token 3"),
])
def test_bad_trees_raise_clear_errors(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


@pytest.mark.parametrize("call, match", [
    (lambda p, q, t: verify_tree(R.get("lenience:ell=0.5"), p, q, t), "lossy.*use scheme 'deterministic'"),
    (lambda p, q, t: verify_tree(R.get("speccascade:p_base=0.3"), p, q, t), "branching > 1"),
    (lambda p, q, t: verify_tree(R.get("block"), p, q, t), "'block' is defined on chains only"),
    (lambda p, q, t: verify_tree(R.get("hsd"), p, q, DraftTree(t.tokens, t.parents, "deterministic")),
     "'hsd' is defined on chains only"),
    (lambda p, q, t: verify_tree(R.get("cos_we:lam=0.5"), p, q, DraftTree(t.tokens, t.parents, "deterministic")),
     "point mass"),
    (lambda p, q, t: verify_tree(R.get("cascade:rule=chow,alpha=0.5"), p, None,
                                 DraftTree(t.tokens, t.parents, "deterministic")), "no deterministic-tree form"),
    (lambda p, q, t: verify_tree(R.get("lossless"), p, None, t), "pass q"),
    (lambda p, q, t: verify_tree(R.get("lossless"), p[:, :3], q, t), r"\[B, N\+1, V\]"),
    (lambda p, q, t: verify_tree(R.get("lossless"), p, q[..., :5], t), "vocabulary size mismatch"),
    (lambda p, q, t: verify_tree(R.get("lossless"), p[..., :5] / p[..., :5].sum(-1, keepdim=True),
                                 q[..., :5] / q[..., :5].sum(-1, keepdim=True), t), "outside the vocabulary"),
    (lambda p, q, t: verify_tree(R.get("lossless"), p.log(), q, t), "negative|sum to 1"),
    (lambda p, q, t: verify_tree(R.get("lossless"), p, q * float("nan"), t), "NaN"),
    (lambda p, q, t: verify_tree(R.get("lossless"), p, q, (t.tokens, t.parents)), "DraftTree"),
    (lambda p, q, t: tree_node_law(R.get("lossless"), p[0, 0], torch.tensor([1, 2])), None),
    (lambda p, q, t: tree_node_law(R.get("lossless"), p[0, 0], torch.tensor([1, 2]), None, "iid"), "pass q"),
    (lambda p, q, t: tree_node_law(R.get("lossless"), p[0, 0], torch.tensor([-1, 2])), "padding"),
    (lambda p, q, t: tree_node_law(R.get("lossless"), p[0, 0], torch.tensor([9])), r"\[0, 6\)"),
    (lambda p, q, t: tree_node_law(R.get("typical:eps=0.1"), p[0, 0], torch.tensor([1, 2]), q[0, 0], "iid"),
     "lossy"),
])
def test_bad_calls_raise_clear_errors(call, match):
    p, q, tree = _small()
    if match is None:                                   # a valid call, for contrast
        call(p, q, tree)
        return
    with pytest.raises((ValueError, TypeError), match=match):
        call(p, q, tree)


# --- 7. batches with padding ---------------------------------------------------------------------------------

MIXED_ROWS = [                               # (tokens, parents)
    ([0, 1, 2], [-1, 0, 1]),                 # a chain
    ([2, 0, 1, 3, 2], [-1, -1, 0, 0, 1]),    # branching 2, depth 2
    ([1], [-1]),                             # one node
    ([], []),                                # no draft at all
    ([3, 1, 3, 0], [-1, -1, -1, -1]),        # wide root (a duplicate: the deterministic scheme skips it)
]


def _outcome_counts(keys: list, path: torch.Tensor, n_acc: torch.Tensor, nxt: torch.Tensor) -> np.ndarray:
    """Counts over the outcomes ``keys`` = (path, next token); an outcome outside them raises KeyError."""
    index = {k: i for i, k in enumerate(keys)}
    out = np.zeros(len(keys))
    for pa, k, z in zip(path.tolist(), n_acc.tolist(), nxt.tolist()):
        out[index[(tuple(pa[:k]), z)]] += 1
    return out


@pytest.mark.parametrize("spec, scheme", [("lenience:ell=0.5", "deterministic"), ("typical:eps=0.2", "deterministic"),
                                          ("lossless", "iid")])
def test_mixed_batch_rows_follow_their_own_tree_law(spec, scheme):
    """Different trees in one padded batch: each row's (path, next token) follows tree_path_law of its
    tree alone, and the same tree verified alone follows it too."""
    rule, v, n = R.get(spec), 4, 12_000
    gen = torch.Generator().manual_seed(21)
    tree = DraftTree.from_rows([r[0] for r in MIXED_ROWS], [r[1] for r in MIXED_ROWS], scheme)
    b, width = tree.batch_size, tree.width
    p = torch.softmax(1.5 * torch.randn(b, width + 1, v, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(1.5 * torch.randn(b, width + 1, v, generator=gen, dtype=torch.float64), -1)
    big = DraftTree(tree.tokens.repeat(n, 1), tree.parents.repeat(n, 1), scheme)
    q_arg = None if scheme == "deterministic" else q.repeat(n, 1, 1)
    path, n_acc, nxt = verify_tree(rule, p.repeat(n, 1, 1), q_arg, big, torch.Generator().manual_seed(5))
    assert path.shape == (b * n, tree.max_depth)
    for row, (tokens, parents) in enumerate(MIXED_ROWS):
        alone = DraftTree.from_rows([tokens], [parents], scheme)
        law = tree_path_law(rule, p[row : row + 1, : len(tokens) + 1], None if q_arg is None else
                            q[row : row + 1, : len(tokens) + 1], alone)
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
        keys = sorted(law)
        probs = np.array([law[k] for k in keys])
        sel = slice(row, None, b)
        assert gof_pvalue(_outcome_counts(keys, path[sel], n_acc[sel], nxt[sel]), probs) > ALPHA, (spec, row)
        k = 4_000
        many = DraftTree(alone.tokens.repeat(k, 1), alone.parents.repeat(k, 1), scheme)
        p_alone = p[row : row + 1, : len(tokens) + 1].repeat(k, 1, 1)
        q_alone = None if q_arg is None else q[row : row + 1, : len(tokens) + 1].repeat(k, 1, 1)
        pa, na, za = verify_tree(rule, p_alone, q_alone, many, torch.Generator().manual_seed(6 + row))
        assert gof_pvalue(_outcome_counts(keys, pa, na, za), probs) > ALPHA, (spec, row, "alone")


def test_tree_path_law_of_a_lossless_tree_emits_p_first():
    """Exact check of the whole-tree closed form: the first emitted token of a lossless deterministic tree is p."""
    tokens, parents = MIXED_ROWS[1]
    tree = DraftTree.from_rows([tokens], [parents], "deterministic")
    gen = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(1, len(tokens) + 1, 4, generator=gen, dtype=torch.float64), -1)
    law = tree_path_law(R.get("lossless"), p, None, tree)
    first = torch.zeros(4, dtype=torch.float64)
    for (path, z), prob in law.items():
        first[tokens[path[0]] if path else z] += prob
    torch.testing.assert_close(first, p[0, 0], atol=1e-12, rtol=0)


def test_tree_layout_helpers():
    tree = DraftTree.from_rows([[5, 6, 7, 8], [1, 2]], [[-1, -1, 0, 2], [-1, 0]])
    assert tree.depth.tolist() == [[1, 1, 2, 3], [1, 2, 0, 0]]
    assert tree.n_nodes.tolist() == [4, 2] and tree.max_depth == 3 and tree.max_branching == 2
    assert tree.is_chain.tolist() == [False, True] and not tree.is_uniform_chain()
    assert tree.children[0].tolist() == [[0, 1], [2, -1], [-1, -1], [3, -1], [-1, -1]]
    chain = DraftTree.chain(torch.tensor([[4, 2, 1]]))
    assert chain.scheme == "iid" and chain.is_uniform_chain() and chain.parents.tolist() == [[-1, 0, 1]]
