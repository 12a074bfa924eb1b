"""FLy, training-free loosely speculative decoding (Li et al., arXiv 2511.22972): entropy-gated deferral.

Sources: the paper's code ``github.com/AMD-AGI/FLy`` @ ``6667ae8`` (2026-05-15),
``fly/models/FLy.py``: ``SPDGenerate.generate_chunks`` (lines 1083–1130), ``calculate_topk_entropy``
(358–371), ``rej_by_entropy`` (403–411), ``_create_output`` (296–355), default configuration
``fly_config/FLy_Llama3_70b.json`` (``win_len = 6``, ``entropy_thre = 0.3``); and the vLLM port
(docs.vllm.ai "FLy Verification"; its Triton kernels ``apply_fly_random_acceptance_kernel`` and
``apply_fly_greedy_acceptance_kernel`` and ``compute_fly_entropy``, read in the public code index
without a repository path), which defines the rule for sampled drafts with p/q acceptance.

Rule as implemented, for a block ``x_1..x_G`` with ``u_i ~ U[0, 1)``::

    native_i = u_i < min(1, p_i(x_i)/q_i(x_i))                        (the lossless token test)
    H3_i     = −Σ_{v in top-3 of p_i} p_i(v) log p_i(v)                (nats; not renormalised)
    defer_i  = not native_i  and  H3_i >= θ  and  p_i(x_i), q_i(x_i) > 0  and  i + W <= G
               and native_{i+1} and … and native_{i+W}                 (the next W, natively)
    accept_i = native_i or defer_i
    n = leading accepts;  n < G: z ~ norm((p_{n+1} − q_{n+1})_+) (fallback p);  n = G: z ~ p_{G+1}

A mismatch is thus accepted when the target is uncertain there (entropy gate) and the draft goes on
to agree with the target for the following ``W`` tokens (the deferred window: a wrong token would
make the target "self-correct" and reject one of them). "Accepted" for the window means natively
accepted: a deferral never supports another (the source unfolds the pre-deferral mask). Positions
whose window would leave the block are verified natively. Spec: ``fly:theta=0.3,window=5``.

Where this differs from the sources, and why:

* The official code verifies by matching: temperature 0 compares the draft with the target's argmax;
  temperature > 0 accepts the (greedy) draft token if it equals either of two samples from ``p`` and
  emits the first sample on rejection. Neither is verispec's setting (sampled drafts, ``p``/``q``
  known), so the native test is the lossless token test with its residual, as in the vLLM port.
* Temperature 0, the official default (``temperature: 0.0``): verispec's ``p`` is then one-hot, so
  the top-3 entropy is 0 and ``p(x) = 0`` at every mismatch — FLy reduces to exact matching here,
  whereas the official code reads the entropy on the target's raw logits and defers. Reproducing the
  greedy FLy needs the unprocessed target distribution in ``verify`` (an API change, not made here).
* ``window`` is the number of following tokens checked (``W``, as the vLLM port's
  ``fly_window_size``); the official ``win_len`` counts the mismatch too: ``win_len = W + 1``
  (so the official default is ``window=5``). The official end-of-block mask also refuses the last
  position whose window fits (``i = G − W`` here, an off-by-one of ``updated_accept[:, -win_len:]``);
  like the vLLM port we allow it.
* Top-3 entropy is taken on the processed ``p`` (as in the vLLM port); the official code takes it on
  the target's raw logits (``log_softmax`` before temperature). The two agree at temperature 1
  without truncation. The official code switches the gate off for ``entropy_thre <= 0.01``; here
  ``theta = 0`` opens it everywhere (the same thing). ``p_i(x_i) > 0`` and ``q_i(x_i) > 0`` are
  required, as in vLLM: a token outside the target's (processed) support is never accepted.

Taxonomy: **other**. Acceptance at position ``i`` depends on the uniforms and distributions of
positions ``i+1..i+W`` (a look-ahead), gated by a row statistic of ``p_i``: it is neither an allowed
set of ``p_i`` (truncation), nor an interpolation of ``p`` and ``q`` (collaborative), nor a
resampling from a target built from both (deferral in this library's sense — FLy's "deferred" means
postponing the decision, not deferring to another distribution). Lossy once the gate can open
(``theta`` below the target's top-3 entropy somewhere, at most ``log 3``) and a window fits in the
block (``window < G``); otherwise it is token-level ``lossless``.

Law. It does not factor per position, so there is no ``induced``/``acceptance_rate``. Per block it is
exact: the native decisions are independent Bernoulli(``h_i``), and ``outcome_law`` enumerates their
``2^G`` patterns (``G <= 16``).

How ``diagnose`` should treat FLy and any lossy sequence-level rule (proposal for the lead): the
per-position measures of ``diagnose`` (distortion of ``P_R`` from ``p``, TV/KL by entropy bin, the
compression-error bounds) are functions of a per-token law ``P_R(p, q)``, which these rules do not
have — FLy's law at a position depends on the next ``W`` positions, HSD variants' on the whole
block. ``diagnose`` should refuse them up front (``rule.per_token is False and not
rule.is_lossless``) with a message naming the rule, saying that its law is defined per block, and
pointing to ``verispec bench`` (end-task quality and accepted tokens per step on real models) and to
``verispec.rules.block_law`` (the exact joint law and its TV from the target on toy models, as
``benchmarks/sequence_rules.py`` prints). Lossless sequence-level rules (``block``, ``hsd``) keep
their current treatment (the law is ``p``). A later per-position proxy would be the marginal law of
the token emitted at a recorded position under the block law conditioned on the recorded prefix,
which needs the draft's and target's distributions for every continuation inside the window — not
recorded by ``diagnose`` today.
"""

