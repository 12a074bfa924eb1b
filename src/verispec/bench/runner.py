"""Benchmark runs and sweeps: every lossy rule beside its true baseline, resumable, with progress.

A *run* is (draft, target, rule spec, sampling, γ, dataset, max_new_tokens, seed); each problem is
sampled ``n_samples`` times. Sample ``k`` of a problem uses a seed derived from (seed, dataset,
problem id, k) only, so every run sees the same seeds on the same problems: outcomes are paired.

For each (dataset, sampling, γ) the plan holds
  * ``target_only``   — the target sampled with the sampling config (the ground truth);
  * ``lossless_ref``  — lossless SD with the same sampling (the speed reference);
  * per lossy rule a ``method`` run, paired with its **true baseline**: target-only sampling with the
    rule's truncation added (min-p for SpecCascade, η for typical acceptance; a ``baseline`` run),
    or the plain ``target_only`` run for lossless and collaborative rules.

Rows go to a SQLite :class:`~verispec.bench.store.ResultStore`, one committed row per sample, so a
re-run of the same command skips finished rows and a kill loses at most the row in flight. Work is
done problem-major (each problem through every run before the next problem), so an interrupted
bench still compares all rules on the same problems.

A :class:`Unit` (run, problem, sample) is what an :class:`Executor` runs: :class:`LocalExecutor` in
this process, one unit after another (the default), or
:class:`~verispec.bench.distributed.RayExecutor` on Ray workers (``--workers``, ``--ray-address``).
Either hands each :class:`UnitResult` back to :meth:`Bench.run`, which writes the unit's files (the
positions a worker recorded) and then commits its row: the store is written by this process alone.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from verispec import rules as rule_registry
from verispec.bench.executors import (
    BatchExecutor,
    Executor,
    LocalExecutor,
    PlannedRun,
    Unit,
    UnitResult,
    check_batchable,
)
from verispec.bench.records import RunKey
from verispec.bench.store import ResultStore
from verispec.engine.costs import DEFAULT_G_MAX
from verispec.engine.tree import TreeShape
from verispec.models import check_model_sources, is_ngram_draft
from verispec.outputs import OutputError, atomic_path, check_out_dir, ensure_out_dir, os_error_text, write_text_atomic
from verispec.params import check_number, shown
from verispec.sampling import SamplingConfig
from verispec.settings import (
    MAX_CHECK_TIMEOUT_S,
    MAX_FEW_SHOT,
    MAX_GAMMA,
    MAX_N_CTX,
    MAX_PROBLEMS,
    MAX_SAMPLES,
    MAX_SEED,
    ClusterSettings,
    DataSettings,
    ModelSettings,
    check_model_settings,
    check_token_budget,
)
from verispec.tasks.checkers import CHECKERS
from verispec.tasks.datasets import Problem, load_problems
from verispec.tasks.sandbox import require_contained

TARGET_ONLY = "target_only"
STORE_NAME = "results.sqlite"

#: The main job: `verispec bench` with no arguments (sized to finish in ~15 minutes on 2 CPU cores).
DEFAULT_DATASET = "humaneval"
DEFAULT_LIMIT = 3
DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_RULES = (
    "lossless",  # the speed reference; its runs also record (p, q) for the per-token distortion
    # Truncation rules beside their true baselines (target with min-p 0.3 / η) and, in the report,
    # beside plain target sampling, the wrong baseline.
    "speccascade:p_base=0.3",
    "typical:eps=0.15",
    # Lenience ℓ = 0.5 is the same rule as the ceiling κ = 2 on p: one of them.
    "lenience:ell=0.5",
    # CoS-WE and the ceiling that caps its overshoot, on the same collaborative target.
    "cos_we:lam=0.5",
    "ceiling:kappa=2,base=we,lam=0.5",
)
DEFAULT_SAMPLING = "temperature=0.7,top_k=20,top_p=0.8"
DEFAULT_OUT = "verispec-out/bench"


@dataclass
class BenchConfig(DataSettings, ModelSettings):
    """Everything that defines a bench invocation (CLI flags or a sweep file): the problems
    (:class:`~verispec.settings.DataSettings`), the model pair (:class:`~verispec.settings.ModelSettings`)
    and the grid below."""

    datasets: list[str] = field(default_factory=lambda: [DEFAULT_DATASET])
    limit: int | None = DEFAULT_LIMIT
    rules: list[str] = field(default_factory=lambda: list(DEFAULT_RULES))
    samplings: list[str] = field(default_factory=lambda: [DEFAULT_SAMPLING])
    gammas: list[int | str] = field(default_factory=lambda: [5])   # "auto": chosen per step (cost model)
    # draft shapes of the SD runs, replacing ``gammas`` when given (``chain:5`` is the chain of γ 5)
    trees: list[str] = field(default_factory=list)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = 0
    n_samples: int = 1
    out: str = DEFAULT_OUT
    few_shot: int = 0
    baselines: bool = True
    lossless_ref: bool = True
    target_only: bool = True
    check_timeout_s: float = 10.0

    def validate(self) -> None:
        check_field_types(self)
        for name in ("datasets", "rules", "trees"):
            if any(not v.strip() for v in getattr(self, name)):
                raise ValueError(f"{name} holds an empty string: remove it")
        if not self.datasets:
            raise ValueError("no dataset given (--dataset)")
        if not self.rules and not (self.target_only or self.lossless_ref):
            raise ValueError("nothing to run: give --rules or keep the target-only / lossless reference runs")
        for spec in self.rules:
            rule_registry.get(spec)
        for s in self.samplings:
            SamplingConfig.parse(s)
        for t in self.trees:
            shape = TreeShape.parse(t)
            if shape.is_chain:
                continue
            if self.lookup or is_ngram_draft(self.draft):
                raise ValueError(f"prompt lookup drafts chains; it does not combine with tree {shape.text()}")
            for rule in self.rules:
                shape.check_rule(rule_registry.get(rule))
        for g in self.gammas:
            if g != "auto" and (isinstance(g, bool) or not isinstance(g, int) or not 1 <= g <= MAX_GAMMA):
                raise ValueError(f"gamma must be an integer in 1..{MAX_GAMMA} or 'auto', got {shown(g)}")
        check_number(self.max_new_tokens, "max_new_tokens", kind=int, lo=1, hi=MAX_N_CTX)
        check_model_settings(self, need_draft=bool(self.rules or self.lossless_ref))
        check_token_budget(self, self.max_new_tokens)
        if not str(self.out).strip():
            raise ValueError("out is empty: give the folder for the results (--out DIR)")
        for s in self.samplings:
            if not s.strip():
                raise ValueError(f"an empty sampling setting in {shown(self.samplings)} (a stray ';'?): remove it, or "
                                 "write temperature=1 for plain sampling")
        check_number(self.n_samples, "n_samples", kind=int, lo=1, hi=MAX_SAMPLES)
        if self.limit is not None:
            check_number(self.limit, "limit", kind=int, lo=1, hi=MAX_PROBLEMS)
        check_number(self.offset, "offset", kind=int, lo=0, hi=MAX_PROBLEMS)
        check_number(self.few_shot, "few_shot", kind=int, lo=0, hi=MAX_FEW_SHOT)
        check_number(self.seed, "seed", kind=int, lo=0, hi=MAX_SEED)
        # before any run: the checkers and the sandbox turn it into timers (inf overflowed there, failing
        # correct answers, and a huge one grades without a limit)
        check_number(self.check_timeout_s, "check_timeout_s (--check-timeout)", lo=0.0, hi=MAX_CHECK_TIMEOUT_S,
                     lo_open=True, unit="seconds")
        for name in ("data_dir", "question_field", "answer_field", "id_field"):
            if getattr(self, name) is not None and not getattr(self, name).strip():
                raise ValueError(f"{name} is empty: give a value or leave it out")
        if self.on_bad_row not in ("skip", "error"):
            raise ValueError(f"on_bad_row must be 'skip' or 'error', got {shown(self.on_bad_row)}")
        if self.checker is not None and self.checker not in CHECKERS:
            raise ValueError(f"unknown checker {shown(self.checker)}; expected one of {', '.join(CHECKERS)}")


#: What each BenchConfig field holds, for sweep files: (accepted types, how it is said in an error).
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    **{f: ((int,), "an integer") for f in ("offset", "n_samples", "max_new_tokens", "seed", "few_shot", "n_ctx")},
    **{f: ((int, type(None)), "an integer (or left out)") for f in ("limit", "n_threads")},
    "check_timeout_s": ((int, float), "a number of seconds"),
    **{f: ((bool,), "true or false") for f in ("baselines", "lossless_ref", "target_only", "lookup")},
    **{f: ((str,), "a string") for f in ("out", "on_bad_row", "device")},
    **{f: ((str, type(None)), "a string (or left out)")
       for f in ("draft", "target", "data_dir", "question_field", "answer_field", "id_field", "checker", "dtype")},
    **{f: ((list,), "a list of strings") for f in ("datasets", "rules", "samplings", "trees")},
    "gammas": ((list,), "a list of integers or 'auto'"),
}


def check_field_types(cfg: "BenchConfig") -> None:
    """Refuse a value of the wrong type (``limit = "three"`` in a sweep file) with the field's name."""
    for name, (types, said) in _FIELD_TYPES.items():
        value = getattr(cfg, name)
        bad = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if not bad and name in ("datasets", "rules", "samplings", "trees"):
            bad = not all(isinstance(v, str) for v in value)
        if not bad and name == "gammas":
            bad = not all(v == "auto" or (isinstance(v, int) and not isinstance(v, bool)) for v in value)
        if bad:
            raise ValueError(f"{name} must be {said}, got {shown(value)}")

