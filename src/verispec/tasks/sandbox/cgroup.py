"""One cgroup per sandbox run, so memory and process limits hold for the run as a whole.

Per-process rlimits let six processes hold six times ``RLIMIT_AS`` and do not see ``memfd`` or
tmpfs pages at all; a cgroup charges all of them to the run.  :func:`create` makes a fresh
group and sets its limits; the bootstrap writes its own pid into :attr:`RunCgroup.procs` before
it forks, so every process of the run is inside; :meth:`RunCgroup.remove` deletes the group
once they are all dead.

Two layouts are handled:

* **cgroup v2** (``cgroup2`` mounted, typically ``/sys/fs/cgroup``): a group under the caller's
  own group (or the root) whose ``cgroup.subtree_control`` has ``memory`` and ``pids``;
  ``memory.max``, ``memory.swap.max = 0``, ``pids.max``; with the ``cpu`` controller also
  ``cpu.max`` = one core (:data:`CPU_PERIOD_US` of every period); CPU time from ``cpu.stat``.
* **cgroup v1** (``memory`` and ``pids`` hierarchies, and ``freezer``, ``cpu`` and ``cpuacct``
  where mounted, separately or together): one group in each; ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` where swap accounting exists), ``pids.max``,
  ``cpu.cfs_quota_us`` = ``cpu.cfs_period_us`` (one core); CPU time from ``cpuacct.usage``.

Memory and pids are required; the CPU quota and the CPU-time accounting are not: without them
:attr:`RunCgroup.cpu_quota` / :meth:`RunCgroup.cpu_seconds` are ``None`` and
:attr:`RunCgroup.cpu_missing` says why (the runner reports it in the run's isolation info).

:meth:`RunCgroup.kill_all` kills every process of the run, wherever it went (``setsid()``, a
double fork, another process group): v2 writes ``cgroup.kill``; v1 freezes the group (freezer),
sends ``SIGKILL`` to every pid in ``cgroup.procs`` and thaws it, and without a freezer repeats
read-and-kill until the group is empty (the pids limit bounds how many a fork race can add).

Neither works without write access to the hierarchy (not root and nothing delegated, or a
container that mounts it read-only): :func:`create` then returns ``None`` with the reason, and
the runner falls back to per-process ``RLIMIT_AS`` plus a per-uid ``RLIMIT_NPROC``, which it
reports in ``SandboxResult.isolation["cgroup"]``.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import time
from dataclasses import dataclass, field

_MOUNTS = "/proc/self/mountinfo"
#: A run's group is named after the grader's pid, so leftovers of a grader that died can be told
#: from groups of live ones (:func:`sweep_stale`).
_NAME_RE = re.compile(r"^verispec-sbx-(\d+)-[0-9a-f]+$")
#: The CFS period of a run's CPU quota; the quota is the same (one core's worth of CPU time).
CPU_PERIOD_US = 100_000


@dataclass
class RunCgroup:
    kind: str  # "v2" | "v1"
    dirs: list[str]  # the group's directory in each hierarchy
    procs: list[str] = field(default_factory=list)  # the cgroup.procs files to join
    freezer: str | None = None  # v1: the run's freezer group, if that hierarchy is mounted
    #: Cores' worth of CPU the run may use at once (1.0), or ``None`` without a cpu controller.
    cpu_quota: float | None = None
    #: The file holding the run's CPU time over all its processes (v1 ``cpuacct.usage``, ns; v2
    #: ``cpu.stat``, ``usage_usec``), or ``None`` without one.
    cpu_usage_file: str | None = None
    #: Why the CPU quota or accounting is missing ("" when both are in place).
    cpu_missing: str = ""

    def cpu_seconds(self) -> float | None:
        """CPU seconds used so far by every process of the run together (``None``: not accounted)."""
        if self.cpu_usage_file is None:
            return None
        try:
            with open(self.cpu_usage_file) as f:
                text = f.read()
            if self.kind == "v1":
                return int(text) / 1e9
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def pids(self) -> list[int]:
        """The processes still in the group (any hierarchy: every process of the run is in all)."""
        out: set[int] = set()
        for procs in self.procs:
            try:
                with open(procs) as f:
                    out.update(int(x) for x in f.read().split())
            except (OSError, ValueError):
                continue
        return sorted(out)

    def kill_all(self, wait_s: float = 5.0) -> bool:
        """SIGKILL every process of the run; True once the group is empty (waits up to ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        if self.kind == "v2":
            try:
                _write(os.path.join(self.dirs[0], "cgroup.kill"), "1")
            except OSError:
                pass  # kernel < 5.14: the loop below
        frozen = self.freezer is not None and _freeze(self.freezer, True, deadline)
        try:
            while True:
                pids = self.pids()
                if not pids:
                    return True
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                if frozen:
                    frozen = not _freeze(self.freezer, False, deadline)  # killed ones die on thaw
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.002)
        finally:
            if frozen:
                _freeze(self.freezer, False, deadline)

    def oom_killed(self) -> bool:
        """True if the kernel killed a process of the run for exceeding the memory limit."""
        for d in self.dirs:
            for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                try:
                    with open(os.path.join(d, name)) as f:
                        for line in f:
                            k, _, v = line.partition(" ")
                            if k == key and int(v) > 0:
                                return True
                except (OSError, ValueError):
                    continue
        return False

    def remove(self, wait_s: float = 5.0) -> None:
        """Delete the group; its processes are already dead, but the kernel may lag behind."""
        deadline = time.monotonic() + wait_s
        for d in self.dirs + ([self.freezer] if self.freezer else []):
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.005)


