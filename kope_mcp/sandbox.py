"""Run untrusted kernel code (and the compiler reading untrusted source) in a limited child process.

Layers, outermost first, each used when the machine allows it:

- ``prlimit``: CPU seconds, address space, no core files, file size, process count (inherited by everything below);
- ``unshare --net --pid --fork``: no network but a downed loopback, and a PID namespace, so that when the child's
  init ends every process the kernel forked is killed by the OS, even one that called ``setsid``;
- a ``sh`` init inside the namespace, so the real command is an ordinary process that dies of its own signals
  (a PID-namespace init ignores signals it sends itself) and its status comes back as ``128 + signal``;
- ``setpriv`` to the unprivileged ``nobody`` user (or the Python harness drops privileges itself after it has
  loaded what it needs), so kernel code cannot read or write the user's files;
- its own session and process group, a scrubbed environment, a private working directory, and a wall-clock
  timeout that kills the whole group.

stdout and stderr go to files capped by the file-size limit, so a kernel that floods output is stopped by the
OS instead of filling the server's memory.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

NOBODY_UID = 65534
NOBODY_GID = 65534
_TAIL_BYTES = 16 * 1024


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 30.0
    cpu_seconds: int = 60
    address_space_bytes: int | None = 4 * 1024**3
    max_processes: int = 256
    max_file_bytes: int = 256 * 1024**2


@dataclass(frozen=True)
class SandboxCapabilities:
    """What isolation this machine allows; ``kope doctor`` prints it."""

    rlimits: bool
    network_isolation: bool
    pid_namespace: bool
    privilege_drop: bool
    notes: tuple[str, ...] = ()


@dataclass
class SandboxResult:
    returncode: int | None
    timed_out: bool
    wall_seconds: float
    stdout_tail: str
    stderr_tail: str
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def signal_number(self) -> int | None:
        """The signal that killed the command (through the sh init its status reads 128 + signal)."""
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


_SIGNAL_HINTS = {
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


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def capabilities() -> SandboxCapabilities:
    """Probe once per process which isolation layers work here."""
    notes: list[str] = []
    rlimits = shutil.which("prlimit") is not None and _works(["prlimit", "--core=0", "--", "true"])
    if not rlimits:
        notes.append("prlimit (util-linux) not usable: no CPU/memory/process limits, only the wall-clock timeout")
    unshare_ok = shutil.which("unshare") is not None
    net = unshare_ok and _works(["unshare", "--net", "--", "true"])
    pid = unshare_ok and _works(["unshare", "--net", "--pid", "--fork", "--kill-child", "--", "true"])
    if not net:
        notes.append("`unshare --net` failed (needs root or user namespaces): kernels run with network access")
    if not pid:
        notes.append("no PID namespace: processes a kernel forks are killed through its process group only")
    drop = os.geteuid() == 0 and shutil.which("setpriv") is not None
    if os.geteuid() != 0:
        notes.append("not root: kernels run as the server's own user (cannot switch to 'nobody')")
    return SandboxCapabilities(rlimits, net, pid, drop, tuple(notes))


def wrap_command(argv: list[str], limits: SandboxLimits, *, switch_user: bool) -> list[str]:
    """The full command line: limits, namespaces, init, user switch, then ``argv``."""
    caps = capabilities()
    cmd = list(argv)
    if switch_user and caps.privilege_drop:
        cmd = ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOBODY_GID}", "--clear-groups", "--", *cmd]
    if caps.pid_namespace:
        cmd = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--", "sh", "-c", '"$@"; exit $?', "sh", *cmd]
    elif caps.network_isolation:
        cmd = ["unshare", "--net", "--", *cmd]
    if caps.rlimits:
        rl = [f"--cpu={limits.cpu_seconds}", "--core=0", f"--nproc={limits.max_processes}",
              f"--fsize={limits.max_file_bytes}"]
        if limits.address_space_bytes is not None:
            rl.append(f"--as={limits.address_space_bytes}")
        cmd = ["prlimit", *rl, "--", *cmd]
    return cmd


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment: nothing of the server's secrets or settings reaches kernel code."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": "/nonexistent",
        "TMPDIR": ".",
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


def make_private_dir(parent: Path | None = None, prefix: str = "kope-run-") -> Path:
    """A fresh directory the sandboxed user can write to and nobody else can read."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    if capabilities().privilege_drop:
        os.chown(path, NOBODY_UID, NOBODY_GID)
    path.chmod(0o700)
    return path


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _TAIL_BYTES))
            data = fh.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return ("[... earlier output cut ...]\n" + text) if size > _TAIL_BYTES else text


def run_sandboxed(
    argv: list[str],
    *,
    cwd: Path,
    limits: SandboxLimits,
    env: dict[str, str],
    switch_user: bool = True,
) -> SandboxResult:
    """Run ``argv`` inside every available isolation layer; never raises for what the child does."""
    cmd = wrap_command(argv, limits, switch_user=switch_user)
    out_path, err_path = cwd / ".stdout", cwd / ".stderr"
    start = time.monotonic()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
        )
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            proc.wait()
        finally:
            # Whatever happened, nothing the kernel started may outlive the call.
            _kill_group(proc)
    wall = time.monotonic() - start
    return SandboxResult(
        returncode=None if timed_out else proc.returncode,
        timed_out=timed_out,
        wall_seconds=wall if not timed_out else limits.wall_seconds,
        stdout_tail=_tail(out_path),
        stderr_tail=_tail(err_path),
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def drop_privileges() -> bool:
    """Called by the harness after it loaded everything: become ``nobody`` when started as root."""
    if os.geteuid() != 0 or os.environ.get("KOPE_SANDBOX_DROP") != "1":
        return False
    os.setgroups([])
    os.setgid(NOBODY_GID)
    os.setuid(NOBODY_UID)
    return True
