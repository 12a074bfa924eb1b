"""Draft length from the cost model (``gamma="auto"``): the choice, the cached profile, exactness."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import random
import time

import numpy as np
import pytest

from tests.conftest import QuietLoad
from tests.helpers.fake_lm import FakeLM
from tests.helpers.laws import T1, assert_law, exact_prefix_law, sample_prefixes
from verispec.engine import (
    AutoGamma,
    CostProfile,
    best_gamma,
    cached_profile,
    expected_tokens,
    generate,
    generate_target_only,
    measure_profile,
)
from verispec.engine.costs import DEFAULT_G_MAX
from verispec.engine.gamma import CALIBRATION_WEIGHT, MAX_EXPLORE_WAIT, PAY_MARGIN, step_rate
from verispec.engine.ngram import NgramDrafter
from verispec.sampling import SamplingConfig

GREEDY = SamplingConfig.parse("temperature=0")


def profile(c: float, v: list[float], t: float = 0.05) -> CostProfile:
    """A profile with draft/target ratio ``c`` and ``v(g)`` for g = 1.. (v(0) = 1)."""
    return CostProfile(draft_token=c * t, target_block=tuple(t * x for x in [1.0, *v]))


# The issue's Xeon figures: c ≈ 0.46, v(1..8) = 1.49, 1.84, 1.60, (2.0), 2.35, (3.0, 3.7), 4.46
XEON = profile(0.46, [1.49, 1.84, 1.60, 2.0, 2.35, 3.0, 3.7, 4.46])
# This session's AMD VM: c = 0.547, v = 1.66 .. 4.78 (drafting never pays)
AMD = profile(0.547, [1.66, 2.11, 2.50, 3.11, 3.60, 4.14, 4.31, 4.78])
CHEAP_DRAFT = profile(0.05, [1.0 + 0.1 * g for g in range(1, 9)])
# best γ: 0 at α = 0.3, 1 at 0.5, 2 at 0.65, 3 at 0.76, 6 at 0.9
MIXED = profile(0.15, [1.3 + 0.1 * g for g in range(8)])


# ------------------------------------------------------------------------------ the choice
def test_expected_tokens_is_the_mean_of_a_simulated_block():
    rng = random.Random(0)
    for alpha, g in [(0.3, 1), (0.7, 4), (0.9, 8), (1.0, 3)]:
        sims = []
        for _ in range(20000):
            n = 0
            while n < g and rng.random() < alpha:
                n += 1
            sims.append(n + 1)  # accepted drafts + the correction / bonus token
        assert abs(np.mean(sims) - expected_tokens(alpha, g)) < 4 * np.std(sims) / np.sqrt(len(sims)) + 1e-9


def test_best_gamma_is_the_argmax_of_tokens_per_cost():
    rng = np.random.default_rng(1)
    for _ in range(200):
        c = float(rng.uniform(0.02, 0.8))
        v = np.cumsum(rng.uniform(0.05, 0.8, size=8)) + 1.0
        prof = profile(c, list(v))
        alpha = float(rng.uniform(0.0, 1.0))
        rates = [expected_tokens(alpha, g) / (g * c + (1.0 if g == 0 else v[g - 1])) for g in range(9)]
        assert best_gamma(prof, alpha) == int(np.argmax(rates))
    # monotone in α on a profile where drafting pays: more acceptance never shortens the draft
    picks = [best_gamma(CHEAP_DRAFT, a) for a in np.linspace(0.0, 0.99, 50)]
    assert picks == sorted(picks) and picks[0] == 0 and picks[-1] == 8


def test_the_issue_machines():
    """On the issue's Xeon γ≈3 pays at high acceptance; on this session's AMD VM drafting never pays."""
    assert best_gamma(XEON, 0.9) == 3 and best_gamma(XEON, 0.5) == 0
    assert all(best_gamma(AMD, a) == 0 for a in (0.5, 0.9, 0.99, 1.0))
    assert not AutoGamma(AMD).can_pay() and AutoGamma(XEON).can_pay()


def test_policy_learns_acceptance_and_explores_only_where_drafting_can_pay():
    pol = AutoGamma(XEON, prior_alpha=0.5, prior_weight=4, explore_every=3, optimism=0.0)
    # α = 0.5: plain steps, a one-token probe after 3 of them, the next after 6 (the wait doubles)
    assert [pol.next() for _ in range(9)] == [0, 0, 1, 0, 0, 0, 0, 0, 1]
    for _ in range(40):
        pol.update(1, 1)  # every explored draft accepted
    assert pol.alpha > 0.9 and pol.next() == 3
    for _ in range(200):
        pol.update(0, 3)  # then nothing is accepted any more
    assert pol.alpha < 0.2 and pol.next() == 0
    never = AutoGamma(AMD, explore_every=1)
    assert [never.next() for _ in range(20)] == [0] * 20
    with pytest.raises(ValueError, match="prior_alpha"):
        AutoGamma(XEON, prior_alpha=1.0)
    with pytest.raises(ValueError, match="optimism"):
        AutoGamma(XEON, optimism=-1.0)


def test_optimism_drafts_while_acceptance_is_uncertain_and_fades_with_evidence():
    """The default prior α = 0.7, where the mean says "do not draft" on the Xeon profile: the optimistic
    policy drafts from the first step, keeps drafting when drafts are accepted, and falls back to
    plain steps once enough rejections make even the optimistic α too low; its bonus is the posterior sd."""
    pol = AutoGamma(XEON, optimism=1.0)
    assert best_gamma(XEON, pol.alpha) == 0 and pol.next() == 3
    assert pol.alpha_upper == pytest.approx(0.7 + (0.21 / 5) ** 0.5)
    assert AutoGamma(XEON).alpha_upper == pytest.approx(0.7 + 0.5 * (0.21 / 5) ** 0.5)   # the default: half an sd
    for _ in range(30):
        pol.update(3, 3)
    assert pol.next() == 3
    for _ in range(60):
        pol.update(0, 3)
    assert pol.alpha < pol.alpha_upper < 0.8 and pol.next() == 0  # γ = 3 pays from α ≈ 0.85 on this profile
    shy = AutoGamma(XEON, optimism=0.0)
    assert shy.next() == 0 and shy.alpha_upper == shy.alpha


# ------------------------------------------------------------------------------ the engine
@pytest.mark.parametrize("prof, plain", [(XEON, "some"), (AMD, "all"), (CHEAP_DRAFT, "any"), (MIXED, "some")],
                         ids=["xeon", "amd", "cheap", "mixed"])
@pytest.mark.parametrize("spec", ["lossless", "lenience:ell=0.3", "speccascade:p_base=0.5"])
def test_greedy_auto_sd_equals_greedy_target_only(prof, plain, spec):
    """Cache handling with variable γ and plain steps (the draft catching up on several tokens)."""
    target, draft = FakeLM(vocab=5, seed=6), FakeLM(vocab=5, seed=7)
    ref = generate_target_only(target, [0, 1, 2], sampling=GREEDY, max_new_tokens=40)
    pol = AutoGamma(prof, explore_every=2)
    out = generate(target, draft, [0, 1, 2], rule=spec, sampling=GREEDY, gamma=pol, max_new_tokens=40)
    assert out.tokens == ref.tokens
    hist = out.stats.gamma_hist
    assert sum(hist) == len(pol.chosen) and out.stats.gamma_policy == "auto"
    assert out.stats.target_calls == sum(hist)
    drafted = sum(hist[1:])
    # AMD: drafting cannot pay, every step is plain; XEON / MIXED: both kinds of step; CHEAP: it drafts
    assert {"all": drafted == 0 and out.stats.draft_calls == 0, "some": hist[0] > 0 and drafted > 0,
            "any": drafted > 0}[plain]


@pytest.mark.slow
def test_auto_lossless_sd_samples_the_target_law():
    """With γ varying step to step (plain steps included) lossless SD still samples p exactly."""
    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    prompt = [0, 1]
    law = exact_prefix_law(target, prompt, 4, T1)
    seen_g: set[int] = set()
    after_full = []     # steps chosen after a block accepted whole (the policy's run state)

    def run(seed):
        pol = AutoGamma(MIXED, prior_alpha=0.3, prior_weight=1, explore_every=2)
        # 5 tokens: a step taken after a block accepted whole then starts within the first 4 (the law's)
        res = generate(target, draft, prompt, rule="lossless", sampling=T1, gamma=pol, max_new_tokens=5, seed=seed)
        seen_g.update(pol.chosen)
        after_full.append(pol.state_verified[1])
        return res

    assert_law(sample_prefixes(run, 6000, 4), law)
    assert {0, 1} <= seen_g and max(seen_g) >= 2, seen_g
    assert sum(x > 0 for x in after_full) > 50     # the run state chose a step within the law's tokens (~130 of 6000)


def test_auto_needs_a_cost_profile():
    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    with pytest.raises(ValueError, match="cost profile"):
        generate(target, draft, [0], rule="lossless", sampling=T1, gamma="auto", max_new_tokens=3)
    with pytest.raises(ValueError, match="'auto'"):
        generate(target, draft, [0], rule="lossless", sampling=T1, gamma="fast", max_new_tokens=3)
    out = generate(target, draft, [0], rule="lossless", sampling=T1, gamma="auto", max_new_tokens=5, costs=XEON)
    assert len(out.tokens) == 5 and out.stats.cost_model_speedup is not None


def test_cost_model_speedup_counts_the_steps_taken():
    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    out = generate(target, draft, [0], rule="lossless", sampling=GREEDY, gamma=3, max_new_tokens=20, costs=XEON)
    modelled = sum(k * XEON.step_cost(g) for g, k in enumerate(out.stats.gamma_hist))
    assert out.stats.cost_model_speedup == pytest.approx(out.stats.new_tokens / modelled)
    # a profile without catch-up or engine time prices a step as the textbook γc + v(γ), so BE / (γc + v(γ))
    # (fixed_speedup) is the speedup of a generation whose every step drafts γ
    for g in range(1, XEON.g_max + 1):
        assert XEON.step_cost(g) == pytest.approx(g * XEON.c + XEON.v(g))
    assert XEON.fixed_speedup(3, 2.5) == pytest.approx(2.5 / (3 * XEON.c + XEON.v(3)))



class _FeedLog(FakeLM):
    """A FakeLM that records how many tokens each forward feeds."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.feeds: list[int] = []

    def forward(self, tokens, **kw):
        self.feeds.append(len(tokens))
        return super().forward(tokens, **kw)

    def forward_tree(self, tokens, parents):
        self.feeds.append(len(tokens))
        return super().forward_tree(tokens, parents)