def _freeze(d: str, on: bool, deadline: float) -> bool:
    """Freeze (``on``) or thaw a v1 freezer group; True once the kernel reports that state."""
    want = "FROZEN" if on else "THAWED"
    try:
        _write(os.path.join(d, "freezer.state"), want)
        while True:
            with open(os.path.join(d, "freezer.state")) as f:
                if f.read().strip() == want:
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
    except OSError:
        return False


def _mounts() -> list[tuple[str, str, list[str]]]:
    """``(mount point, fs type, super options)`` of every cgroup mount."""
    out = []
    try:
        with open(_MOUNTS) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if rfields and rfields[0] in ("cgroup", "cgroup2"):
                    out.append((fields[4], rfields[0], rfields[2].split(",") if len(rfields) > 2 else []))
    except OSError:
        pass
    return out


def _own_paths() -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's group path, from ``/proc/self/cgroup``."""
    paths = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(",") if ctrls else [""]:
                    paths[c] = path
    except OSError:
        pass
    return paths


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _try_v2(mnt: str, own: str, name: str, memory: int, pids: int) -> RunCgroup:
    errors = []
    for parent in (os.path.join(mnt, own.lstrip("/")), mnt):
        try:
            with open(os.path.join(parent, "cgroup.controllers")) as f:
                available = f.read().split()
            if not {"memory", "pids"} <= set(available):
                raise OSError(f"controllers {available} lack memory/pids")
            with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
            if not {"memory", "pids"} <= set(enabled):
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
            d = os.path.join(parent, name)
            os.mkdir(d)
        except OSError as e:
            errors.append(f"{parent}: {e}")
            continue
        try:
            _write(os.path.join(d, "memory.max"), str(memory))
            _write(os.path.join(d, "pids.max"), str(pids))
            try:
                _write(os.path.join(d, "memory.swap.max"), "0")
            except OSError:
                pass  # no swap accounting: nothing to cap
        except OSError:
            os.rmdir(d)
            raise
        group = RunCgroup("v2", [d], [os.path.join(d, "cgroup.procs")])
        # cpu.stat's usage_usec is kept in every v2 group; the quota needs the cpu controller.
        group.cpu_usage_file = os.path.join(d, "cpu.stat")
        try:
            if "cpu" not in available:
                raise OSError(f"controllers {available} lack cpu")
            if "cpu" not in enabled:
                _write(os.path.join(parent, "cgroup.subtree_control"), "+cpu")
            _write(os.path.join(d, "cpu.max"), f"{CPU_PERIOD_US} {CPU_PERIOD_US}")
            group.cpu_quota = 1.0
        except OSError as e:
            group.cpu_missing = f"no CPU quota (cgroup v2 cpu controller at {parent}: {e})"
        return group
    raise OSError("; ".join(errors))


