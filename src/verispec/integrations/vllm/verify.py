"""verispec's chain verification in vLLM's flat layout: one batched call per rule, no vLLM import.

vLLM's rejection sampler holds the drafted positions of all requests flattened: request ``b`` owns the
rows ``cu[b] - n_b .. cu[b] - 1`` of ``target_logits [N, V]`` and ``draft_probs [N, V]``, ``n_b`` =
``num_draft_tokens[b]`` (0 allowed), and its bonus token (sampled by vLLM's ordinary sampler from the
processed target at the position after the last draft) arrives separately. The result is vLLM's
``[B, max_spec_len + 1]`` int32 table: the accepted drafts, then the correction or the bonus token, then
:data:`PLACEHOLDER` (-1).

Per request the semantics are exactly verispec's (:mod:`verispec.rules.base`, :mod:`verispec.rules.tree`):

* probabilistic drafts (``q`` given, ``x ~ q``): the chain form. The shared chain verifier's rules
  (``PerTokenRule.verify`` not overridden) run here batched over every row of the group: ``h =
  rule.accept_prob_at(p, q, x)``, the leading successes ``u < h`` are accepted, the first failure emits
  ``z ~ rule.residual(p, q)`` at that position; rules with their own ``verify`` (mentored, the divergence
  gates, SGLang's thresholds, strict) are called as ``rule.verify(p [b, g+1, V], q [b, g, V], x [b, g])`` on
  the rows with ``g`` drafts;
* point-mass drafts (``q`` None: ngram, greedy drafting): the deterministic-candidate form: accept with
  ``rule.accept_prob_at(p, δ_x, x)``, on rejection ``z ~ rule.bonus(norm(p·1_{V∖{x}}))``;
* all drafts accepted: the bonus token. Every per-token rule draws it from ``p`` (vLLM's sampled token is
  used), ``greedy`` from ``argmax p`` (read from the bonus logits).

Greedy requests (temperature 0) see one-hot ``p = δ_argmax`` and ``q = δ_x`` as in verispec's pipeline at
temperature 0; for the rules whose acceptance then is an exact match (lossless, greedy, lenience, the
ceiling on ``p``, the truncation sets) this is computed from the argmax alone, like vLLM's greedy path.

Randomness: ``uniforms [N]`` (one per drafted token, float64, drawn by the caller with the requests'
seeded generators, as vLLM does), and one draw per rejected row for its correction (from the row's
generator when it has one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.checks import MASS_EPS
from verispec.rules.base import PerTokenRule, Rule, normalize_or
from verispec.rules.collaborative import CeilingOnTarget, CosWE, Lenience
from verispec.rules.lossless import Greedy, Lossless
from verispec.rules.truncation import Truncation

#: vLLM's marker of an unused slot in the output table.
PLACEHOLDER = -1
#: Rules whose acceptance on one-hot ``p`` and ``q`` is an exact match against ``argmax p`` with the
#: correction ``argmax p`` (checked in the tests against the general path).
EXACT_MATCH_WHEN_GREEDY = (Lossless, Greedy, Lenience, CeilingOnTarget, Truncation)
_LOSSLESS = Lossless()
#: Rules whose residual is ``norm((p − q)_+)`` with fallback ``p`` (sampled without normalising first).
_LOSSLESS_RESIDUALS = (Lossless.residual, Lenience.residual, CosWE.residual)


def uses_chain_verifier(rule: Rule) -> bool:
    """Whether ``rule.verify`` is the shared chain verifier (then its ``(h, residual)`` run here batched)."""
    return isinstance(rule, PerTokenRule) and type(rule).verify is PerTokenRule.verify


def point_mass_form(rule: Rule) -> PerTokenRule:
    """The rule that verifies point-mass drafts for ``rule``: itself, or ``lossless`` for the lossless
    settings of rules that accept a candidate ``c`` with ``p(c)`` there (``cos_we:lam=1``, ``strict``,
    ...; see :data:`verispec.rules.tree.LOSSLESS_AT_POINT_MASS`)."""
    if isinstance(rule, (Lossless, Greedy, Lenience, CeilingOnTarget, Truncation)):
        return rule
    if rule.is_lossless:
        return _LOSSLESS
    raise ValueError(f"rule {rule.spec()!r} has no point-mass form (see verispec.integrations.vllm.support)")


def verify_flat(
    rules: Sequence[Rule | None],
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    greedy_rows: torch.Tensor | None = None,
    bonus_logits: torch.Tensor | None = None,
    generators: dict[int, torch.Generator] | None = None,
    out: torch.Tensor | None = None,
    max_spec_len: int | None = None,
) -> torch.Tensor:
    """Verify every request whose entry of ``rules`` is a rule; rows with None are left untouched in ``out``.

    ``target_logits [N, V]``: the target at the drafted positions after vLLM's processing (temperature,
    top-k, top-p; raw for greedy rows). ``draft_probs [N, V]`` or None (point-mass drafts).
    ``draft_token_ids [N]``; ``num_draft_tokens [B]`` (list); ``bonus_token_ids [B]`` or ``[B, 1]``;
    ``uniforms [N]`` float64 in [0, 1). ``greedy_rows [B]`` bool: requests at temperature 0 (None: none).
    ``bonus_logits [B, V]``: the processed target at the bonus positions, needed only by rules with their own
    ``verify`` and by ``greedy`` on sampled rows. ``generators``: vLLM's ``{row: torch.Generator}`` of seeded
    requests. ``out [B, max_spec_len + 1]`` int32 to fill (created filled with -1 when None).
    ``-> out``.
    """
    batch = len(num_draft_tokens)
    device = target_logits.device
    n_draft = torch.as_tensor(list(num_draft_tokens), dtype=torch.long)
    width = (int(n_draft.max()) if batch else 0) if max_spec_len is None else max_spec_len
    if out is None:
        out = torch.full((batch, width + 1), PLACEHOLDER, dtype=torch.int32, device=device)
    if len(rules) != batch:
        raise ValueError(f"one rule (or None) per request: got {len(rules)} for {batch} requests")
    generators = generators or {}
    bonus = bonus_token_ids.reshape(-1)
    starts = torch.cumsum(n_draft, 0) - n_draft

    groups: dict[Rule, list[int]] = {}
    for b, rule in enumerate(rules):
        if rule is not None:
            groups.setdefault(rule, []).append(b)
    for rule, rows in groups.items():
        with_drafts = [b for b in rows if num_draft_tokens[b] > 0]
        without = [b for b in rows if num_draft_tokens[b] == 0]
        if without:
            idx = torch.tensor(without, device=device)
            logits = None if bonus_logits is None else bonus_logits[idx]
            out[idx, 0] = _bonus_for(rule, bonus[idx], logits).to(out.dtype)
        if not with_drafts:
            continue
        group = _Group(with_drafts, n_draft, starts, device, greedy_rows)
        if draft_probs is None:
            _verify_point_mass(point_mass_form(rule), group, target_logits, draft_token_ids, uniforms, bonus,
                               bonus_logits, generators, out)
        elif uses_chain_verifier(rule):
            _verify_chain(rule, group, target_logits, draft_probs, draft_token_ids, uniforms, bonus, bonus_logits,
                          generators, out)
        else:
            _verify_with_rule(rule, group, target_logits, draft_probs, draft_token_ids, bonus, bonus_logits,
                              generators, out)
    return out


class _Group:
    """The rows of one rule that have drafts: ``rows [b]``, ``n [b]`` drafts each, ``tokens [n]`` their flat
    row indices in request order, ``local [n]`` / ``pos [n]`` each token's row within the group and position."""

    def __init__(self, rows: list[int], n_draft: torch.Tensor, starts: torch.Tensor, device: torch.device,
                 greedy_rows: torch.Tensor | None) -> None:
        self.rows = torch.tensor(rows, device=device)
        n = n_draft[rows]
        self.n = n.to(device)
        self.size = len(rows)
        self.width = int(n.max())
        self.local = torch.repeat_interleave(torch.arange(len(rows)), n).to(device)
        first = torch.cumsum(n, 0) - n
        self.pos = (torch.arange(int(n.sum())) - torch.repeat_interleave(first, n)).to(device)
        self.tokens = (starts[rows].to(device)[self.local] + self.pos)
        total = int(n_draft.sum())
        self.contiguous = self.tokens.numel() == total      # the group holds every drafted token, in order
        if greedy_rows is None:
            self.greedy = None
        else:
            greedy = greedy_rows.to(device)[self.rows]
            self.greedy = greedy if bool(greedy.any()) else None
        self.all_greedy = self.greedy is not None and bool(self.greedy.all())

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """The group's rows of a flat ``[N, ...]`` tensor."""
        return t if self.contiguous else t[self.tokens]

    def greedy_tokens(self) -> torch.Tensor | None:
        """``[n]`` bool: tokens of greedy rows (None: no greedy row)."""
        return None if self.greedy is None else self.greedy[self.local]


