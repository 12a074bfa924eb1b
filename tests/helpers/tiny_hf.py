"""Tiny random Hugging Face causal LMs over a character vocabulary (no download)."""

from __future__ import annotations

import string

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"


def tiny_char_tokenizer(seed: int | None = None):
    """A character-level ``PreTrainedTokenizerFast`` (3 special tokens + 96 characters = 99 ids).

    ``seed`` permutes the character ids, giving a tokenizer of the same size that differs from the
    default one (for vocabulary-mismatch tests).
    """
    import random

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(CHARS)
    if seed is not None:
        random.Random(seed).shuffle(chars)
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_hf_model(
    arch: str = "qwen2",
    *,
    vocab_width: int = 99,
    hidden: int = 32,
    layers: int = 2,
    seed: int = 0,
    init_range: float = 0.02,
    eos_token_id: int = 2,
):
    """A randomly initialised float64 causal LM ("qwen2" or "llama"); ``vocab_width`` = lm_head rows."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    cfg = cfg_cls(
        vocab_size=vocab_width,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init_range,
        eos_token_id=eos_token_id,
        bos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return model_cls(cfg).to(torch.float64).eval()
