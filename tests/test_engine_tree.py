"""Tree speculative decoding in the engine: tree specs, tree growth, exactness in law, greedy equality,
cache handling, statistics, and the bench / diagnose plumbing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.fake_lm import FakeLM
from tests.helpers.laws import assert_law, exact_prefix_law, sample_prefixes
from tests.helpers.rule_cases import gof_pvalue
from verispec.engine import generate, generate_target_only
from verispec.engine.tree import TreeShape, grow_tree
from verispec.sampling import SamplingConfig

T1 = SamplingConfig.parse("temperature=1")
GREEDY = SamplingConfig.parse("temperature=0")
TREES = ["4,2,2,1", "topk:2,2", "iid:3,2", "wor:3,2", "dynamic:top_k=3,depth=4,nodes=10"]


# -- specs -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, kind, scheme, depth, nodes", [
    ("4,2,2,1", "static", "deterministic", 4, 4 + 8 + 16 + 16),
    ("topk:3", "static", "deterministic", 1, 3),
    ("iid:2,2", "static", "iid", 2, 6),
    ("wor:2,1", "static", "without_replacement", 2, 4),
    ("dynamic:top_k=10,depth=5,nodes=60", "dynamic", "deterministic", 5, 60),
    ("dynamic", "dynamic", "deterministic", 5, 60),
    ("dynamic:4,3,20", "dynamic", "deterministic", 3, 20),
])
def test_tree_shapes_parse_and_round_trip(text, kind, scheme, depth, nodes):
    shape = TreeShape.parse(text)
    assert (shape.kind, shape.scheme, shape.depth, shape.max_nodes) == (kind, scheme, depth, nodes)
    assert TreeShape.parse(shape.text()) == shape


def test_a_chain_is_the_tree_with_one_sampled_child_per_node():
    assert TreeShape.parse("iid:1,1,1") == TreeShape.chain(3)
    assert TreeShape.chain(3).is_chain and not TreeShape.parse("topk:1,1,1").is_chain


@pytest.mark.parametrize("text, words", [
    ("", "empty"), ("bogus:2", "unknown tree kind"), ("4,0", ">= 1"), ("4,x", "integers"),
    ("dynamic:top_k=0", "top_k"), ("dynamic:nodes=1000", "nodes"), ("16,16", "at most 255"),
])
def test_bad_tree_shapes_are_refused_clearly(text, words):
    with pytest.raises(ValueError, match=words):
        TreeShape.parse(text)


# -- growth ------------------------------------------------------------------------------------------
def _grow(text, *, vocab=12, seed=0, max_depth=None):
    draft = FakeLM(vocab=vocab, seed=7)
    draft.forward([1, 2])
    prop = grow_tree(draft, [3], TreeShape.parse(text), T1, vocab, torch.Generator().manual_seed(seed),
                     max_depth=max_depth)
    return draft, prop


@pytest.mark.parametrize("text", TREES)
def test_grown_trees_have_the_promised_shape(text):
    shape = TreeShape.parse(text)
    draft, prop = _grow(text)
    depths = prop.depths()
    assert all(par < i for i, par in enumerate(prop.parents))            # parents first
    assert prop.n_nodes <= shape.max_nodes
    assert max(depths) == shape.depth - 1 if shape.kind == "static" else max(depths) <= shape.depth - 1
    assert prop.q.shape == (prop.n_nodes + 1, 12)
    torch.testing.assert_close(prop.q.sum(-1), torch.ones(prop.n_nodes + 1))
    if shape.kind == "static":
        for node in [-1] + [i for i in range(prop.n_nodes) if depths[i] < shape.depth - 1]:
            d = 0 if node < 0 else depths[node] + 1
            assert len(prop.children(node)) == shape.branching[d]
    # the draft model saw the expanded nodes once each (dynamic: also expanded nodes not kept), one
    # forward per depth but the last, plus the root's
    kept_seen = sum(1 for i in prop.in_draft if i >= 0)
    assert draft.n_tree == kept_seen if shape.kind == "static" else draft.n_tree >= kept_seen
    assert prop.draft_forwards == shape.depth
    for i, j in enumerate(prop.in_draft):
        if j >= 0:
            assert draft.tree[j][0] == prop.tokens[i]


def test_deterministic_candidates_are_the_drafts_best_tokens_in_rank_order():
    draft, prop = _grow("topk:3,2")
    logits = FakeLM(vocab=12, seed=7).next_logits([1, 2, 3])
    assert [prop.tokens[i] for i in prop.children(-1)] == torch.topk(logits, 3).indices.tolist()
    for node in prop.children(-1):
        kids = [prop.tokens[i] for i in prop.children(node)]
        best = torch.topk(FakeLM(vocab=12, seed=7).next_logits([1, 2, 3, prop.tokens[node]]), 2).indices
        assert kids == best.tolist()


def test_dynamic_tree_keeps_the_best_nodes_by_cumulative_draft_log_probability():
    """Brute force from scratch (no cache): per depth the top_k candidates are expanded, each proposing
    its top_k children; the kept tree is the ``nodes`` best candidates; siblings come in rank order."""
    k, depth, nodes = 3, 3, 7
    draft, prop = _grow(f"dynamic:top_k={k},depth={depth},nodes={nodes}")
    lm = FakeLM(vocab=12, seed=7)

    def children(path, score):
        logp = torch.log_softmax(lm.next_logits([1, 2, 3] + list(path)).double(), -1)
        top = torch.topk(logp, k)
        return [(path + (t,), score + lp) for lp, t in zip(top.values.tolist(), top.indices.tolist())]

    level = children((), 0.0)
    candidates = list(level)
    for _ in range(1, depth):
        expanded = sorted(level, key=lambda c: -c[1])[:k]
        level = [c for path, score in expanded for c in children(path, score)]
        candidates += level
    best = {path for path, _ in sorted(candidates, key=lambda c: -c[1])[:nodes]}

    def path_of(i):
        out = []
        while i >= 0:
            out.append(prop.tokens[i])
            i = prop.parents[i]
        return tuple(out[::-1])

    assert {path_of(i) for i in range(prop.n_nodes)} == best
    score = {path: s for path, s in candidates}
    for node in [-1] + list(range(prop.n_nodes)):
        kids = [score[path_of(i)] for i in prop.children(node)]
        assert kids == sorted(kids, reverse=True)


def test_sampled_children_without_replacement_are_distinct_and_iid_children_may_repeat():
    repeats = 0
    for seed in range(30):
        _, prop = _grow("wor:4,1", vocab=5, seed=seed)
        kids = [prop.tokens[i] for i in prop.children(-1)]
        assert len(set(kids)) == len(kids)
        _, prop = _grow("iid:4,1", vocab=5, seed=seed)
        kids = [prop.tokens[i] for i in prop.children(-1)]
        repeats += len(set(kids)) < len(kids)
    assert repeats > 0


# -- decoding ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tree", TREES + ["topk:1,1,1"])
def test_greedy_tree_sd_equals_greedy_target_only(tree):
    target, draft = FakeLM(vocab=6, seed=1), FakeLM(vocab=6, seed=2)
    ref = generate_target_only(target, [1, 2, 3], sampling=GREEDY, max_new_tokens=40)
    for rule in ("lossless", "greedy"):
        res = generate(target, draft, [1, 2, 3], rule=rule, sampling=GREEDY, tree=tree, max_new_tokens=40)
        assert res.tokens == ref.tokens


@pytest.mark.parametrize("tree", TREES + ["iid:1,1,1"])
def test_every_step_sees_caches_that_hold_exactly_the_committed_text(tree):
    """At every verification the target's p and the draft's q rows are those of the committed text plus
    the node's path (FakeLM logits are a function of the whole prefix), whatever the previous steps
    accepted; sampled decoding so that paths of every length occur."""
    target, draft = FakeLM(vocab=6, seed=1), FakeLM(vocab=6, seed=2)
    prompt = [1, 2, 3]
    text = list(prompt)
    checked = [0]

    def check(step):
        prop = step.proposal
        for row in range(prop.n_nodes + 1):
            path, node = [], row - 1
            while node >= 0:
                path.append(prop.tokens[node])
                node = prop.parents[node]
            want = T1.process(target.next_logits(text + path[::-1])[None])[0]
            torch.testing.assert_close(step.p[row], want)
            if row == 0 or prop.expanded[row - 1]:
                torch.testing.assert_close(prop.q[row], T1.process(draft.next_logits(text + path[::-1])[None])[0])
        text.extend([prop.tokens[i] for i in step.path] + [step.next_token])
        checked[0] += 1

    for seed in range(3):
        text[:] = prompt
        generate(target, draft, prompt, rule="lossless", sampling=T1, tree=tree, max_new_tokens=30, seed=seed,
                 observers=[check])
    assert checked[0] >= 6


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["topk:2,2", "iid:2,2", "wor:2,2", "dynamic:top_k=2,depth=2,nodes=4"])
def test_lossless_tree_sd_samples_the_target_law(tree):
    """Through real tree growth, tree forwards and path commits, lossless tree SD gives the exact law of
    the first 3 tokens (chi-square, α = ALPHA); lenience 0.5 on the same tree is rejected (power)."""
    target, draft = FakeLM(vocab=3, seed=1), FakeLM(vocab=3, seed=2)
    prompt = [0, 1]
    law = exact_prefix_law(target, prompt, 3, T1)
    run = lambda rule: (lambda s: generate(target, draft, prompt, rule=rule, sampling=T1, tree=tree,
                                           max_new_tokens=3, seed=s))
    assert_law(sample_prefixes(run("lossless"), 4000, 3), law)
    if not tree.startswith(("iid", "wor")):
        lossy = sample_prefixes(run("lenience:ell=0.5"), 4000, 3)
        keys = sorted(set(law) | set(lossy))
        assert gof_pvalue(np.array([lossy.get(k, 0) for k in keys]), np.array([law.get(k, 0.0) for k in keys])) < 1e-6


@pytest.mark.slow
def test_stopping_on_draft_confidence_keeps_lossless_exact_and_shortens_drafts():
    """The draft stops at its first token below ``draft_stop``: the law of the first 3 tokens is still
    the target's (chi-square, α = ALPHA), and the drafted lengths recorded are shorter."""
    target, draft = FakeLM(vocab=3, seed=1), FakeLM(vocab=3, seed=2)
    prompt = [0, 1]
    law = exact_prefix_law(target, prompt, 3, T1)
    run = lambda s: generate(target, draft, prompt, rule="lossless", sampling=T1, gamma=3, max_new_tokens=3,
                             seed=s, draft_stop=0.5)
    assert_law(sample_prefixes(run, 4000, 3), law)


