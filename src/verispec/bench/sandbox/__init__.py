"""Run untrusted Python (model-generated code) in a contained child process.

``run_python(code)`` runs ``code`` as ``python -I -B prog.py``; ``run_module(path, args)`` runs a
trusted module file the same way (the code grader's child entry point).  Nothing of the program
runs in the calling process and nothing is ``exec``'d there.  Modules:

* :mod:`.runner` -- the parent side: run directory, cgroup, start, deadlines (including the
  per-line deadlines of the report channel), kill, status, cleanup;
* :mod:`.bootstrap` -- the child side, run by path before the program: namespaces, minimal
  root, uid drop, seccomp, rlimits, ``execve``;
* :mod:`.cgroup` -- one cgroup per run (v2 or v1);
* :mod:`.audit_hook` -- the in-interpreter fallback guard.

Containment, in the order it is set up:

1. **Cgroup** (:mod:`.cgroup`): the run joins its own group with ``memory`` = ``memory_mb`` and
   ``pids`` = ``max_procs`` for all its processes together (memfd and tmpfs pages included).
2. **Namespaces** (``unshare(2)``; as root directly, otherwise inside a user namespace mapping only
   the caller's uid): **network** (loopback down: no TCP/UDP/DNS, and abstract Unix sockets are
   per namespace), **IPC** (SysV shared memory, semaphores and message queues die with the run),
   **PID** (the program is PID 1: when it ends the kernel kills every descendant, even
   ``setsid()`` ones; ``/proc`` shows only the run), **mount** (below).
3. **Minimal root**: the program's whole file system is a read-only tmpfs holding ``/usr`` (and
   the host's ``/bin``, ``/lib*`` links), the interpreter's prefixes (and venv), ``/dev/null``,
   ``zero``, ``full``, ``random``, ``urandom``, a fresh ``/proc``, a ``/dev/shm`` tmpfs and the run
   directory ``/sandbox`` -- a tmpfs of ``max_disk_mb`` (and at most 65,536 files) holding the
   input files.  Repositories,
   datasets, result stores, other runs, ``/tmp``, ``/run`` (and so host Unix socket files),
   ``/etc``, ``/root`` and ``/home`` do not exist inside.  These tmpfs mounts exist only in the
   run's mount namespace, so they vanish with it: the program cannot leave anything behind.
4. **Unprivileged user**: started as root (as in CI), the program runs as ``SANDBOX_UID`` /
   ``SANDBOX_GID`` (65534, "nobody") without supplementary groups; ``PR_SET_NO_NEW_PRIVS``.
5. **Seccomp**: ``add_key``, ``request_key`` and ``keyctl`` (the kernel keyrings, which are per
   uid and would carry data between runs) fail with ``EPERM``; so do syscalls of foreign ABIs
   (i386 ``int 0x80``, x32), which would bypass a number-based filter.
6. **Resource limits** just before ``execve``: ``RLIMIT_AS`` (``memory_mb``, per process),
   ``RLIMIT_CPU`` (``ceil(timeout_s) + 1`` s), ``RLIMIT_FSIZE`` (``max_file_mb``; also caps the
   captured stdout/stderr, which go to files), ``RLIMIT_NOFILE`` (``max_open_files``),
   ``RLIMIT_CORE`` = 0; ``RLIMIT_NPROC`` only when there is no pids cgroup.
7. **Time** from outside: the wall-clock ``timeout_s`` and the report channel's per-line
   deadlines are kept by the parent, which kills PID 1 of the run (and its process group).

Fallbacks, each recorded in :attr:`SandboxResult.isolation` (:func:`sandbox_info` reports what
this machine gives; nothing degrades silently):

* **no cgroup** (no write access to a cgroup hierarchy): ``isolation["cgroup"] is None`` and
  ``isolation["cgroup_fallback"]`` says why; memory is then capped per process only
  (``RLIMIT_AS``) and processes per uid (``RLIMIT_NPROC``, shared by concurrent runs).
* **no namespaces** (no ``CAP_SYS_ADMIN`` and no unprivileged user namespaces, e.g. a default
  Docker container, or ``namespaces=False``): no minimal root, no IPC/PID isolation, the run
  directory is a host directory (no disk quota beyond ``RLIMIT_FSIZE``), and the program runs
  under the in-interpreter audit hook of :mod:`.audit_hook` (refuses sockets, ``ctypes``,
  starting programs, writing outside the run directory) -- much weaker, bypassable;
  ``isolation["audit_hook"] = True``.  As root without a mount namespace the interpreter must
  be usable by the sandbox uid (``VERISPEC_SANDBOX_PYTHON``), else the run is refused.
* started as root and the uid drop fails: the run is refused (status ``"error"``).
* no seccomp filter for this CPU architecture: ``isolation["seccomp"] is None`` plus a warning.

Statuses: ``"passed"`` (exit code 0), ``"failed"`` (non-zero exit, killed by an unrelated
signal, or report channel overflow), ``"timeout"`` (wall clock, a report deadline or
``RLIMIT_CPU``), ``"memory"`` (the cgroup's OOM killer, ``MemoryError`` as the last line of
stderr, or a ``SIGKILL`` not sent by us), ``"stopped"`` (the report handler stopped it),
``"error"`` (the sandbox could not be set up).

Environment: ``VERISPEC_SANDBOX_UID`` / ``VERISPEC_SANDBOX_GID`` choose the unprivileged ids
(default 65534); ``VERISPEC_SANDBOX_PYTHON`` the interpreter (default ``sys.executable``).
"""

from .runner import (
    SANDBOX_GID,
    SANDBOX_UID,
    SandboxResult,
    remove_tree,
    run_module,
    run_python,
    sandbox_info,
)

__all__ = ["SandboxResult", "run_python", "run_module", "sandbox_info", "remove_tree", "SANDBOX_UID", "SANDBOX_GID"]
