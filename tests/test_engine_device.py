"""Sampling and verification run where the target's logits are (issue: rules on the accelerator).

On the CPU the engine is unchanged (the suite's seeded tests pin that); here: the transformers backend
returns logits on its output layer's device, the engine's generator lives there, and on CUDA (when a
GPU is present) decoding is reproducible run to run, greedy decoding matches the CPU, and lossless SD
keeps the target's law.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.rule_cases import ALPHA, gof_pvalue
from tests.helpers.tiny_hf import tiny_char_tokenizer, tiny_hf_model
from verispec.engine import generate, generate_target_only
from verispec.models.base import logits_device
from verispec.sampling import SamplingConfig

GREEDY = SamplingConfig.parse("temperature=0")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _pair(device: str):
    from verispec.models.hf import HFBackend

    tok = tiny_char_tokenizer()
    target = HFBackend(tiny_hf_model("qwen2", vocab_width=128, hidden=32, seed=1, init_range=0.2), tokenizer=tok,
                       device=device)
    draft = HFBackend(tiny_hf_model("llama", vocab_width=len(tok), hidden=16, seed=2, init_range=0.2), tokenizer=tok,
                      device=device)
    return target, draft


def test_backends_say_where_their_logits_are():
    target, _ = _pair("cpu")
    assert logits_device(target) == torch.device("cpu")
    assert target.forward([3, 4, 5]).device == target.logits_device
    assert logits_device(object()) == torch.device("cpu")     # a backend without the attribute: CPU


def test_device_map_is_refused_for_a_model_object():
    from verispec.models.hf import HFBackend

    with pytest.raises(ValueError, match="device_map places a model while loading"):
        HFBackend(tiny_hf_model("qwen2"), tokenizer=tiny_char_tokenizer(), device_map="auto")


@cuda
def test_greedy_on_cuda_equals_greedy_on_cpu():
    prompt = [5, 6, 7, 8]
    outs = []
    for device in ("cpu", "cuda"):
        target, draft = _pair(device)
        ref = generate_target_only(target, prompt, sampling=GREEDY, max_new_tokens=20)
        sd = generate(target, draft, prompt, rule="lossless", sampling=GREEDY, gamma=4, max_new_tokens=20)
        assert sd.tokens == ref.tokens
        outs.append(ref.tokens)
    assert outs[0] == outs[1]


@cuda
@pytest.mark.parametrize("spec", ["lossless", "lenience:ell=0.5", "speccascade:p_base=0.3"])
def test_sampling_on_cuda_is_reproducible_run_to_run(spec):
    target, draft = _pair("cuda")
    sampling = SamplingConfig.parse("temperature=1,top_k=8")
    runs = [generate(target, draft, [5, 6, 7], rule=spec, sampling=sampling, gamma=3, max_new_tokens=16, seed=11)
            for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens


@cuda
def test_lossless_sd_on_cuda_keeps_the_target_law_of_the_first_token():
    target, draft = _pair("cuda")
    sampling = SamplingConfig.parse("temperature=1,top_k=5")
    prompt = [5, 6, 7]
    target.reset()
    p = sampling.process(target.forward(prompt, all_logits=False)[:, :99].float())[0].double().cpu()
    counts = np.zeros(99)
    for s in range(800):
        counts[generate(target, draft, prompt, rule="lossless", sampling=sampling, gamma=3, max_new_tokens=1,
                        seed=s).tokens[0]] += 1
    assert gof_pvalue(counts, p.numpy()) > ALPHA
