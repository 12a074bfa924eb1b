"""EAGLE-3 draft heads in the authors' Hugging Face layout, and EAGLE-2 dynamic draft trees grown with them.

The head (Li et al., EAGLE-3, arXiv 2503.01840; reference implementation ``eagle/model/cnets.py`` of
github.com/SafeAILab/EAGLE, class ``Model``) is one Llama decoder layer on top of the target:

- ``fc`` fuses three hidden states of the target, ``[3 * target_hidden] -> [hidden]``. They are the
  *inputs* of decoder layers ``low = 2``, ``mid = L // 2`` and ``high = L - 3`` (``L`` layers), i.e.
  ``output_hidden_states[i]`` of a transformers model for ``i`` in ``(2, L // 2, L - 3)`` (index 0 is the
  embedding output), concatenated in that order (:func:`default_target_layers`).
- ``midlayer``: the decoder layer; its attention reads ``concat(input_layernorm(embedding(token)),
  hidden_norm(hidden))`` of width ``2 * hidden``, the residual is the (fused) hidden state; then the
  usual post-attention norm and SwiGLU MLP. Rotary embeddings use the head's own ``rope_theta``
  (10000 when config.json has none, as for the published Llama-3.1 head).
- ``norm`` and ``lm_head`` over a reduced draft vocabulary of ``draft_vocab_size`` ids; ``d2t``
  (``[draft_vocab]``, int64) maps a draft id to the target id ``draft_id + d2t[draft_id]``; ``t2d``
  (``[vocab]``, bool) marks the target ids in the draft vocabulary.
- ``embed_tokens`` is usually absent from the published files: the target's input embeddings are used.

Head entries and positions. Entry ``t`` of the head's sequence pairs the target's hidden state at
token ``t`` (which predicts token ``t + 1``) with the embedding of token ``t + 1``; it sits at position
``t``. Its output hidden state gives the draft distribution of token ``t + 2`` and is the hidden input
of the next entry while drafting (the head then feeds itself; only committed entries use the target's
hidden states and stay in the head's KV cache).

Trees (EAGLE-2, ``Model.topK_genrate``): the root is the last committed token, which the target has
not processed; its entry pairs the hidden state of the token before it with the root's embedding.
Level 1 holds the ``top_k`` best draft tokens after the root; below, every level expands the
``top_k`` best candidates of the level above by cumulative draft log-probability (one head forward
for all of them, tree attention), each proposing its ``top_k`` best children; finally the ``nodes``
best candidates overall are kept. A child's cumulative log-probability never exceeds its parent's,
and ties are broken towards the earlier candidate, so every kept node's ancestors are kept.
Rankings use the log-softmax of the draft logits (no temperature, no truncation) computed in
float32 (float64 for a float64 head); EAGLE computes it in the head's dtype. Everything is
deterministic: sorting is stable, ties go to the lower draft id.

Parameter conventions: ``depth`` is the deepest level of the returned tree and ``nodes`` the number
of returned nodes, the root excluded (as in :class:`verispec.engine.tree.TreeShape`). EAGLE's code
counts differently: ``total_token = 60, depth = 5`` there returns 59 nodes up to 6 levels deep, i.e.
``nodes = 59, depth = 6`` here.
"""

from verispec.models.eagle3.config import Eagle3Config, default_target_layers, published_keys
from verispec.models.eagle3.drafter import Eagle3Drafter, load_head_pair
from verispec.models.eagle3.head import Eagle3Head

__all__ = ["Eagle3Config", "Eagle3Head", "Eagle3Drafter", "default_target_layers", "published_keys", "load_head_pair"]
