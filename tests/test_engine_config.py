"""Resolving what a speculative-decoding call asks for, without any model (engine/config.py, engine/plan.py)."""

from __future__ import annotations

import types

import pytest

from verispec.engine import AutoGamma, CostProfile
from verispec.engine.config import resolve
from verispec.engine.plan import DraftPlan

PROFILE = CostProfile(draft_token=0.01, target_block=tuple(0.05 * (1 + 0.1 * g) for g in range(7)))
LOOKUP_ONLY = CostProfile(draft_token=None, target_block=PROFILE.target_block)
HEAD = types.SimpleNamespace(top_k=4, depth=3, nodes=12)


def cfg(**kw):
    args = dict(rule="lossless", gamma=5, tree=None, draft_stop=0.0, costs=None, draft=True, lookup=False, head=None)
    args.update(kw)
    return resolve(**args)


@pytest.mark.parametrize("kw, gamma, label, policy, modelled", [
    ({}, 5, "", "fixed", False),
    ({"costs": PROFILE}, 5, "", "fixed", True),
    ({"tree": "chain:3", "costs": PROFILE}, 3, "", "fixed", True),            # a chain spec is a chain
    ({"tree": "topk:2,2", "costs": PROFILE}, 2, "topk:2,2", "fixed", False),  # the cost model prices chains only
    ({"tree": "dynamic:top_k=3,depth=4,nodes=8"}, 4, "dynamic:top_k=3,depth=4,nodes=8", "fixed", False),
    ({"gamma": "auto", "costs": PROFILE}, 6, "", "auto", True),
    ({"gamma": "auto", "costs": PROFILE, "draft_stop": "auto"}, 6, "", "auto+stop", True),
    ({"gamma": 4, "costs": PROFILE, "draft_stop": "auto"}, 4, "", "fixed+stop", True),
    ({"gamma": "auto", "costs": LOOKUP_ONLY, "draft": False, "lookup": True}, 6, "", "auto", True),
    ({"draft": False, "head": HEAD}, 3, "eagle3:top_k=4,depth=3,nodes=12", "fixed", False),
    ({"gamma": AutoGamma(PROFILE, fixed=2)}, 2, "", "fixed", False),
    # no draft_stop given: token by token for gamma="auto" on the draft model's chains alone
    ({"gamma": "auto", "costs": PROFILE, "draft_stop": None}, 6, "", "auto+stop", True),
    ({"gamma": "auto", "costs": PROFILE, "draft_stop": None, "lookup": True}, 6, "", "auto", True),
    ({"gamma": "auto", "costs": LOOKUP_ONLY, "draft_stop": None, "draft": False, "lookup": True}, 6, "", "auto", True),
    ({"gamma": 5, "costs": PROFILE, "draft_stop": None}, 5, "", "fixed", True),
    ({"tree": "topk:2,2", "draft_stop": None}, 2, "topk:2,2", "fixed", False),
    ({"draft": False, "head": HEAD, "draft_stop": None}, 3, "eagle3:top_k=4,depth=3,nodes=12", "fixed", False),
    ({"gamma": AutoGamma(PROFILE), "draft_stop": None}, 6, "", "auto", False),
])
def test_resolution(kw, gamma, label, policy, modelled):
    c = cfg(**kw)
    assert (c.gamma, c.tree_label, c.gamma_policy, c.profile is not None) == (gamma, label, policy, modelled)
    plan = c.plan()
    assert isinstance(plan, DraftPlan) and plan.gamma == gamma
    if c.auto or c.stop_auto:       # each generation's plan learns on its own
        assert plan.policy is not c.plan().policy


@pytest.mark.parametrize("kw, message", [
    ({"tree": "topk:2,2", "gamma": "auto", "costs": PROFILE}, "gamma='auto' chooses the length of a chain"),
    ({"draft": False}, "no draft source"),
    ({"head": HEAD}, "an EAGLE-3 head drafts its own trees"),
    ({"draft": False, "head": HEAD, "tree": "topk:2"}, "an EAGLE-3 head drafts its own trees"),
    ({"lookup": True, "tree": "topk:2,2"}, "prompt lookup drafts chains"),
    ({"draft": False, "lookup": True, "gamma": AutoGamma(PROFILE)}, "an AutoGamma policy chooses"),
    ({"costs": LOOKUP_ONLY}, "measured without a draft model"),
    ({"draft_stop": "auto", "tree": "topk:2"}, "draft_stop='auto' decides where"),
    ({"draft_stop": "auto"}, "needs the machine's cost profile"),
    ({"draft_stop": "auto", "costs": PROFILE, "gamma": 9}, "an integer in 1..6"),
    ({"gamma": "auto"}, "gamma='auto' needs the machine's cost profile"),
    ({"gamma": "auto", "draft_stop": None}, "gamma='auto' needs the machine's cost profile"),
    ({"gamma": 0}, "must be an integer in 1..64 or 'auto'"),
    ({"gamma": True}, "must be an integer in 1..64 or 'auto'"),
    ({"gamma": 100000}, "must be an integer in 1..64 or 'auto'"),
    ({"gamma": 7, "costs": PROFILE}, "covers γ = 1..6"),
    ({"rule": "nope"}, "unknown rule"),
    ({"rule": "fuzzy:T=0.4,on=raw", "tree": "topk:2"}, "reads the draft's raw distribution"),
    ({"rule": "fuzzy:T=0.4,on=raw", "lookup": True}, "reads the draft's raw distribution"),
    ({"rule": "lenience:ell=0.5", "tree": "iid:2,2"}, "is lossy"),
    ({"draft_stop": 1.0}, "draft_stop is a draft probability"),
    ({"draft_stop": "often"}, "draft_stop is a draft probability"),
])
def test_refusals(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cfg(**kw)


def test_costs_of_another_type_are_refused():
    with pytest.raises(TypeError, match="costs must be a CostProfile"):
        cfg(costs={"gamma": 3})


def test_plan_lengths_and_modelled_cost():
    plan = cfg(gamma="auto", costs=PROFILE).plan()
    g = plan.length(unseen=1, cap=2)
    assert 0 <= g <= 2
    assert cfg(gamma=5).plan().length(unseen=1, cap=2) == 2          # fixed γ, cut by the budget
    fixed = cfg(gamma=3, costs=PROFILE).plan()
    fixed.count(None, 0, 1)
    assert fixed.modelled == pytest.approx(PROFILE.step_cost(0))
    assert cfg(gamma=3, tree="topk:2,2", costs=PROFILE).plan().profile is None   # trees are not modelled
