"""An EAGLE-3 head's configuration: its config.json fields, the published state-dict layout and the target
layers it fuses (see :mod:`verispec.models.eagle3`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F

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
