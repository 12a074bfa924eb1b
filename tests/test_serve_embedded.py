"""The interface the checks use, on the embedded llama.cpp pair: `verispec serve` with its defaults answers a
lossy-rule completion with its text and usage.speculative, and an unknown rule with a 400 error body."""

from __future__ import annotations

import argparse

import pytest

from tests.helpers.serve import LiveServer

requests = pytest.importorskip("requests")


@pytest.mark.embedded
def test_embedded_pair_behind_serve(embedded_pair_paths):
    pytest.importorskip("llama_cpp")
    from verispec.engine.session import BatchSession, RowRequest
    from verispec.sampling import SamplingConfig
    from verispec.serve.cli import add_serve_parser, build_server

    ap = argparse.ArgumentParser()
    add_serve_parser(ap.add_subparsers(dest="command"))
    app, scheduler = build_server(ap.parse_args(["serve", "--batch-size", "2", "--n-ctx", "256", "--batched-only"]))
    server = LiveServer(app)
    try:
        body = {"prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0,
                "verification": {"rule": "lenience:ell=0.5", "gamma": 3}}
        r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        out = r.json()
        spec = out["usage"]["speculative"]
        assert spec["rule"] == "lenience:ell=0.5" and spec["gamma"] == 3 and spec["draft_tokens"] > 0
        assert out["usage"]["completion_tokens"] >= 1 and out["choices"][0]["text"]
        # the engine directly, on the same batched backends and row: the same tokens
        target = scheduler.target_rows
        session = BatchSession(target, scheduler.draft_rows)
        h = session.admit(RowRequest(target.tokenize("def add(a, b):", add_special=True), 8,
                                     SamplingConfig.parse("temperature=0"), rule="lenience:ell=0.5", gamma=3))
        session.run()
        assert h.result.text == out["choices"][0]["text"]
        bad = requests.post(server.url + "/v1/completions", json=body | {"verification": {"rule": "no_such_rule"}})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "verification.rule" and "no_such_rule" in bad.json()["error"]["message"]
    finally:
        server.stop()