class _UnseenLog(AutoGamma):
    """An AutoGamma that records the ``unseen`` the engine tells it and the draft length it chose."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.told: list[tuple[int | None, int]] = []

    def next(self, unseen=None):
        g = super().next(unseen)
        self.told.append((unseen, g))
        return g


def test_engine_tells_the_policy_the_drafts_catch_up_and_models_each_step_with_it():
    """After plain steps the draft's first forward feeds every token it missed: the engine passes that
    count to the policy, it is exactly what the draft is fed, and the modelled speedup charges it."""
    prof = dataclasses.replace(XEON, draft_pair=1.8 * XEON.draft_token)   # a fed token costs 0.8 of a draft step
    target, draft = FakeLM(vocab=4, seed=1), _FeedLog(vocab=4, seed=2)
    pol = _UnseenLog(prof, prior_alpha=0.5, explore_every=3, optimism=0.0)
    out = generate(target, draft, [0, 1], rule="lossless", sampling=T1, gamma=pol, max_new_tokens=60, seed=3,
                   costs=prof)
    told = pol.told
    assert len(told) == sum(out.stats.gamma_hist) and {0, 1} <= {g for _, g in told}
    assert max(u for u, g in told if g) >= 3   # a catch-up after a plain run
    # the prefill fed the prompt's first token; every drafted step then feeds its unseen tokens, then
    # one token per further draft (the last step drafts at most what the token budget leaves)
    body = [f for u, g in told[:-1] if g for f in [u] + [1] * (g - 1)]
    assert draft.feeds[: 1 + len(body)] == [1, *body]
    (u_last, _), g_last = told[-1], len(draft.feeds) - 1 - len(body)
    assert g_last == 0 or draft.feeds[1 + len(body)] == u_last
    modelled = sum(prof.step_cost(g, unseen=u) for u, g in told[:-1]) + prof.step_cost(g_last, unseen=u_last)
    assert out.stats.cost_model_speedup == pytest.approx(out.stats.new_tokens * prof.step_cost(0) / modelled)
    assert prof.draft_feed(5) == pytest.approx(prof.draft_token * (1 + 4 * 0.8))


def test_exploring_stops_where_the_catch_up_cannot_be_repaid():
    """At α → 1 drafting pays by 6% after an accepted block (2 tokens to feed), by 2% after 2 plain steps (3 to
    feed: under the 5% that timing noise can make, PAY_MARGIN, so it does not count) and not at all after 3."""
    prof = CostProfile(draft_token=0.3, target_block=tuple(1 + 0.6 * g for g in range(9)), draft_pair=0.6)
    best = [max(step_rate(prof, 1.0, g, u) for g in range(1, 9)) / step_rate(prof, 1.0, 0, u) for u in (2, 3, 4)]
    assert best == pytest.approx([1.059, 1.023, 0.989], abs=1e-3) and PAY_MARGIN == 1.05
    assert AutoGamma(prof).can_pay() and AutoGamma(prof).can_pay(2) and not AutoGamma(prof).can_pay(3)
    told = AutoGamma(prof, prior_alpha=0.5, explore_every=3, optimism=0.0)
    assert [told.next(u) for u in range(1, 8)] == [0] * 7
    blind = AutoGamma(prof, prior_alpha=0.5, explore_every=3, optimism=0.0)
    assert [blind.next() for _ in range(9)] == [0, 0, 1, 0, 0, 0, 0, 0, 1]

# ------------------------------------------------------------------------------ the cached profile
def test_profile_is_measured_once_and_cached(tmp_path, caplog, quiet_machine):
    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    prof, measured = cached_profile(target, draft, [0, 1], cache_dir=tmp_path, g_max=4)
    assert measured and prof.g_max == 4 and prof.identity
    again, measured = cached_profile(target, draft, [0, 1], cache_dir=tmp_path, g_max=4)
    assert not measured and again == prof
    _, measured = cached_profile(target, draft, [0, 1], cache_dir=tmp_path, g_max=4, refresh=True)
    assert measured
    _, measured = cached_profile(target, draft, [0, 1], cache_dir=tmp_path, g_max=4, n_threads=7)
    assert measured  # another thread count is another setting
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 2
    files[0].write_text("{not json")
    files[1].write_text(json.dumps({"version": 99}))
    with caplog.at_level(logging.WARNING, logger="verispec.costs"):
        for threads in (None, 7):
            _, measured = cached_profile(target, draft, [0, 1], cache_dir=tmp_path, g_max=4, n_threads=threads)
            assert measured
    assert "unreadable" in caplog.text


def test_measured_profile_and_bad_profiles():
    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    prof = measure_profile(target, draft, [0, 1], g_max=3, repeats=3)
    assert prof.g_max == 3 and prof.v(0) == 1.0 and prof.c > 0
    assert target.n_cached == 2 and draft.n_cached == 2  # both caches hold the prompt again
    with pytest.raises(ValueError, match="positive"):
        CostProfile(draft_token=0.0, target_block=(1.0, 2.0))
    with pytest.raises(ValueError, match="covers"):
        prof.fixed_speedup(4, 2.0)
    with pytest.raises(ValueError, match="covers"):
        generate(target, draft, [0], rule="lossless", sampling=T1, gamma=5, max_new_tokens=3, costs=prof)


def test_cli_gamma_flag(capsys):
    from verispec.cli import main

    with pytest.raises(SystemExit) as e:   # diagnose records fixed blocks: it needs a fixed γ
        main(["diagnose", "--gamma", "auto"])
    assert e.value.code == 2
    assert main(["bench", "--gamma", "auto", "--dry-run", "--rules", "lenience:ell=0.5"]) == 0
    assert f"γ=auto(≤{DEFAULT_G_MAX})" in capsys.readouterr().out
    assert main(["generate", "--prompt", "x", "--gamma", "auto", "--no-cost-model", "--target", "nope.gguf"]) == 2


def test_step_cost_counts_the_drafts_catch_up_and_the_rows():
    t, d1, d2, r = 0.03, 0.015, 0.025, 0.002
    prof = CostProfile(draft_token=d1, target_block=(t, 0.05, 0.06, 0.07), draft_pair=d2, row_s=r)
    for g, alpha in [(1, 0.5), (3, 0.9), (2, None)]:
        full = 0.0 if alpha is None else alpha**g
        draft = (g - 1) * d1 + full * d2 + (1 - full) * d1
        assert prof.step_cost(g, alpha) == pytest.approx((draft + prof.target_block[g] + (2 * g + 1) * r) / t)
    assert prof.step_cost(0) == pytest.approx(1 + r / t)
    # target-only pays one row per token too: a step as costly as target-only's per token breaks even
    assert prof.speedup(3.0, 3 * prof.step_cost(0)) == pytest.approx(1.0)
    assert CostProfile.from_json(json.loads(json.dumps(prof.to_json()))) == prof


# ------------------------------------------------------------------------------ per-token stop (draft_stop="auto")
def _rate_after(pol: AutoGamma, confidences: list[float], h: int, ahead: float | None = None) -> float:
    """Brute force: expected tokens per cost if the step drafts up to ``h`` tokens, the ones beyond the
    drafted ``confidences`` counted with ``ahead`` (default: the generation's accepted / verified positions
    with the last drafted token's acceptance worth ``prior_weight`` positions; before the first token: the
    policy's mean acceptance in its state); the draft's catch-up reads the chance that all ``h`` survive."""
    drafted = [pol.acceptance_at(c) for c in confidences]
    if ahead is None:
        ahead = (pol.accepted + drafted[-1] * pol.prior_weight) / (pol.verified + pol.prior_weight) if drafted \
            else pol.acceptance(optimistic=False)[0]
    acc = drafted + [ahead] * (h - len(confidences))
    tokens, survive = 1.0, 1.0
    for a in acc[:h]:
        survive *= a
        tokens += survive
    return tokens / pol.profile.step_cost(h, survive ** (1 / h) if h else None)


def test_keep_drafting_is_the_look_ahead_argmax_of_tokens_per_cost():
    rng = np.random.default_rng(3)
    for prof in (XEON, MIXED, CHEAP_DRAFT):
        pol = AutoGamma(prof, by_confidence=True, prior_weight=2)
        for _ in range(60):     # calibrate: confident tokens are accepted, unconfident ones are not
            c = [float(x) for x in rng.uniform(0, 1, size=4)]
            n = next((i for i, x in enumerate(c) if rng.uniform() > x), 4)
            pol.update(n, 4, c)
        for _ in range(100):
            conf = [float(x) for x in rng.uniform(0, 1, size=int(rng.integers(1, 6)))]
            k = len(conf)
            want = k < pol.g_max and max(_rate_after(pol, conf, h) for h in range(k + 1, pol.g_max + 1)) > \
                _rate_after(pol, conf, k)
            assert pol.keep_drafting(conf) == want
    assert pol.acceptance_at(0.95) > pol.alpha > pol.acceptance_at(0.05)


def test_a_confident_draft_drafts_on_from_the_first_step():
    """Before any position is verified, a drafted token's acceptance is its confidence (a draft's confidence
    approximates its acceptance, EAGLE-2), and the tokens not yet drafted count with the last one's: a
    confident draft drafts on in the generation's first step, an unsure token ends the chain."""
    pol = AutoGamma(CHEAP_DRAFT, by_confidence=True)
    assert pol.miscalibration == 1.0
    assert pol.acceptance_at(0.97) == pytest.approx(0.97) and pol.acceptance_at(0.02) == pytest.approx(0.02)
    assert pol.acceptance_at(1.0) == 1.0
    assert all(pol.keep_drafting([0.97] * k) for k in range(1, pol.g_max))
    assert not pol.keep_drafting([0.97, 0.97, 0.02])
    pol.update(0, 3, [0.97, 0.97, 0.97])       # evidence moves the bin away from its prior
    assert pol.acceptance_at(0.97) < 0.95