def test_stopping_on_draft_confidence_shortens_drafts():
    target, draft = FakeLM(vocab=6, seed=1), FakeLM(vocab=6, seed=2)
    full = generate(target, draft, [1, 2], rule="lossless", sampling=T1, gamma=4, max_new_tokens=60, seed=0)
    short = generate(target, draft, [1, 2], rule="lossless", sampling=T1, gamma=4, max_new_tokens=60, seed=0,
                     draft_stop=0.4)
    assert full.stats.mean_gamma > short.stats.mean_gamma > 0
    assert short.stats.gamma_hist[1] > 0 and sum(short.stats.accepted_hist) == sum(short.stats.gamma_hist[1:])
    with pytest.raises(ValueError, match="draft_stop"):
        generate(target, draft, [1, 2], rule="lossless", sampling=T1, gamma=4, max_new_tokens=6, draft_stop=1.5)


def test_tree_statistics_are_consistent():
    target, draft = FakeLM(vocab=6, seed=1), FakeLM(vocab=6, seed=2)
    res = generate(target, draft, [1, 2, 3], rule="lossless", sampling=T1, tree="4,2,2", max_new_tokens=60, seed=3)
    st = res.stats
    assert st.tree == "topk:4,2,2" and st.gamma == 3
    tree_steps = sum(st.accepted_hist)
    assert tree_steps + st.gamma_hist[0] == st.target_calls and len(st.accepted_hist) <= 4
    assert st.nodes_per_call == pytest.approx(st.tree_nodes / tree_steps) and st.nodes_per_call <= 4 + 8 + 16
    emitted = sum(n * k for n, k in enumerate(st.accepted_hist)) + st.target_calls
    assert emitted >= st.new_tokens  # the last step may be cut by the budget
    assert st.draft_calls == 3 * tree_steps  # pending + 2 expanded depths per tree step


