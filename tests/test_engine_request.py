"""One decoding request, checked (:func:`verispec.engine.request.resolve_decode`): the settings ``verispec
serve`` and the lm-eval ``verispec`` model share — each bad setting is refused naming it, a true baseline
carries the rule's truncation, and a request knows whether a batch can run it."""

from __future__ import annotations

import pytest

from verispec.engine.request import DecodeError, resolve_decode, row_request
from verispec.rules import get as get_rule
from verispec.sampling import SamplingConfig

T = SamplingConfig.parse("temperature=0.7")


def decode(**kw):
    args = dict(rule="lossless", gamma=3, tree=None, draft="model", baseline=False, sampling=T, max_tokens=8)
    return resolve_decode(**{**args, **kw})


@pytest.mark.parametrize("kw, param", [
    ({"rule": "no_such_rule"}, "verification.rule"),
    ({"rule": "lenience:ell=7"}, "verification.rule"),
    ({"rule": ""}, "verification.rule"),
    ({"gamma": 0}, "verification.gamma"),
    ({"gamma": "many"}, "verification.gamma"),
    ({"gamma": True}, "verification.gamma"),
    ({"draft": "oracle"}, "verification.draft"),
    ({"draft": "model", "draft_sources": ("none", "ngram")}, "verification.draft"),
    ({"tree": 5}, "verification.tree"),
    ({"rule": "lenience:ell=0.5", "tree": "iid:2,2"}, "verification"),
    ({"rule": "mentored:D=0.1", "draft": "ngram"}, "verification"),
    ({"gamma": "auto", "tree": "2,2"}, "verification"),
])
def test_bad_settings_are_refused_naming_the_setting(kw, param):
    with pytest.raises(DecodeError) as caught:
        decode(**kw)
    assert caught.value.param == param and str(caught.value)


def test_baselines_target_only_and_what_batches_run():
    base = decode(rule="speccascade:p_base=0.3", baseline=True)
    assert base.rule is None and base.baseline and base.rule_spec == "speccascade:p_base=0.3"
    assert base.sampling == T.with_truncation(**get_rule("speccascade:p_base=0.3").baseline_truncation())
    plain = decode(draft="none")
    assert plain.rule is None and not plain.baseline and plain.sampling == T and plain.batched
    chain = decode(rule="lenience:ell=0.5", gamma=4.0)
    assert chain.gamma == 4 and chain.batched and chain.verify_room == 5 and chain.rule_spec == "lenience:ell=0.5"
    for kw in ({"draft": "ngram"}, {"tree": "2,2"}, {"gamma": "auto"}, {"rule": "fuzzy:0.1,on=raw"}):
        d = decode(**kw)
        assert not d.batched, kw
        with pytest.raises(ValueError, match="generate_single"):
            row_request([1, 2], d)
    req = row_request([1, 2], decode(seed=5, stop=["\n"]), tag="x")
    assert (req.prompt, req.gamma, req.seed, list(req.stop), req.tag) == ([1, 2], 3, 5, ["\n"], "x")