def test_the_tokens_not_yet_drafted_count_with_the_generations_acceptance_not_the_last_tokens():
    """An unsure token does not announce unsure ones: where the generation accepts nearly everything (the
    arithmetic prompt on the transformers backend: three blocks of 12 accepted whole, then a step's first token
    drafted at confidence 0.55, which was accepted) the chain drafts on, where counting the tokens ahead with
    that token's own acceptance ended it (5 target calls for 48 tokens instead of 4); where the generation
    rejects often, the same token ends it."""
    t = 0.2585        # the transformers backend's profile on the 2-core VM (docs/performance.md, fourth round)
    v = (1.0, 1.85, 2.34, 2.34, 2.72, 3.22, 3.53, 3.16, 3.51, 3.37, 3.43, 3.46, 3.32, 3.42, 3.48, 3.36, 4.10)
    prof = CostProfile(draft_token=0.348 * t, target_block=tuple(x * t for x in v))
    accepting = AutoGamma(prof, by_confidence=True)
    for _ in range(3):
        accepting.update(12, 12, [1.0] * 11 + [0.7])
    own = accepting.acceptance_at(0.55)
    assert accepting.ahead_acceptance(own) == pytest.approx((36 + 4 * own) / 40)
    unsure_ahead = max(_rate_after(accepting, [0.55], h, ahead=own) for h in range(2, accepting.g_max + 1))
    assert unsure_ahead <= _rate_after(accepting, [0.55], 1)          # the tokens ahead at 0.55's own: stop
    assert accepting.keep_drafting([0.55])
    rejecting = AutoGamma(prof, by_confidence=True)
    for _ in range(3):
        rejecting.update(0, 12, [0.5] + [1.0] * 11)
    assert not rejecting.keep_drafting([0.55]) and not rejecting.keep_drafting([1.0, 0.55])