def test_rules_without_a_tree_form_are_refused_before_decoding():
    target, draft = FakeLM(vocab=6, seed=1), FakeLM(vocab=6, seed=2)
    with pytest.raises(ValueError, match="chains only"):
        generate(target, draft, [1, 2], rule="block", sampling=T1, tree="2,2", max_new_tokens=5)
    with pytest.raises(ValueError, match="deterministic"):
        generate(target, draft, [1, 2], rule="lenience:ell=0.5", sampling=T1, tree="iid:2,2", max_new_tokens=5)
    with pytest.raises(ValueError, match="auto"):
        generate(target, draft, [1, 2], rule="lossless", sampling=T1, tree="2,2", gamma="auto", max_new_tokens=5)
    assert target.forward_calls == 0


def test_the_budget_holds_with_trees():
    target, draft = FakeLM(vocab=6, seed=1), FakeLM(vocab=6, seed=2)
    for max_new in (1, 2, 3, 7):
        res = generate(target, draft, [1], rule="lossless", sampling=T1, tree="3,3,3", max_new_tokens=max_new)
        assert len(res.tokens) == max_new


# -- bench and diagnose plumbing ---------------------------------------------------------------------
def test_bench_runs_carry_the_tree_and_chain_run_ids_do_not_change():
    from verispec.bench.records import RunKey
    from verispec.bench.runner import BenchConfig, plan_runs

    key = RunKey(dataset="d", rule="lossless", sampling="", gamma=5, draft="a", target="b", max_new_tokens=8, seed=0)
    assert "tree" not in key.to_dict()
    cfg = BenchConfig(datasets=["gsm8k"], rules=["lenience:ell=0.5"], trees=["4,2"])
    runs = plan_runs(cfg, "draft", "target")
    sd = [r for r in runs if r.rule]
    assert sd and all(r.key.tree == "topk:4,2" and r.key.gamma == 2 for r in sd)
    assert all(r.key.tree == "" for r in runs if not r.rule)
    with pytest.raises(ValueError, match="tree"):
        BenchConfig(datasets=["gsm8k"], trees=["x:1"]).validate()
    # a chain spec is the ordinary chain (same run ids as --gamma); rules without a tree form and
    # prompt lookup are refused before anything runs
    chain = plan_runs(BenchConfig(datasets=["gsm8k"], rules=["lenience:ell=0.5"], trees=["chain:3"]), "d", "t")
    same = plan_runs(BenchConfig(datasets=["gsm8k"], rules=["lenience:ell=0.5"], gammas=[3]), "d", "t")
    assert {r.key.run_id for r in chain} == {r.key.run_id for r in same}
    with pytest.raises(ValueError, match="point mass"):
        BenchConfig(datasets=["gsm8k"], rules=["cos_we:lam=0.5"], trees=["4,2"]).validate()
    with pytest.raises(ValueError, match="lookup"):
        BenchConfig(datasets=["gsm8k"], rules=["lossless"], trees=["4,2"], lookup=True).validate()


