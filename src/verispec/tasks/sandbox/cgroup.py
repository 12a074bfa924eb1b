"""One cgroup per sandbox run, so memory and process limits hold for the run as a whole.

Per-process rlimits let six processes hold six times ``RLIMIT_AS`` and do not see ``memfd`` or
tmpfs pages at all; a cgroup charges all of them to the run.  :func:`create` makes a fresh
group and sets its limits; the bootstrap writes its own pid into :attr:`RunCgroup.procs` before
it forks, so every process of the run is inside; :meth:`RunCgroup.remove` deletes the group
once they are all dead.

Two layouts are handled:

* **cgroup v2** (``cgroup2`` mounted, typically ``/sys/fs/cgroup``): a group under the caller's
  own group (or the root) whose ``cgroup.subtree_control`` has ``memory`` and ``pids``;
  ``memory.max``, ``memory.swap.max = 0``, ``pids.max``.
* **cgroup v1** (separate ``memory`` and ``pids`` hierarchies, and ``freezer`` where mounted):
  one group in each; ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap
  accounting exists), ``pids.max``.

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


@dataclass
class RunCgroup:
    kind: str  # "v2" | "v1"
    dirs: list[str]  # the group's directory in each hierarchy
    procs: list[str] = field(default_factory=list)  # the cgroup.procs files to join
    freezer: str | None = None  # v1: the run's freezer group, if that hierarchy is mounted

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
        return RunCgroup("v2", [d], [os.path.join(d, "cgroup.procs")])
    raise OSError("; ".join(errors))


def _try_v1(mounts, own: dict[str, str], name: str, memory: int, pids: int) -> RunCgroup:
    made: list[str] = []
    try:
        for ctrl in ("memory", "pids"):
            mnt = next((m for m, fs, opts in mounts if fs == "cgroup" and ctrl in opts), None)
            if mnt is None:
                raise OSError(f"no cgroup v1 {ctrl} hierarchy")
            d = os.path.join(mnt, own.get(ctrl, "/").lstrip("/"), name)
            os.mkdir(d)
            made.append(d)
            if ctrl == "memory":
                _write(os.path.join(d, "memory.limit_in_bytes"), str(memory))
                try:
                    _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(memory))
                except OSError:
                    pass  # no swap accounting
            else:
                _write(os.path.join(d, "pids.max"), str(pids))
    except OSError:
        for d in made:
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise
    group = RunCgroup("v1", made, [os.path.join(d, "cgroup.procs") for d in made])
    mnt = next((m for m, fs, opts in mounts if fs == "cgroup" and "freezer" in opts), None)
    if mnt is not None:
        d = os.path.join(mnt, own.get("freezer", "/").lstrip("/"), name)
        try:
            os.mkdir(d)
            group.freezer = d
            group.procs.append(os.path.join(d, "cgroup.procs"))
        except OSError:
            pass  # no freezer: kill_all loops instead
    return group


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
            parents.update(os.path.join(mnt, own.get(c, "/").lstrip("/")) for c in ("memory", "pids", "freezer")
                           if c in opts)
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
