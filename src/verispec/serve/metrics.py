"""``GET /metrics``: counters, gauges and histograms in Prometheus' text format (version 0.0.4).

Names follow vLLM's where vLLM has the quantity (``vllm:`` prefix, so dashboards built for vLLM read
them): requests and tokens (``vllm:request_success_total``, ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``), latencies (``vllm:e2e_request_latency_seconds``,
``vllm:time_to_first_token_seconds``, ``vllm:request_queue_time_seconds``), the scheduler's gauges
(``vllm:num_requests_running``, ``vllm:num_requests_waiting``) and speculative decoding
(``vllm:spec_decode_num_drafts_total``: verification steps that drafted; ``..._num_draft_tokens_total``;
``..._num_accepted_tokens_total``; ``..._num_accepted_tokens_per_pos_total{position}``). verispec's own
are prefixed ``verispec:``: HTTP requests by endpoint and status, target calls, and the same counts per
rule (``rule`` label). Every series carries ``model_name``.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    esc = lambda v: str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


class Metrics:
    """The server's metrics. :meth:`job_finished` records an ended choice (on an engine thread),
    :meth:`http` every HTTP answer (on the event loop), :meth:`render` writes the text format: counters and
    histograms are read and written under ``_lock``; ``gauges`` (name -> function) is filled before the
    server starts and only read after."""

    def __init__(self, model_name: str) -> None:
        self.model = model_name
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple], float] = defaultdict(float)
        self._hist: dict[str, list] = {}
        self._help: dict[str, tuple[str, str]] = {}
        self.gauges: dict[str, callable] = {}

    def _count(self, name: str, value: float = 1, help: str = "", **labels) -> None:
        self._help.setdefault(name, ("counter", help))
        self._counters[(name, tuple(sorted(labels.items())))] += value

    def _observe(self, name: str, value: float, help: str = "") -> None:
        self._help.setdefault(name, ("histogram", help))
        h = self._hist.setdefault(name, [[0] * (len(LATENCY_BUCKETS) + 1), 0.0, 0])
        h[0][bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        h[1] += value
        h[2] += 1

    def http(self, endpoint: str, status: int) -> None:
        with self._lock:
            self._count("verispec:http_requests_total", 1, "HTTP requests answered, by endpoint and status",
                        endpoint=endpoint, status=str(status))

    def job_finished(self, job) -> None:
        """A choice ended (done, failed or cancelled)."""
        with self._lock:
            result, d = job.result, job.decode
            reason = "abort" if job.state == "cancelled" or job.error is not None else \
                {"eos": "stop", "stop": "stop"}.get(result.stats.stop_reason, "length")
            self._count("vllm:request_success_total", 1, "Finished choices by finish reason", finished_reason=reason)
            self._count("vllm:prompt_tokens_total", len(job.prompt), "Prompt tokens processed")
            self._observe("vllm:request_queue_time_seconds", max(job.t_start - job.t_submit, 0.0),
                          "Seconds from submission to the first engine step")
            if result is None:
                return
            st = result.stats
            self._count("vllm:generation_tokens_total", st.new_tokens, "Generated tokens")
            self._observe("vllm:e2e_request_latency_seconds", job.t_end - job.t_submit, "Seconds per choice")
            self._observe("vllm:time_to_first_token_seconds", job.t_first - job.t_submit,
                          "Seconds to the first committed token")
            self._count("verispec:target_calls_total", st.target_calls, "Target forwards the choices took part in")
            if st.mode != "sd":
                return
            rule = d.rule_spec
            drafts = sum(st.gamma_hist[1:])
            drafted = st.tree_nodes if st.tree else sum(g * k for g, k in enumerate(st.gamma_hist))
            accepted = sum(n * k for n, k in enumerate(st.accepted_hist))
            self._count("vllm:spec_decode_num_drafts_total", drafts, "Verification steps that drafted tokens")
            self._count("vllm:spec_decode_num_draft_tokens_total", drafted, "Draft tokens proposed")
            self._count("vllm:spec_decode_num_accepted_tokens_total", accepted, "Draft tokens accepted")
            for pos, n in enumerate(st.position_accepted):
                self._count("vllm:spec_decode_num_accepted_tokens_per_pos_total", n,
                            "Draft tokens accepted at each position", position=str(pos))
            self._count("verispec:spec_decode_draft_tokens_total", drafted, "Draft tokens proposed, by rule", rule=rule)
            self._count("verispec:spec_decode_accepted_tokens_total", accepted, "Draft tokens accepted, by rule",
                        rule=rule)

    def render(self) -> str:
        base = {"model_name": self.model}
        lines: list[str] = []
        # the gauges read the scheduler under its own lock: called before taking ours, so no thread ever
        # holds both
        for name, fn in sorted(self.gauges.items()):
            lines += [f"# HELP {name} {fn.__doc__ or name}", f"# TYPE {name} gauge",
                      f"{name}{_labels(base)} {_num(fn())}"]
        with self._lock:
            by_name: dict[str, list] = defaultdict(list)
            for (name, labels), value in sorted(self._counters.items()):
                by_name[name].append((dict(labels), value))
            for name, series in by_name.items():
                kind, help = self._help[name]
                lines += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
                lines += [f"{name}{_labels({**base, **labels})} {_num(v)}" for labels, v in series]
            for name, (counts, total, n) in sorted(self._hist.items()):
                kind, help = self._help[name]
                lines += [f"# HELP {name} {help}", f"# TYPE {name} histogram"]
                cum = 0
                for bound, c in zip((*LATENCY_BUCKETS, "+Inf"), counts):
                    cum += c
                    le = "+Inf" if bound == "+Inf" else _num(float(bound))
                    lines.append(f"{name}_bucket{_labels({**base, 'le': le})} {cum}")
                lines += [f"{name}_sum{_labels(base)} {_num(float(total))}", f"{name}_count{_labels(base)} {n}"]
        return "\n".join(lines) + "\n"