def test_miscalibration_is_learned_from_every_verified_position_and_sets_every_bins_prior():
    """``λ`` = rejections / Σ (1 − c), from 1 worth CALIBRATION_WEIGHT: a pair that accepts its draft's unsure
    tokens (code on the embedded pair) lifts the acceptance of every unsure bin, also bins never verified,
    so the chain drafts on past an unsure token; one that rejects more than the confidence says lowers it."""
    lenient = AutoGamma(CHEAP_DRAFT, by_confidence=True)
    for _ in range(10):
        lenient.update(4, 4, [0.99, 0.6, 0.99, 0.75])    # every unsure token accepted
    slack = 10 * (0.01 + 0.4 + 0.01 + 0.25)
    assert lenient.miscalibration == pytest.approx(CALIBRATION_WEIGHT / (slack + CALIBRATION_WEIGHT))
    fresh = AutoGamma(CHEAP_DRAFT, by_confidence=True)
    assert lenient.acceptance_at(0.35) == pytest.approx(1 - lenient.miscalibration * 0.65)   # a bin never verified
    assert lenient.acceptance_at(0.35) > 0.75 > fresh.acceptance_at(0.35) == pytest.approx(0.35)
    assert lenient.keep_drafting([0.99, 0.35]) and not fresh.keep_drafting([0.99, 0.35])

    strict = AutoGamma(CHEAP_DRAFT, by_confidence=True)
    for _ in range(10):
        strict.update(1, 4, [0.8, 0.8, 0.9, 0.9])        # the second token rejected every time
    assert strict.miscalibration == pytest.approx((10 + CALIBRATION_WEIGHT) / (10 * 0.4 + CALIBRATION_WEIGHT))
    assert strict.acceptance_at(0.55) == pytest.approx(max(0.0, 1 - strict.miscalibration * 0.45))
    assert strict.acceptance_at(0.55) < fresh.acceptance_at(0.55)
    assert strict.acceptance_at(0.2) == 0.0              # clipped: never a negative acceptance


