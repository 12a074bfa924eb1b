"""Each rule's distortion in tree form beside its chain form, on the same real trajectories.

Recording (:func:`collect_tree_corpus`): every problem is generated with lossless SD on the draft
tree ``spec`` (its trajectory follows the target exactly). At every verification the whole tree is
recorded: one :class:`~verispec.diagnose.record.PositionRecorder` row per node (the root included),
holding the processed target ``p`` there and the processed draft ``q`` where the draft expanded the
node (elsewhere ``q = p``, never read), with the tree layout beside it (:class:`TreeCorpus`: step,
node, parent, token, whether the node lies on the accepted path, whether it was expanded).

Measures (:func:`summarize_tree_form`), per rule:

* **distortion at the visited decision nodes** — the root and every accepted node that has children,
  i.e. the positions of the lossless trajectory where a tree decision was made. Tree form:
  ``P_tree = tree_node_law(rule, p, candidates)`` (:func:`verispec.rules.tree_law.tree_node_law`, the
  exact law of the node given its candidate list) against ``rule.reference``; chain form: the
  rule's per-token law ``rule.induced(p, q)`` at the same node. TV, KL, overshoot, tail leak,
  acceptance (tree: the probability that some candidate is accepted).
* **tokens per target call** of the recorded trees: ``1 + E[accepted path length]`` computed exactly
  from every node's law by a recursion over the tree (``E(v) = Σ_k P(child k accepted at v)·(1 +
  E(child k))``), averaged over steps. Like the chain's :func:`recorded_block_efficiency` it is
  exact for the recorded trees, which were grown along the lossless trajectory.

Candidates are deterministic (``topk:`` and ``dynamic:`` trees; ``run_diagnose`` refuses sampled
ones). A candidate whose token is not in the node's compact record is dropped. When the record is
lossless (the whole supports kept: always the case with top-k / top-p sampling) such a token has
``p = 0``: every rule with a tree form accepts it with probability 0 and zeroing it leaves ``g``
unchanged, so the law is exact. Otherwise the dropped candidates carry at most the record's rest
mass ``p_rest`` (stored per node), which bounds the error of that node's law.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verispec import rules as rules_mod
from verispec.diagnose.measures import _distortion, snap
from verispec.diagnose.record import PositionRecorder

#: Target-entropy bins (nats) of the tree-vs-chain breakdown.
ENTROPY_EDGES = (0.0, 0.1, 0.5, 1.0, 2.0, math.inf)
#: Node-layout arrays of a tree corpus (name -> dtype).
_LAYOUT = {"step_id": np.int32, "node": np.int16, "parent": np.int16, "token": np.int32,
           "on_path": np.int8, "expanded": np.int8}


@dataclass
class TreeCorpus:
    """Recorded trees: ``rows`` (one recorder row per node, root first in each step) and the layout."""

    rows: PositionRecorder
    layout: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in _LAYOUT})
    tree: str = ""

    def add_step(self, step, step_id: int, dataset: str, problem_id: str) -> None:
        """Record one :class:`~verispec.engine.generate.VerifiedStep` (all its nodes)."""
        prop = step.proposal
        n = prop.n_nodes
        p = step.p.float()
        q = prop.q.float().clone() if prop.q is not None else p.clone()
        expanded = [True] + list(prop.expanded)
        for i in range(n + 1):
            if not expanded[i]:
                q[i] = p[i]
        on_path = {-1} | set(step.path)
        self.rows.add(p, q, dataset=dataset, problem_id=problem_id, step=step_id,
                      position=[0] + [d + 1 for d in prop.depths()],
                      accepted=[int(i - 1 in on_path) for i in range(n + 1)])
        lay = self.layout
        lay["step_id"] += [step_id] * (n + 1)
        lay["node"] += list(range(-1, n))
        lay["parent"] += [-2] + list(prop.parents)
        lay["token"] += [-1] + list(prop.tokens)
        lay["on_path"] += [int(i - 1 in on_path) for i in range(n + 1)]
        lay["expanded"] += [int(e) for e in expanded]

    def save(self, path: str | Path) -> None:
        path = Path(path)
        self.rows.save(path)
        arrays = {k: np.asarray(v, dtype=_LAYOUT[k]) for k, v in self.layout.items()}
        with open(path.with_suffix(".layout.npz"), "wb") as fh:
            np.savez_compressed(fh, tree=np.array(self.tree), **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "TreeCorpus":
        path = Path(path)
        rows = PositionRecorder.load(path)
        with np.load(path.with_suffix(".layout.npz"), allow_pickle=False) as z:
            layout = {k: z[k].tolist() for k in _LAYOUT}
            tree = str(z["tree"])
        if len(layout["node"]) != len(rows):
            raise ValueError(f"{path}: the tree layout has {len(layout['node'])} rows but the records {len(rows)}")
        return cls(rows, layout, tree)

    def __len__(self) -> int:
        return len(self.rows)

    def steps(self) -> list[np.ndarray]:
        """Row indices of each recorded step (root first)."""
        sid = np.asarray(self.layout["step_id"])
        bounds = np.flatnonzero(np.diff(sid)) + 1
        return np.split(np.arange(len(sid)), bounds) if len(sid) else []


def collect_tree_corpus(target, draft, problems: Iterable[Any], *, sampling, tree, max_new_tokens: int,
                        seed: int, progress: bool = True) -> TreeCorpus:
    """Generate each problem with lossless SD on ``tree`` and record every verified tree."""
    from verispec.engine import generate
    from verispec.engine.tree import TreeShape

    shape = TreeShape.parse(tree)
    corpus = TreeCorpus(PositionRecorder(), tree=shape.text())
    problems = list(problems)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(problems), desc="recording trees", unit="problem")
    step_id = [0]
    try:
        for problem in problems:
            dataset, pid = str(problem.dataset), str(problem.id)

            def observe(step, _ds=dataset, _pid=pid):
                corpus.add_step(step, step_id[0], _ds, _pid)
                step_id[0] += 1

            generate(target, draft, target.chat_prompt(problem.prompt), rule="lossless", sampling=sampling,
                     tree=shape, max_new_tokens=max_new_tokens, stop=tuple(getattr(problem, "stop", ()) or ()),
                     seed=seed, observers=[observe])
            if bar is not None:
                bar.update(1)
                bar.set_postfix(nodes=len(corpus))
    finally:
        if bar is not None:
            bar.close()
    return corpus


def _candidate_columns(ids: torch.Tensor, children_tokens: list[list[int]]) -> torch.Tensor:
    """Map each node's candidate tokens to columns of its compact row (``-1``: not kept, so p = 0
    there; dropped). ``ids [n, W]`` -> ``[n, m]`` padded with -1."""
    m = max((len(c) for c in children_tokens), default=0)
    out = torch.full((len(children_tokens), max(m, 1)), -1, dtype=torch.long)
    for r, toks in enumerate(children_tokens):
        col = {int(t): j for j, t in enumerate(ids[r].tolist()) if t >= 0}
        kept = [col[t] for t in toks if t in col]
        if kept:
            out[r, :len(kept)] = torch.tensor(kept)
    return out


def _children_tokens(corpus: TreeCorpus, rows: np.ndarray) -> dict[int, list[int]]:
    """Row index of every node in ``rows`` (one step) -> tokens of its children, in order."""
    lay = corpus.layout
    node_row = {lay["node"][r]: r for r in rows}
    kids: dict[int, list[int]] = {r: [] for r in rows}
    for r in rows:
        par = lay["parent"][r]
        if par >= -1 and lay["node"][r] >= 0:
            kids[node_row[par]].append(lay["token"][r])
    return kids


def summarize_tree_form(corpus: TreeCorpus, rule_specs: Iterable[str], *, chunk: int = 4096) -> list[dict]:
    """Per rule: tree-form and chain-form distortion at the visited decision nodes, acceptance, and the
    exact tokens per target call of the recorded trees under the rule (see the module docstring)."""
    from verispec.rules.tree_law import tree_node_law

    lay = corpus.layout
    n = len(corpus)
    kids: dict[int, list[int]] = {}
    for rows in corpus.steps():
        kids.update(_children_tokens(corpus, rows))
    with_children = [r for r in range(n) if kids.get(r)]
    decision = [r for r in with_children if lay["on_path"][r]]
    out = []
    for spec in rule_specs:
        rule = rules_mod.get(spec)
        try:
            entry = _summarize_rule(corpus, rule, kids, with_children, decision, chunk, tree_node_law)
        except ValueError as exc:          # the rule has no tree form
            entry = {"rule": rule.spec(), "tree": corpus.tree, "n_decision_nodes": len(decision),
                     "n_steps": len(corpus.steps()), "tree_form": {}, "chain_form": {},
                     "tokens_per_call": math.nan, "tv_amplification": math.nan, "note": str(exc)}
        out.append(entry)
    return out


def _summarize_rule(corpus: TreeCorpus, rule, kids: dict[int, list[int]], with_children: list[int],
                    decision: list[int], chunk: int, tree_node_law) -> dict:
    """One rule's entry of :func:`summarize_tree_form`."""
    # every node with children: its tree law and per-candidate acceptance (for the recursion)
    accept_of: dict[int, list[float]] = {}
    tree_vals: dict[str, list[torch.Tensor]] = {}
    chain_vals: dict[str, list[torch.Tensor]] = {}
    entropy: list[torch.Tensor] = []
    decision_set = set(decision)
    target_entropy = corpus.rows.arrays["target_entropy"]
    for lo in range(0, len(with_children), chunk):
        sel = with_children[lo:lo + chunk]
        pbar, qbar, ids = corpus.rows.dense(sel)
        ids_ext = torch.cat([ids, torch.full((len(sel), 1), -1, dtype=ids.dtype)], 1)  # rest column
        cand_tokens = [kids[r] for r in sel]
        cols = _candidate_columns(ids_ext, cand_tokens)
        law, accept = tree_node_law(rule, pbar, cols)
        # accept[k] belongs to the k-th *kept* candidate; map back to the children order
        for j, r in enumerate(sel):
            col_of = {int(t): c for c, t in enumerate(ids_ext[j].tolist()) if t >= 0}
            kept = iter(accept[j].tolist())
            accept_of[r] = [next(kept) if t in col_of else 0.0 for t in kids[r]]
        mask = torch.tensor([r in decision_set for r in sel])
        if not bool(mask.any()):
            continue
        p, q, P = pbar[mask], qbar[mask], law[mask].double()
        entropy.append(torch.as_tensor(target_entropy[np.asarray(sel)[mask.numpy()]].astype(np.float64)))
        ref = rule.reference(p, q)
        for name, v in _distortion(snap(P, p, q), ref, p).items():
            tree_vals.setdefault(name, []).append(v)
        tree_vals.setdefault("acceptance", []).append(accept[mask].double().sum(-1))
        if rule.per_token:
            Pc = snap(rule.induced(p, q), p, q)
            for name, v in _distortion(Pc, ref, p).items():
                chain_vals.setdefault(name, []).append(v)
            chain_vals.setdefault("acceptance", []).append(rule.acceptance_rate(p, q).clamp(0, 1))
    entry: dict[str, Any] = {"rule": rule.spec(), "tree": corpus.tree, "n_decision_nodes": len(decision),
                             "n_steps": len(corpus.steps())}
    entry["tree_form"] = {k: _mean(v) for k, v in tree_vals.items()}
    entry["chain_form"] = {k: _mean(v) for k, v in chain_vals.items()}
    if entropy and "tv" in chain_vals:
        ent = torch.cat(entropy)
        tv_tree, tv_chain = torch.cat(tree_vals["tv"]), torch.cat(chain_vals["tv"])
        entry["by_entropy"] = [
            {"lo": lo, "hi": hi, "n": int(m.sum()), "tv_chain": _mean([tv_chain[m]]), "tv_tree": _mean([tv_tree[m]])}
            for lo, hi in zip(ENTROPY_EDGES[:-1], ENTROPY_EDGES[1:])
            for m in [(ent >= lo) & (ent < hi)] if bool(m.any())]
    entry["tokens_per_call"] = _expected_tokens_per_call(corpus, kids, accept_of)
    tv_c, tv_t = entry["chain_form"].get("tv", math.nan), entry["tree_form"].get("tv", math.nan)
    entry["tv_amplification"] = tv_t / tv_c if tv_c and tv_c > 0 else math.nan
    return entry


