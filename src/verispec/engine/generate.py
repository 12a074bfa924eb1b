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

What to draft is resolved once before the loop (:func:`verispec.engine.config.resolve`); how deep each
step drafts -- a fixed ``γ``, or the cost model's choice (``γ = "auto"``, :mod:`verispec.engine.gamma`),
``g = 0`` being a plain target step -- is the generation's :class:`~verispec.engine.plan.DraftPlan`.

``g = min(γ, budget − 1)`` so that ``max_new_tokens`` is never exceeded; when one token is left it is
sampled from the target alone. EOS or a stop string inside an accepted block ends the output at the
token that completes it. Both loops share their prologue and epilogue (:class:`Decoding`); model,
sampling and rule time is added to the :class:`Stats` fields by ``with stats.timing(field):`` blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.engine.config import DraftHead, resolve
from verispec.engine.costs import CostProfile
from verispec.engine.decoding import Decoding, GenerationResult, Observer, VerifiedStep
from verispec.engine.gamma import AutoGamma
from verispec.engine.ngram import NgramDrafter
from verispec.engine.sources import DraftSources
from verispec.engine.stats import Stats
from verispec.engine.tree import LOOKUP, DraftProposal, TreeShape
from verispec.models.base import Backend, check_compatible, tokenizer_size
from verispec.rules import Rule
from verispec.rules.tree import DETERMINISTIC, DraftTree, verify_tree
from verispec.sampling import SamplingConfig


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
    vocab_width: int | None = None,
    costs: CostProfile | None = None,
    tree: TreeShape | str | None = None,
    lookup: NgramDrafter | None = None,
    head: DraftHead | None = None,
    draft_stop: float | str | None = None,
    observers: Sequence[Observer] = (),
) -> GenerationResult:
    """Speculative decoding of ``prompt_ids`` with ``rule`` on chains or trees; see the module docstring.

    ``gamma``: draft tokens per step, or ``"auto"``: chosen before every step by the cost model from
    ``costs`` (a :class:`CostProfile`) and the acceptance seen so far (:class:`AutoGamma`; a step may
    then also be a plain target step, ``g = 0``), or an :class:`AutoGamma` of one's own (fresh per
    generation: it learns from the steps). ``tree`` (a :class:`TreeShape` or its text, e.g.
    ``"dynamic:top_k=10,depth=5,nodes=60"``) drafts that tree instead of a chain of ``gamma`` tokens.
    ``vocab_width`` (from :func:`check_compatible`, computed when omitted) slices both models' logits
    to the shared vocabulary. ``costs`` (a :class:`CostProfile`) fills ``stats.cost_model_speedup`` for
    chains: the modelled time of target-only sampling over the modelled time of the steps actually taken
    (:mod:`verispec.engine.costs`). ``observers`` see every verification as a :class:`VerifiedStep` on the
    host (:meth:`VerifiedStep.chain` gives a draft-model chain's ``p``, ``q``, drafts and accepted count).

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
    model's γ_max). ``draft_stop=None`` (the default): ``"auto"`` with ``gamma="auto"`` on the draft model's
    chains alone, else 0.0 (:func:`~verispec.engine.config.default_draft_stop`); ``gamma="auto",
    draft_stop=0.0`` chooses the step's γ alone. With a tree or a head, ``gamma`` is their depth.
    """
    cfg = resolve(rule=rule, gamma=gamma, tree=tree, draft_stop=draft_stop, costs=costs, draft=draft is not None,
                  lookup=lookup is not None, head=head)
    run = Decoding(target, prompt_ids, stats=Stats(mode="sd", rule=cfg.rule.spec(), gamma=cfg.gamma,
                                                   gamma_policy=cfg.gamma_policy, tree=cfg.tree_label),
                   max_new_tokens=max_new_tokens, stop=stop, seed=seed, gamma=cfg.gamma)
    stats, out, plan = run.stats, run.out, cfg.plan()
    if draft is not None:
        run.check_prompt(draft)
    width = vocab_width or (check_compatible(target, draft) if draft is not None
                            else min(target.vocab_size, tokenizer_size(target)))
    sources = DraftSources(target, draft, lookup=lookup, head=head, shape=cfg.tree, sampling=sampling, width=width,
                           generator=run.gen, stats=stats, stop_below=cfg.draft_stop,
                           keep_drafting=plan.keep_drafting, keep_raw=cfg.keep_raw)
    target.reset()
    # Where no draft can pay, every step is plain: the prefill then feeds the whole prompt and gives the first
    # token's distribution, as target-only sampling does (no forward of the prompt's last token on its own).
    plain_only = plan.defers_draft and lookup is None and head is None
    ready = None        # the target's logits at the root, when its forward has already run
    with stats.timing("prefill_s"):
        if plain_only:
            ready = target.forward(run.ids, all_logits=False)
            stats.target_calls += 1
        elif len(run.ids) > 1:
            target.forward(run.ids[:-1], all_logits=False)
        sources.prefill(run.ids, defer_draft=plan.defers_draft)

    run.start()
    while True:
        # 1. draft a tree (a chain: one child per node) below the root, or nothing (a plain step)
        unseen, cap = sources.unseen, out.remaining - 1
        g = plan.length(unseen, cap)
        proposal = sources.propose(g, *plan.lookup_choice(g, unseen, cap))
        drafted = proposal.depth if proposal is not None else 0
        stats.record_gamma(drafted)
        plan.count(proposal, drafted, unseen)
        if proposal is None:        # the next token comes from the target alone (bonus semantics)
            tok = _plain_step(target, sources.root, sampling, width, run, ready)
            ready = None
            if out.extend([tok]):
                break
            sources.after_plain(tok)
            continue
        # 2. one target forward over [root, nodes] -> p at the root and after every node
        with stats.timing("verify_s"):
            logits = target.forward_tree([sources.root] + proposal.tokens, [-1] + [i + 1 for i in proposal.parents])
        stats.target_calls += 1
        stats.tree_nodes += proposal.n_nodes
        # 3. verify -> the accepted path and the next token z
        with stats.timing("rule_s"):
            step = _verify(cfg.rule, sampling, logits[:, :width], proposal, run.gen)
        stats.record_step(step.n_accepted, drafted, lookup=proposal.source == LOOKUP, nodes=proposal.n_nodes)
        plan.learn(proposal, step.n_accepted, drafted, sources.lookup_match)
        _notify(observers, step)
        # 4. commit the path and z; every cache keeps the path and drops the rest of the tree
        emitted = [proposal.tokens[i] for i in step.path] + [step.next_token]
        if out.extend(emitted):
            break
        target.commit_tree_path([0] + [i + 1 for i in step.path])
        sources.after_step(proposal, step.path, emitted)
    result = run.result()
    stats.cost_model_speedup = plan.speedup(stats)
    return result