from __future__ import annotations

import math

import torch

from verispec.params import Param, in_range
from verispec.rules.base import (
    Rule,
    check_verify_inputs,
    normalize_or,
    positive_part,
    ratio,
    sample_categorical,
    uniform,
)
from verispec.rules.hsd_variants import sequence_level_error

#: The entropy gate reads the target's three largest probabilities (the source's ``calculate_topk_entropy(·, 3)``).
ENTROPY_TOP_K = 3
#: Largest block size whose native decisions ``outcome_law`` enumerates (2^G patterns).
MAX_ENUMERATED_GAMMA = 16

THETA = Param("theta", float, lambda v: v >= 0, "a number >= 0 (nats; top-3 entropy is at most log 3 ≈ 1.0986)",
              "entropy gate θ on the target's top-3 entropy (official default 0.3)", 0.3)
WINDOW = Param("window", int, in_range(1, math.inf), "an integer >= 1",
               "number W of following draft tokens that must be natively accepted (official win_len = W + 1)", 5)


def top_k_entropy(p: torch.Tensor, k: int = ENTROPY_TOP_K) -> torch.Tensor:
    """``−Σ_{top-k} p log p`` over the last dimension ``[..., V] -> [...]`` (zero terms count 0)."""
    top = torch.topk(p, min(k, p.shape[-1]), dim=-1).values
    terms = torch.where(top > 0, top * top.clamp_min(torch.finfo(top.dtype).tiny).log(), torch.zeros_like(top))
    return -terms.sum(-1)