def _probs(logits: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor:
    """Softmax of processed logits ``[n, V]`` in float32; one-hot at the argmax on the ``greedy [n]`` rows."""
    probs = torch.softmax(logits.float(), dim=-1)
    if greedy is not None:
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


def _one_hot_rows(probs: torch.Tensor, tokens: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor:
    """``probs [n, V]`` with the ``greedy [n]`` rows replaced by one-hot rows at ``tokens [n]``."""
    if greedy is None:
        return probs
    one_hot = torch.zeros_like(probs).scatter_(-1, tokens.clamp_min(0)[:, None], 1.0)
    return torch.where(greedy[:, None], one_hot, probs.float())


def _bonus_for(rule: Rule, sampled: torch.Tensor, bonus_logits: torch.Tensor | None) -> torch.Tensor:
    """The bonus token of each row: vLLM's draw from ``p``, or ``argmax p`` for ``greedy``."""
    if isinstance(rule, Greedy):
        if bonus_logits is None:
            raise ValueError("the greedy rule draws its bonus token from argmax p: pass bonus_logits")
        return bonus_logits.argmax(-1)
    return sampled


def _accepted_counts(ok: torch.Tensor, group: _Group) -> torch.Tensor:
    """Leading successes per row ``[b]`` from ``ok [n]`` (one flag per drafted token of the group)."""
    table = torch.ones(group.size, group.width, dtype=torch.bool, device=ok.device)
    table[group.local, group.pos] = ok
    return table.long().cumprod(-1).sum(-1).minimum(group.n)


def _row_uniforms(group: _Group, rows: torch.Tensor, generators: dict[int, torch.Generator],
                  device: torch.device) -> torch.Tensor:
    """One float64 ``U[0, 1)`` per row of ``rows`` (indices into the group), from the row's generator if seeded."""
    u = torch.rand(rows.numel(), dtype=torch.float64, device=device)
    if generators:
        for i, b in enumerate(group.rows[rows].tolist()):
            gen = generators.get(b)
            if gen is not None:
                u[i] = torch.rand((), dtype=torch.float64, device=device, generator=gen)
    return u


def _sample(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row of ``dist [r, V]`` (rows need not be normalised) with ``u [r]`` -> ``[r]``;
    as :func:`verispec.rules.base.sample_categorical` (float64 cumulative sums, zero-mass tokens never drawn)."""
    cdf = dist.double().cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return idx.clamp_max(dist.shape[-1] - 1)


def _write(out: torch.Tensor, group: _Group, draft: torch.Tensor, n_acc: torch.Tensor, last: torch.Tensor) -> None:
    """Accepted drafts (``draft [n]`` flat), then ``last [b]`` at position ``n_acc [b]``, into ``out``."""
    keep = group.pos < n_acc[group.local]
    out[group.rows[group.local[keep]], group.pos[keep]] = draft[keep].to(out.dtype)
    out[group.rows, n_acc] = last.to(out.dtype)


def _finish(rule: PerTokenRule, group: _Group, n_acc: torch.Tensor, rejection_law, bonus: torch.Tensor,
            bonus_logits: torch.Tensor | None, generators, draft: torch.Tensor, out: torch.Tensor) -> None:
    """Rows that rejected draw their correction from ``rejection_law(flat token index [r]) -> [r, V]`` at the
    failed position; the others take the bonus; then the table is written."""
    device = n_acc.device
    last = _bonus_for(rule, bonus[group.rows], None if bonus_logits is None else bonus_logits[group.rows])
    last = last.clone()
    rejected = (n_acc < group.n).nonzero()[:, 0]
    if rejected.numel():
        first = torch.cumsum(group.n, 0) - group.n
        failed = first[rejected] + n_acc[rejected]                 # index into the group's flat tokens
        dist = rejection_law(failed)
        last[rejected] = _sample(dist, _row_uniforms(group, rejected, generators, device)).to(last.dtype)
    _write(out, group, draft, n_acc, last)


def _verify_chain(rule: PerTokenRule, group: _Group, target_logits, draft_probs, draft_token_ids, uniforms, bonus,
                  bonus_logits, generators, out) -> None:
    """Probabilistic drafts, a rule on the shared chain verifier: ``h`` and the residual batched over the group."""
    draft = group.take(draft_token_ids).long()
    u = group.take(uniforms)
    greedy = group.greedy_tokens()
    if group.all_greedy and isinstance(rule, EXACT_MATCH_WHEN_GREEDY):
        target_argmax = group.take(target_logits).argmax(-1)
        n_acc = _accepted_counts(draft == target_argmax, group)
        _finish(rule, group, n_acc, lambda at: torch.zeros(at.numel(), target_logits.shape[-1], device=draft.device)
                .scatter_(-1, target_argmax[at, None], 1.0), bonus, bonus_logits, generators, draft, out)
        return
    p = _probs(group.take(target_logits), greedy)
    q = _one_hot_rows(group.take(draft_probs), draft, greedy).float()
    valid = draft >= 0
    h = rule.accept_prob_at(p, q, draft.clamp_min(0))
    n_acc = _accepted_counts(valid & (u < h), group)
    if type(rule).residual in _LOSSLESS_RESIDUALS:
        rejection_law = lambda at: _lossless_residual_mass(p, q, at)   # noqa: E731
    else:
        rejection_law = lambda at: rule.residual(p[at], q[at])   # noqa: E731
    _finish(rule, group, n_acc, rejection_law, bonus, bonus_logits, generators, draft, out)


def _lossless_residual_mass(p: torch.Tensor, q: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``(p − q)_+`` at rows ``at`` (unnormalised: :func:`_sample` normalises), ``p`` where that mass vanishes:
    ``lossless_residual``'s law in fewer passes over the vocabulary."""
    mass = p.index_select(0, at)
    mass.sub_(q.index_select(0, at)).clamp_min_(0.0)
    empty = mass.sum(-1) <= MASS_EPS
    if bool(empty.any()):
        mass[empty] = p[at[empty]]
    return mass


def _verify_point_mass(rule: PerTokenRule, group: _Group, target_logits, draft_token_ids, uniforms, bonus,
                       bonus_logits, generators, out) -> None:
    """Point-mass drafts: the deterministic-candidate form of :mod:`verispec.rules.tree` on a chain."""
    draft = group.take(draft_token_ids).long()
    u = group.take(uniforms)
    valid = draft >= 0
    x = draft.clamp_min(0)
    if group.all_greedy:             # every point-mass rule is an exact match on one-hot p
        target_argmax = group.take(target_logits).argmax(-1)
        n_acc = _accepted_counts(valid & (x == target_argmax), group)
        _finish(rule, group, n_acc, lambda at: torch.zeros(at.numel(), target_logits.shape[-1], device=draft.device)
                .scatter_(-1, target_argmax[at, None], 1.0), bonus, bonus_logits, generators, draft, out)
        return
    p = _probs(group.take(target_logits), group.greedy_tokens())
    point_mass = torch.ones((), dtype=p.dtype, device=p.device).expand_as(p)   # q(x) = 1 at the drafted token
    h = rule.accept_prob_at(p, point_mass, x)
    n_acc = _accepted_counts(valid & (u < h), group)

    def rejection_law(at: torch.Tensor) -> torch.Tensor:
        g = p[at]
        zeroed = g.scatter(-1, x[at, None], 0.0)
        return rule.bonus(normalize_or(torch.where(valid[at, None], zeroed, g), g))

    _finish(rule, group, n_acc, rejection_law, bonus, bonus_logits, generators, draft, out)


def _verify_with_rule(rule: Rule, group: _Group, target_logits, draft_probs, draft_token_ids, bonus, bonus_logits,
                      generators, out) -> None:
    """Probabilistic drafts, a rule with its own ``verify``: called on the rows with the same number of drafts."""
    if bonus_logits is None:
        raise ValueError(f"rule {rule.spec()!r} verifies whole chains: pass bonus_logits (the bonus position's p)")
    draft_all = group.take(draft_token_ids).long()
    greedy_tokens = group.greedy_tokens()
    p_all = _probs(group.take(target_logits), greedy_tokens)
    q_all = _one_hot_rows(group.take(draft_probs), draft_all, greedy_tokens).float()
    greedy_rows = group.greedy
    p_bonus = _probs(bonus_logits[group.rows], greedy_rows)
    first = torch.cumsum(group.n, 0) - group.n
    for g in sorted(set(group.n.tolist())):
        sub = (group.n == g).nonzero()[:, 0]                                  # rows of the group with g drafts
        flat = (first[sub][:, None] + torch.arange(g, device=sub.device)).reshape(-1)
        p = torch.cat([p_all[flat].view(sub.numel(), g, -1), p_bonus[sub][:, None]], dim=1)   # [r, g+1, V]
        q = q_all[flat].view(sub.numel(), g, -1)
        draft = draft_all[flat].view(sub.numel(), g)
        seeded = [generators.get(b) for b in group.rows[sub].tolist()] if generators else []
        if any(gen is not None for gen in seeded):
            gens = [gen if gen is not None else torch.Generator(device=p.device).manual_seed(
                int(torch.randint(0, 2**62, ()))) for gen in seeded]
        else:
            gens = None
        n_acc, nxt = rule.verify(p, q, draft.clamp_min(0), generator=gens)
        n_acc = torch.minimum(n_acc, (draft >= 0).long().cumprod(-1).sum(-1))   # an invalid draft is rejected
        keep = torch.arange(g, device=sub.device)[None, :] < n_acc[:, None]
        rows = group.rows[sub]
        r_idx, p_idx = keep.nonzero(as_tuple=True)
        out[rows[r_idx], p_idx] = draft[r_idx, p_idx].to(out.dtype)
        out[rows, n_acc] = nxt.to(out.dtype)
