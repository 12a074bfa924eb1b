"""The HTTP layer of ``verispec serve``: a FastAPI app over a :class:`~verispec.serve.scheduler.Scheduler`.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both streamed as server-sent events
in OpenAI's chunk format, ending with ``data: [DONE]``), ``GET /v1/models``, ``GET /health``,
``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``, ``GET /metrics``.

Every error is OpenAI's error body ``{"error": {"message", "type", "param", "code"}}`` with a 4xx
status for what the request did wrong (400 bad field, 404 unknown model or path, 405, 408 time limit,
413 body too large, 429 queue full with ``Retry-After``, 503 shutting down) and 500 (no traceback) for
what the server did wrong; the server goes on serving. A client that disconnects has its choices
cancelled at once (their rows free for the next requests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from verispec.serve.metrics import Metrics
from verispec.serve.model import ServedModel
from verispec.serve.protocol import (
    APIError,
    ParsedRequest,
    Policy,
    bad,
    check_prompt_chars,
    check_token_ids,
    get_bool,
    parse_body,
    parse_chat,
    parse_completion,
    prompt_char_limit,
)
from verispec.serve.responses import (
    TextStream,
    chunk,
    eos_of,
    finish_reason,
    logprobs_block,
    new_id,
    now,
    per_request_metrics,
    sse,
    usage,
    usage_chunk,
)
from verispec.serve.scheduler import Job, Overloaded, Scheduler

_log = logging.getLogger("verispec.serve")
MAX_BODY = 32 * 1024 * 1024
#: Seconds a request's body may take to arrive (``--body-timeout``); beyond, 408 and the connection closes.
BODY_TIMEOUT_S = 60.0
#: Tokens from which decoding a text runs off the event loop (below, the thread hand-off costs more).
LONG_TEXT = 256
#: Seconds between checks that a waiting client is still connected (and SSE keep-alive comments).
POLL_S = 1.0


class ServerState:
    """What the endpoints share: the engine, the served model's text side, the policy, the metrics."""

    def __init__(self, scheduler: Scheduler, model: ServedModel, policy: Policy, metrics: Metrics,
                 request_timeout: float | None, body_timeout: float = BODY_TIMEOUT_S) -> None:
        self.scheduler, self.model, self.policy, self.metrics = scheduler, model, policy, metrics
        self.request_timeout, self.body_timeout = request_timeout, body_timeout
        self.draining = False