def test_tree_form_diagnosis_is_exact_on_recorded_trees():
    """Lossless: zero distortion in both forms; the expected tokens per call computed from the recorded
    trees matches the mean accepted path length actually observed (law of large numbers); lenience
    accepts at least as much as lossless and distorts more in tree form than at the same nodes in chain
    form (the point-mass candidates collapse onto the draft's top choice)."""
    from verispec.diagnose.tree_form import collect_tree_corpus, summarize_tree_form

    class Problem:
        def __init__(self, i):
            self.dataset, self.id, self.prompt = "toy", str(i), "ab"[: 1 + i % 2] + "c" * i

    target, draft = FakeLM(vocab=5, seed=1, scale=2.0), FakeLM(vocab=5, seed=2, scale=2.0)
    corpus = collect_tree_corpus(target, draft, [Problem(i) for i in range(6)], sampling=T1, tree="3,2",
                                 max_new_tokens=40, seed=0, progress=False)
    lossless, lenient = summarize_tree_form(corpus, ["lossless", "lenience:ell=0.3"])
    assert lossless["tree_form"]["tv"] == pytest.approx(0, abs=1e-9)
    assert lossless["chain_form"]["tv"] == pytest.approx(0, abs=1e-9)
    assert lenient["tree_form"]["tv"] > 0 and lenient["tokens_per_call"] >= lossless["tokens_per_call"]
    # the exact expectation against the path lengths the lossless run realised on the same trees
    steps = corpus.steps()
    realised = np.mean([1 + sum(corpus.layout["on_path"][r] for r in rows[1:]) for rows in steps])
    assert abs(realised - lossless["tokens_per_call"]) < 4 * 1.5 / np.sqrt(len(steps))


def test_tree_corpus_round_trips(tmp_path):
    from verispec.diagnose.tree_form import TreeCorpus, collect_tree_corpus

    class Problem:
        dataset, id, prompt = "toy", "0", "abc"

    target, draft = FakeLM(vocab=5, seed=1), FakeLM(vocab=5, seed=2)
    corpus = collect_tree_corpus(target, draft, [Problem()], sampling=T1, tree="2,2", max_new_tokens=10, seed=0,
                                 progress=False)
    corpus.save(tmp_path / "t.npz")
    back = TreeCorpus.load(tmp_path / "t.npz")
    assert back.layout == corpus.layout and back.tree == "topk:2,2" and len(back) == len(corpus)