def _mean(parts: list[torch.Tensor]) -> float:
    if not parts:
        return math.nan
    v = torch.cat([x.reshape(-1).double() for x in parts])
    return float(v.mean())


def _expected_tokens_per_call(corpus: TreeCorpus, kids: dict[int, list[int]],
                              accept_of: dict[int, list[float]]) -> float:
    """Mean over steps of ``1 + E[accepted path length]`` under the rule, exactly from the node laws."""
    lay = corpus.layout
    totals = []
    for rows in corpus.steps():
        child_rows: dict[int, list[int]] = {r: [] for r in rows}
        node_row = {lay["node"][r]: r for r in rows}
        for r in rows:
            if lay["node"][r] >= 0:
                child_rows[node_row[lay["parent"][r]]].append(r)
        expected: dict[int, float] = {}
        for r in reversed(rows):            # children come after parents
            acc = accept_of.get(r, [])
            expected[r] = sum(a * (1.0 + expected[c]) for a, c in zip(acc, child_rows[r]))
        totals.append(1.0 + expected[rows[0]])
    return float(np.mean(totals)) if totals else math.nan


def tree_form_markdown(summary: list[dict]) -> str:
    """Per rule, chain form vs tree form at the same nodes; then TV by target entropy."""
    if not summary:
        return ""
    head = (f"Tree {summary[0]['tree']}: {summary[0]['n_decision_nodes']} decision nodes over "
            f"{summary[0]['n_steps']} recorded trees\n\n")
    lines = ["| rule | TV chain | TV tree | tree/chain | acceptance chain | acceptance tree | tokens/call tree |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for e in summary:
        c, t = e["chain_form"], e["tree_form"]
        lines.append(f"| {e['rule']} | {_fmt(c.get('tv'))} | {_fmt(t.get('tv'))} | {_fmt(e['tv_amplification'], 2)} "
                     f"| {_fmt(c.get('acceptance'))} | {_fmt(t.get('acceptance'))} | {_fmt(e['tokens_per_call'], 3)} |")
    bins = [e for e in summary if e.get("by_entropy")]
    if bins:
        edges = [(b["lo"], b["hi"]) for b in bins[0]["by_entropy"]]
        lines += ["", "TV chain / tree by target entropy (nats; decision nodes per bin in the header):", "",
                  "| rule | " + " | ".join(f"[{lo:g}, {hi:g}) n={b['n']}" for (lo, hi), b in
                                        zip(edges, bins[0]["by_entropy"])) + " |",
                  "|---|" + "---:|" * len(edges)]
        for e in bins:
            lines.append(f"| {e['rule']} | " + " | ".join(f"{_fmt(b['tv_chain'], 3)} / {_fmt(b['tv_tree'], 3)}"
                                                         for b in e["by_entropy"]) + " |")
    return head + "\n".join(lines) + "\n"


def _fmt(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}f}"
