"""Decoding loops: target-only (the baseline and ground truth) and speculative decoding on trees,
a chain being the tree with one child per node (one code path; :mod:`verispec.engine.tree`).

Cache invariant of the SD loop: the target's KV cache holds every committed token except the
last one (the root of the next tree); each draft source keeps its own state in step with the
committed text (:mod:`verispec.engine.sources`: the draft model lacks only ``pending``, the root and
what it never processed). A step

1. drafts below the root: a tree or chain grown by the draft model (feeding ``pending`` first, one
   draft forward per depth), a prompt-lookup chain, or an EAGLE-3 head's tree; none: a plain step,
2. runs one target forward over ``[root, nodes]`` (tree attention) -> ``p`` at the root and after
   every node,
3. calls :func:`verispec.rules.tree.verify_tree` (a chain goes to ``rule.verify``) -> the accepted
   path and the next token ``z``,
4. commits the path and ``z``: both caches keep the path's nodes they processed and drop the rest,
   ``pending`` = what the draft has not seen.

``γ = "auto"`` chooses ``g`` before every step from the machine's cost profile and the acceptance so
far (:mod:`verispec.engine.gamma`); ``g = 0`` is then a plain target step.

``g = min(γ, budget − 1)`` so that ``max_new_tokens`` is never exceeded; when one token is left it is
sampled from the target alone. EOS or a stop string inside an accepted block ends the output at the
token that completes it.

Both loops share their prologue (prompt checks, generator, output buffer) and epilogue (totals) in
:class:`Decoding`; model, sampling and rule time is added to the :class:`Stats` fields by
``with stats.timing(field):`` blocks.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from verispec.engine.costs import CostProfile
from verispec.engine.gamma import AutoGamma, LookupGamma
from verispec.engine.ngram import NgramDrafter
from verispec.engine.sources import DraftSources
from verispec.engine.stats import CallCosts, Stats
from verispec.engine.tree import DraftProposal, TreeSpec, check_tree_rule
from verispec.models.base import Backend, check_compatible, logits_device, tokenizer_size
from verispec.rules import Rule
from verispec.rules import get as get_rule
from verispec.rules.base import sample_categorical
from verispec.rules.tree import DraftTree, verify_tree
from verispec.sampling import SamplingConfig

#: observer(p [G+1, V], q [G, V], draft [G], n_accepted) called after every chain verification.
Observer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], None]


@dataclass
class VerifiedStep:
    """One verification, chain or tree: ``p [N+1, V]`` the processed target at the root and after every
    node, the draft ``proposal`` (tokens, parents, ``q [N+1, V]``), the accepted ``path`` (node
    indices from the root down) and the ``next_token`` emitted after it."""

    p: torch.Tensor
    proposal: DraftProposal
    path: list[int]
    next_token: int


#: tree_observer(step) called after every verification.
TreeObserver = Callable[[VerifiedStep], None]


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stats: Stats


class _Output:
    """Committed tokens with exact EOS / stop-string / budget handling."""

    def __init__(self, backend: Backend, stop: Sequence[str], max_new_tokens: int) -> None:
        self.backend, self.stop, self.max_new = backend, tuple(s for s in stop if s), max_new_tokens
        self.tokens: list[int] = []
        self.text = ""
        self.stop_reason = ""

    @property
    def remaining(self) -> int:
        return self.max_new - len(self.tokens)

    def extend(self, new: Sequence[int]) -> bool:
        """Append ``new``; returns True when the generation is over (EOS, stop string or budget)."""
        for tok in new:
            if tok in self.backend.eos_token_ids:
                self.stop_reason = "eos"
                break
            self.tokens.append(int(tok))
            if self.stop and self._cut_at_stop():
                self.stop_reason = "stop"
                break
            if len(self.tokens) >= self.max_new:
                self.stop_reason = "length"
                break
        if self.stop_reason:
            self.text = self._text_without_stop()
            return True
        return False

    def _cut_at_stop(self) -> bool:
        # Only the tail can contain a stop string that the last token completed.
        window = max(len(s) for s in self.stop) + 32
        tail = self.backend.detokenize(self.tokens[-window:])
        return any(s in tail for s in self.stop)

    def _text_without_stop(self) -> str:
        text = self.backend.detokenize(self.tokens)
        if self.stop_reason == "stop":
            cut = min((text.find(s) for s in self.stop if s in text), default=-1)
            if cut >= 0:
                text = text[:cut]
        return text

    def finish(self) -> str:
        if not self.stop_reason:
            self.text = self.backend.detokenize(self.tokens)
        return self.text


def check_prompt(backend: Backend, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("the prompt is empty: give at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(ids) >= backend.context_length:
        raise ValueError(
            f"the prompt has {len(ids)} tokens but {backend.name} has a context of {backend.context_length}: "
            "shorten the prompt or raise the context length (--n-ctx)"
        )
    return ids


def _budget(backend: Backend, n_prompt: int, max_new_tokens: int, gamma: int) -> int:
    # A verification forward may hold γ+1 tokens beyond the committed ones.
    room = backend.context_length - n_prompt - gamma - 1
    return max(1, min(max_new_tokens, room))


class Decoding:
    """What both loops share: the checked prompt, the generator, the statistics and the output, and
    the epilogue that fills the totals. The wall clock starts after the prefill (:meth:`start`)."""

    def __init__(self, target: Backend, prompt_ids: Sequence[int], *, stats: Stats, max_new_tokens: int,
                 stop: Sequence[str], seed: int, gamma: int) -> None:
        self.ids = check_prompt(target, prompt_ids, max_new_tokens)
        # sampling and verification run where the target's logits are, with a generator there
        self.device = logits_device(target)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.stats = stats
        self.out = _Output(target, stop, _budget(target, len(self.ids), max_new_tokens, gamma))
        self.t_start = 0.0

    def start(self) -> None:
        self.t_start = time.perf_counter()

    def sample(self, probs: torch.Tensor) -> int:
        """One token from ``probs [1, V]`` with this generation's generator."""
        return int(sample_categorical(probs, self.gen)[0])

    def result(self) -> GenerationResult:
        stats, out = self.stats, self.out
        stats.wall_s = time.perf_counter() - self.t_start
        stats.new_tokens = len(out.tokens) + (out.stop_reason == "eos")
        stats.stop_reason = out.stop_reason
        return GenerationResult(out.finish(), out.tokens, stats)