def test_run_diagnose_with_a_tree_writes_the_tree_form_and_reuses_its_corpus(tmp_path):
    """``diagnose --tree``: chain and tree corpora recorded through the engine, tree_form.{json,md,png}
    written, rules without a tree form reported with the reason, the tree corpus reused on a re-run
    (also when the spec is written differently), sampled trees refused."""
    from tests.helpers.bench_fakes import config, fake_models
    from verispec.diagnose.run import DiagnoseConfig, run_diagnose

    data = config(tmp_path, rules=["lossless"], n_rows=3)
    specs = ["lossless", "lenience:ell=0.5", "speccascade:p_base=0.3", "cos_we:lam=0.5"]
    cfg = DiagnoseConfig(datasets=data.datasets, question_field="question", answer_field="answer", id_field="id",
                         checker="gsm8k", limit=2, rules=specs, sampling="temperature=1", gamma=3, max_new_tokens=10,
                         out=str(tmp_path / "diag"), tree="3,2")
    logs: list[str] = []
    loads: list[int] = []

    def counted(*args, **kw):
        loads.append(1)
        return fake_models(*args, **kw)

    result = run_diagnose(cfg, progress=False, log=logs.append, load_models=counted)
    assert len(loads) == 1   # both corpora recorded with one model pair
    by_rule = {e["rule"]: e for e in result["tree_form"]}
    assert by_rule["lossless"]["tree_form"]["tv"] == pytest.approx(0, abs=1e-9)
    assert by_rule["lenience:ell=0.5"]["n_decision_nodes"] > 0 and by_rule["lenience:ell=0.5"]["tokens_per_call"] > 1
    assert "point mass" in by_rule["cos_we:lam=0.5"]["note"]
    for name in ("tree_form.json", "tree_form.md", "tree_form.png", "tree_corpus.npz"):
        assert (tmp_path / "diag" / name).stat().st_size > 0
    cfg.tree = "topk:3,2"
    run_diagnose(cfg, progress=False, log=logs.append, load_models=None)
    assert any("reusing" in m and "tree nodes" in m for m in logs)
    cfg.tree = "iid:3,2"
    with pytest.raises(ValueError, match="deterministic"):
        run_diagnose(cfg, progress=False, log=logs.append, load_models=fake_models)


def test_bench_plans_and_runs_gamma_auto_beside_fixed_gamma(tmp_path, monkeypatch):
    """``bench --gamma auto``: SD runs keyed apart from fixed γ (fixed-γ run ids unchanged), run with the
    cost profile, reported as γ = auto."""
    from tests.helpers.bench_fakes import DigitLM, config, fake_models
    from verispec.bench import runner
    from verispec.bench.records import RunKey
    from verispec.bench.rows import collect_rows

    plan = runner.plan_runs(runner.BenchConfig(datasets=["gsm8k"], rules=["lenience:ell=0.5"], gammas=[3, "auto"]),
                            "d", "t")
    auto = [r for r in plan if r.key.gamma_policy == "auto"]
    assert auto and all(r.rule for r in auto) and {r.key.role for r in auto} == {"method", "lossless_ref"}
    fixed = RunKey(dataset="gsm8k", rule="lenience:ell=0.5", sampling=auto[0].key.sampling, gamma=3, draft="d",
                   target="t", max_new_tokens=auto[0].key.max_new_tokens, seed=0)
    assert fixed.run_id in {r.key.run_id for r in plan} and "gamma_policy" not in fixed.to_dict()

    monkeypatch.delenv("VERISPEC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # the fake pair's cost profile goes here
    cfg = config(tmp_path, rules=["lenience:ell=0.5"], n_rows=2)
    cfg.gammas = ["auto"]
    out, _ = runner.run_bench(cfg, progress=False, load_models=fake_models, log=lambda m: None, report=True)
    rows = [r for r in collect_rows(out) if r.key.gamma_policy == "auto"]
    assert rows and all(r.gamma_label == "auto" for r in rows)
    assert "| auto |" in (out / "report.md").read_text()
    assert len(list((tmp_path / "cache" / "verispec" / "costs").iterdir())) == 1   # measured once, cached
    # prompt lookup alone: auto weighs its free drafts with the target's own profile (a second file)
    (tmp_path / "ngram").mkdir()
    cfg = config(tmp_path / "ngram", rules=["lossless"], n_rows=2, draft="ngram", gammas=["auto"], max_new_tokens=4)
    target_alone = lambda cfg, need_draft: (DigitLM(1), None, 10)   # what load_pair gives for draft="ngram"
    out, _ = runner.run_bench(cfg, progress=False, load_models=target_alone, log=lambda m: None, report=False)
    rows = [r for r in collect_rows(out) if r.key.gamma_policy == "auto"]
    assert rows and all(r.gamma_label == "auto" for r in rows)
    assert len(list((tmp_path / "cache" / "verispec" / "costs").iterdir())) == 2
