"""Checks the vLLM plug-in on a GPU machine: both model runners (V1 and V2), lossless exactness, a lossy rule's law.

Run there after ``bash scripts/setup_vllm.sh`` (which installs vllm==0.32.0 when nvidia-smi sees a GPU):

    .venv-vllm/bin/python scripts/vllm_gpu_check.py [--n 4000] [--out DIR]

It builds two tiny random Qwen2 models (no download), then for each runner (``VLLM_USE_V2_MODEL_RUNNER=0`` / ``1``,
each in its own process) starts an engine with a draft model and probabilistic drafts and checks, on ``n``
identical two-token requests, that the pair (t1, t2) follows ``p1(t1) · law(t2 | t1)`` with verispec's closed form
(lossless: the target; ``lenience:ell=0.3``: ``rule.induced``), computed in transformers; that greedy output equals
greedy decoding of the target; and (V1 only) that a request's own rule applies. Prints one line per check and
exits non-zero on any failure. Without a GPU it says so and exits 0 without checking (CPU runs: tests/vllm).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))             # tests.helpers / tests.vllm: the tiny models and the law oracle
PROMPT = [40, 41, 42, 43, 44, 45]
ALPHA = 1e-4


def _models(root: Path) -> None:
    from tests.helpers.tiny_hf import tiny_char_tokenizer
    from tests.vllm.conftest import _tiny_qwen2

    tok = tiny_char_tokenizer()
    for name, seed, layers in (("target", 11, 2), ("draft", 12, 1)):
        model = _tiny_qwen2(seed, layers, head_std=0.2)
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)


def _check_runner(root: Path, n: int) -> dict:
    """In this process (its runner chosen by the environment): generate and test the laws."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.vllm.laws import TwoTokenOracle, joint_pvalue
    from verispec import rules as R
    from verispec.integrations.vllm import make_llm, request_params

    llm = make_llm(str(root / "target"), rule="lossless", dtype="float32", enforce_eager=True, max_model_len=256,
                   speculative_config={"method": "draft_model", "model": str(root / "draft"),
                                       "num_speculative_tokens": 2, "draft_sample_method": "probabilistic"},
                   gpu_memory_utilization=0.3)
    v2 = bool(getattr(llm.llm_engine.vllm_config, "use_v2_model_runner", False))
    target = AutoModelForCausalLM.from_pretrained(root / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(root / "draft", dtype=torch.float32).eval()
    oracle = TwoTokenOracle(target, draft, PROMPT)
    results = {"v2_runner": v2}
    engine_rule = request_params("temperature=1", max_tokens=2, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * n, engine_rule, use_tqdm=False)
    results["lossless_law_p"] = joint_pvalue(outs, oracle, oracle.p2)
    if not v2:                         # per-request rules: the V1 runner
        lenient = request_params("temperature=1", rule="lenience:ell=0.3", max_tokens=2, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": PROMPT}] * n, lenient, use_tqdm=False)
        results["lenience_law_p"] = joint_pvalue(outs, oracle, R.get("lenience:ell=0.3").induced(oracle.p2, oracle.q2))
        results["lenience_vs_target_p"] = joint_pvalue(outs, oracle, oracle.p2)
    prompts = [[40 + i, 50 + i, 60, 70 + i] for i in range(4)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        request_params("greedy", max_tokens=12, ignore_eos=True), use_tqdm=False)
    with torch.no_grad():
        ref = target.generate(torch.tensor(prompts), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                              pad_token_id=0)[:, 4:].tolist()
    results["greedy_equal"] = [list(o.outputs[0].token_ids) for o in outs] == ref
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4000, help="identical requests per law test")
    ap.add_argument("--out", default=None, help="folder for the models and results (default: a temp folder)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:                                        # one runner, in a fresh process
        print("RESULT " + json.dumps(_check_runner(Path(args.child), args.n)), flush=True)
        return 0

    import torch

    if not torch.cuda.is_available():
        print("vllm_gpu_check: no GPU visible to torch here; nothing checked (the CPU path is tests/vllm)")
        return 0
    root = Path(args.out or tempfile.mkdtemp(prefix="verispec-vllm-gpu-"))
    root.mkdir(parents=True, exist_ok=True)
    _models(root)
    failures = 0
    for v2 in ("0", "1"):
        env = dict(os.environ, VLLM_USE_V2_MODEL_RUNNER=v2)
        proc = subprocess.run([sys.executable, __file__, "--child", str(root), "--n", str(args.n)], env=env,
                              capture_output=True, text=True, timeout=1800)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(f"runner V{'2' if v2 == '1' else '1'}: FAILED to run (exit {proc.returncode})\n{proc.stderr[-3000:]}")
            failures += 1
            continue
        res = json.loads(line[len("RESULT "):])
        checks = [("lossless law = target", res["lossless_law_p"] > ALPHA, res["lossless_law_p"]),
                  ("greedy = target argmax", res["greedy_equal"], None)]
        if "lenience_law_p" in res:
            checks += [("lenience law = closed form", res["lenience_law_p"] > ALPHA, res["lenience_law_p"]),
                       ("lenience told apart from target", res["lenience_vs_target_p"] < 1e-6,
                        res["lenience_vs_target_p"])]
        name = "V2" if res["v2_runner"] else "V1"
        if v2 == "1" and not res["v2_runner"]:
            print("runner V2: vLLM chose the V1 runner for this model/config; V2 not exercised")
        for what, ok, p in checks:
            failures += not ok
            print(f"runner {name}: {what}: {'ok' if ok else 'FAILED'}" + (f" (p = {p:.3g})" if p is not None else ""))
        (root / f"result_{name}.json").write_text(json.dumps(res, indent=1))
    print(f"vllm_gpu_check: {failures} failure(s); models and results in {root}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