def test_confidence_stop_drafts_on_when_sure_and_stops_when_not():
    pol = AutoGamma(CHEAP_DRAFT, by_confidence=True)
    for _ in range(50):
        pol.update(4, 4, [0.95] * 4)           # confident drafts always accepted
        pol.update(0, 4, [0.05, 0.9, 0.9, 0.9])  # unconfident ones rejected
    assert pol.keep_drafting([0.95, 0.95]) and not pol.keep_drafting([0.95, 0.05, 0.05])
    assert not pol.keep_drafting([0.95] * pol.g_max)     # never beyond γ_max
    assert pol.next() == pol.g_max                       # the stop rule, not γ, ends the chain
    amd = AutoGamma(AMD, by_confidence=True)
    assert amd.next() == 0                               # drafting never pays there: plain steps


@pytest.mark.slow
@pytest.mark.parametrize("gamma, stop", [(4, "auto"), ("auto", None)], ids=["cap-4", "auto-default"])
def test_draft_stop_auto_keeps_lossless_exact(gamma, stop):
    """Chains cut token by token by the cost model, under a fixed cap and as ``gamma="auto"``'s default (plain
    steps and the step's γ too): the law of the first 4 tokens is still the target's."""
    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    prompt = [0, 1]
    law = exact_prefix_law(target, prompt, 4, T1)
    lengths: set[int] = set()
    policies: set[str] = set()

    def run(seed):
        res = generate(target, draft, prompt, rule="lossless", sampling=T1, gamma=gamma, max_new_tokens=4, seed=seed,
                       costs=MIXED, draft_stop=stop)
        lengths.update(g for g, k in enumerate(res.stats.gamma_hist) if k)
        policies.add(res.stats.gamma_policy)
        return res

    assert_law(sample_prefixes(run, 6000, 4), law)
    assert len(lengths - {0}) >= 2, lengths     # the chains really had different lengths
    assert policies == {"fixed+stop" if gamma == 4 else "auto+stop"}


