"""Per-rule counters of the plug-in in vLLM's ``/metrics`` (prometheus), across vLLM's processes.

The counts live in the rejection sampler, inside vLLM's worker process; ``/metrics`` is served by the API server,
another process (``vllm serve`` starts the engine core, and its workers, as children). So each sampler that
verifies with verispec writes its running totals, after every verification step, to a small JSON file in a
directory shared through the environment (:data:`ENV_DIR`, created by the first process that installs the
plug-in and inherited by the processes vLLM spawns), and a prometheus collector registered in every process
that installs the plug-in sums those files when ``/metrics`` is read:

* ``verispec_drafted_tokens_total{rule="<spec>"}``: drafted tokens verified with that rule,
* ``verispec_accepted_tokens_total{rule="<spec>"}``: of those, accepted,
* ``verispec_verification_steps_total{rule="<spec>"}``: verification steps (requests x steps with drafts).

Totals are per directory, i.e. over every engine started from the process that made it (one engine for
``vllm serve``). With tensor parallelism only the first rank writes (every rank verifies the same batch).
``vllm serve --api-server-count N`` (N > 1) serves vLLM's prometheus multiprocess registry, which does not
hold this collector: there, read the counts with ``collective_rpc("verispec_counts")``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

#: The environment variable naming the directory of the samplers' count files.
ENV_DIR = "VERISPEC_VLLM_METRICS_DIR"
#: ``(what the sampler counts, metric name, help)``; prometheus adds ``_total`` to counters.
METRICS = (
    ("drafted", "verispec_drafted_tokens", "Drafted tokens verified by the verispec plug-in, per rule"),
    ("accepted", "verispec_accepted_tokens", "Drafted tokens accepted by the verispec plug-in, per rule"),
    ("steps", "verispec_verification_steps", "Verification steps (request x step with drafts), per rule"),
)

_collector_registered = False


def metrics_dir() -> Path:
    """The count files' directory: :data:`ENV_DIR`, or a new temporary one (removed when this process exits)
    exported in :data:`ENV_DIR` so that the processes vLLM starts from here write into it."""
    found = os.environ.get(ENV_DIR, "").strip()
    if found:
        return Path(found)
    made = tempfile.mkdtemp(prefix="verispec-vllm-metrics-")
    os.environ[ENV_DIR] = made
    atexit.register(shutil.rmtree, made, True)
    return Path(made)


def write_counts(path: Path, counts: Mapping[tuple[str, str], int]) -> None:
    """Replace ``path`` by ``{rule spec: {what: n}}`` of ``counts`` (``{(spec, what): n}``), atomically: the
    collector in another process never reads half a file."""
    by_rule: dict[str, dict[str, int]] = {}
    for (spec, what), n in counts.items():
        by_rule.setdefault(spec, {})[what] = int(n)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(by_rule))
    os.replace(tmp, path)


def read_totals(directory: Path) -> dict[str, dict[str, int]]:
    """``{rule spec: {what: n}}`` summed over every count file of ``directory`` (unreadable files skipped: a
    sampler that died mid-write leaves only its ``.tmp``)."""
    totals: dict[str, dict[str, int]] = {}
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return totals
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for spec, counts in data.items():
            mine = totals.setdefault(spec, {})
            for what, n in counts.items():
                mine[what] = mine.get(what, 0) + int(n)
    return totals


class CountsCollector:
    """A prometheus collector of the count files of one directory (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def collect(self) -> Iterable:
        from prometheus_client.core import CounterMetricFamily

        totals = read_totals(self.directory)
        for what, name, doc in METRICS:
            family = CounterMetricFamily(name, doc, labels=["rule"])
            for spec in sorted(totals):
                family.add_metric([spec], totals[spec].get(what, 0))
            yield family


def register_collector() -> None:
    """Register :class:`CountsCollector` with prometheus' default registry (what ``vllm serve`` exposes at
    ``/metrics``), once per process."""
    global _collector_registered
    if _collector_registered:
        return
    from prometheus_client import REGISTRY

    REGISTRY.register(CountsCollector(metrics_dir()))
    _collector_registered = True


def counts_file(tag: str) -> Path | None:
    """Where a sampler (``tag``: unique within its process) writes its counts; None on tensor-parallel ranks
    other than the first (they verify the same batch) or where no directory is shared."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        if get_tensor_model_parallel_rank() != 0:
            return None
    except Exception:      # no distributed state (a sampler built outside an engine): nothing to split
        pass
    found = os.environ.get(ENV_DIR, "").strip()
    if not found or not Path(found).is_dir():
        return None
    return Path(found) / f"{os.getpid()}-{tag}.json"
