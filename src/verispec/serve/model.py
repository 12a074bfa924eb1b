"""The served target's text side: tokenization as the API sees it, chat rendering, tokenizer facts.

Completion prompts given as text are tokenized as ``verispec generate --no-chat`` does
(``tokenize(text, add_special=True)``: a BOS where the model wants one); chat messages are rendered with
the target's chat template as ``verispec generate`` renders its prompt (:meth:`Backend.chat_prompt` for a
system + user turn; the tokenizer's template over the whole conversation otherwise).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from verispec.models.hf import tokenizer_lock


class ServedModel:
    """Text methods of the served target ``backend`` (batched or not) for the API layer. Safe to call from
    any thread: the backends' text methods are (a per-call buffer on llama.cpp, the tokenizer's lock on
    transformers), and so are the calls made here into the tokenizer itself."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.single = getattr(backend, "single", None) or backend
        self.vocab_size = int(backend.vocab_size)
        self.context_length = int(backend.context_length)
        self.eos_token_ids = frozenset(backend.eos_token_ids)
        self._parse_option = "parse_special" in inspect.signature(self.single.tokenize).parameters

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """``parse_special``: text spelling a special token (``<|im_end|>``) becomes its special id, as
        transformers' tokenizers always do (llama.cpp only when asked: ``/tokenize`` asks)."""
        if parse_special and self._parse_option:
            return list(self.single.tokenize(text, add_special=add_special, parse_special=True))
        return list(self.backend.tokenize(text, add_special=add_special))

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.backend.detokenize(list(ids))

    def piece(self, token_id: int) -> str:
        """The text of one token (special tokens as their text)."""
        return self.backend.token_piece(int(token_id))

    def chat(self, messages: list[dict]) -> list[int]:
        """Token ids of ``messages`` (``{role, content}``, roles system / user / assistant) rendered with the
        chat template and the generation prompt. ``ValueError`` if the model has no template for them."""
        roles = [m["role"] for m in messages]
        if roles == ["user"]:
            return list(self.backend.chat_prompt(messages[0]["content"]))
        if roles == ["system", "user"]:
            return list(self.backend.chat_prompt(messages[1]["content"], system=messages[0]["content"]))
        tok = getattr(self.single, "tokenizer", None)
        if tok is not None and getattr(tok, "chat_template", None):
            with tokenizer_lock(tok):
                text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self.tokenize(text, add_special=False)
        template = (getattr(self.single, "metadata", None) or {}).get("tokenizer.chat_template")
        model = getattr(self.single, "_model", None)
        if template and model is not None:
            return self._llama_chat(template, model, messages)
        raise ValueError(f"{self.backend.name} renders a system + user turn only (no chat template for a "
                         "conversation): send one user message, optionally after one system message")

    def _llama_chat(self, template: str, model: Any, messages: list[dict]) -> list[int]:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        eos, bos = model.token_eos(), model.token_bos()
        formatter = Jinja2ChatFormatter(template=template, eos_token=model.token_get_text(eos) if eos >= 0 else "",
                                        bos_token=model.token_get_text(bos) if bos >= 0 else "",
                                        add_generation_prompt=True)
        text = formatter(messages=messages).prompt
        ids = list(model.tokenize(text.encode("utf-8"), False, True))
        if getattr(self.single, "add_bos", False) and bos >= 0 and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    def tokenizer_info(self) -> dict:
        """What ``GET /tokenizer_info`` answers: the fields lm-evaluation-harness's remote tokenizer reads
        (``eos_token``, ``bos_token``, ``pad_token``, ``chat_template``; it takes the EOS id as the first id
        ``/tokenize`` gives for ``eos_token``, which is that single special id) and their ids
        (``eos_token_id``, ...; ``eos_token_ids``: every token that ends a generation here)."""
        tok = getattr(self.single, "tokenizer", None)
        kind = type(tok if tok is not None else self.single).__name__
        info: dict[str, Any] = {"tokenizer_class": kind, "model_max_length": self.context_length,
                                "vocab_size": self.vocab_size, "eos_token": None, "bos_token": None,
                                "pad_token": None, "chat_template": None, "eos_token_id": None,
                                "bos_token_id": None, "pad_token_id": None, "eos_token_ids": sorted(self.eos_token_ids)}
        model = getattr(self.single, "_model", None)
        if tok is not None:
            with tokenizer_lock(tok):
                ids = {name: getattr(tok, f"{name}_id", None) for name in ("eos_token", "bos_token", "pad_token")}
                info.update(eos_token=tok.eos_token, bos_token=tok.bos_token, pad_token=tok.pad_token,
                            chat_template=getattr(tok, "chat_template", None))
            info.update({f"{name}_id": ids[name] for name in ids})
        elif model is not None:
            eos, bos = model.token_eos(), model.token_bos()
            pad = _llama_pad(model)
            info.update(chat_template=(getattr(self.single, "metadata", None) or {}).get("tokenizer.chat_template"))
            if eos >= 0:
                info.update(eos_token=model.token_get_text(eos), eos_token_id=int(eos))
            if bos >= 0 and self.single.add_bos:
                info.update(bos_token=model.token_get_text(bos), bos_token_id=int(bos))
            if pad is not None:
                info.update(pad_token=model.token_get_text(pad), pad_token_id=pad)
        if info["eos_token_id"] is None and self.eos_token_ids:     # the tokenizer names none: the model's own
            eos = min(self.eos_token_ids)
            info.update(eos_token=self.piece(eos), eos_token_id=eos)
        return info


def _llama_pad(model: Any) -> int | None:
    """The GGUF's padding token, if it names one (llama.cpp answers -1 otherwise)."""
    get = getattr(model, "token_pad", None)
    pad = int(get()) if get is not None else -1
    return pad if pad >= 0 else None