def test_gamma_auto_stops_token_by_token_by_default():
    """``gamma="auto"`` with a draft model alone cuts its chains token by token unless told otherwise
    (``draft_stop=0.0``: the step's γ alone); with prompt lookup beside the draft model the step's γ alone
    stays the default."""
    target, draft = FakeLM(vocab=6, seed=1), FakeLM(vocab=6, seed=2)

    def run(**kw):
        out = generate(target, draft, [1, 2], rule="lossless", sampling=T1, gamma="auto", max_new_tokens=40, seed=3,
                       costs=MIXED, **kw)
        return out.tokens, out.stats.gamma_hist, out.stats.gamma_policy

    default, per_token, per_step = run(), run(draft_stop="auto"), run(draft_stop=0.0)
    assert default == per_token and default[2] == "auto+stop"
    assert per_step[2] == "auto" and per_step[:2] != default[:2]      # a different policy, other lengths
    with_lookup = generate(target, draft, [1, 2, 1, 2], rule="lossless", sampling=T1, gamma="auto", max_new_tokens=20,
                           costs=MIXED, lookup=NgramDrafter(min_ngram=1, max_ngram=2, max_tokens=4))
    assert with_lookup.stats.gamma_policy == "auto"
    fixed = generate(target, draft, [1, 2], rule="lossless", sampling=T1, gamma=3, max_new_tokens=20, costs=MIXED)
    hist = fixed.stats.gamma_hist       # every step drafts 3 but near the token budget
    assert fixed.stats.gamma_policy == "fixed" and hist[3] > sum(hist) - hist[3]


def test_draft_stop_auto_in_the_engine():
    target, draft = FakeLM(vocab=6, seed=1), FakeLM(vocab=6, seed=2)
    ref = generate_target_only(target, [1, 2], sampling=GREEDY, max_new_tokens=30)
    for gamma in (4, "auto"):
        out = generate(target, draft, [1, 2], rule="lossless", sampling=GREEDY, gamma=gamma, max_new_tokens=30,
                       costs=CHEAP_DRAFT, draft_stop="auto")
        assert out.tokens == ref.tokens
        assert out.stats.gamma_policy == ("fixed+stop" if gamma == 4 else "auto+stop")
    sampled = generate(target, draft, [1, 2], rule="lossless", sampling=T1, gamma=5, max_new_tokens=60,
                       costs=MIXED, draft_stop="auto")
    assert sum(sampled.stats.gamma_hist[1:5]) > 0          # some chains stopped before γ = 5
    with pytest.raises(ValueError, match="cost profile"):
        generate(target, draft, [1], rule="lossless", sampling=T1, gamma=3, max_new_tokens=3, draft_stop="auto")
    with pytest.raises(ValueError, match="does not apply to trees"):
        generate(target, draft, [1], rule="lossless", sampling=T1, tree="2,1", max_new_tokens=3, costs=MIXED,
                 draft_stop="auto")
    with pytest.raises(ValueError, match="most a step drafts"):
        generate(target, draft, [1], rule="lossless", sampling=T1, gamma=40, max_new_tokens=3, costs=MIXED,
                 draft_stop="auto")
    with pytest.raises(ValueError, match="'auto'"):
        generate(target, draft, [1], rule="lossless", sampling=T1, gamma=3, max_new_tokens=3, draft_stop="soon")


class _SlowLM(FakeLM):
    """A FakeLM whose every forward takes at least ``delay`` seconds: model time the overhead must exclude."""

    def __init__(self, *a, delay: float, **kw) -> None:
        super().__init__(*a, **kw)
        self.delay = delay

    def forward(self, tokens, *, all_logits=True):
        time.sleep(self.delay)
        return super().forward(tokens, all_logits=all_logits)

    def forward_tree(self, tokens, parents):
        time.sleep(self.delay)
        return super().forward_tree(tokens, parents)


def test_measured_overheads_exclude_model_time_and_enter_the_step_cost():
    target, draft = _SlowLM(vocab=6, seed=1, delay=0.02), _SlowLM(vocab=6, seed=2, delay=0.01)
    prof = measure_profile(target, draft, [0, 1, 2], g_max=4, repeats=3)
    assert target.n_cached == 3 and draft.n_cached == 3   # both caches hold the prompt again
    assert prof.target_token >= 0.02 and prof.draft_token >= 0.01
    (o_a, o_b), plain = prof.step_overhead, prof.plain_overhead
    # the sleeps are model time: what is left per step is the engine's own work, a few ms here
    assert 0 < plain < 0.01 and 0 <= o_a + 4 * o_b < 0.01
    for g, alpha in [(1, 0.5), (4, 0.9)]:
        full = alpha**g
        pair = max(prof.draft_pair, prof.draft_token)   # a pair measured faster than one token: one token
        draft_s = (g - 1) * prof.draft_token + full * pair + (1 - full) * prof.draft_token
        want = (draft_s + o_a + o_b * g + prof.target_block[g]) / prof.target_token
        assert prof.step_cost(g, alpha) == pytest.approx(want)
    assert prof.step_cost(0) == pytest.approx(1 + plain / prof.target_token)
    assert CostProfile.from_json(json.loads(json.dumps(prof.to_json()))) == prof
    with pytest.raises(ValueError, match="step_overhead"):
        dataclasses.replace(prof, step_overhead=(-1.0, 0.0))
    with pytest.raises(ValueError, match="plain_overhead"):
        dataclasses.replace(prof, plain_overhead=-1.0)