SWEEP_KEYS = {f for f in BenchConfig.__dataclass_fields__}
_SWEEP_ALIASES = {"dataset": "datasets", "rule": "rules", "sampling": "samplings", "gamma": "gammas",
                  "tree": "trees"}


#: A sweep is a few dozen settings: a file beyond this size, or values beyond this count once YAML's aliases
#: are expanded (``&a [*b, *b, ...]`` nested: 700 bytes made 9^8 values), or nested deeper, is refused unread.
MAX_SWEEP_BYTES = 1 << 20
MAX_SWEEP_VALUES = 100_000
MAX_SWEEP_DEPTH = 32


def load_sweep(path: str | Path, base: BenchConfig | None = None) -> BenchConfig:
    """Read a TOML or YAML sweep file; keys are BenchConfig fields (``dataset``/``rule``/``sampling``/
    ``gamma`` accepted as singular aliases, scalars or lists). Unknown keys are refused, and so are files
    beyond :data:`MAX_SWEEP_BYTES`, :data:`MAX_SWEEP_VALUES` values (YAML aliases expanded) or
    :data:`MAX_SWEEP_DEPTH` levels; every error quotes at most a short excerpt of a value."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sweep file not found: {path}")
    if path.suffix.lower() not in (".toml", ".yaml", ".yml"):
        raise ValueError(f"sweep file must be .toml, .yaml or .yml, got {shown(path.name)}")
    size = path.stat().st_size
    if size > MAX_SWEEP_BYTES:
        raise ValueError(f"{path}: {size} bytes is far more than a sweep of settings holds (at most "
                         f"{MAX_SWEEP_BYTES}): is it the right file?")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                         "save it as UTF-8") from None
    try:
        data = _parse_toml(path, text) if path.suffix.lower() == ".toml" else _parse_yaml(path, text)
    except RecursionError:
        raise ValueError(f"{path}: nested more than {MAX_SWEEP_DEPTH} levels deep: a sweep holds settings, "
                         "scalars or lists of them") from None
    _check_sweep_size(path, data)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the sweep must be a mapping of settings")
    cfg = asdict(base or BenchConfig())
    for key, value in data.items():
        name = _SWEEP_ALIASES.get(key, key) if isinstance(key, str) else key
        if name not in SWEEP_KEYS:
            raise ValueError(f"{path}: unknown sweep key {shown(key)}; valid keys: {', '.join(sorted(SWEEP_KEYS))}")
        if name in ("datasets", "rules", "samplings", "gammas") and not isinstance(value, list):
            value = [value]
        cfg[name] = value
    out = BenchConfig(**cfg)
    try:
        out.validate()
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return out


def _parse_toml(path: Path, text: str) -> object:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {shown(str(e), 300)}") from None


def _parse_yaml(path: Path, text: str) -> object:
    """The YAML document, its node graph checked (:func:`_check_yaml_nodes`) before any value is built."""
    import yaml

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):   # the composer recurses once per level: stop it early
            self.depth += 1
            try:
                if self.depth > MAX_SWEEP_DEPTH:
                    raise RecursionError
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}
        _check_yaml_nodes(path, node)
        return loader.construct_document(node) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {shown(' '.join(str(e).split()), 300)}") from None
    finally:
        loader.dispose()


def _check_yaml_nodes(path: Path, root) -> None:
    """Refuse a YAML node graph whose values, aliases expanded, number more than :data:`MAX_SWEEP_VALUES`,
    that nests deeper than :data:`MAX_SWEEP_DEPTH` or refers to itself. Each node is visited once (an alias
    is the same node object as its anchor), so a graph that would expand to billions costs its own size."""
    import yaml

    expanded: dict[int, int] = {}

    def count(node, depth: int) -> int:
        if depth > MAX_SWEEP_DEPTH:
            raise RecursionError
        key = id(node)
        if key in expanded:
            if expanded[key] < 0:
                raise ValueError(f"{path}: an alias refers to the collection that holds it (&anchor ... *anchor "
                                 "inside it): write the values out")
            return expanded[key]
        expanded[key] = -1
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(count(child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(count(k, depth + 1) + count(v, depth + 1) for k, v in node.value)
        if total > MAX_SWEEP_VALUES:
            raise ValueError(f"{path}: its aliases (*name) expand to more than {MAX_SWEEP_VALUES} values: a sweep "
                             "holds a few settings; write them out without nested aliases")
        expanded[key] = total
        return total

    count(root, 0)


def _check_sweep_size(path: Path, data: object) -> None:
    """The same bounds on parsed TOML (no aliases there, but deep or long arrays all the same)."""
    seen = 0
    stack = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        seen += 1
        if depth > MAX_SWEEP_DEPTH:
            raise ValueError(f"{path}: nested more than {MAX_SWEEP_DEPTH} levels deep: a sweep holds settings, "
                             "scalars or lists of them")
        if seen > MAX_SWEEP_VALUES:
            raise ValueError(f"{path}: more than {MAX_SWEEP_VALUES} values: a sweep holds a few settings")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for kv in value.items() for v in kv)
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


#: Spec-list splitting lives with the rules (kept here under its old name).
split_rule_list = rule_registry.split_specs


def plan_runs(cfg: BenchConfig, draft_name: str, target_name: str) -> list[PlannedRun]:
    """The runs of a bench with their pairing (see the module docstring)."""
    runs: dict[str, PlannedRun] = {}

    def add(dataset, rule, sampling, gamma, role, pair=None, tree="") -> str:
        auto = gamma == "auto" and bool(rule)
        key = RunKey(dataset=dataset, rule=rule or TARGET_ONLY, sampling=sampling.spec(),
                     gamma=(DEFAULT_G_MAX if auto else gamma) if rule else 0,
                     draft=draft_name if rule else "", target=target_name, max_new_tokens=cfg.max_new_tokens,
                     seed=cfg.seed, role=role, tree=tree if rule else "", gamma_policy="auto" if auto else "")
        if key.run_id not in runs:
            runs[key.run_id] = PlannedRun(key, sampling, rule, dict(pair or {}))
        return key.run_id

    # a chain spec is the ordinary chain: same runs (and run ids) as --gamma
    shapes = [(s.text() if not s.is_chain else "", s.depth) for s in map(TreeShape.parse, cfg.trees)]
    grid = shapes or [("", g) for g in cfg.gammas]
    for dataset, sampling_spec, (tree, gamma) in itertools.product(cfg.datasets, cfg.samplings, grid):
        sampling = SamplingConfig.parse(sampling_spec)
        plain = add(dataset, None, sampling, gamma, "target_only") if (cfg.target_only or cfg.baselines) else None
        lossless = (add(dataset, "lossless", sampling, gamma, "lossless_ref", {"baseline": plain}, tree)
                    if cfg.lossless_ref else None)
        for spec in cfg.rules:
            rule = rule_registry.get(spec)
            if rule.spec() == "lossless" and lossless is not None:
                continue  # the lossless reference run is that run
            pair: dict = {"lossless_ref": lossless}
            if cfg.baselines:
                truncation = rule.baseline_truncation()
                if truncation:
                    pair["baseline"] = add(dataset, None, sampling.with_truncation(**truncation), gamma, "baseline")
                else:
                    pair["baseline"] = plain
            add(dataset, rule.spec(), sampling, gamma, "method", pair, tree)
    return list(runs.values())


def model_label(source: str | None, role: str) -> str:
    return source if source else f"embedded-{role}"


class Bench:
    """Loads datasets once, then executes a plan into the store: in this process, or with
    ``cluster`` (:class:`~verispec.settings.ClusterSettings`) on Ray workers; ``executor`` plugs in
    any other :class:`Executor`."""

    def __init__(self, cfg: BenchConfig, *, progress: bool = True, log: Callable[[str], None] | None = None,
                 load_models: Callable | None = None, cluster: ClusterSettings | None = None,
                 executor: Executor | None = None) -> None:
        cfg.validate()
        if cluster is not None:
            cluster.validate()
        self.cfg = cfg
        self.progress = progress
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.out = Path(cfg.out)
        self._load_models = load_models
        self.cluster = cluster
        self._executor = executor
        self.problems: dict[str, list[Problem]] = {}

    def load_problems(self) -> None:
        self.problems = load_problems(self.cfg, self.log, few_shot=self.cfg.few_shot)

    def executor(self) -> Executor:
        if self._executor is not None:
            return self._executor
        if self.cluster is not None and self.cluster.distributed:
            from verispec.bench.distributed import RayExecutor

            return RayExecutor(self.cfg, self.cluster, load_models=self._load_models, log=self.log)
        if self.cluster is not None and self.cluster.batch_size is not None:
            return BatchExecutor(self.cfg, self.out, self.cluster.batch_size, self._load_models,
                                 invariant=self.cluster.batch_invariant)
        return LocalExecutor(self.cfg, self.out, self._load_models)

    def plan(self, *, check_models: bool = False) -> list[PlannedRun]:
        """Everything the run checks before it decodes, without writing anything: the settings, the
        combination with the cluster settings, the output folder, the problems (loaded) and, with
        ``check_models``, the model files (:func:`verispec.models.check_model_sources`). A dry run is
        this: it refuses what the run would refuse."""
        if self.cluster is not None and self.cluster.batch_size is not None and not self.cluster.distributed:
            check_batchable(self.cfg)
        if self.cluster is not None and self.cluster.ray_address:
            from verispec.cluster import check_ray_address

            check_ray_address(self.cluster.ray_address)    # seconds, not Ray's endless retries
        check_out_dir(self.out)
        store = self.out / STORE_NAME
        if store.exists() and not store.is_file():
            raise ValueError(f"{store} is a folder; the bench keeps its results in a file of that name: choose "
                             "another --out")
        self.load_problems()
        if any(p.checker == "code" for problems in self.problems.values() for p in problems):
            require_contained()     # code is graded in the sandbox: refused here where it cannot hold it
        if check_models:
            check_model_sources(self.cfg, need_draft=bool(self.cfg.rules or self.cfg.lossless_ref))
        draft_name = model_label(self.cfg.draft, "draft") + ("+lookup" if self.cfg.lookup else "")
        # the datasets as loaded: Spec-Bench's name stands for its categories, each a dataset of its own
        datasets = replace(self.cfg, datasets=list(self.problems))
        return plan_runs(datasets, draft_name, model_label(self.cfg.target, "target"))

    def run(self) -> Path:
        plan = self.plan()
        ensure_out_dir(self.out)
        write_text_atomic(self.out / "config.json", json.dumps(asdict(self.cfg), indent=2))
        store = ResultStore(self.out / STORE_NAME)
        try:
            for run in plan:
                store.register_run(run.key, {k: v for k, v in run.pair.items() if v})
            done = {run.key.run_id: store.done(run.key.run_id) for run in plan}
            work = [
                Unit(problem, k, run)
                for dataset, problems in self.problems.items()
                for problem in problems
                for k in range(self.cfg.n_samples)
                for run in plan
                if run.key.dataset == dataset
            ]
            todo = [u for u in work if (u.problem.id, u.k) not in done[u.run.key.run_id]]
            self.log(f"bench: {len(plan)} runs, {len(work)} samples, {len(work) - len(todo)} already done, "
                     f"{len(todo)} to go -> {self.out}")
            if not todo:
                return self.out
            executor = self.executor()
            try:
                executor.start(need_draft=any(u.run.rule for u in todo))
                bar = _progress(len(todo), self.progress)

                def commit(unit: Unit, result: UnitResult) -> None:
                    for name, data in result.files.items():  # before the row: it implies them
                        _write_atomic(self.out, name, data)
                    if not store.add(result.record):
                        self.log(f"bench: {unit.run.key.run_id}/{unit.problem.id}/{unit.k} was already stored "
                                 "(another writer?); the stored row is kept")
                    bar.set_postfix_str(f"{unit.problem.dataset}/{unit.problem.id} {unit.run.key.rule[:24]}",
                                        refresh=False)
                    bar.update(1)

                executor.run(todo, commit)
                bar.close()
            finally:
                executor.close()
        finally:
            store.close()
        return self.out


def _write_atomic(root: Path, name: str, data: bytes) -> None:
    """Write ``root/name`` (a relative path inside ``root``) so that a crash leaves the old file or the new."""
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"result file {name!r} is not a path inside the bench directory")
    path = root / rel
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(os_error_text(exc)) from None
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, unit="sample", dynamic_ncols=True, file=sys.stderr)


def run_bench(cfg: BenchConfig, *, progress: bool = True, report: bool = True, log=None, load_models=None,
              cluster: ClusterSettings | None = None, executor: Executor | None = None):
    """Execute the bench of ``cfg`` (resuming what its store already holds) and build its report;
    ``cluster`` spreads the samples over Ray workers (:mod:`verispec.bench.distributed`)."""
    out = Bench(cfg, progress=progress, log=log, load_models=load_models, cluster=cluster, executor=executor).run()
    if not report:
        return out, None
    from verispec.bench.report import build_report

    return out, build_report(out, out)


def describe_plan(runs: Iterable[PlannedRun]) -> str:
    lines = []
    for r in runs:
        pair = ", ".join(f"{k}={v}" for k, v in r.pair.items() if v)
        k = r.key
        gamma = f"auto(≤{k.gamma})" if k.gamma_policy == "auto" else str(k.gamma)
        shape = f" tree={k.tree}" if k.tree else ""
        lines.append(f"  {k.run_id}  {k.role:12} {k.dataset:10} {k.rule:34} {k.sampling:40} γ={gamma}{shape} {pair}")
    return "\n".join(lines)