class FLy(Rule):
    name = "fly"
    is_lossless = False
    per_token = False
    family = "fly"
    taxonomy = "other"
    PARAMS = (THETA, WINDOW)

    def __init__(self, theta: float = 0.3, window: int = 5) -> None:
        super().__init__(theta=THETA.check(self.name, theta), window=WINDOW.check(self.name, window))

    def describe(self) -> str:
        return (f"FLy: accept a rejected draft token when the target's top-3 entropy >= {self.params['theta']} "
                f"and the next {self.params['window']} drafts pass the lossless test (lossy)")

    # -- the pieces ---------------------------------------------------------------------------
    def _native_probs(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """``h_i = min(1, p_i(x_i)/q_i(x_i))`` ``[B, G]``."""
        gamma = draft.shape[1]
        idx = draft.unsqueeze(-1)
        return ratio(p[:, :gamma].gather(-1, idx)[..., 0], q.gather(-1, idx)[..., 0]).clamp_max(1.0)

    def deferrable(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """Where a native rejection may be deferred, before looking at the window ``[B, G]`` (bool):
        the gate is open, the window fits in the block and both models give the token mass."""
        gamma = draft.shape[1]
        window = self.params["window"]
        idx = draft.unsqueeze(-1)
        px, qx = p[:, :gamma].gather(-1, idx)[..., 0], q.gather(-1, idx)[..., 0]
        fits = torch.arange(gamma, device=p.device) + window <= gamma - 1            # 0-based i + W <= G − 1
        return (top_k_entropy(p[:, :gamma]) >= self.params["theta"]) & (px > 0) & (qx > 0) & fits

    def _final_accepts(self, native: torch.Tensor, deferrable: torch.Tensor) -> torch.Tensor:
        """``accept_i = native_i or (deferrable_i and native_{i+1..i+W})`` for bool ``[..., G]``."""
        gamma = native.shape[-1]
        window = self.params["window"]
        ones = native.long()
        cum = torch.cat([torch.zeros_like(ones[..., :1]), ones.cumsum(-1)], dim=-1)   # cum[j] = Σ_{<j}
        start = torch.arange(gamma, device=native.device) + 1
        end = (start + window).clamp_max(gamma)
        window_ok = (cum[..., end] - cum[..., start]) == window
        return native | (deferrable & window_ok)

    def _residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return normalize_or(positive_part(p - q), p)

    # -- API -----------------------------------------------------------------------------------
    def verify(self, p, q, draft, generator=None):
        """``p: [B, G+1, V]``, ``q: [B, G, V]``, ``draft: [B, G]`` -> ``(n_accepted [B], next_token [B])``."""
        p, q, draft = check_verify_inputs(p, q, draft)
        batch, gamma = draft.shape
        h = self._native_probs(p, q, draft)
        u = uniform(h.shape, generator, dtype=h.dtype, device=h.device)
        accepted = self._final_accepts(u < h, self.deferrable(p, q, draft))
        n_accepted = accepted.long().cumprod(-1).sum(-1)
        at = n_accepted.clamp(max=gamma - 1)
        rows = torch.arange(batch, device=p.device)
        residual = self._residual(p[rows, at], q[rows, at])
        dist = torch.where((n_accepted == gamma)[:, None], p[:, gamma], residual)
        return n_accepted, sample_categorical(dist, generator)

    def outcome_law(self, p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """Exact ``P(n_accepted = k, next_token = v)`` per block ``[B, G+1, V]`` (float64), by enumerating
        the ``2^G`` patterns of native decisions (independent Bernoulli ``h_i``)."""
        p, q, draft = check_verify_inputs(p, q, draft)
        p, q = p.double(), q.double()
        batch, gamma = draft.shape
        if gamma > MAX_ENUMERATED_GAMMA:
            raise ValueError(f"fly.outcome_law enumerates 2^G native patterns; G = {gamma} > {MAX_ENUMERATED_GAMMA}")
        h = self._native_probs(p, q, draft)                                           # [B, G]
        bits = (torch.arange(2**gamma)[:, None] >> torch.arange(gamma)) & 1         # [P, G]
        native = bits.bool().to(p.device)
        pattern_prob = torch.where(native[None], h[:, None], 1 - h[:, None]).prod(-1)  # [B, P]
        accepted = self._final_accepts(native[None].expand(batch, -1, -1), self.deferrable(p, q, draft)[:, None])
        n = accepted.long().cumprod(-1).sum(-1)                                       # [B, P]
        prob_n = torch.zeros(batch, gamma + 1, dtype=p.dtype, device=p.device).scatter_add_(1, n, pattern_prob)
        law = torch.empty(batch, gamma + 1, p.shape[-1], dtype=p.dtype, device=p.device)
        law[:, :gamma] = prob_n[:, :gamma, None] * self._residual(p[:, :gamma], q)
        law[:, gamma] = prob_n[:, gamma, None] * p[:, gamma]
        return law

    def induced(self, p, q):
        raise sequence_level_error(self.name, lossless=False)

    def acceptance_rate(self, p, q):
        raise sequence_level_error(self.name, lossless=False)