def test_one_stalled_overhead_run_does_not_enter_the_profile(monkeypatch):
    """A hypervisor stall in one of the short runs (here: 1 s added to the first target-only run's
    wall time) is outvoted by the median of the rounds; with one round it adds ~80 ms to every
    plain step (so the check has power)."""
    from verispec.engine.calibrate import measure_overheads

    gen_mod = importlib.import_module("verispec.engine.calibrate")   # where measure_overheads finds it

    real = gen_mod.generate_target_only
    target, draft = _SlowLM(vocab=6, seed=1, delay=0.002), _SlowLM(vocab=6, seed=2, delay=0.001)
    for repeats, stalled in [(3, False), (1, True)]:
        calls = []

        def first_run_stalls(*args, calls=calls, **kwargs):
            out = real(*args, **kwargs)
            calls.append(out)
            if len(calls) > 1:
                return out
            return dataclasses.replace(out, stats=dataclasses.replace(out.stats, wall_s=out.stats.wall_s + 1.0))

        monkeypatch.setattr(gen_mod, "generate_target_only", first_run_stalls)
        _, plain = measure_overheads(target, draft, [0, 1, 2], repeats=repeats)
        assert len(calls) == repeats
        assert (plain > 1.0 / 12 - 0.005) if stalled else (plain < 0.01)
    with pytest.raises(ValueError, match="repeats"):
        measure_overheads(target, draft, [0, 1, 2], repeats=0)


# ------------------------------------------------------------------------------ runs, probes, the busy machine
def test_probes_back_off_where_drafting_keeps_losing_and_reset_when_it_pays():
    """Plain steps teach nothing, so one-token probes keep α learnable; each probe that changes nothing
    doubles the wait for the next (a bad pair costs a logarithmic number of probes), capped; a probe
    that starts a run of chosen drafts resets it."""
    pol = AutoGamma(XEON, prior_alpha=0.3, explore_every=4, optimism=0.0)
    probes = [i for i in range(1, 2000) if pol.next() == 1]
    gaps = [b - a for a, b in zip([0] + probes, probes)]
    assert gaps[:5] == [4, 8, 16, 32, 64] and max(gaps) == MAX_EXPLORE_WAIT
    assert len(probes) <= 12                  # 2000 plain steps, a dozen probes
    for _ in range(30):
        pol.update(3, 3)                      # the pair turned good: drafts chosen again
    assert pol.next() > 0 and pol.explore_wait == 4


def test_per_token_stop_drafts_its_first_step_and_probes_up_to_g_max():
    """With the per-token stop the draft's confidence decides where a step ends, so the generation's first
    step drafts (up to γ_max) even where the prior acceptance makes plain steps the step γ's choice, and so
    does every probe; the wait between probes still doubles; where drafting cannot pay, nothing drafts."""
    pol = AutoGamma(XEON, prior_alpha=0.3, explore_every=4, optimism=0.0, by_confidence=True)
    assert best_gamma(XEON, 0.3) == 0 and pol.next() == pol.g_max          # the first step drafts
    pol.update(0, 1, [0.2])                   # it stopped after one unsure token, rejected
    drafted = [i for i in range(1, 200) if pol.next() > 0]
    assert all(pol.chosen[i] == pol.g_max for i in drafted)                 # probes may draft long
    assert [b - a for a, b in zip([0] + drafted, drafted)][:4] == [4, 8, 16, 32]
    step = AutoGamma(XEON, prior_alpha=0.3, explore_every=4, optimism=0.0)
    assert step.next() == 0                   # the step γ alone starts plain, its probes draft one token
    assert AutoGamma(AMD, by_confidence=True).next() == 0                   # drafting cannot pay: plain


def _replay(policy_or_gamma, prof: CostProfile, alphas: tuple[float, float], switch: float, seed: int,
            tokens: int = 1500) -> float:
    """Modelled speedup over target-only of a policy (or a fixed γ) on an acceptance process that switches
    between an easy and a hard stretch (per-token acceptance ``alphas``) with probability ``switch`` per
    token: the engine's bookkeeping (plain steps feed the draft later) priced by ``prof``."""
    rng = random.Random(seed)
    easy, emitted, cost, unseen = True, 0, 0.0, 1

    def tick():
        nonlocal easy
        if rng.random() < switch:
            easy = not easy

    while emitted < tokens:
        g = policy_or_gamma.next(unseen) if isinstance(policy_or_gamma, AutoGamma) else policy_or_gamma
        cost += prof.step_cost(g, unseen=unseen)
        if g == 0:
            tick()
            emitted, unseen = emitted + 1, unseen + 1
            continue
        n = 0
        while n < g and rng.random() < alphas[0 if easy else 1]:
            n += 1
            tick()
        tick()
        if isinstance(policy_or_gamma, AutoGamma):
            policy_or_gamma.update(n, g)
        emitted, unseen = emitted + n + 1, 2 if n == g else 1
    return emitted * prof.step_cost(0) / cost


@pytest.mark.parametrize("alphas, switch, margin", [((0.9, 0.9), 0.0, 0.95), ((0.6, 0.6), 0.0, 0.95),
                                                    ((0.98, 0.5), 1 / 40, 1.0), ((0.95, 0.3), 1 / 20, 1.0)],
                         ids=["steady-0.9", "steady-0.6", "runs-0.98/0.5", "runs-0.95/0.3"])
def test_auto_tracks_the_best_fixed_gamma_and_rides_runs_of_full_acceptance(alphas, switch, margin):
    """On a steady acceptance auto is within 5% of the best fixed γ in hindsight; where acceptance comes
    in runs (easy and hard stretches) it beats every fixed γ, since a block accepted whole predicts a
    long next one (the policy's state). Modelled speedups, 3 seeds x 1500 tokens each."""
    seeds = range(3)
    auto = sum(_replay(AutoGamma(MIXED), MIXED, alphas, switch, s) for s in seeds)
    fixed = {g: sum(_replay(g, MIXED, alphas, switch, s) for s in seeds) for g in range(1, MIXED.g_max + 1)}
    assert auto >= margin * max(fixed.values()), (auto, fixed)