def generate_target_only(
    target: Backend,
    prompt_ids: Sequence[int],
    *,
    sampling: SamplingConfig,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    seed: int = 0,
    vocab_width: int | None = None,
) -> GenerationResult:
    """Plain autoregressive sampling from the target with ``sampling`` (one forward per token).

    ``vocab_width`` slices the logits (default: the tokenizer's size, dropping padded rows)."""
    run = Decoding(target, prompt_ids, stats=Stats(mode="target_only", rule="", gamma=0),
                    max_new_tokens=max_new_tokens, stop=stop, seed=seed, gamma=0)
    stats = run.stats
    # Logits rows past the tokenizer are padding: never sample them.
    width = vocab_width or min(target.vocab_size, tokenizer_size(target))
    target.reset()
    with stats.timing("prefill_s"):
        logits = target.forward(run.ids, all_logits=False)
    stats.target_calls += 1  # the prefill forward produced the first token's distribution
    run.start()
    while True:
        with stats.timing("rule_s"):
            tok = run.sample(sampling.process(logits[-1:, :width]))
        if run.out.extend([tok]):
            break
        with stats.timing("verify_s"):
            logits = target.forward([tok], all_logits=False)
        stats.target_calls += 1
    return run.result()


def generate(
    target: Backend,
    draft: Backend | None,
    prompt_ids: Sequence[int],
    *,
    rule: Rule | str,
    sampling: SamplingConfig,
    gamma: int | str | AutoGamma = 5,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    seed: int = 0,
    observer: Observer | None = None,
    vocab_width: int | None = None,
    costs: CallCosts | CostProfile | None = None,
    tree: TreeSpec | str | None = None,
    tree_observer: TreeObserver | None = None,
    lookup: NgramDrafter | None = None,
    head=None,
    draft_stop: float | str = 0.0,
) -> GenerationResult:
    """Speculative decoding of ``prompt_ids`` with ``rule`` on chains or trees; see the module docstring.

    ``gamma``: draft tokens per step, or ``"auto"``: chosen before every step by the cost model from
    ``costs`` (a :class:`CostProfile`) and the acceptance seen so far (:class:`AutoGamma`; a step may
    then also be a plain target step, ``g = 0``), or an :class:`AutoGamma` of one's own (fresh per
    generation: it learns from the steps). ``tree`` (a :class:`TreeSpec` or its text, e.g.
    ``"dynamic:top_k=10,depth=5,nodes=60"``) drafts that tree instead of a chain of ``gamma`` tokens.
    ``vocab_width`` (from :func:`check_compatible`, computed when omitted) slices both models' logits
    to the shared vocabulary. ``costs`` (a :class:`CallCosts` from :func:`measure_costs` or a
    :class:`CostProfile`) fills ``stats.cost_model_speedup`` for chains: with a profile, the modelled
    time of target-only sampling over the modelled time of the steps actually taken
    (:mod:`verispec.engine.costs`). ``observer`` sees every chain verification, ``tree_observer``
    every verification as a :class:`VerifiedStep` (chains included).

    ``lookup`` (an :class:`NgramDrafter`): prompt-lookup drafting. Before each chain step the longest
    earlier match of the text's suffix proposes up to ``g`` tokens; they are verified as deterministic
    candidates (point masses, :mod:`verispec.rules.tree`), the draft model drafting only when nothing
    matches. With ``draft=None`` lookup is the only draft source and a step without a match is a
    plain target step. With ``gamma="auto"`` the cost model also decides how many of lookup's tokens
    to verify, if any (:class:`LookupGamma`: by the acceptance seen per matched-suffix length, against
    a plain step or the draft model's chain; ``costs`` may then be a profile without a draft model,
    ``cached_profile(target, None, ...)``). ``head`` (an :class:`~verispec.models.eagle3.Eagle3Drafter`, with
    ``draft=None``): EAGLE-3 draft trees grown from the target's hidden states (the target must be an
    ``HFBackend`` built with ``capture_hidden=head.head.target_layers``). Draft sources and their cache
    bookkeeping: :mod:`verispec.engine.sources`. ``draft_stop``: the draft model stops drafting a
    chain (expanding a tree node) at a token it gave probability below this (as transformers'
    ``assistant_confidence_threshold``; static trees and chains of the draft model only: dynamic trees,
    heads and lookup rank their candidates otherwise); ``stats.gamma_hist`` counts the lengths
    actually drafted. ``draft_stop="auto"``: the cost model decides token by token whether drafting
    one more pays, from the draft's probabilities of the tokens drafted so far and the acceptance seen
    at such probabilities (:meth:`AutoGamma.keep_drafting`; needs ``costs`` as a :class:`CostProfile`;
    chains of the draft model; ``gamma`` is then the most a step drafts, or with ``"auto"`` the cost
    model's γ_max). With a tree or a head, ``gamma`` is their depth.
    """
    policy = gamma if isinstance(gamma, AutoGamma) else None
    if (tree is not None or head is not None) and (policy is not None or gamma == "auto"):
        raise ValueError("gamma='auto' chooses the length of a chain; it does not apply to --tree or a head "
                         "(drop one)")
    spec = TreeSpec.parse(tree) if tree is not None else None
    if spec is not None and spec.is_chain:
        gamma, spec = spec.depth, None
    if draft is None and lookup is None and head is None:
        raise ValueError("no draft source: pass a draft model, lookup=NgramDrafter() for prompt lookup, "
                         "or head= an EAGLE-3 drafter")
    if head is not None and (draft is not None or spec is not None):
        raise ValueError("an EAGLE-3 head drafts its own trees (its top_k, depth, nodes): drop the draft model "
                         "and the tree spec")
    if lookup is not None and spec is not None:
        raise ValueError("prompt lookup drafts chains; it does not combine with a tree (drop one)")
    if draft is None and policy is not None:
        raise ValueError("an AutoGamma policy chooses the draft model's chains: with prompt lookup alone pass "
                         "gamma='auto'")
    if isinstance(costs, CostProfile) and draft is not None and not costs.has_draft:
        raise ValueError("the cost profile was measured without a draft model (for prompt lookup alone): measure "
                         "one with this draft model (cached_profile(target, draft, ...))")
    stop_auto = draft_stop == "auto"
    if stop_auto:
        if spec is not None or head is not None or draft is None:
            raise ValueError("draft_stop='auto' decides where the draft model's chain ends: it does not apply to "
                             "trees, heads or prompt lookup alone")
        if not isinstance(costs, CostProfile):
            raise ValueError("draft_stop='auto' needs the machine's cost profile: pass costs=CostProfile "
                             "(verispec.engine.cached_profile or measure_profile)")
        if policy is None and gamma != "auto":
            if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= costs.g_max:
                raise ValueError(f"with draft_stop='auto', gamma is the most a step drafts: an integer in "
                                 f"1..{costs.g_max} (the cost profile's range) or 'auto', got {gamma!r}")
            policy = AutoGamma(costs, by_confidence=True, fixed=gamma)
        draft_stop = 0.0
    if gamma == "auto":
        if not isinstance(costs, CostProfile):
            raise ValueError("gamma='auto' needs the machine's cost profile: pass costs=CostProfile "
                             "(verispec.engine.cached_profile or measure_profile)")
        if draft is not None:
            policy = AutoGamma(costs, by_confidence=stop_auto)
        lookup_policy = LookupGamma(costs) if lookup is not None else None
    else:
        lookup_policy = None
    if policy is not None:
        gamma = policy.fixed or policy.g_max
    elif lookup_policy is not None:
        gamma = lookup_policy.g_max
    elif spec is not None or head is not None:
        gamma = spec.depth if spec is not None else head.depth
    elif isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft tokens per step) must be an integer >= 1 or 'auto', got {gamma!r}")
    elif isinstance(costs, CostProfile) and gamma > costs.g_max:
        raise ValueError(f"the cost profile covers γ = 1..{costs.g_max}, got gamma={gamma}")
    rule = get_rule(rule)
    if getattr(rule, "needs_raw", False) and (spec is not None or head is not None or lookup is not None):
        raise ValueError(f"rule {rule.spec()!r} reads the draft's raw distribution: it runs on chains of a draft "
                         "model only (no tree, head or prompt lookup)")
    if spec is not None:
        check_tree_rule(rule, spec)
    if head is not None:
        spec_text = f"eagle3:top_k={head.top_k},depth={head.depth},nodes={head.nodes}"
        check_tree_rule(rule, TreeSpec("dynamic", "deterministic", top_k=head.top_k, depth_limit=head.depth,
                                       nodes=head.nodes))
    else:
        spec_text = spec.spec() if spec else ""
    if lookup is not None:
        check_tree_rule(rule, TreeSpec("static", "deterministic", (1,) * gamma))
    run = Decoding(target, prompt_ids, stats=Stats(mode="sd", rule=rule.spec(), gamma=gamma,
                                                    gamma_policy=_policy_label(policy, lookup_policy),
                                                    tree=spec_text),
                    max_new_tokens=max_new_tokens, stop=stop, seed=seed, gamma=gamma)
    stats, out, ids = run.stats, run.out, run.ids
    if draft is not None:
        check_prompt(draft, ids, max_new_tokens)
    width = vocab_width or (check_compatible(target, draft) if draft is not None
                            else min(target.vocab_size, tokenizer_size(target)))
    if isinstance(draft_stop, bool) or not isinstance(draft_stop, (int, float)) or not 0.0 <= draft_stop < 1.0:
        raise ValueError(f"draft_stop is a draft probability in [0, 1) or 'auto', got {draft_stop!r}")
    by_confidence = policy is not None and policy.by_confidence
    sources = DraftSources(target, draft, lookup=lookup, head=head, spec=spec, sampling=sampling, width=width,
                           generator=run.gen, stats=stats, stop_below=draft_stop,
                           keep_drafting=policy.keep_drafting if by_confidence else None,
                           keep_raw=getattr(rule, "needs_raw", False))

    target.reset()
    with stats.timing("prefill_s"):
        if len(ids) > 1:
            target.forward(ids[:-1], all_logits=False)
        sources.prefill(ids)

    # the cost model covers chains of the draft model and of lookup (γ <= its g_max, checked above)
    profile = costs if isinstance(costs, CostProfile) and spec is None and head is None else None
    modelled = 0.0   # the cost model's time of the steps taken, in target steps
    run.start()
    while True:
        unseen = len(sources.pending) if draft is not None else None   # the draft's catch-up this step
        cap = out.remaining - 1
        g = min(policy.next(unseen) if policy else gamma, cap)
        # 1. draft a tree (a chain: one child per node) below the root, or nothing; with lookup_policy
        # lookup's draft must beat the step it replaces (the draft model's chain of g, or a plain step)
        choose = None
        if lookup_policy is not None:
            rival = policy.rate(g, unseen) if policy is not None else 1.0 / profile.verify_cost(0)
            choose = functools.partial(lookup_policy.choose, rival=rival)
        proposal = sources.propose(g, min(lookup_policy.g_max, cap) if lookup_policy else None, choose)
        drafted = max(proposal.depths(), default=-1) + 1 if proposal is not None else 0
        stats.record_gamma(drafted)
        if profile is not None:
            free = proposal is not None and proposal.source == "lookup"
            modelled += profile.verify_cost(drafted) if free else profile.step_cost(drafted, unseen=unseen)
        if proposal is None:
            # A plain target step (one token left, nothing to draft, or the policy found drafting
            # not worth it): the next token comes from the target alone (bonus semantics).
            with stats.timing("verify_s"):
                logits = target.forward([sources.root], all_logits=False)
            stats.target_calls += 1
            with stats.timing("rule_s"):
                tok = run.sample(sampling.process(logits[:, :width]))
            if out.extend([tok]):
                break
            sources.after_plain(tok)
            continue

        # 2. one target forward over [root, nodes] -> p at the root and after every node
        with stats.timing("verify_s"):
            target_logits = target.forward_tree([sources.root] + proposal.tokens,
                                                [-1] + [par + 1 for par in proposal.parents])
        stats.target_calls += 1
        stats.tree_nodes += proposal.n_nodes
        # 3. verify -> the accepted path and the next token z
        with stats.timing("rule_s"):
            p = sampling.process(target_logits[:, :width])
            draft_tree = DraftTree(torch.tensor([proposal.tokens], device=run.device),
                                   torch.tensor([proposal.parents], device=run.device), proposal.scheme)
            q = None if proposal.scheme == "deterministic" else proposal.q[None]
            raw = None
            if proposal.q_raw is not None:     # a rule reading the untruncated temperature-1 distributions
                raw = (torch.softmax(target_logits[:, :width].float(), -1)[None], proposal.q_raw[None])
            path_t, n_acc, nxt = verify_tree(rule, p[None], q, draft_tree, generator=run.gen, raw=raw)
            # the only copy to the host per step: the accepted count, the path and the next token
            n, z, *path = torch.cat([n_acc, nxt, path_t[0]]).tolist()
            path = path[:n]
        stats.record_step(n, drafted)
        from_model = proposal.source == "model"
        if policy is not None and from_model:
            confidences = None
            if by_confidence:       # the draft's probability of each drafted token (row i drafted token i)
                rows = torch.arange(drafted, device=proposal.q.device)
                confidences = proposal.q[rows, torch.tensor(proposal.tokens, device=rows.device)].tolist()
            policy.update(n, drafted, confidences)
        if proposal.source == "lookup":
            stats.lookup_accepted += n
            if lookup_policy is not None:
                lookup_policy.update(sources.lookup_match, n, drafted)
        if observer is not None and spec is None and from_model:
            observer(p.cpu(), proposal.q[:drafted].cpu(), torch.tensor(proposal.tokens), n)
        if tree_observer is not None:
            tree_observer(VerifiedStep(p.cpu(), _on_host(proposal), path, z))

        # 4. commit the path and z; every cache keeps the path and drops the rest of the tree
        emitted = [proposal.tokens[i] for i in path] + [z]
        if out.extend(emitted):
            break
        target.commit_tree_path([0] + [i + 1 for i in path])
        sources.after_step(proposal, path, emitted)
    result = run.result()
    # a profile models chains of the draft model and of lookup; CallCosts (one fixed γ) the draft model's only
    if profile is not None:
        stats.cost_model_speedup = profile.speedup(stats.new_tokens, modelled) if modelled else None
    elif costs is not None and spec is None and head is None and not stats.lookup_steps:
        stats.cost_model_speedup = costs.speedup(stats.block_efficiency)
    return result


def _policy_label(policy: AutoGamma | None, lookup_policy: LookupGamma | None) -> str:
    if policy is None:
        return "auto" if lookup_policy is not None else "fixed"
    base = "fixed" if policy.fixed is not None else "auto"
    return base + "+stop" if policy.by_confidence else base


def _on_host(proposal: DraftProposal) -> DraftProposal:
    """The proposal with its draft rows on the CPU (what observers read)."""
    if proposal.q is None or proposal.q.device.type == "cpu":
        return proposal
    return replace(proposal, q=proposal.q.cpu())