def create_app(scheduler: Scheduler, model: ServedModel, policy: Policy, *, request_timeout: float | None = 600.0,
               metrics: Metrics | None = None, start: bool = True, body_timeout: float = BODY_TIMEOUT_S) -> FastAPI:
    """The app; ``start``: the scheduler's threads start with the app and stop (after the jobs in flight)
    with it; ``body_timeout``: seconds a request body may take to arrive (then 408)."""
    metrics = metrics or Metrics(policy.model_name)
    if policy.max_prompt_chars is None:
        policy = replace(policy, max_prompt_chars=prompt_char_limit(model, policy.context_length))
    state = ServerState(scheduler, model, policy, metrics, request_timeout, body_timeout)
    if scheduler.on_finish is None:
        scheduler.on_finish = metrics.job_finished

    def running() -> int:
        """Choices being decoded"""
        return scheduler.running

    def waiting() -> int:
        """Choices waiting for a row"""
        return scheduler.waiting

    metrics.gauges.update({"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting})

    @asynccontextmanager
    async def lifespan(app):
        if start:
            scheduler.start()
        yield
        state.draining = True
        if start:
            await asyncio.get_running_loop().run_in_executor(None, scheduler.stop)

    app = FastAPI(title="verispec serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.verispec = state

    @app.middleware("http")
    async def guard(request: Request, call_next):
        path = request.url.path
        if state.draining and path.startswith("/v1/"):
            response = _error(APIError(503, "the server is shutting down: retry on another instance",
                                       type="server_error"))
        else:
            try:
                response = await call_next(request)
            except Exception as exc:        # never a traceback to the client
                _log.exception("unhandled error on %s", path)
                response = _error(APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error"))
        metrics.http(path if path in _ROUTES else "other", response.status_code)
        return response

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return _error(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                               type="invalid_request_error"))

    @app.get("/health")
    async def health():
        return {"status": "draining" if state.draining else "ok", "running": scheduler.running,
                "waiting": scheduler.waiting}

    @app.get("/v1/models")
    async def models():
        p = policy
        card = {"id": p.model_name, "object": "model", "created": 0, "owned_by": "verispec",
                "max_model_len": p.context_length,
                "verispec": {"rule": p.rule, "gamma": p.gamma, "draft": p.draft, "tree": p.tree,
                             "draft_sources": list(p.draft_sources),
                             "allowed_rules": sorted(p.allowed_rules) if p.allowed_rules is not None else None,
                             "batch_rows": scheduler.slots, "target": getattr(model.backend, "name", "")}}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        return model.tokenizer_info()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await _json(request)
        add = get_bool(body, "add_special_tokens", True)
        if "messages" in body:
            from verispec.serve.protocol import check_messages

            messages = check_messages(body["messages"])
            check_prompt_chars(sum(len(m["content"]) for m in messages), policy, "the messages' content", "messages")
            try:
                ids = await run_in_threadpool(model.chat, messages)     # seconds of CPU for a long text
            except ValueError as exc:
                raise bad(f"messages: {exc}", "messages") from None
        else:
            text = body.get("prompt")
            if not isinstance(text, str):
                raise bad("'prompt' must be a string (or give 'messages')", "prompt")
            check_prompt_chars(len(text), policy, "the text", "prompt")
            # special-token text becomes its special id, as vLLM's /tokenize (HF tokenizers) does: lm-eval's
            # remote tokenizer reads the EOS id as the first id of tokenize(eos_token)
            ids = await run_in_threadpool(model.tokenize, text, add_special=add, parse_special=True)
        return {"tokens": ids, "count": len(ids), "max_model_len": policy.context_length}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await _json(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise bad("'tokens' must be an array of token ids", "tokens")
        if not tokens:
            return {"prompt": ""}
        return {"prompt": await run_in_threadpool(lambda: model.detokenize(check_token_ids(tokens, policy, "tokens")))}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _json(request)
        # tokenizing (and checking) a prompt takes up to seconds of CPU: off the event loop
        return await _serve(state, request, body, await run_in_threadpool(parse_completion, body, policy, model))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _json(request)
        return await _serve(state, request, body, await run_in_threadpool(parse_chat, body, policy, model))

    return app


_ROUTES = {"/health", "/v1/models", "/metrics", "/tokenizer_info", "/tokenize", "/detokenize", "/v1/completions",
           "/v1/chat/completions"}


def _error(exc: APIError) -> JSONResponse:
    headers = dict(exc.headers)
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


#: The response to a request whose body was not read to its end closes the connection (its rest is not
#: waited for).
_CLOSE = {"Connection": "close"}


async def _json(request: Request) -> dict:
    """The request's JSON object: its body read within the body deadline (408) and :data:`MAX_BODY` bytes
    (413 as soon as it is known to be larger), then checked and parsed off the event loop
    (:func:`~verispec.serve.protocol.parse_body`)."""
    state: ServerState = request.app.state.verispec
    declared = request.headers.get("content-length")
    if declared is not None and (len(declared) > 12 or int(declared) > MAX_BODY):    # h11 checked: digits
        raise APIError(413, f"the request body has {declared[:20]} bytes; this server takes at most {MAX_BODY}",
                       headers=_CLOSE)
    parts: list[bytes] = []
    size = 0

    async def read() -> None:
        nonlocal size
        async for part in request.stream():
            size += len(part)
            if size > MAX_BODY:
                raise APIError(413, f"the request body has more than {MAX_BODY} bytes; this server takes at most "
                               f"{MAX_BODY}", headers=_CLOSE)
            parts.append(part)

    try:
        await asyncio.wait_for(read(), state.body_timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {state.body_timeout:g} s ({size} bytes"
                       f"{' of ' + declared if declared else ''} received): send the whole body at once",
                       headers=_CLOSE) from None
    except ClientDisconnect:
        raise APIError(400, "the client closed the connection before sending its whole body",
                       headers=_CLOSE) from None
    return await run_in_threadpool(lambda: parse_body(b"".join(parts), state.policy.max_values))


async def _serve(state: ServerState, request: Request, body: dict, parsed: ParsedRequest):
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    jobs: list[Job] = []

    def put(item) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(events.put_nowait, item)

    for k, dec in enumerate(parsed.decodes):
        if dec.max_tokens == 0:        # echo with max_tokens 0: the prompt's scores only
            continue
        ids = parsed.prompts[k // parsed.n]
        on_tokens = (lambda toks, k=k: put((k, "tokens", toks))) if parsed.stream else None
        jobs.append(Job(ids, dec, on_done=lambda job, k=k: put((k, "done", job)), on_tokens=on_tokens,
                        timeout_s=state.request_timeout))
    try:
        state.scheduler.submit(jobs)
    except Overloaded as exc:
        raise APIError(429, f"the server is at capacity ({exc}): retry after a moment", type="rate_limit_error",
                       headers={"Retry-After": "1"}) from None
    rid, created = new_id(parsed.kind), now()
    if parsed.stream:
        return StreamingResponse(_stream(state, request, parsed, jobs, events, rid, created),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        by_index = await _wait_all(state, request, jobs, events)
    except BaseException:
        for job in jobs:
            state.scheduler.cancel(job)
        raise
    if by_index is None:                # the client left: nothing to answer
        return Response(status_code=499)
    choices = []
    for k in range(len(parsed.decodes)):
        job = by_index.get(k)
        ids = parsed.prompts[k // parsed.n]
        text = job.result.text if job is not None else ""
        reason = finish_reason(job) if job is not None else "length"
        if parsed.kind == "chat":
            choices.append({"index": k, "message": {"role": "assistant", "content": text}, "logprobs": None,
                            "finish_reason": reason})
            continue
        prefix = _prompt_text(state, body, ids, k // parsed.n) if parsed.echo else ""
        lp = None
        if parsed.logprobs is not None or parsed.echo:
            out_tokens = list(job.result.tokens) if job is not None else []
            scores = await asyncio.wrap_future(state.scheduler.score(ids + out_tokens, parsed.logprobs or 0))
            if parsed.logprobs is not None:
                start = 0 if parsed.echo else len(ids)
                # a piece of text per token and alternative (up to 21 x the context): off the event loop
                lp = await run_in_threadpool(logprobs_block, state.model, ids + out_tokens, scores, start,
                                             parsed.logprobs, 0 if parsed.echo else len(prefix),
                                             eos_of(job, scores, state.model.eos_token_ids))
        choices.append({"index": k, "text": prefix + text, "logprobs": lp, "finish_reason": reason})
    obj = "chat.completion" if parsed.kind == "chat" else "text_completion"
    done_jobs = [by_index[k] for k in sorted(by_index)]
    out = {"id": rid, "object": obj, "created": created, "model": state.policy.model_name, "choices": choices,
           "usage": usage(parsed, done_jobs)}
    per_request = per_request_metrics(parsed, done_jobs, state.policy.spec_decode_metrics)
    if per_request is not None:
        out["metrics"] = per_request
    return out


def _prompt_text(state: ServerState, body: dict, ids: list[int], i: int) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return prompt[i]
    return state.model.detokenize(ids)


def _watch_disconnect(request: Request, events: asyncio.Queue) -> asyncio.Task:
    """A task that puts ``(None, "disconnect", None)`` on ``events`` the moment the client closes its
    connection (ASGI's ``http.disconnect``; the request body has been read, so that is the next message),
    so its choices are cancelled at once and their rows free before the engine's next step. Cancel it
    when the response is done."""

    async def watch() -> None:
        while True:
            try:
                message = await request.receive()
            except Exception:           # the server lost the connection: as good as a disconnect
                message = {"type": "http.disconnect"}
            if message.get("type") == "http.disconnect":
                events.put_nowait((None, "disconnect", None))
                return

    return asyncio.ensure_future(watch())


def _cancel_all(state: ServerState, jobs: Sequence[Job]) -> None:
    for job in jobs:
        state.scheduler.cancel(job)


async def _wait_all(state: ServerState, request: Request, jobs: Sequence[Job], events: asyncio.Queue
                    ) -> dict[int, Job] | None:
    """Every choice's ended job by index; None if the client disconnected (its jobs are cancelled)."""
    done: dict[int, Job] = {}
    watcher = _watch_disconnect(request, events)
    try:
        while len(done) < len(jobs):
            k, kind, job = await events.get()
            if kind == "disconnect":
                _cancel_all(state, jobs)
                return None
            if kind != "done":
                continue
            if job.error is not None:
                _cancel_all(state, jobs)
                raise job.error
            done[k] = job
        return done
    finally:
        watcher.cancel()


async def _stream(state: ServerState, request: Request, parsed: ParsedRequest, jobs: Sequence[Job],
                  events: asyncio.Queue, rid: str, created: int):
    kind, name = parsed.kind, state.policy.model_name
    texts = {k: TextStream(state.model.detokenize, dec.stop) for k, dec in enumerate(parsed.decodes)}
    finished: dict[int, Job] = {}
    watcher = _watch_disconnect(request, events)
    try:
        if kind == "chat":
            for k in texts:
                yield sse(chunk(kind, rid, created, name, k, None, role=True))
        while len(finished) < len(jobs):
            try:
                k, what, payload = await asyncio.wait_for(events.get(), timeout=POLL_S)
            except asyncio.TimeoutError:
                yield ": keep-alive\n\n"           # an SSE comment: a client that left makes this send fail
                continue
            if what == "disconnect":
                return
            if what == "tokens":
                # the whole text so far is decoded again: off the event loop once it is long
                delta = texts[k].update(payload) if len(payload) < LONG_TEXT else \
                    await run_in_threadpool(texts[k].update, payload)
                if delta:
                    yield sse(chunk(kind, rid, created, name, k, delta))
                continue
            job = payload
            if job.error is not None:
                yield sse(job.error.body())
                yield "data: [DONE]\n\n"
                return
            finished[k] = job
            rest = texts[k].finish(job.result.text)
            if rest:
                yield sse(chunk(kind, rid, created, name, k, rest))
            yield sse(chunk(kind, rid, created, name, k, None, finish=finish_reason(job)))
        if parsed.include_usage:       # vLLM's per-request metrics ride on the usage chunk, as in vLLM
            done = [finished[k] for k in sorted(finished)]
            yield sse(usage_chunk(kind, rid, created, name, usage(parsed, done),
                                  per_request_metrics(parsed, done, state.policy.spec_decode_metrics)))
        yield "data: [DONE]\n\n"
    finally:
        watcher.cancel()
        _cancel_all(state, jobs)        # the jobs still queued or running: a client that left, an error
