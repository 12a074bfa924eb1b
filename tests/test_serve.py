"""``verispec serve`` driven by the official openai client (and plain HTTP for what the client cannot send),
on the tiny float64 transformers pair: every answer is checked against verispec's engine called directly."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from tests.helpers.serve import serve_tiny, tiny_served

openai = pytest.importorskip("openai")
requests = pytest.importorskip("requests")

from verispec.engine import generate, generate_target_only  # noqa: E402
from verispec.rules import get as get_rule  # noqa: E402
from verispec.sampling import SamplingConfig  # noqa: E402

GREEDY = SamplingConfig.parse("temperature=0")
LOSSY = {"verification": {"rule": "lenience:ell=0.5", "gamma": 3}}


@pytest.fixture(scope="module")
def pair():
    return tiny_served(rows=4)


@pytest.fixture(scope="module")
def live(pair):
    server = serve_tiny(pair)
    yield server
    server.stop()


def text_ids(pair, text: str) -> list[int]:
    return pair.target.tokenize(text, add_special=True)


def test_models_health_and_tokenizer_endpoints(live, pair):
    client = live.client()
    assert [m.id for m in client.models.list()] == ["verispec"]
    url = live.url
    assert requests.get(url + "/health").json()["status"] == "ok"
    ids = requests.post(url + "/tokenize", json={"prompt": "Hello!", "add_special_tokens": False}).json()
    assert ids["tokens"] == pair.target.tokenize("Hello!") and ids["max_model_len"] == pair.target.context_length
    assert requests.post(url + "/detokenize", json={"tokens": ids["tokens"]}).json() == {"prompt": "Hello!"}
    chat = requests.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == pair.target.chat_prompt("hi")
    info = requests.get(url + "/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and "im_start" in info["chat_template"]


def test_completions_streamed_and_not_equal_the_engine_with_a_lossy_rule(live, pair):
    """A lossy rule through extra_body: the text is generate()'s with that rule, streamed or not, and
    usage.speculative reports what the decoding did."""
    client = live.client()
    ref = generate(pair.target, pair.draft, text_ids(pair, "hello"), rule="lenience:ell=0.5", sampling=GREEDY,
                   gamma=3, max_new_tokens=12)
    out = client.completions.create(model="verispec", prompt="hello", max_tokens=12, temperature=0, extra_body=LOSSY)
    assert out.choices[0].text == ref.text and out.usage.completion_tokens == ref.stats.new_tokens
    assert out.choices[0].finish_reason == ("length" if ref.stats.stop_reason == "length" else "stop")
    spec = out.usage.model_extra["speculative"]
    assert spec["rule"] == "lenience:ell=0.5" and spec["gamma"] == 3 and spec["mode"] == "sd"
    assert spec["target_calls"] == ref.stats.target_calls and spec["draft_tokens"] > 0
    assert len(spec["per_position_acceptance"]) == 3
    chunks = list(client.completions.create(model="verispec", prompt="hello", max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, extra_body=LOSSY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    assert chunks[-1].usage.completion_tokens == ref.stats.new_tokens


def test_chat_streamed_and_not_use_the_chat_template(live, pair):
    client = live.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    ids = pair.target.chat_prompt("What is 2+2?", system="Be brief.")
    ref = generate(pair.target, pair.draft, ids, rule="lossless", sampling=GREEDY, gamma=5, max_new_tokens=10)
    out = client.chat.completions.create(model="verispec", messages=messages, max_tokens=10, temperature=0)
    assert out.choices[0].message.content == ref.text and out.choices[0].message.role == "assistant"
    assert out.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(model="verispec", messages=messages, max_tokens=10, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_token_id_prompts_n_choices_and_seeds(live, pair):
    """Token-id prompts (as lm-eval sends), n = 2 sampled choices each: choice j of a prompt is generate()
    with seed + j, whichever rows the choices shared."""
    prompts = [text_ids(pair, "abc"), text_ids(pair, "xyz!")]
    out = live.client().completions.create(model="verispec", prompt=prompts, n=2, max_tokens=9, temperature=0.8,
                                           seed=40, extra_body={"verification": {"rule": "lossless", "gamma": 2}})
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    sampling = SamplingConfig.parse("temperature=0.8")
    for c in out.choices:
        ref = generate(pair.target, pair.draft, prompts[c.index // 2], rule="lossless", sampling=sampling, gamma=2,
                       max_new_tokens=9, seed=40 + c.index % 2)
        assert c.text == ref.text


def test_logprobs_with_echo_are_the_targets(live, pair):
    """What a harness's loglikelihood request sends (max_tokens 1, logprobs 1, echo): the target's own
    log-probabilities of every prompt token, then of the generated one."""
    ids = text_ids(pair, "The cat sat")
    out = live.client().completions.create(model="verispec", prompt=ids, max_tokens=1, temperature=0, logprobs=1,
                                           echo=True)
    lp = out.choices[0].logprobs
    pair.target.reset()
    full = ids + [pair.target.tokenize(out.choices[0].text[len("The cat sat"):])[0]]
    logp = torch.log_softmax(pair.target.forward(full).double()[:, :pair.target.tokenizer_size], -1)
    want = [None] + [logp[i, full[i + 1]].item() for i in range(len(full) - 1)]
    assert len(lp.token_logprobs) == len(full) and lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(want[1:], abs=1e-6)
    assert out.choices[0].text.startswith("The cat sat")
    assert all(len(t) == 1 for t in lp.top_logprobs[1:])
    assert max(lp.top_logprobs[-1].values()) == pytest.approx(lp.token_logprobs[-1], abs=1e-9)   # greedy token
    scored = live.client().completions.create(model="verispec", prompt=ids, max_tokens=0, logprobs=0, echo=True)
    assert scored.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs[:-1], abs=1e-9)


def test_lookup_trees_and_true_baselines(live, pair):
    client = live.client()
    ids = text_ids(pair, "abcabcabc")
    for extra, ref in [
        ({"verification": {"draft": "ngram", "gamma": 3}},
         lambda: generate(pair.target, None, ids, rule="lossless", sampling=GREEDY, gamma=3, max_new_tokens=10,
                          lookup=__import__("verispec.engine", fromlist=["NgramDrafter"]).NgramDrafter(max_tokens=3))),
        ({"verification": {"tree": "2,2"}},
         lambda: generate(pair.target, pair.draft, ids, rule="lossless", sampling=GREEDY, max_new_tokens=10,
                          tree="2,2")),
        ({"baseline": True, "verification": {"rule": "speccascade:p_base=0.3"}},
         lambda: generate_target_only(pair.target, ids, max_new_tokens=10, sampling=GREEDY.with_truncation(
             **get_rule("speccascade:p_base=0.3").baseline_truncation()))),
        ({"verification": {"draft": "none"}},
         lambda: generate_target_only(pair.target, ids, sampling=GREEDY, max_new_tokens=10)),
    ]:
        out = client.completions.create(model="verispec", prompt=ids, max_tokens=10, temperature=0, extra_body=extra)
        assert out.choices[0].text == ref().text, extra
    spec = out.usage.model_extra["speculative"]
    assert spec["mode"] == "target_only" and spec["draft_tokens"] == 0


BAD = [  # (body or raw text, status, param)
    ("{not json", 400, None),
    ("[1, 2]", 400, None),
    ({"prompt": "hi", "max_tokens": "8"}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 100000}, 400, "max_tokens"),
    ({"prompt": "hi", "n": 0}, 400, "n"),
    ({"prompt": "hi", "n": 65}, 400, "n"),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "hi", "stop": 3}, 400, "stop"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": [[1, 2], [999]]}, 400, "prompt[1]"),
    ({"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ({"prompt": "hi", "verification": {"rule": "no_such_rule"}}, 400, "verification.rule"),
    ({"prompt": "hi", "verification": {"rule": "lenience:ell=7"}}, 400, "verification.rule"),
    ({"prompt": "hi", "verification": {"gamma": "many"}}, 400, "verification.gamma"),
    ({"prompt": "hi", "verification": {"draft": "oracle"}}, 400, "verification.draft"),
    ({"prompt": "hi", "verification": {"rule": "lenience:ell=0.5", "tree": "iid:2,2"}}, 400, "verification"),
    ({"prompt": "hi", "verification": {"rule": "mentored:D=0.1", "draft": "ngram"}}, 400, "verification"),
    ({"prompt": "hi", "verification": {"rulez": "lossless"}}, 400, "verification"),
    ({"prompt": "hi", "verification": "lossless"}, 400, "verification"),
    ({"prompt": "x" * 600, "max_tokens": 4}, 400, "prompt"),
    ({"prompt": "hi", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"prompt": "hi", "unknown_field": 1}, 400, "unknown_field"),
    ({"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    ({"prompt": "hi", "logprobs": 1, "stream": True}, 400, "stream"),
    ({"messages": []}, 400, "messages"),
]


def test_every_bad_request_gets_an_openai_error_and_the_server_goes_on(live, pair):
    for body, status, param in BAD:
        path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
        r = requests.post(live.url + path, data=body if isinstance(body, str) else json.dumps(body),
                          headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], body
        assert err["param"] == param, (body, err)
        assert "Traceback" not in r.text
    assert requests.get(live.url + "/v1/nowhere").json()["error"]["code"] == "not_found"
    assert requests.get(live.url + "/v1/completions").status_code == 405
    client = live.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="verispec", prompt="hi", max_tokens=4,
                                  extra_body={"verification": {"rule": "no_such_rule"}})
    assert caught.value.status_code == 400 and "no_such_rule" in caught.value.body["message"]
    assert client.completions.create(model="verispec", prompt="hi", max_tokens=4).choices[0].text is not None


def test_metrics_count_requests_tokens_and_speculative_decoding(live):
    live.client().completions.create(model="verispec", prompt="metrics", max_tokens=8, temperature=0,
                                     extra_body={"verification": {"rule": "lossless", "gamma": 2}})
    text = requests.get(live.url + "/metrics").text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    total = lambda prefix: sum(v for k, v in values.items() if k.startswith(prefix))
    assert total("vllm:spec_decode_num_draft_tokens_total") >= total("vllm:spec_decode_num_accepted_tokens_total")
    assert total("vllm:spec_decode_num_drafts_total") > 0 and total("vllm:generation_tokens_total") >= 8
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="verispec",position="0"}' in values
    assert total("vllm:e2e_request_latency_seconds_count") > 0
    assert 'verispec:http_requests_total{model_name="verispec",endpoint="/v1/completions",status="200"}' in values
    assert "# TYPE vllm:num_requests_running gauge" in text


def _aborted(live) -> float:
    text = requests.get(live.url + "/metrics").text
    line = 'vllm:request_success_total{model_name="verispec",finished_reason="abort"} '
    return sum(float(x.split(" ")[-1]) for x in text.splitlines() if x.startswith(line))


#: a prompt the tiny target continues greedily for all of its 450 tokens (no EOS)
LONG = {"prompt": "zzz", "max_tokens": 450, "temperature": 0}


def test_a_client_that_disconnects_frees_its_row_at_once(live):
    state = live.state
    before = _aborted(live)
    with requests.post(live.url + "/v1/completions", json=LONG | {"stream": True}, stream=True, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                break
        assert state.scheduler.running == 1
    deadline = time.time() + 10
    while state.scheduler.running and time.time() < deadline:
        time.sleep(0.02)
    assert state.scheduler.running == 0 and _aborted(live) == before + 1


def test_a_request_past_the_time_limit_gets_408(live):
    state = live.state
    saved, state.request_timeout = state.request_timeout, 0.05
    try:
        r = requests.post(live.url + "/v1/completions", json=LONG, timeout=30)
    finally:
        state.request_timeout = saved
    assert r.status_code == 408 and r.json()["error"]["type"] == "timeout_error"
    assert state.scheduler.running == 0


def test_a_full_queue_answers_429_with_retry_after():
    """One row, one waiting place: a third long request is refused with 429 and Retry-After, the first two are
    answered."""
    pair = tiny_served(rows=1)
    server = serve_tiny(pair, max_waiting=1)
    try:
        answers = {}

        def post(name):
            answers[name] = requests.post(server.url + "/v1/completions", timeout=60,
                                          json=LONG | {"max_tokens": 60})

        threads = [threading.Thread(target=post, args=(n,)) for n in ("first", "second")]   # both decode "zzz"
        sched = server.state.scheduler
        for i, t in enumerate(threads):
            t.start()
            deadline = time.time() + 10
            while sched.running + sched.waiting < i + 1 and time.time() < deadline:
                time.sleep(0.01)
        post("third")
        for t in threads:
            t.join()
        assert answers["third"].status_code == 429 and answers["third"].headers["Retry-After"] == "1"
        assert answers["third"].json()["error"]["type"] == "rate_limit_error"
        assert answers["first"].status_code == answers["second"].status_code == 200
    finally:
        server.stop()


def test_text_stream_deltas_are_prefixes_of_the_final_text():
    """Deltas never run past where a stop string may start, nor into an incomplete character, and they add up
    to the final text."""
    from verispec.serve.responses import TextStream

    texts = ["ab", "abc\ufffd", "abc\u00e9", "abc\u00e9ST", "abc\u00e9STOP", "abc\u00e9STOPx"]
    stream = TextStream(lambda toks: texts[len(toks) - 1], ["STOP", "zz"])
    sent = ""
    for n in range(1, 7):
        sent += stream.update(list(range(n)))
        assert "abc\u00e9".startswith(sent)
    assert sent == "abc"
    sent += stream.finish("abc\u00e9")
    assert sent == "abc\u00e9"
    plain = TextStream(lambda toks: "xy"[: len(toks)], [])
    assert plain.update([0]) == "x" and plain.update([0, 1]) == "y" and plain.finish("xy") == ""