def test_a_block_accepted_whole_predicts_a_longer_next_one():
    pol = AutoGamma(MIXED, optimism=0.0)
    for _ in range(20):       # after a full block the next is accepted whole; after a rejection, it is not
        pol.state = 1
        pol.update(4, 4)
        pol.state = 0
        pol.update(1, 4)
    pol.state = 1
    after_full = pol.next()
    pol.state = 0
    after_reject = pol.next()
    assert pol.acceptance()[0] < 0.6 < pol.alpha < 0.9 and after_full > after_reject
    pol.state = 1
    assert after_full == best_gamma(MIXED, (80 + 4 * pol.alpha) / (80 + 4)) == best_gamma(MIXED, pol.acceptance()[0])


def test_other_load_sees_a_busy_machine():
    """Another process spinning on one of the cores takes a share of the machine's CPU that OtherLoad sees
    (this process's own CPU time is not counted)."""
    import os
    import subprocess
    import sys

    from verispec.engine.calibrate import OtherLoad, other_load_now

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)
        with OtherLoad() as load:
            t = time.perf_counter()
            while time.perf_counter() - t < 0.6:   # this process is busy too: not counted
                pass
        assert load.share >= 0.8 / (os.cpu_count() or 1)
    finally:
        spin.wait()
    assert 0.0 <= other_load_now(0.2) <= 1.0


def test_a_profile_measured_on_a_busy_machine_is_measured_again_once_quiet(tmp_path, monkeypatch, caplog):
    from verispec.engine import calibrate

    target, draft = FakeLM(vocab=4, seed=1), FakeLM(vocab=4, seed=2)
    prof, measured = cached_profile(target, draft, [0, 1], cache_dir=tmp_path, g_max=3)
    assert measured and prof.busy is not None and prof.measured_at is not None
    path = next(tmp_path.glob("*.json"))
    path.write_text(json.dumps(dataclasses.replace(prof, busy=0.6).to_json()))
    monkeypatch.setattr(calibrate, "other_load_now", lambda seconds=0.5: 0.5)     # still busy: used, with a warning
    with caplog.at_level(logging.WARNING, logger="verispec.costs"):
        again, measured = cached_profile(target, draft, [0, 1], cache_dir=tmp_path, g_max=3)
    assert not measured and again.busy == 0.6 and "still busy" in caplog.text
    monkeypatch.setattr(calibrate, "other_load_now", lambda seconds=0.5: 0.0)     # quiet now: measured again
    monkeypatch.setattr(calibrate, "OtherLoad", QuietLoad)
    fresh, measured = cached_profile(target, draft, [0, 1], cache_dir=tmp_path, g_max=3)
    assert measured and fresh.busy == 0.0
    assert CostProfile.from_json(json.loads(path.read_text())).busy == 0.0
    with pytest.raises(ValueError, match="busy"):
        dataclasses.replace(prof, busy=1.5)


class _StallsOnOneToken(_SlowLM):
    """A target whose one-token forwards stall on three calls out of five (another process took the CPU):
    a median of five would carry the stall into v(g)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.ones = 0

    def forward(self, tokens, *, all_logits=True):
        if len(tokens) == 1:
            self.ones += 1
            if self.ones % 5 in (1, 2, 3):
                time.sleep(0.05)
        return super().forward(tokens, all_logits=all_logits)


def test_forward_costs_are_the_fastest_of_their_rounds():
    from verispec.engine.calibrate import _forward_seconds

    target = _StallsOnOneToken(vocab=6, seed=1, delay=0.01)
    _, targets = _forward_seconds(target, None, [0, 1, 2], draft_sizes=(), target_sizes=(1, 2, 3), repeats=5)
    assert targets[1] < 0.03 and targets[2] >= targets[1] * 0.9   # the stall never enters: v(1) stays ~1


def test_the_draft_never_runs_where_no_draft_length_can_pay():
    """With a profile where drafting cannot pay even at α → 1 every step is plain: the draft model's
    prefill is deferred, so it is never called, and the target runs exactly as target-only sampling does
    (the whole prompt in one forward, then one forward per token: the same forwards, the same tokens);
    where drafting may pay the target feeds the prompt but its last token, and the draft is prefilled."""
    for prof, calls in ((AMD, 0), (XEON, None)):
        target, draft = _FeedLog(vocab=4, seed=1), _FeedLog(vocab=4, seed=2)
        out = generate(target, draft, [0, 1, 2], rule="lossless", sampling=T1, gamma="auto", max_new_tokens=20,
                       costs=prof, seed=5)
        if calls == 0:
            assert draft.feeds == [] and out.stats.draft_calls == 0 and out.stats.gamma_hist == [20]
            alone = _FeedLog(vocab=4, seed=1)
            reference = generate_target_only(alone, [0, 1, 2], sampling=T1, max_new_tokens=20, seed=5)
            assert target.feeds == alone.feeds == [3] + [1] * 19
            assert out.tokens == reference.tokens and out.stats.target_calls == reference.stats.target_calls == 20
        else:
            assert draft.feeds[0] == 2 and target.feeds[0] == 2     # the prompt but its last token
    # the plain-only prefill is a property of the policy: no step drafts, whatever the acceptance seen
    policy = AutoGamma(AMD, by_confidence=True)
    policy.update(5, 5, [0.99] * 5)
    assert not policy.pays_at_all and [policy.next(1) for _ in range(300)] == [0] * 300
