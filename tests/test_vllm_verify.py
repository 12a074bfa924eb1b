"""The plug-in's verification core (vLLM's flat layout) against verispec's closed forms, without an engine.

Every row of a batch is one sample: ``n`` identical requests with the same ``p`` and ``q`` at every drafted
position. The first emitted token of a request (its first draft if accepted, else the correction) has the
rule's per-token law: ``rule.induced(p, q)`` for probabilistic drafts, the deterministic-candidate law
``tree_node_law(rule, p, [x])`` for a point-mass draft ``x``. Chi-square tests at level ALPHA; the power
check shows the same test rejects a wrong law.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import verispec.rules as R
from tests.helpers.rule_cases import ALPHA, gof_pvalue, pq_cases
from verispec.integrations.vllm.verify import PLACEHOLDER, verify_flat
from verispec.rules.tree_law import tree_node_law

CASES = pq_cases(v=7, seed=3)
P, Q = CASES["tail_overshoot"]
N = 20_000
GAMMA = 2

CHAIN_SPECS = ["lossless", "greedy", "lenience:ell=0.4", "speccascade:p_base=0.3", "typical:eps=0.2",
               "cos_we:lam=0.5", "ceiling:kappa=2,base=we,lam=0.5", "cascade:rule=chow,alpha=0.5",
               "relaxed:top_k=2,delta=0.9"]
OWN_VERIFY_SPECS = ["mentored:D=0.05", "sglang:single=0.5,acc=0.8", "strict", "fuzzy:T=0.3,div=js"]
POINT_MASS_SPECS = ["lossless", "greedy", "lenience:ell=0.4", "speccascade:p_base=0.3", "typical:eps=0.2",
                    "ceiling:kappa=2", "cos_we:lam=1"]


def _batch(p: torch.Tensor, q: torch.Tensor | None, n: int, gamma: int, seed: int, draft: int | None = None):
    """``n`` requests of ``gamma`` drafts each, every position with ``p`` and ``q`` (drafts ~ q, or = draft)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = p.shape[-1]
    logits = p.float().clamp_min(1e-30).log().expand(n * gamma, vocab).contiguous()
    logits[:, p == 0] = float("-inf")
    if draft is None:
        drafts = torch.multinomial(q.float(), n * gamma, replacement=True, generator=gen)
    else:
        drafts = torch.full((n * gamma,), draft, dtype=torch.long)
    probs = None if q is None else q.float().expand(n * gamma, vocab).contiguous()
    bonus = torch.multinomial(p.float(), n, replacement=True, generator=gen)
    uniforms = torch.rand(n * gamma, dtype=torch.float64, generator=gen)
    return logits, probs, drafts, bonus, uniforms


def _first_token_counts(out: torch.Tensor, vocab: int) -> np.ndarray:
    return np.bincount(out[:, 0].long().numpy(), minlength=vocab)


@pytest.mark.parametrize("spec", CHAIN_SPECS + OWN_VERIFY_SPECS)
def test_probabilistic_drafts_emit_the_rules_induced_law(spec):
    torch.manual_seed(0)
    rule = R.get(spec)
    logits, probs, drafts, bonus, uniforms = _batch(P, Q, N, GAMMA, seed=1)
    bonus_logits = logits[:N]
    out = verify_flat([rule] * N, logits, probs, drafts, [GAMMA] * N, bonus, uniforms, bonus_logits=bonus_logits)
    assert gof_pvalue(_first_token_counts(out, P.numel()), rule.induced(P, Q).numpy()) > ALPHA


@pytest.mark.parametrize("x", [0, 4])               # the target's favourite; a token the draft overshoots
@pytest.mark.parametrize("spec", POINT_MASS_SPECS)
def test_point_mass_drafts_emit_the_deterministic_candidate_law(spec, x):
    torch.manual_seed(0)
    rule = R.get(spec)
    logits, _, drafts, bonus, uniforms = _batch(P, None, N, GAMMA, seed=2, draft=x)
    out = verify_flat([rule] * N, logits, None, drafts, [GAMMA] * N, bonus, uniforms, bonus_logits=logits[:N])
    law, _ = tree_node_law(rule, P, torch.tensor([x]))
    assert gof_pvalue(_first_token_counts(out, P.numel()), law.numpy()) > ALPHA


def test_the_law_test_has_power_against_the_lossless_law():
    torch.manual_seed(0)
    logits, probs, drafts, bonus, uniforms = _batch(P, Q, N, GAMMA, seed=3)
    out = verify_flat([R.get("lenience:ell=0.4")] * N, logits, probs, drafts, [GAMMA] * N, bonus, uniforms)
    assert gof_pvalue(_first_token_counts(out, P.numel()), P.numpy()) < 1e-6