def _plain_step(target: Backend, root: int, sampling: SamplingConfig, width: int, run: Decoding,
                ready: torch.Tensor | None = None) -> int:
    """One target forward over the root and a token sampled from it; ``ready``: the target's logits at the
    root ``[1, V]`` where the prefill already computed them (no forward then)."""
    if ready is not None:
        logits = ready
    else:
        with run.stats.timing("verify_s"):
            logits = target.forward([root], all_logits=False)
        run.stats.target_calls += 1
    with run.stats.timing("rule_s"):
        return run.sample(sampling.process(logits[:, :width]))


def _verify(rule: Rule, sampling: SamplingConfig, logits: torch.Tensor, proposal: DraftProposal,
            generator: torch.Generator) -> VerifiedStep:
    """Verify ``proposal`` against the target's ``logits [N+1, V]`` (root, then every node): the accepted
    path and the next token, with one copy to the host."""
    p = sampling.process(logits)
    device = p.device
    tree = DraftTree(torch.tensor([proposal.tokens], device=device), torch.tensor([proposal.parents], device=device),
                     proposal.scheme)
    q = None if proposal.scheme == DETERMINISTIC else proposal.q[None]
    raw = None
    if proposal.q_raw is not None:     # a rule reading the untruncated temperature-1 distributions
        raw = (torch.softmax(logits.float(), -1)[None], proposal.q_raw[None])
    path_t, n_acc, nxt = verify_tree(rule, p[None], q, tree, generator=generator, raw=raw)
    n, z, *path = torch.cat([n_acc, nxt, path_t[0]]).tolist()
    return VerifiedStep(p, proposal, path[:n], z)


def _notify(observers: Sequence[Observer], step: VerifiedStep) -> None:
    if observers:
        host = step.on_host()
        for watch in observers:
            watch(host)
