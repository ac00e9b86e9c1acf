"""The sandbox's system-call filters (seccomp, built by libseccomp through its ``pyseccomp`` bindings).

Two filters, stacked:

- **The sandbox's own**, loaded by bubblewrap (``--seccomp``) just before the first command of every run
  (compilers, kernels, task code, Triton's interpreter). It denies what no kernel or compiler needs and what the
  namespaces alone do not stop: io_uring, the key syscalls, userfaultfd, perf_event_open, bpf, every mount and
  namespace call (a root server's per-run uid could otherwise create a user namespace and mount in it), clone with a
  namespace flag, ptrace, and scheduler, affinity, priority, resource-limit and page-placement changes aimed at any
  process but the caller (``pid 0``). ``clone3`` answers ENOSYS, whose flags a filter cannot read; glibc then
  falls back to ``clone``. Runs other than a profile's coordinator are also denied ``process_vm_*``.
- **A worker's own** (:func:`confine_to_self`), which a profile's coordinator loads into each implementation's
  process after forking it and before its library is loaded (constructors run under it): signals only to its own
  pid, no reaching another process's memory, and no ``F_SETOWN``/``FIOSETOWN`` (the kernel would deliver SIGIO, or
  any signal ``F_SETSIG`` names, to another process with this process's credentials); a CPU profile's workers
  create no process either (only threads, whose CPU time is the process's). The workers of one profile
  share a uid, and a root server's coordinator must keep reaching the candidate's memory, so per-worker identities
  would cost the check of every timed call; the filter gives the separation instead, in both modes.

Denied calls fail with EPERM (a program sees an ordinary error); a call of another ABI (``int 0x80``) kills the
process. Where libseccomp cannot be loaded the filters are absent, ``kope doctor`` says so, and the profile's
scheduling watch (``interfered``) still refuses a candidate that re-prioritised a neighbour.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import struct
from collections.abc import Iterator
from types import ModuleType
from typing import Any, NamedTuple

# Denied outright, for every run.
DENIED = (
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key",
    "userfaultfd", "perf_event_open", "bpf", "fanotify_init", "lookup_dcookie", "open_by_handle_at",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr", "unshare", "setns",
    "ptrace", "kcmp", "pidfd_getfd", "process_madvise",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "iopl", "ioperm", "syslog",
)
# Denied except for a profile's coordinator, which reads and poisons the stopped candidate's buffers with them.
REACHING = ("process_vm_readv", "process_vm_writev")
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
# Calls whose first argument names the process they change; allowed only for the caller itself (pid 0).
AIMED_AT_PID = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "migrate_pages",
                "move_pages")
_PRIO_PROCESS = 0
_IOPRIO_WHO_PROCESS = 1
_F_SETOWN, _F_SETOWN_EX = 8, 15
_FIOSETOWN, _SIOCSPGRP = 0x8901, 0x8902
_CLONE_THREAD = 0x00010000
_INT = 0xFFFFFFFF  # int arguments: the kernel ignores the upper half a caller may fill
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277, "riscv64": 277, "ppc64le": 358, "s390x": 348}.get(os.uname().machine, -1)


class FilterStatus(NamedTuple):  # no dataclasses: the harness imports this module, and every import is per run
    active: bool
    detail: str


def _library() -> ModuleType:
    import pyseccomp  # type: ignore[import-untyped,unused-ignore]

    return pyseccomp


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    try:
        return _library(), ""
    except (ImportError, RuntimeError, OSError, AttributeError) as exc:  # no bindings, or no libseccomp
        return None, f"libseccomp cannot be loaded ({type(exc).__name__}: {exc})"


def _numbers(sc: ModuleType, names: tuple[str, ...]) -> Iterator[int]:
    for name in names:
        try:
            number = sc.resolve_syscall(sc.Arch.NATIVE, name)
        except (OSError, ValueError):
            continue
        if number >= 0:  # a call this architecture does not have (iopl on arm64) needs no rule
            yield number


def _sandbox_filter(sc: ModuleType, *, reaching: bool) -> Any:
    eperm = sc.ERRNO(errno.EPERM)
    flt = sc.SyscallFilter(sc.ALLOW)
    for number in _numbers(sc, DENIED + (() if reaching else REACHING)):
        flt.add_rule(eperm, number)
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in NAMESPACE_FLAGS:
        flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for number in _numbers(sc, AIMED_AT_PID):
        flt.add_rule(eperm, number, sc.Arg(0, sc.NE, 0))
    # setpriority/ioprio_set(which, who): only the caller itself (PRIO_USER would renice every run of this uid).
    for name, own in (("setpriority", _PRIO_PROCESS), ("ioprio_set", _IOPRIO_WHO_PROCESS)):
        flt.add_rule(eperm, name, sc.Arg(0, sc.NE, own))
        flt.add_rule(eperm, name, sc.Arg(1, sc.NE, 0))
    # prlimit64(pid, resource, new, old): reading another's limits is harmless, setting them is not.
    flt.add_rule(eperm, "prlimit64", sc.Arg(0, sc.NE, 0), sc.Arg(2, sc.NE, 0))
    return flt


@functools.cache
def sandbox_program(*, reaching: bool = False) -> bytes | None:
    """The compiled classic-BPF program bubblewrap loads (``--seccomp``); None without libseccomp."""
    sc, _ = _load()
    if sc is None:
        return None
    return _export(_sandbox_filter(sc, reaching=reaching))


def program_fd(*, reaching: bool = False) -> int | None:
    """A descriptor holding the sandbox's program at offset 0, for one bwrap (which reads it to the end)."""
    program = sandbox_program(reaching=reaching)
    if program is None:
        return None
    fd = os.memfd_create("kope-seccomp", 0)  # inherited by bwrap through pass_fds
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def status() -> FilterStatus:
    sc, why = _load()
    if sc is None:
        return FilterStatus(False, why)
    try:
        sandbox_program()
        worker_program()
    except (OSError, RuntimeError) as exc:
        return FilterStatus(False, f"libseccomp could not build the filter: {exc}")
    return FilterStatus(True, "seccomp (libseccomp): io_uring, keys, userfaultfd, perf_event_open, bpf, mounts, "
                              "namespaces, ptrace, process_vm_* and scheduling/priority/limits of other "
                              "processes denied; a profile's workers signal only themselves")