def _v1_group(mounts, own: dict[str, str], name: str, ctrl: str, made: dict[str, str]) -> str:
    """The run's group in the v1 hierarchy holding ``ctrl`` (made once per hierarchy: controllers
    may be mounted together, e.g. ``cpu,cpuacct``)."""
    mnt = next((m for m, fs, opts in mounts if fs == "cgroup" and ctrl in opts), None)
    if mnt is None:
        raise OSError(f"no cgroup v1 {ctrl} hierarchy")
    if mnt not in made:
        d = os.path.join(mnt, own.get(ctrl, "/").lstrip("/"), name)
        os.mkdir(d)
        made[mnt] = d
    return made[mnt]


def _try_v1(mounts, own: dict[str, str], name: str, memory: int, pids: int) -> RunCgroup:
    made: dict[str, str] = {}  # mount point -> the run's group there
    try:
        d = _v1_group(mounts, own, name, "memory", made)
        _write(os.path.join(d, "memory.limit_in_bytes"), str(memory))
        try:
            _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(memory))
        except OSError:
            pass  # no swap accounting
        _write(os.path.join(_v1_group(mounts, own, name, "pids", made), "pids.max"), str(pids))
    except OSError:
        _rmdirs(made.values())
        raise
    group = RunCgroup("v1", [], [])
    missing = []
    try:
        d = _v1_group(mounts, own, name, "cpu", made)
        _write(os.path.join(d, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
        _write(os.path.join(d, "cpu.cfs_quota_us"), str(CPU_PERIOD_US))
        group.cpu_quota = 1.0
    except OSError as e:
        missing.append(f"no CPU quota (cgroup v1 cpu: {e})")
    try:
        d = _v1_group(mounts, own, name, "cpuacct", made)
        group.cpu_usage_file = os.path.join(d, "cpuacct.usage")
        if not os.path.exists(group.cpu_usage_file):
            raise OSError(f"{group.cpu_usage_file} is missing")
    except OSError as e:
        group.cpu_usage_file = None
        missing.append(f"no CPU time over the whole run (cgroup v1 cpuacct: {e})")
    group.cpu_missing = "; ".join(missing)
    try:
        group.freezer = _v1_group(mounts, own, name, "freezer", made)
    except OSError:
        pass  # no freezer: kill_all loops instead
    group.dirs = [d for d in made.values() if d != group.freezer]
    group.procs = [os.path.join(d, "cgroup.procs") for d in made.values()]
    return group


def _rmdirs(dirs) -> None:
    for d in dirs:
        try:
            os.rmdir(d)
        except OSError:
            pass


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, not ours to signal
    return True


def sweep_stale() -> list[str]:
    """Remove the groups of graders that died mid-run (their processes are killed first); returns
    the groups removed.  Groups of live processes are left alone."""
    mounts, own = _mounts(), _own_paths()
    parents = set()
    for mnt, fs, opts in mounts:
        if fs == "cgroup2":
            parents.update((os.path.join(mnt, own.get("", "/").lstrip("/")), mnt))
        else:
            parents.update(os.path.join(mnt, own.get(c, "/").lstrip("/"))
                           for c in ("memory", "pids", "freezer", "cpu", "cpuacct") if c in opts)
    removed = []
    for parent in sorted(parents):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            m = _NAME_RE.match(name)
            if m is None or pid_alive(int(m.group(1))):
                continue
            d = os.path.join(parent, name)
            group = RunCgroup("v1", [d], [os.path.join(d, "cgroup.procs")])
            group.kill_all(wait_s=1.0)
            group.remove(wait_s=1.0)
            if not os.path.exists(d):
                removed.append(d)
    return removed


def create(memory_bytes: int, max_procs: int) -> tuple[RunCgroup | None, str]:
    """A fresh group for one run with these limits, or ``(None, why not)``."""
    name = f"verispec-sbx-{os.getpid()}-{secrets.token_hex(6)}"
    mounts = _mounts()
    own = _own_paths()
    reasons = []
    for mnt, fs, _ in mounts:
        if fs == "cgroup2":
            try:
                return _try_v2(mnt, own.get("", "/"), name, memory_bytes, max_procs), ""
            except OSError as e:
                reasons.append(f"cgroup v2 at {mnt}: {e}")
    try:
        return _try_v1(mounts, own, name, memory_bytes, max_procs), ""
    except OSError as e:
        reasons.append(f"cgroup v1: {e}")
    return None, "; ".join(reasons) or "no cgroup file system mounted"