def test_accepted_prefix_then_one_token_then_placeholders():
    logits, probs, drafts, bonus, uniforms = _batch(P, Q, 500, 3, seed=4)
    out = verify_flat([R.get("lenience:ell=0.5")] * 500, logits, probs, drafts, [3] * 500, bonus, uniforms)
    drafts = drafts.view(500, 3)
    for row, d in zip(out.tolist(), drafts.tolist()):
        n = next((i for i, t in enumerate(row) if t == PLACEHOLDER), 4) - 1
        assert row[:n] == d[:n] and all(t == PLACEHOLDER for t in row[n + 1:])
    bonus_rows = (out[:, 3] != PLACEHOLDER).nonzero()[:, 0]
    assert bonus_rows.numel() > 0 and torch.equal(out[bonus_rows, 3].long(), bonus[bonus_rows])


def test_a_rule_per_request_with_ragged_drafts_and_native_rows_left_alone():
    """Rows of different rules and draft counts in one call: each row's first token follows its own rule's
    law; rows without drafts emit the bonus; rows of None (vLLM's own sampler) are not written."""
    torch.manual_seed(0)
    specs = ["lossless", "lenience:ell=0.3", "mentored:D=0.05", None]
    n_each = 6000
    counts = [2, 1, 3, 2]
    rules, n_draft = [], []
    for k in range(n_each):
        for spec, c in zip(specs, counts):
            rules.append(None if spec is None else R.get(spec))
            n_draft.append(0 if k % 50 == 0 else c)
    total = sum(n_draft)
    gen = torch.Generator().manual_seed(5)
    logits = P.float().log().expand(total, -1).contiguous()
    probs = Q.float().expand(total, -1).contiguous()
    drafts = torch.multinomial(Q.float(), total, replacement=True, generator=gen)
    bonus = torch.full((len(rules),), 6)
    out = verify_flat(rules, logits, probs, drafts, n_draft, bonus, torch.rand(total, dtype=torch.float64),
                      bonus_logits=P.float().log().expand(len(rules), -1), max_spec_len=3)
    rows = torch.arange(len(rules))
    n_draft = torch.tensor(n_draft)
    assert (out[rows % 4 == 3] == PLACEHOLDER).all()
    no_drafts = (n_draft == 0) & (rows % 4 != 3)
    assert (out[no_drafts, 0] == 6).all()
    for i, spec in enumerate(specs[:3]):
        sel = (rows % 4 == i) & (n_draft > 0)
        law = R.get(spec).induced(P, Q).numpy()
        assert gof_pvalue(np.bincount(out[sel, 0].long().numpy(), minlength=P.numel()), law) > ALPHA


@pytest.mark.parametrize("drafts_kind", ["probabilistic", "point_mass"])
def test_greedy_requests_match_the_target_argmax(drafts_kind):
    """At temperature 0 every exact-match rule accepts a draft iff it is the target's argmax and corrects to
    the argmax; greedy rows inside a sampled batch too."""
    gen = torch.Generator().manual_seed(6)
    n, gamma, vocab = 300, 3, 11
    logits = torch.randn(n * gamma, vocab, generator=gen)
    target_argmax = logits.argmax(-1).view(n, gamma)
    drafts = torch.where(torch.rand(n * gamma, generator=gen) < 0.6, logits.argmax(-1),
                         torch.randint(0, vocab, (n * gamma,), generator=gen))
    probs = torch.softmax(torch.randn(n * gamma, vocab, generator=gen), -1) if drafts_kind == "probabilistic" else None
    bonus = torch.randint(0, vocab, (n,), generator=gen)
    greedy = torch.arange(n) % 2 == 0
    for rule in ("lossless", "lenience:ell=0.3", "speccascade:p_base=0.5"):
        out = verify_flat([R.get(rule)] * n, logits, probs, drafts, [gamma] * n, bonus,
                          torch.rand(n * gamma, dtype=torch.float64, generator=gen), greedy_rows=greedy)
        d = drafts.view(n, gamma)
        for b in greedy.nonzero()[:, 0].tolist():
            n_ok = int((d[b] == target_argmax[b]).long().cumprod(0).sum())
            expect = d[b, :n_ok].tolist() + ([target_argmax[b, n_ok].item()] if n_ok < gamma else [bonus[b].item()])
            assert out[b, : len(expect)].tolist() == expect


def test_seeded_requests_are_reproducible():
    logits, probs, drafts, bonus, uniforms = _batch(P, Q, 50, GAMMA, seed=7)
    runs = []
    for _ in range(2):
        gens = {b: torch.Generator().manual_seed(100 + b) for b in range(50)}
        runs.append(verify_flat([R.get("lossless")] * 50, logits, probs, drafts, [GAMMA] * 50, bonus, uniforms,
                                generators=gens))
    assert torch.equal(runs[0], runs[1])