# The worker's filter names its own pid. The server builds it once with this stand-in, and the worker writes its pid
# over it before loading: no libseccomp (and no `ldconfig` run by ctypes.util.find_library, ~30 ms) in the run.
_PID_STAND_IN = 0x7EAD_BEEF


@functools.cache
def worker_program(*, spawn: bool = True) -> bytes | None:
    """The worker's filter as classic BPF, its pid still the stand-in; None without libseccomp. ``spawn=False``
    (a CPU profile's workers): no new process either, only threads (``clone`` with ``CLONE_THREAD``, whose CPU time
    is the process's): a child forked at load or at the warm-up call computed every input set ahead, and a
    ``clone(CLONE_VM)`` helper did half the work, neither of them counted."""
    sc, _ = _load()
    if sc is None or _SYS_SECCOMP < 0:
        return None
    eperm = sc.ERRNO(errno.EPERM)
    flt = sc.SyscallFilter(sc.ALLOW)
    if not spawn:
        for number in _numbers(sc, ("fork", "vfork")):
            flt.add_rule(eperm, number)
        flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open"):
        flt.add_rule(eperm, name, sc.Arg(0, sc.NE, _PID_STAND_IN))
    for number in _numbers(sc, ("tkill", "pidfd_send_signal", *REACHING, "ptrace", "kcmp", "pidfd_getfd")):
        flt.add_rule(eperm, number)
    for cmd in (_F_SETOWN, _F_SETOWN_EX):
        flt.add_rule(eperm, "fcntl", sc.Arg(1, sc.MASKED_EQ, _INT, cmd))
    for request in (_FIOSETOWN, _SIOCSPGRP):
        flt.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, _INT, request))
    program = _export(flt)
    if _stand_ins(program) < 1:  # libseccomp shares one comparison block between the calls that use it
        raise RuntimeError("libseccomp laid out the worker's filter in an unexpected way")
    return program


_PR_SET_SECCOMP = 22


@functools.cache
def counting_program() -> bytes | None:
    """The filter callgrind's driver loads before it opens the kernel: no exec (valgrind would leave no summary, and
    the program it ran could write one) and no further filter (one denying valgrind's own writes). Classic BPF;
    None without libseccomp."""
    sc, _ = _load()
    if sc is None:
        return None
    eperm = sc.ERRNO(errno.EPERM)
    flt = sc.SyscallFilter(sc.ALLOW)
    for number in _numbers(sc, ("execve", "execveat", "seccomp")):
        flt.add_rule(eperm, number)
    flt.add_rule(eperm, "prctl", sc.Arg(0, sc.MASKED_EQ, _INT, _PR_SET_SECCOMP))
    return _export(flt)


def _stand_ins(program: bytes) -> int:
    # struct sock_filter { u16 code; u8 jt; u8 jf; u32 k; }: only k is read here.
    return sum(1 for offset in range(0, len(program), 8)
               if struct.unpack_from("=I", program, offset + 4)[0] == _PID_STAND_IN)


def confine_to_self(program: bytes | None) -> None:
    """Load, into the calling process, the worker's filter (:func:`worker_program`) for its own pid: it reaches no
    other process (signals, memory, ownership of asynchronous I/O). Irreversible, inherited by every thread and
    child it creates later, and by the threads it already has. None (no libseccomp): nothing to load."""
    if not program:
        return
    pid = os.getpid()
    patched = bytearray(program)
    for index in range(0, len(patched), 8):
        if struct.unpack_from("=I", patched, index + 4)[0] == _PID_STAND_IN:
            struct.pack_into("=I", patched, index + 4, pid)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    filters = (ctypes.c_char * len(patched)).from_buffer(patched)
    fprog = _SockFprog(len(patched) // 8, ctypes.cast(filters, ctypes.c_void_p))
    # TSYNC: every thread of the process (an OpenBLAS or OpenMP pool started before this call) gets it too.
    if libc.syscall(_SYS_SECCOMP, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fprog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _export(flt: Any) -> bytes:
    fd = os.memfd_create("kope-seccomp-build", os.MFD_CLOEXEC)
    try:
        flt.export_bpf(_Fileno(fd))
        size = os.lseek(fd, 0, os.SEEK_CUR)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


class _Fileno:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd
