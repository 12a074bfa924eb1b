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
of returned nodes, the root excluded (as in :class:`verispec.engine.tree.TreeSpec`). EAGLE's code
counts differently: ``total_token = 60, depth = 5`` there returns 59 nodes up to 6 levels deep, i.e.
``nodes = 59, depth = 6`` here.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from verispec.tree_nodes import keep_best, layout_by_depth

__all__ = [
    "Eagle3Config",
    "Eagle3Head",
    "Eagle3Drafter",
    "default_target_layers",
    "published_keys",
]

#: Rotary base of the EAGLE code when config.json has no ``rope_theta``.
EAGLE_ROPE_THETA = 10000.0
#: ``rms_norm_eps`` of the EAGLE code's config class when config.json has none.
EAGLE_RMS_EPS = 1e-6
#: Node parent meaning "a child of the root token".
ROOT = -1
CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
TORCH_FILE = "pytorch_model.bin"
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: Non-persistent buffers that old checkpoints sometimes carry; recomputed here.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")

_ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def default_target_layers(num_layers: int) -> tuple[int, int, int]:
    """Indices into a transformers model's ``output_hidden_states`` (0 = embeddings) fused by EAGLE-3.

    EAGLE's target (``modeling_llama_kv.py``) keeps the input of decoder layers ``2``, ``L // 2`` and
    ``L - 3``, which is ``hidden_states[i]`` with the embedding offset. That needs ``L >= 7`` to give
    three distinct layers; smaller (test-sized) targets get ``(1, (1 + h) // 2, h)`` with ``h = L - 1``
    (``L`` for ``L < 4``): low, middle and late layers, never the final (pre-norm) output before ``L = 4``.
    """
    n = int(num_layers)
    if n < 1:
        raise ValueError(f"a target needs at least one layer, got num_layers={num_layers}")
    if n >= 7:
        return (2, n // 2, n - 3)
    high = n - 1 if n >= 4 else n
    return (1, (1 + high) // 2, high)


# --------------------------------------------------------------------------------------------------
# configuration


def _text_config(cfg: Any) -> Any:
    if isinstance(cfg, Mapping):
        from types import SimpleNamespace

        return SimpleNamespace(**cfg)
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg


@dataclass(frozen=True)
class Eagle3Config:
    """The fields of a head's config.json that shape it; ``extra`` keeps the other keys for saving."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float = EAGLE_RMS_EPS
    rope_theta: float = EAGLE_ROPE_THETA
    rope_linear_factor: float = 1.0
    hidden_act: str = "silu"
    aux_layers: tuple[int, ...] | None = None  # eagle_config.eagle_aux_hidden_state_layer_ids
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = CONFIG_FILE) -> "Eagle3Config":
        def need(key: str) -> Any:
            if d.get(key) is None:
                raise ValueError(f"{source} has no {key!r}: not an EAGLE-3 head config")
            return d[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        kv = int(d.get("num_key_value_heads") or heads)
        vocab = int(need("vocab_size"))
        rope = dict(d.get("rope_parameters") or {})
        theta = d.get("rope_theta", rope.get("rope_theta"))
        scaling = d.get("rope_scaling") or None
        factor = 1.0
        kind = rope.get("rope_type", "default")
        if scaling is not None:
            kind = scaling.get("type", scaling.get("rope_type", "default"))
            factor = float(scaling.get("factor", 1.0))
        if kind not in ("default", "linear"):
            raise ValueError(f"{source}: rope scaling {kind!r} is not supported (only none and 'linear')")
        aux = (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        act = str(d.get("hidden_act", "silu"))
        if act not in _ACTIVATIONS:
            raise ValueError(f"{source}: hidden_act {act!r} is not supported; use one of {', '.join(_ACTIVATIONS)}")
        known = {"hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "vocab_size", "draft_vocab_size", "target_hidden_size", "rms_norm_eps", "rope_theta",
                 "rope_scaling", "hidden_act"}
        cfg = cls(
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=int(d.get("head_dim") or hidden // heads),
            vocab_size=vocab,
            draft_vocab_size=int(d.get("draft_vocab_size") or vocab),
            target_hidden_size=int(d.get("target_hidden_size") or hidden),
            rms_norm_eps=float(d.get("rms_norm_eps", EAGLE_RMS_EPS)),
            rope_theta=float(theta if theta is not None else EAGLE_ROPE_THETA),
            rope_linear_factor=factor,
            hidden_act=act,
            aux_layers=tuple(int(i) for i in aux) if aux else None,
            extra={k: v for k, v in d.items() if k not in known},
        )
        cfg.validate(source)
        return cfg

    def validate(self, source: str = CONFIG_FILE) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{source}: {f.name} must be a positive integer, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{source}: num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"{source}: head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"{source}: draft_vocab_size {self.draft_vocab_size} exceeds vocab_size {self.vocab_size}")
        if self.aux_layers is not None and len(self.aux_layers) != 3:
            raise ValueError(f"{source}: eagle_aux_hidden_state_layer_ids must list 3 layers, got {self.aux_layers}")

    def to_dict(self, dtype: torch.dtype | None = None) -> dict[str, Any]:
        d = dict(self.extra)
        d.pop("rope_parameters", None)
        d.update(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            draft_vocab_size=self.draft_vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=None if self.rope_linear_factor == 1.0 else {"type": "linear",
                                                                      "factor": self.rope_linear_factor},
            hidden_act=self.hidden_act,
        )
        if self.target_hidden_size != self.hidden_size:
            d["target_hidden_size"] = self.target_hidden_size
        if self.aux_layers is not None:
            d["eagle_config"] = {**dict(d.get("eagle_config") or {}),
                                 "eagle_aux_hidden_state_layer_ids": list(self.aux_layers)}
        if dtype is not None:
            d["torch_dtype"] = str(dtype).removeprefix("torch.")
        return d


def published_keys(config: Eagle3Config, *, embeddings: bool = False) -> dict[str, tuple[int, ...]]:
    """State-dict key -> shape of a head in the authors' layout (``eagle/model/cnets.py``, ``Model``)."""
    c = config
    h, hd, heads, kv = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    keys = {
        "fc.weight": (h, 3 * c.target_hidden_size),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * hd),
        "midlayer.mlp.gate_proj.weight": (c.intermediate_size, h),
        "midlayer.mlp.up_proj.weight": (c.intermediate_size, h),
        "midlayer.mlp.down_proj.weight": (h, c.intermediate_size),
        "norm.weight": (h,),
        "lm_head.weight": (c.draft_vocab_size, h),
        "d2t": (c.draft_vocab_size,),
        "t2d": (c.vocab_size,),
    }
    if embeddings:
        keys["embed_tokens.weight"] = (c.vocab_size, h)
    return keys


# --------------------------------------------------------------------------------------------------
# the head


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype != torch.float64 else x
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act = _ACTIVATIONS[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)
        self.hidden_norm = _RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = _RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(c.hidden_size, c.rms_norm_eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Eagle3Head(nn.Module):
    """An EAGLE-3 draft head; its ``state_dict`` has the published key names (:func:`published_keys`).

    ``head(hidden [T, hidden], embeds [T, hidden], positions [T], past=(k, v), mask=None)`` runs the
    decoder layer on ``T`` new entries: ``hidden`` is the fused target hidden state (:meth:`fuse`) or
    the head's own output for a drafted entry, ``embeds`` the embeddings of the entries' tokens,
    ``past`` the cached keys/values ``[kv_heads, P, head_dim]`` (or None), ``mask [T, P + T]`` (True =
    may attend; default causal). Returns ``(out [T, hidden], k [kv_heads, T, head_dim], v)``; the
    draft log-probabilities of the next token are :meth:`draft_logprobs` ``(out)``.
    """

    def __init__(self, config: Eagle3Config, *, embeddings: bool = False,
                 target_layers: Sequence[int] | None = None) -> None:
        super().__init__()
        config.validate("Eagle3Config")
        self.config = config
        c = config
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = _RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool) if c.draft_vocab_size == c.vocab_size
                             else torch.zeros(c.vocab_size, dtype=torch.bool))
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size) if embeddings else None
        # A plain attribute, not a buffer: ``module.to(float16)`` must not round the frequencies.
        self._inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self._inv_freq_on: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._target_layers = tuple(int(i) for i in target_layers) if target_layers is not None else None
        if self._target_layers is not None and len(self._target_layers) != 3:
            raise ValueError(f"target_layers must name 3 hidden states, got {self._target_layers}")

    # -- metadata --------------------------------------------------------------------------------
    @property
    def target_layers(self) -> tuple[int, int, int]:
        """Indices into the target's ``output_hidden_states`` (0 = embeddings) whose concatenation
        :meth:`fuse` expects, low to high."""
        if self._target_layers is None:
            raise ValueError("this head does not know its target's layers: load it with target_config=... "
                             "(or target_layers=...)")
        return self._target_layers  # type: ignore[return-value]

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target vocabulary ids of draft ids: ``draft_id + d2t[draft_id]`` (EAGLE-3's mapping)."""
        return draft_ids + self.d2t[draft_ids]

    # -- compute ---------------------------------------------------------------------------------
    def fuse(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """``[T, 3 * target_hidden]`` captured target states -> ``[T, hidden]`` (the ``fc`` layer)."""
        return self.fc(target_hidden.to(device=self.device, dtype=self.dtype))

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        calc = torch.float64 if dtype == torch.float64 else torch.float32
        key = (positions.device, calc)
        inv = self._inv_freq_on.get(key)
        if inv is None:
            inv = self._inv_freq_on[key] = self._inv_freq.to(device=positions.device, dtype=calc)
        t = positions.to(calc) / self.config.rope_linear_factor
        freqs = t[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layer, attn = self.midlayer, self.midlayer.self_attn
        n = hidden.shape[0]
        x = torch.cat((layer.input_layernorm(embeds), layer.hidden_norm(hidden)), dim=-1)  # [T, 2h]
        q = attn.q_proj(x).view(n, attn.heads, attn.head_dim).transpose(0, 1)           # [H, T, hd]
        k = attn.k_proj(x).view(n, attn.kv_heads, attn.head_dim).transpose(0, 1)        # [KV, T, hd]
        v = attn.v_proj(x).view(n, attn.kv_heads, attn.head_dim).transpose(0, 1)
        cos, sin = self._rope(positions, q.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_all = k if past is None else torch.cat((past[0], k), dim=1)
        v_all = v if past is None else torch.cat((past[1], v), dim=1)
        n_past = k_all.shape[1] - n
        if mask is None:
            col = torch.arange(n_past + n, device=q.device)
            mask = col[None, :] <= (n_past + torch.arange(n, device=q.device))[:, None]
        rep = attn.heads // attn.kv_heads
        scores = q @ k_all.repeat_interleave(rep, dim=0).transpose(1, 2) / math.sqrt(attn.head_dim)
        scores = scores.masked_fill(~mask[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32 if q.dtype != torch.float64 else torch.float64)
        ctx = probs.to(q.dtype) @ v_all.repeat_interleave(rep, dim=0)                   # [H, T, hd]
        h = hidden + attn.o_proj(ctx.transpose(0, 1).reshape(n, attn.heads * attn.head_dim))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h, k, v

    def draft_logprobs(self, out: torch.Tensor) -> torch.Tensor:
        """``out [T, hidden]`` -> log-softmax over the draft vocabulary ``[T, draft_vocab]`` (float32, or
        float64 for a float64 head)."""
        logits = self.lm_head(self.norm(out))
        return torch.log_softmax(logits.double() if logits.dtype == torch.float64 else logits.float(), dim=-1)

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def random(cls, target_config: Any, *, draft_vocab_size: int, seed: int = 0, init_std: float = 0.02,
               dtype: torch.dtype = torch.float32, embeddings: bool = False,
               target_layers: Sequence[int] | None = None) -> "Eagle3Head":
        """A randomly initialised head for ``target_config`` (tests): the target's width, heads and
        vocabulary, a sorted random draft vocabulary of ``draft_vocab_size`` target ids, norm weights
        ``1 + N(0, 0.1)`` (so that swapping two of them changes the outputs)."""
        t = _text_config(target_config)
        vocab = int(t.vocab_size)
        if not 1 <= draft_vocab_size <= vocab:
            raise ValueError(f"draft_vocab_size must be in [1, {vocab}], got {draft_vocab_size}")
        heads = int(t.num_attention_heads)
        config = Eagle3Config(
            hidden_size=int(t.hidden_size),
            intermediate_size=int(getattr(t, "intermediate_size", 4 * t.hidden_size)),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(t, "num_key_value_heads", None) or heads),
            head_dim=int(t.hidden_size) // heads,
            vocab_size=vocab,
            draft_vocab_size=int(draft_vocab_size),
            target_hidden_size=int(t.hidden_size),
            rms_norm_eps=float(getattr(t, "rms_norm_eps", EAGLE_RMS_EPS)),
            extra={"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                   "max_position_embeddings": 2048, "tie_word_embeddings": False},
        )
        layers = target_layers if target_layers is not None else default_target_layers(t.num_hidden_layers)
        head = cls(config, embeddings=embeddings, target_layers=layers)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in head.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
                else:
                    p.copy_(init_std * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            used = torch.randperm(vocab, generator=gen)[:draft_vocab_size].sort().values
            head.d2t.copy_(used - torch.arange(draft_vocab_size))
            head.t2d.zero_()
            head.t2d[used] = True
        return head.to(dtype=dtype)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, target_config: Any = None,
                        device: str | torch.device = "cpu", dtype: torch.dtype | str | None = None,
                        target_layers: Sequence[int] | None = None) -> "Eagle3Head":
        """Load a head from a local directory in the authors' layout (config.json plus model.safetensors,
        pytorch_model.bin, or a sharded index of either).

        ``target_config``: the target's transformers config; checks that the head fits it (hidden size,
        vocabulary) and gives :attr:`target_layers`: ``target_layers`` if given, else the config's
        ``eagle_config.eagle_aux_hidden_state_layer_ids`` (vLLM's convention: the input of those decoder
        layers, the same ``output_hidden_states`` indices), else :func:`default_target_layers`.
        ``dtype``: None keeps the checkpoint's floating dtype.
        """
        root = Path(path).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"EAGLE-3 head directory not found: {root}")
        cfg_path = root / CONFIG_FILE
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{root} has no {CONFIG_FILE}: not a Hugging Face model directory")
        try:
            raw = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg_path} is not valid JSON: {e}") from None
        config = Eagle3Config.from_dict(raw, source=str(cfg_path))
        state = _read_state_dict(root)
        for key in [k for k in state if k.endswith(_IGNORED_SUFFIXES)]:
            del state[key]

        if config.draft_vocab_size == config.vocab_size:  # EAGLE drops d2t/t2d for a full vocabulary
            state.setdefault("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            state.setdefault("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        embeddings = "embed_tokens.weight" in state
        expected = published_keys(config, embeddings=embeddings)
        missing = [k for k in expected if k not in state]
        if missing:
            raise ValueError(f"{root}: the weights lack {', '.join(missing)} (an EAGLE-3 head in the authors' "
                             f"layout has {', '.join(expected)})")
        unexpected = [k for k in state if k not in expected]
        if unexpected:
            warnings.warn(f"{root}: ignoring weights that an EAGLE-3 head does not use: {', '.join(unexpected)}",
                          stacklevel=2)
            for k in unexpected:
                del state[k]
        bad = [f"{k} {tuple(state[k].shape)} (config.json implies {shape})" for k, shape in expected.items()
               if tuple(state[k].shape) != shape]
        if bad:
            raise ValueError(f"{root}: weight shapes do not match its config.json: {'; '.join(bad)}")
        _check_d2t(state["d2t"], config, str(root))

        layers = target_layers
        if target_config is not None:
            t = _text_config(target_config)
            if int(t.hidden_size) != config.target_hidden_size:
                raise ValueError(f"{root}: the head fuses target hidden states of width {config.target_hidden_size} "
                                 f"(fc.weight {expected['fc.weight']}) but the target's hidden_size is {t.hidden_size}")
            if int(t.vocab_size) != config.vocab_size:
                raise ValueError(f"{root}: the head's vocab_size {config.vocab_size} differs from the target's "
                                 f"{t.vocab_size}: it was trained for another target")
            n_layers = int(t.num_hidden_layers)
            if layers is None:
                layers = config.aux_layers or default_target_layers(n_layers)
            if not all(0 <= i <= n_layers for i in layers):
                raise ValueError(f"{root}: target layers {tuple(layers)} are not hidden-state indices of a "
                                 f"{n_layers}-layer target (0..{n_layers})")
        elif layers is None:
            layers = config.aux_layers

        if dtype is None:
            dtype = state["fc.weight"].dtype
        elif isinstance(dtype, str):
            dtype = getattr(torch, dtype.removeprefix("torch."))
        head = cls(config, embeddings=embeddings, target_layers=layers)
        head.load_state_dict(state, strict=True)
        return head.to(device=device, dtype=dtype).eval()

    def save_pretrained(self, path: str | os.PathLike, *, safe_serialization: bool = True) -> None:
        """Write config.json and model.safetensors (or pytorch_model.bin) in the authors' layout."""
        root = Path(path).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        config = self.config
        if self._target_layers is not None and config.aux_layers != self._target_layers:
            from dataclasses import replace

            config = replace(config, aux_layers=self._target_layers, extra=config.extra)
        (root / CONFIG_FILE).write_text(json.dumps(config.to_dict(self.dtype), indent=2, sort_keys=True) + "\n")
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.state_dict().items()}
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(state, str(root / SAFETENSORS_FILE), metadata={"format": "pt"})
        else:
            torch.save(state, root / TORCH_FILE)


def _read_state_dict(root: Path) -> dict[str, torch.Tensor]:
    if (root / SAFETENSORS_FILE).is_file():
        from safetensors.torch import load_file

        return dict(load_file(str(root / SAFETENSORS_FILE), device="cpu"))
    if (root / TORCH_FILE).is_file():
        return dict(torch.load(root / TORCH_FILE, map_location="cpu", weights_only=True))
    for index in _INDEX_FILES:
        if (root / index).is_file():
            weight_map = json.loads((root / index).read_text()).get("weight_map", {})
            state: dict[str, torch.Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                if not (root / shard).is_file():
                    raise FileNotFoundError(f"{root / index} names shard {shard}, which is missing")
                state.update(_read_shard(root / shard))
            return state
    present = sorted(p.name for p in root.iterdir())
    raise FileNotFoundError(f"{root} has no weights: expected {SAFETENSORS_FILE} or {TORCH_FILE} "
                            f"(or a sharded index); found {', '.join(present) or 'nothing'}")


def _read_shard(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return dict(load_file(str(path), device="cpu"))
    return dict(torch.load(path, map_location="cpu", weights_only=True))


def _check_d2t(d2t: torch.Tensor, config: Eagle3Config, where: str) -> None:
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise ValueError(f"{where}: d2t must hold integers, got {d2t.dtype}")
    ids = torch.arange(config.draft_vocab_size) + d2t.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size):
        raise ValueError(f"{where}: d2t maps draft ids outside the target vocabulary [0, {config.vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise ValueError(f"{where}: d2t maps two draft ids to the same target id")


# --------------------------------------------------------------------------------------------------
# the drafter


def _stable_top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row of ``x`` and their indices, ties to the lower index."""
    values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


class Eagle3Drafter:
    """Draft source for a transformers target: keeps the head's own KV cache in step with the committed text.

    The committed text is ``tokens`` (observed with the target's hidden states) plus, after
    :meth:`grow`, the root. The head's cache holds the entries whose token pair is committed: entry
    ``t`` pairs hidden state ``t`` with token ``t + 1`` (the last observed hidden state pairs with the
    root). Drafted tree entries never enter it, so an ordinary round needs no rollback:

    1. ``observe(prompt[:-1], hidden)``, ``grow(prompt[-1])``;
    2. after verification: ``observe([root] + accepted, hidden at those tree rows)``, ``grow(next_token)``.

    :meth:`commit` shortens the committed text (the engine undid tokens); :meth:`reset` forgets it.
    ``target_embeddings`` embeds tokens when the head ships no ``embed_tokens`` (as published).
    """

    def __init__(self, head: Eagle3Head, target_embeddings: nn.Embedding | None, *, top_k: int = 10,
                 depth: int = 5, nodes: int = 60) -> None:
        c = head.config
        for name, value, lo, hi in (("top_k", top_k, 1, c.draft_vocab_size), ("depth", depth, 1, None),
                                    ("nodes", nodes, 1, None)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
                raise ValueError(f"{name} must be an integer in [{lo}, {hi if hi is not None else 'inf'}), "
                                 f"got {value!r}")
        embed = head.embed_tokens if head.embed_tokens is not None else target_embeddings
        if embed is None:
            raise ValueError("the head has no embed_tokens: pass the target's input embeddings")
        weight = embed.weight
        if tuple(weight.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(f"the embeddings are {tuple(weight.shape)} but the head needs "
                             f"[vocab_size, hidden_size] = ({c.vocab_size}, {c.hidden_size})")
        self.head = head.eval()
        self._embed = weight
        self.top_k, self.depth, self.nodes = top_k, depth, nodes
        self.root_logprobs: torch.Tensor | None = None  # draft log-probs after the last root (diagnostics)
        self.reset()

    # -- state -----------------------------------------------------------------------------------
    def reset(self) -> None:
        h = self.head
        c = h.config
        empty = torch.zeros(c.num_key_value_heads, 0, c.head_dim, dtype=h.dtype, device=h.device)
        self._tokens: list[int] = []
        self._fused = torch.zeros(0, c.hidden_size, dtype=h.dtype, device=h.device)   # fc(hidden) per token
        self._k, self._v = empty, empty.clone()   # head cache, entries 0.._m-1
        self._m = 0
        self._root: int | None = None
        self._root_out: torch.Tensor | None = None

    @property
    def n_committed(self) -> int:
        """Tokens of committed text the drafter knows (observed tokens, plus the root after :meth:`grow`)."""
        return len(self._tokens) + (self._root is not None)

    @property
    def n_cached(self) -> int:
        """Entries in the head's KV cache."""
        return self._m

    def _embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids.to(self._embed.device), self._embed).to(device=self.head.device, dtype=self.head.dtype)

    @torch.no_grad()
    def observe(self, tokens: Sequence[int], target_hidden: torch.Tensor) -> None:
        """Committed ``tokens`` that the target processed, with its captured hidden states at them
        (``[len(tokens), 3 * target_hidden]``, in :attr:`Eagle3Head.target_layers` order). After a
        :meth:`grow`, the first token must be that root."""
        toks = [int(t) for t in tokens]
        c = self.head.config
        hid = target_hidden[0] if target_hidden.dim() == 3 and target_hidden.shape[0] == 1 else target_hidden
        if hid.dim() != 2 or hid.shape[0] != len(toks) or hid.shape[1] != 3 * c.target_hidden_size:
            raise ValueError(f"observe: expected hidden states [{len(toks)}, {3 * c.target_hidden_size}] for "
                             f"{len(toks)} tokens, got {tuple(target_hidden.shape)}")
        if not toks:
            return
        bad = [t for t in toks if not 0 <= t < c.vocab_size]
        if bad:
            raise ValueError(f"observe: token id {bad[0]} is out of range for a vocabulary of {c.vocab_size}")
        if self._root is not None:
            if toks[0] != self._root:
                raise ValueError(f"observe: the first token must be the root {self._root} given to grow, "
                                 f"got {toks[0]} (call commit() first to replace the root)")
            self._root = None
        self._tokens += toks
        self._fused = torch.cat((self._fused, self.head.fuse(hid)))

    def commit(self, n_committed: int) -> None:
        """Shorten the committed text to its first ``n_committed`` tokens (the root counts). Cache
        entries whose token pair is no longer committed are dropped."""
        total = self.n_committed
        if isinstance(n_committed, bool) or not isinstance(n_committed, int) or not 0 <= n_committed <= total:
            raise ValueError(f"commit: n_committed must be an integer in [0, {total}], got {n_committed!r}")
        if n_committed == total:
            return
        if n_committed == 0:
            self.reset()
            return
        n_obs = len(self._tokens)
        if n_committed <= n_obs:
            self._root = None
            del self._tokens[n_committed:]
            self._fused = self._fused[:n_committed]
        keep = min(self._m, n_committed - 1)  # entry t needs token t + 1
        if keep < self._m:
            self._k, self._v = self._k[:, :keep], self._v[:, :keep]
            self._m = keep
            self._root_out = None

    # -- drafting --------------------------------------------------------------------------------
    @torch.no_grad()
    def _advance(self, root: int) -> torch.Tensor:
        """Bring the cache up to the root's entry; return its output hidden state ``[hidden]``."""
        n = len(self._tokens)
        if n == 0:
            raise RuntimeError("grow: observe at least one committed token with the target's hidden states first")
        if self._root is not None and self._root != root and self._m == n:
            self._k, self._v, self._m = self._k[:, : n - 1], self._v[:, : n - 1], n - 1
        if self._m == n and self._root_out is not None:
            return self._root_out
        m = self._m
        pair = torch.tensor(self._tokens[m + 1:] + [root], dtype=torch.long)
        positions = torch.arange(m, n, device=self.head.device)
        out, k, v = self.head(self._fused[m:n], self._embed_ids(pair), positions, past=(self._k, self._v))
        self._k, self._v = torch.cat((self._k, k), dim=1), torch.cat((self._v, v), dim=1)
        self._m = n
        self._root_out = out[-1]
        return self._root_out

    @torch.no_grad()
    def grow(self, root_token: int) -> tuple[list[int], list[int], torch.Tensor]:
        """EAGLE-2 dynamic tree below ``root_token`` (committed, not yet processed by the target).

        Returns ``(tokens [N], parents [N], draft_logprob [N])``: target-vocabulary ids, parent node
        indices (``-1``: a child of the root; parents come before children, siblings in draft-rank
        order, nodes depth by depth), and cumulative draft log-probabilities (float32 CPU, float64 for
        a float64 head). ``N <= nodes``; depth ``<= depth``; ``<= top_k`` children per node.
        """
        root = int(root_token)
        head, k = self.head, self.top_k
        if not 0 <= root < head.config.vocab_size:
            raise ValueError(f"grow: root token {root} is out of range for a vocabulary of {head.config.vocab_size}")
        root_out = self._advance(root)
        self._root = root
        dev = head.device

        lp = head.draft_logprobs(root_out[None])[0]
        self.root_logprobs = lp
        s, d = _stable_top(lp, k)
        scores, draft_ids, parents = [s], [d], [torch.full((k,), ROOT, dtype=torch.long, device=dev)]
        # The frontier: the candidates expanded at the next level, with their parents' outputs.
        f_idx, f_score, f_tok = torch.arange(k, device=dev), s, d
        f_hidden = root_out[None].expand(k, -1)
        ancestors = torch.zeros(k, 0, dtype=torch.bool, device=dev)  # frontier x earlier tree entries
        tree_k = self._k.new_zeros(self._k.shape[0], 0, self._k.shape[2])
        tree_v = tree_k.clone()
        n_past, offset = self._m, k
        eye = torch.eye(k, dtype=torch.bool, device=dev)
        for level in range(2, self.depth + 1):
            mask = torch.cat((torch.ones(k, n_past, dtype=torch.bool, device=dev), ancestors, eye), dim=1)
            positions = torch.full((k,), n_past - 1 + level - 1, device=dev)
            out, nk, nv = head(f_hidden, self._embed_ids(head.target_ids(f_tok)), positions,
                               past=(torch.cat((self._k, tree_k), dim=1), torch.cat((self._v, tree_v), dim=1)),
                               mask=mask)
            tree_k, tree_v = torch.cat((tree_k, nk), dim=1), torch.cat((tree_v, nv), dim=1)
            child_lp, child_ids = _stable_top(head.draft_logprobs(out), k)                # [k, k]
            cum = (f_score[:, None] + child_lp.clamp(max=0.0)).reshape(-1)               # never above the parent
            scores.append(cum)
            draft_ids.append(child_ids.reshape(-1))
            parents.append(f_idx.repeat_interleave(k))
            if level == self.depth:
                break
            f_score, sel = _stable_top(cum, k)
            row = sel // k
            f_idx, f_tok, f_hidden = offset + sel, child_ids.reshape(-1)[sel], out[row]
            ancestors = torch.cat((ancestors, eye), dim=1)[row]
            offset += k * k

        all_scores, all_parents = torch.cat(scores), torch.cat(parents)
        all_tokens = head.target_ids(torch.cat(draft_ids))
        kept = keep_best(all_scores.tolist(), all_parents.tolist(), self.nodes)
        order, parents = layout_by_depth(kept, all_parents.tolist())
        return all_tokens[order].tolist(), parents, all_scores[order].cpu()


def load_head_pair(target_spec: str, head_path: str | os.PathLike, *, device: str = "cpu", dtype: Any = None,
                   top_k: int = 10, depth: int = 5, nodes: int = 60):
    """``(target, drafter)``: a transformers target (an :class:`~verispec.models.hf.HFBackend` capturing
    the hidden states the head fuses) and an :class:`Eagle3Drafter` over the head at ``head_path``, from
    local files or hub ids. This is what ``verispec generate --draft-head PATH`` runs."""
    from transformers import AutoConfig

    from verispec.models.hf import HFBackend

    if target_spec is None or str(target_spec).endswith(".gguf"):
        raise ValueError("an EAGLE-3 head drafts for a transformers target: pass --target as a model directory "
                         "or hub id (not the embedded GGUF pair)")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    head = Eagle3Head.from_pretrained(head_path, target_config=AutoConfig.from_pretrained(str(target_spec)),
                                      device=device, dtype=dtype)
    target = HFBackend(str(target_spec), device=device, dtype=dtype, capture_hidden=head.target_layers)
    drafter = Eagle3Drafter(head, target.model.get_input_embeddings(), top_k=top_k, depth=depth, nodes=nodes)
    return target, drafter
