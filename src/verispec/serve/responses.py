"""Response bodies in OpenAI's format: choices, usage (with verispec's ``speculative`` object),
log-probabilities, stream chunks, and the text deltas of a stream."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence

from verispec.engine.request import Decode
from verispec.engine.session import Scores
from verispec.serve.protocol import ParsedRequest
from verispec.serve.scheduler import Job
from verispec.serve.spec_metrics import response_metrics


def new_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def finish_reason(job: Job) -> str:
    return "length" if job.result.stats.stop_reason == "length" else "stop"


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class TextStream:
    """The text deltas of a streamed choice: every delta extends what was sent, and what was sent is
    always a prefix of the final text. The text of the committed tokens is cut before a stop string it
    holds, and a trailing incomplete UTF-8 character and the last ``len(longest stop) - 1`` characters
    are held back (a stop string may be starting there: the final text is cut before it)."""

    def __init__(self, detokenize, stop: Sequence[str]) -> None:
        self.detokenize = detokenize
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.sent = ""

    def update(self, tokens: Sequence[int]) -> str:
        text = self.detokenize(tokens).rstrip("\ufffd")
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            text = text[:cut]
        safe = text[: len(text) - self.hold] if self.hold else text
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent):], safe
        return delta

    def finish(self, final: str) -> str:
        """The rest of the final text (empty if the tokens' text was not a prefix of it, which the holdback
        prevents for prefix-stable tokenizers)."""
        if not final.startswith(self.sent):
            return ""
        delta, self.sent = final[len(self.sent):], final
        return delta


def speculative(decodes: Sequence[Decode], jobs: Sequence[Job]) -> dict:
    """``usage.speculative``: what the choices' decoding did, summed over the choices."""
    d = decodes[0]
    stats = [j.result.stats for j in jobs]
    reached = [0] * max((len(s.position_reached) for s in stats), default=0)
    accepted_at = [0] * len(reached)
    for s in stats:
        for i, (r, a) in enumerate(zip(s.position_reached, s.position_accepted)):
            reached[i] += r
            accepted_at[i] += a
    draft_tokens = sum(s.tree_nodes if s.tree else sum(g * k for g, k in enumerate(s.gamma_hist)) for s in stats)
    accepted = sum(sum(n * k for n, k in enumerate(s.accepted_hist)) for s in stats)
    target_calls = sum(s.target_calls for s in stats)
    new = sum(s.new_tokens for s in stats)
    mode = "baseline" if d.baseline else "target_only" if d.rule is None else "sd"
    return {
        "mode": mode, "rule": d.rule_spec, "draft": d.draft if d.rule is not None else "none",
        "gamma": d.gamma if d.rule is not None else 0, "tree": d.tree,
        "sampling": str(d.sampling),
        "draft_tokens": draft_tokens, "accepted_tokens": accepted, "target_calls": target_calls,
        "draft_calls": sum(s.draft_calls for s in stats),
        "tokens_per_target_call": new / target_calls if target_calls else 0.0,
        "per_position_acceptance": [a / r if r else None for a, r in zip(accepted_at, reached)],
    }


def usage(parsed: ParsedRequest, jobs: Sequence[Job]) -> dict:
    prompt = sum(len(p) for p in parsed.prompts)
    completion = sum(j.result.stats.new_tokens for j in jobs)
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if jobs:
        out["speculative"] = speculative(parsed.decodes, jobs)
    return out


def per_request_metrics(parsed: ParsedRequest, jobs: Sequence[Job], level: str) -> dict | None:
    """vLLM's per-request ``metrics`` object (``{"speculative_decoding": ...}``) at ``level``; None for several
    choices (prompts × n: not one sequence's, as vLLM) or at level ``none``."""
    if len(parsed.decodes) != 1 or len(jobs) != 1:
        return None
    return response_metrics([jobs[0].result.stats], parsed.decodes[0].spec_tokens, level)


def logprobs_block(model, tokens: Sequence[int], scores: Scores, start: int, k: int, offset0: int,
                   eos: int | None) -> dict:
    """OpenAI's legacy ``logprobs`` object for ``tokens[start:]`` (and ``eos``, the end-of-sequence token
    the choice ended on, which its text does not show)."""
    pieces, lps, tops = [], [], []
    for i in range(start, len(tokens)):
        pieces.append(model.piece(tokens[i]))
        lps.append(scores.token_logprobs[i])
        top = scores.top[i]
        tops.append(None if top is None else {model.piece(t): v for t, v in top})
    if eos is not None:
        pieces.append(model.piece(eos))
        lps.append(float(scores.next_logprobs[eos]))
        tops.append({model.piece(t): v for t, v in scores.next_top(k)})
    offsets, at = [], offset0
    for p in pieces:
        offsets.append(at)
        at += len(p)
    return {"tokens": pieces, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def eos_of(job: Job | None, scores: Scores, eos_ids) -> int | None:
    """The end-of-sequence token a choice ended on (the most probable of the model's EOS tokens there)."""
    if job is None or job.result.stats.stop_reason != "eos" or not eos_ids:
        return None
    ids = sorted(eos_ids)
    return max(ids, key=lambda t: float(scores.next_logprobs[t]) if t < scores.next_logprobs.shape[0] else -1e300)


def chunk(kind: str, rid: str, created: int, model_name: str, index: int, text: str | None,
          finish: str | None = None, role: bool = False) -> dict:
    if kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name,
                "choices": [choice]}
    choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "text_completion", "created": created, "model": model_name, "choices": [choice]}


def usage_chunk(kind: str, rid: str, created: int, model_name: str, use: dict, per_request: dict | None = None) -> dict:
    """The final chunk with the usage; ``per_request``: vLLM's ``metrics`` object, which rides on it."""
    out = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
           "created": created, "model": model_name, "choices": [], "usage": use}
    if per_request is not None:
        out["metrics"] = per_request
    return out


def now() -> int:
    return int(time.time())
