"""The EAGLE-3 head module (one Llama decoder layer over the fused target hidden states) and its files in
the authors' layout (see :mod:`verispec.models.eagle3`)."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from verispec.models.eagle3.config import (
    _ACTIVATIONS,
    _IGNORED_SUFFIXES,
    _INDEX_FILES,
    CONFIG_FILE,
    EAGLE_RMS_EPS,
    SAFETENSORS_FILE,
    TORCH_FILE,
    Eagle3Config,
    _text_config,
    default_target_layers,
    published_keys,
)


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
