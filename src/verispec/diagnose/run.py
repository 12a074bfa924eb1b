"""`verispec diagnose`: record real verified positions, measure every rule's distortion, write figures.

1. Generate each benchmark prompt with lossless SD (its trajectory follows the target exactly) and
   record the drafted positions' (p, q) compactly (:class:`PositionRecorder`), saved to
   ``corpus.npz``; a re-run with the same settings reuses it.
2. For every rule spec: TV / KL between ``induced`` and ``reference``, overshoot, ceiling ratio, tail
   leak, acceptance, tokens per call (:func:`summarize`) -> ``diagnostics.json``, ``diagnostics.md``.
3. Figures: the frontier in distribution space, distortion vs target entropy, and a Figure-2-style
   view of the position where the rules disagree most.
4. With ``bench_dir``: the rank correlation between each rule's mean distortion and its accuracy gap
   to its true baseline in that bench (``correlation.json``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verispec import rules as rule_registry
from verispec.settings import DataSettings, ModelSettings

DEFAULT_DIAGNOSE_RULES = (
    "lossless",
    "typical:eps=0.05", "typical:eps=0.15", "typical:eps=0.25",
    "speccascade:p_base=0.1", "speccascade:p_base=0.3", "speccascade:p_base=0.5",
    "speccascade:p_base=0.7", "speccascade:p_base=0.9",
    "lenience:ell=0.2", "lenience:ell=0.4", "lenience:ell=0.6", "lenience:ell=0.8",
    "ceiling:kappa=5,base=we,lam=0.5", "ceiling:kappa=2.5,base=we,lam=0.5",
    "ceiling:kappa=1.6667,base=we,lam=0.5", "ceiling:kappa=1.25,base=we,lam=0.5",
    "cos_we:lam=0.2", "cos_we:lam=0.5", "cos_we:lam=0.8",
    "cos_cd:mu=0.1", "cos_cd:mu=0.5",
)


@dataclass
class DiagnoseConfig(DataSettings, ModelSettings):
    """A diagnose invocation: the problems (:class:`~verispec.settings.DataSettings`), the model pair
    (:class:`~verispec.settings.ModelSettings`), one decoding setting and the rules to measure."""

    datasets: list[str] = field(default_factory=lambda: ["gsm8k", "math500"])
    limit: int | None = 5
    rules: list[str] = field(default_factory=lambda: list(DEFAULT_DIAGNOSE_RULES))
    sampling: str = "temperature=0.7,top_k=20,top_p=0.8"
    gamma: int = 5
    max_new_tokens: int = 128
    seed: int = 0
    out: str = "verispec-out/diagnose"
    bench_dir: str | None = None
    recollect: bool = False
    tree: str | None = None   # also record trees of this spec and report each rule's tree form

    def tree_corpus_key(self) -> dict:
        from verispec.engine.tree import TreeShape

        key = {**self.corpus_key(), "tree": TreeShape.parse(self.tree).text()}
        del key["gamma"]   # a tree has its own depth
        return key

    def corpus_key(self) -> dict:
        """The settings the recorded corpus depends on (rules and outputs do not matter)."""
        keys = ("datasets", "sampling", "gamma", "limit", "offset", "max_new_tokens", "seed", "draft", "target",
                "data_dir", "question_field", "answer_field", "id_field", "checker")
        return {k: getattr(self, k) for k in keys}


def run_diagnose(cfg: DiagnoseConfig, *, progress: bool = True, log=None, load_models=None,
                 accuracy_gaps: Callable[[str], Mapping[str, float]] | None = None, pool=None,
                 batch_size: int | None = None, batch_invariant: bool = False) -> dict:
    """Record (or reuse) the corpus, summarise every rule, write the outputs; returns the summary,
    plot paths and, with ``cfg.bench_dir``, the rank correlation with the accuracy gaps that
    ``accuracy_gaps(bench_dir)`` reads from that bench (``verispec.bench.cli.accuracy_gaps``: the
    bench sits above this layer, so the caller passes it)."""
    from verispec.diagnose.corpus import collect_corpus
    from verispec.diagnose.plots import plot_distortion_vs_entropy, plot_frontier, plot_position
    from verispec.diagnose.record import PositionRecorder
    from verispec.diagnose.summary import (
        distortion_by_rule,
        rank_correlation,
        summarize,
        to_jsonable,
        write_diagnostics_json,
        write_diagnostics_markdown,
    )
    from verispec.sampling import SamplingConfig

    log = log or (lambda msg: print(msg, file=sys.stderr))
    from verispec.diagnose.measures import check_measurable

    for spec in cfg.rules:
        check_measurable(rule_registry.get(spec))
    if cfg.gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {cfg.gamma}")
    from verispec.models import is_ngram_draft

    if is_ngram_draft(cfg.draft) or cfg.lookup:
        raise ValueError("diagnose measures rules on the draft model's distribution q; prompt lookup has none "
                         "(drop --draft ngram / --lookup)")
    if cfg.tree:
        from verispec.engine.tree import TreeShape

        if TreeShape.parse(cfg.tree).scheme != "deterministic":
            raise ValueError(f"diagnose measures tree forms on deterministic candidates (topk:... or dynamic:...); "
                             f"{cfg.tree!r} samples its children, whose law is an average over draws that one "
                             "recorded tree cannot show")
    if cfg.bench_dir and accuracy_gaps is None:
        raise ValueError("bench_dir is set but no accuracy_gaps reader was passed (verispec.bench.cli.accuracy_gaps)")
    sampling = SamplingConfig.parse(cfg.sampling)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    options = dict(sampling=sampling, gamma=cfg.gamma, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                   recorder=PositionRecorder(), progress=progress)
    workers_load = load_models
    load_models = _load_once(load_models)   # the chain and tree corpora record with the same pair
    if batch_size is not None:   # batch_size prompts decoded together on batched backends
        if cfg.tree:
            raise ValueError("--batch-size records chains; the tree corpus (--tree) is recorded one prompt at a time "
                             "(drop one)")
        from verispec.diagnose.corpus import collect_corpus_batched

        def batched(c: DiagnoseConfig, need_draft: bool = True):
            from verispec.models import load_pair

            extra = {"batch_invariant": True} if batch_invariant else {}
            return (workers_load or load_pair)(c, need_draft=need_draft, batch_size=batch_size, **extra)

        loader = _load_once(batched)
        record = lambda target, draft, problems: collect_corpus_batched(  # noqa: E731
            target, draft, problems, batch_size=batch_size, **options)
    elif pool is not None:   # one unit per prompt on the pool's Ray workers: no pair loaded in this process
        from verispec.diagnose.corpus import collect_corpus_on_workers

        loader = None
        record = lambda _target, _draft, problems: collect_corpus_on_workers(  # noqa: E731
            cfg, problems, pool=pool, load_models=workers_load, **options)
    else:
        loader = load_models
        record = lambda target, draft, problems: collect_corpus(target, draft, problems, **options)  # noqa: E731
    corpus = _reuse_or_record(cfg, out / "corpus.npz", cfg.corpus_key(), PositionRecorder.load, "positions", log,
                              loader, record)

    summary = summarize(corpus, cfg.rules, gamma=cfg.gamma)
    write_diagnostics_json(out / "diagnostics.json", summary)
    write_diagnostics_markdown(out / "diagnostics.md", summary)
    plots = [
        plot_frontier(summary, out / "frontier_distribution.png"),
        plot_distortion_vs_entropy(summary, out / "distortion_vs_entropy.png"),
    ]
    figure2_rules = ["lossless", "lenience:ell=0.4", "cos_we:lam=0.5", "speccascade:p_base=0.3", "typical:eps=0.15"]
    index = _most_contested_position(corpus)
    if index is not None:
        plots.append(plot_position(corpus, index, figure2_rules, out / "figure2_position.png"))
    result = {"summary": summary, "plots": [str(p) for p in plots], "n_positions": len(corpus), "out": str(out)}
    if cfg.tree:
        result["tree_form"] = _tree_form(cfg, sampling, out, log, load_models, progress)
    if cfg.bench_dir:
        gaps = dict(accuracy_gaps(cfg.bench_dir))
        corr = rank_correlation(distortion_by_rule(summary), gaps)
        (out / "correlation.json").write_text(json.dumps({"accuracy_gap": gaps, **to_jsonable(corr)}, indent=2))
        result["correlation"] = corr
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    return result


def _load_once(load_models):
    """``load_models`` (default :func:`verispec.models.load_pair`) that builds the pair on its first
    call only and returns the same models afterwards."""
    pair: list = []

    def load(cfg: DiagnoseConfig, need_draft: bool = True):
        if not pair:
            from verispec.models import load_pair

            pair.append((load_models or load_pair)(cfg, need_draft=need_draft))
        return pair[0]

    return load


def _reuse_or_record(cfg: DiagnoseConfig, path: Path, key: dict, load, what: str, log, load_models, record):
    """The corpus at ``path`` when ``path.json`` says it was recorded with ``key`` (and no
    ``recollect``); else ``record(target, draft, problems)`` on the configured problems, saved with
    its key."""
    key_path = path.with_suffix(".json")
    if path.exists() and key_path.exists() and not cfg.recollect and json.loads(key_path.read_text()) == key:
        corpus = load(path)
        log(f"diagnose: reusing {len(corpus)} recorded {what} from {path}")
        return corpus
    from verispec.tasks.datasets import load_problems

    problems = [p for ps in load_problems(cfg, log).values() for p in ps]
    target, draft, _ = load_models(cfg, need_draft=True) if load_models else (None, None, None)
    corpus = record(target, draft, problems)
    corpus.save(path)
    key_path.write_text(json.dumps(key))
    log(f"diagnose: recorded {len(corpus)} {what} -> {path}")
    return corpus


def _tree_form(cfg: DiagnoseConfig, sampling, out: Path, log, load_models, progress: bool) -> list[dict]:
    """Record (or reuse) the tree corpus and summarise every rule's tree form beside its chain form;
    writes ``tree_form.json`` and ``tree_form.md``."""
    from verispec.diagnose.summary import to_jsonable
    from verispec.diagnose.tree_form import TreeCorpus, collect_tree_corpus, summarize_tree_form, tree_form_markdown

    corpus = _reuse_or_record(
        cfg, out / "tree_corpus.npz", cfg.tree_corpus_key(), TreeCorpus.load, "tree nodes", log, load_models,
        lambda target, draft, problems: collect_tree_corpus(
            target, draft, problems, sampling=sampling, tree=cfg.tree, max_new_tokens=cfg.max_new_tokens,
            seed=cfg.seed, progress=progress))
    summary = summarize_tree_form(corpus, cfg.rules)
    (out / "tree_form.json").write_text(json.dumps(to_jsonable(summary), indent=2))
    (out / "tree_form.md").write_text(tree_form_markdown(summary))
    from verispec.diagnose.plots import plot_tree_form

    plot_tree_form(summary, out / "tree_form.png")
    return summary


#: Positions shown in the Figure-2 view need an uncertain target (nats), else every rule looks alike.
FIGURE2_MIN_ENTROPY = 0.5


def _most_contested_position(corpus) -> int | None:
    """The recorded position where the draft overshoots the target the most (max Σ(q − p)+), among
    positions whose target entropy is at least :data:`FIGURE2_MIN_ENTROPY` when there are any."""
    import torch

    from verispec.diagnose.measures import overshoot_mass

    if len(corpus) == 0:
        return None
    p, q, _ = corpus.dense()
    overshoot = overshoot_mass(q, p)
    entropy = torch.as_tensor(corpus.arrays["target_entropy"].astype("float64"))
    uncertain = entropy >= FIGURE2_MIN_ENTROPY
    if uncertain.any():
        overshoot = torch.where(uncertain, overshoot, torch.full_like(overshoot, -1.0))
    return int(overshoot.argmax())
