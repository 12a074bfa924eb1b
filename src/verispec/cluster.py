"""A pool of Ray workers for units of work whose results one driver commits (bench samples, diagnose prompts).

``verispec bench --workers N`` starts a local Ray cluster; ``--ray-address ADDR`` joins a running one
(``auto``: the cluster this machine belongs to). Each worker is a Ray actor that loads one model pair
(its own ``--threads-per-worker`` CPU threads: llama.cpp ``n_threads`` and torch threads; its own
``--gpus-per-worker``) and then runs units — one sample (run, problem, k) of the bench, or one prompt
of the ``diagnose`` corpus — as the driver hands them out.

Invariants, the same as in-process execution:

* **Dynamic scheduling.** A worker holds one unit at a time and gets the next unit of the work list
  (problem-major, as in-process) when its result is back, so fast and slow workers stay busy alike.
* **One committed row per unit.** Only the driver writes: it commits a unit's result (its recorded
  positions first, then its row) when the result arrives, before handing that worker another unit. A
  unit is handed out again only when its worker died without returning it, and the store ignores a
  row it already holds (:meth:`ResultStore.add`), so nothing is committed twice.
* **Nothing lost.** A worker that dies (process crash, OOM kill, node loss: ``RayActorError``) has its
  unit put back at the front of the queue and is replaced by a fresh worker (at most
  :data:`MAX_REPLACEMENTS_PER_WORKER` times per worker; then the pool goes on with fewer and says
  so). A unit whose worker dies :data:`MAX_ATTEMPTS` times is set aside and reported at the end: a
  unit that crashes every process it runs in would otherwise take down the whole pool. A killed driver
  loses only the units in flight; its workers die with it (Ray ties actors to their job), and the same
  command resumes from the store.
* **Same results.** A sample's seed depends on (seed, dataset, problem, k) alone, and every worker
  builds the same pair, so a unit's output does not depend on which worker ran it or when (timings
  and the measured call costs do; ``--gamma auto`` reads each machine's own cost profile).

Ray is optional (``pip install 'verispec[ray]'``) and imported only when a pool starts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from verispec.settings import ClusterSettings

#: Deaths of the worker running a unit after which the unit is set aside instead of handed out again.
MAX_ATTEMPTS = 3
#: Fresh workers started in place of dead ones, per worker of the pool.
MAX_REPLACEMENTS_PER_WORKER = 2
#: Seconds without any worker ready after which the driver says what it is waiting for.
PLACEMENT_WARNING_S = 60.0
#: Seconds a connection to ``--ray-address`` may take before the command gives up (Ray's own client
#: retries for ever against an address where no cluster answers).
RAY_CONNECT_TIMEOUT_S = 30.0
#: Seconds the address probe waits for a TCP connection and for the cluster's first gRPC frame.
RAY_PROBE_TIMEOUT_S = 5.0
#: OpenMP settings of the driver that the workers get too (see :mod:`verispec.runtime`).
_OPENMP_ENV = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


class WorkerStartError(ValueError):
    """A worker could not build its unit runner (e.g. load its models): a setting to fix, not a crash to
    retry. A ``ValueError`` so that the command line reports it as a plain error."""


class RayConnectError(ValueError):
    """No Ray cluster could be joined at the address given (a ``ValueError``: the CLI prints it, exit 2)."""


_JOIN_HINT = "start one with `ray start --head` and pass the address it prints (host:port), or drop --ray-address"
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS


def check_ray_address(address: str, timeout_s: float | None = None) -> None:
    """Refuse, within about ``2 x timeout_s``, an address where no Ray cluster answers: it must be
    ``host:port`` (or ``auto``, left to Ray), take a TCP connection, and answer the HTTP/2 handshake
    every gRPC server (Ray's GCS) answers with its SETTINGS frame."""
    timeout = RAY_PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    text = address.strip()
    if text.lower() == "auto":
        return
    bare = text.removeprefix("ray://")
    host, sep, port_text = bare.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RayConnectError(f"--ray-address {address!r} is not host:port (e.g. 10.0.0.5:6379) or auto; "
                              + _JOIN_HINT)
    try:
        sock = socket.create_connection((host, int(port_text)), timeout=timeout)
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise RayConnectError(f"no Ray cluster at {text}: {why} (after at most {timeout:g} s); {_JOIN_HINT}") from None
    try:
        sock.settimeout(timeout)
        sock.sendall(_HTTP2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = sock.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except OSError:
        head = b""
    finally:
        sock.close()
    if len(head) < 9 or head[3] != 0x04:
        raise RayConnectError(f"{text} accepts connections but does not answer as a Ray cluster (no gRPC handshake "
                              f"within {timeout:g} s: another service on that port?); {_JOIN_HINT}")


def join_ray(ray, address: str, timeout_s: float | None = None) -> None:
    """``ray.init(address=...)`` that gives up after ``timeout_s`` (default :data:`RAY_CONNECT_TIMEOUT_S`)
    with a :class:`RayConnectError` naming the address, instead of Ray's endless retries. The address is
    probed first (:func:`check_ray_address`), so a wrong one fails in seconds."""
    limit = RAY_CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    check_ray_address(address)
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            ray.init(address=address, logging_level="WARNING")
            outcome.append(None)
        except BaseException as exc:   # handed to the caller's thread
            outcome.append(exc)

    quiet = logging.getLogger("ray._private.worker")
    level = quiet.level
    quiet.setLevel(logging.ERROR)      # "SIGTERM handler is not set ... not the main thread"
    try:
        worker = threading.Thread(target=connect, name="verispec-ray-connect", daemon=True)
        worker.start()
        worker.join(limit)
    finally:
        quiet.setLevel(level)
    if not outcome:
        raise RayConnectError(f"could not join the Ray cluster at {address} within {limit:g} s (it answers, but Ray's "
                              "client did not connect: a firewall on its other ports, or another Ray version?); "
                              + _JOIN_HINT)
    if outcome[0] is not None:
        exc = outcome[0]
        if isinstance(exc, (ConnectionError, RuntimeError, ValueError, TimeoutError)):
            raise RayConnectError(f"could not join the Ray cluster at {address}: {_first_line(exc)}; {_JOIN_HINT}") \
                from None
        raise exc


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ImportError("--workers / --ray-address need Ray: pip install 'verispec[ray]'") from exc
    return ray


class _Worker:
    """The Ray actor: builds its unit runner (its model pair) once, then runs units on it."""

    def __init__(self, factory: Callable[[], Callable[[Any], Any]], threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self._run = factory()

    def ready(self) -> str:
        return f"{socket.gethostname()} pid {os.getpid()}"

    def run(self, unit: Any) -> Any:
        return self._run(unit)


@dataclass
class _Slot:
    name: str
    actor: Any
    unit: int | None = None   # index of the unit in flight; None while starting or idle
    ready: bool = False


class WorkerPool:
    """``workers`` Ray actors, each running ``factory()`` once and then units; see the module docstring.

    ``start`` connects to Ray (starting a local cluster unless ``cluster.ray_address`` is given or
    this process is already connected), chooses the workers and their threads, builds the factory of
    the unit runner with ``make_factory(threads)`` and starts the actors; ``run`` drives the units;
    ``close`` ends the actors (and the local cluster if ``start`` began it).
    """

    def __init__(self, cluster: ClusterSettings, *, n_threads: int | None = None,
                 log: Callable[[str], None] = print) -> None:
        cluster.validate()
        self.cluster = cluster
        self.n_threads = n_threads   # the model settings' --n-threads: the per-worker default
        self.log = log
        self.workers = self.threads = 0
        self._ray = None
        self._started_ray = False
        self._slots: list[_Slot] = []
        self._spawned = 0
        self._replacements_left = 0
        self._actor_cls = None
        self._factory = None

    # -- start ------------------------------------------------------------------------------------
    def start(self, make_factory: Callable[[int], Callable[[], Callable[[Any], Any]]]) -> None:
        ray = self._ray = import_ray()
        c = self.cluster
        if not ray.is_initialized():
            if c.ray_address:
                join_ray(ray, c.ray_address)
            else:
                cpus = os.cpu_count() or 1
                threads = c.threads_per_worker or self.n_threads or max(1, cpus // c.workers)
                # the cluster this process starts fits the workers asked for, even on fewer cores
                ray.init(num_cpus=max(cpus, c.workers * threads), include_dashboard=False, logging_level="WARNING")
            self._started_ray = True
        self.workers, self.threads = self._size(ray)
        self._factory = make_factory(self.threads)
        env = {k: os.environ[k] for k in _OPENMP_ENV if k in os.environ}
        self._actor_cls = ray.remote(_Worker).options(
            num_cpus=self.threads, num_gpus=c.gpus_per_worker, max_restarts=0,
            **({"runtime_env": {"env_vars": env}} if env else {}))
        self._replacements_left = MAX_REPLACEMENTS_PER_WORKER * self.workers
        gpus = f", {c.gpus_per_worker:g} GPU each" if c.gpus_per_worker else ""
        where = ("a local Ray cluster" if self._started_ray and not c.ray_address
                 else f"the Ray cluster at {ray.get_runtime_context().gcs_address}")
        self.log(f"{self.workers} worker{_s(self.workers)} × {self.threads} thread{_s(self.threads)}{gpus} on {where}")
        for _ in range(self.workers):
            self._spawn()

    def _size(self, ray) -> tuple[int, int]:
        """(workers, threads per worker) from the settings and what the cluster holds."""
        c = self.cluster
        total = ray.cluster_resources()
        cpus, gpus = int(total.get("CPU", 0)), float(total.get("GPU", 0))
        node_cpus = max((int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=cpus)
        if c.workers is not None:
            threads = c.threads_per_worker or self.n_threads or max(1, min(cpus // c.workers, node_cpus))
            workers = c.workers
        else:   # joined a cluster without --workers: as many workers as its resources hold
            threads = c.threads_per_worker or self.n_threads or 1
            workers = cpus // threads
            if c.gpus_per_worker:
                workers = min(workers, int(gpus // c.gpus_per_worker))
            if workers < 1:
                raise RuntimeError(f"the Ray cluster ({cpus} CPUs, {gpus:g} GPUs) holds no worker of {threads} "
                                   f"threads and {c.gpus_per_worker:g} GPUs")
        if workers * threads > cpus or workers * c.gpus_per_worker > gpus:
            self.log(f"warning: {workers} workers × ({threads} CPUs, {c.gpus_per_worker:g} GPUs) exceed the "
                     f"cluster's {cpus} CPUs / {gpus:g} GPUs: some wait until others end")
        return workers, threads

    def _spawn(self) -> _Slot:
        self._spawned += 1
        actor = self._actor_cls.remote(self._factory, self.threads)
        slot = _Slot(f"worker {self._spawned}", actor)
        self._slots.append(slot)
        return slot

    # -- run --------------------------------------------------------------------------------------
    def run(self, units: Sequence[Any], on_result: Callable[[Any, Any], None]) -> None:
        """Run every unit once on some worker and call ``on_result(unit, result)`` here as each arrives.

        Raises the unit's own error if a unit raises (what in-process execution does),
        :class:`WorkerStartError` when a worker cannot build its runner, and ``RuntimeError`` when no
        worker is left or, at the end, when units had to be set aside (the results of the others are
        all delivered first)."""
        ray = self._ray
        from ray.exceptions import RayActorError

        pending = deque(range(len(units)))
        deaths: dict[int, int] = {}
        set_aside: list[int] = []
        inflight: dict[Any, _Slot] = {s.actor.ready.remote(): s for s in self._slots if not s.ready}
        warned = False

        def dispatch() -> None:
            for slot in self._slots:
                if slot.ready and slot.unit is None and pending:
                    slot.unit = pending.popleft()
                    inflight[slot.actor.run.remote(units[slot.unit])] = slot

        dispatch()
        while pending or inflight:
            if not inflight:
                raise RuntimeError(f"no Ray worker left; {len(pending)} units not run (the same command resumes)")
            done, _ = ray.wait(list(inflight), num_returns=1, timeout=None if warned else PLACEMENT_WARNING_S)
            if not done:
                if not any(s.ready for s in self._slots):
                    self.log(f"still waiting for Ray to place the workers ({self.threads} CPUs, "
                             f"{self.cluster.gpus_per_worker:g} GPUs each); cluster: {ray.cluster_resources()}")
                warned = True
                continue
            slot = inflight.pop(done[0])
            index, slot.unit = slot.unit, None
            try:
                value = ray.get(done[0])
            except RayActorError as exc:
                if exc.actor_init_failed:   # its runner raised: a setting, not a crash; another would fail alike
                    raise WorkerStartError(f"a Ray worker could not load its models: {_last_line(exc)}") from exc
                what = "while starting" if index is None else f"running unit {index}"
                self.log(f"{slot.name} died {what} ({_first_line(exc)})")
                if index is not None:
                    deaths[index] = deaths.get(index, 0) + 1
                    if deaths[index] >= MAX_ATTEMPTS:
                        self.log(f"unit {index} set aside: {MAX_ATTEMPTS} workers died running it")
                        set_aside.append(index)
                    else:
                        pending.appendleft(index)
                self._replace(slot, inflight)
                dispatch()
                continue
            if index is None:
                slot.ready = True
                self.log(f"{slot.name} ready on {value}")
            else:
                on_result(units[index], value)
            dispatch()
        if set_aside:
            raise RuntimeError(f"{len(set_aside)} units were set aside after {MAX_ATTEMPTS} worker deaths each "
                               f"(indices {sorted(set_aside)}); every other result is committed. The same command "
                               "retries them.")

    def _replace(self, dead: _Slot, inflight: dict) -> None:
        self._slots.remove(dead)
        self._ray.kill(dead.actor, no_restart=True)
        if self._replacements_left > 0:
            self._replacements_left -= 1
            slot = self._spawn()
            inflight[slot.actor.ready.remote()] = slot
            self.log(f"{slot.name} replaces {dead.name}")
        else:
            self.log(f"no replacement left: going on with {len(self._slots)} workers")

    def close(self) -> None:
        if self._ray is None:
            return
        for slot in self._slots:
            self._ray.kill(slot.actor, no_restart=True)
        self._slots.clear()
        if self._started_ray:
            self._ray.shutdown()
            self._started_ray = False


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _last_line(exc: BaseException) -> str:
    """The raised error of a Ray traceback (its last line: ``FileNotFoundError: ...``)."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


