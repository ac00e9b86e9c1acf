"""The worker's filter, loaded into a real forked process: it signals itself, nothing else."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import threading

import pytest

from kope_mcp.runtime import sandbox_seccomp
from kope_mcp.runtime.sandbox import capabilities

pytestmark = pytest.mark.skipif(sandbox_seccomp.worker_program() is None, reason="libseccomp cannot be loaded here")
_libc = ctypes.CDLL(None, use_errno=True)
_F_SETOWN = 8


def _in_confined_child(check, *, spawn: bool = True) -> int:
    """Run ``check`` in a forked child after confine_to_self; its exit status (0: every expectation held)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            sandbox_seccomp.confine_to_self(sandbox_seccomp.worker_program(spawn=spawn))
            code = check()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _errno_of(call) -> int:
    ctypes.set_errno(0)
    return 0 if call() == 0 else ctypes.get_errno()


def test_a_confined_worker_signals_itself_but_not_its_parent():
    parent = os.getpid()

    def check() -> int:
        own = os.getpid()
        os.kill(own, 0)
        signal.signal(signal.SIGUSR1, lambda *_: None)
        os.kill(own, signal.SIGUSR1)  # raise() and abort() keep working
        failures = 0
        for target in (parent, 0, -1):
            failures += _errno_of(lambda t=target: _libc.kill(t, 0)) != errno.EPERM
        # The kernel reads a pid_t: a value equal to this pid only in its lower half is refused, not let through.
        failures += _errno_of(lambda: _libc.syscall(62, ctypes.c_long(parent | (1 << 32)), 0)) != errno.EPERM
        return min(failures, 1)

    assert _in_confined_child(check) == 0


def test_a_profile_worker_starts_threads_but_no_process_of_its_own():
    clone_vm, sigchld = 0x100, 17

    def check() -> int:
        failures = 0
        try:
            pid = os.fork()
        except OSError as exc:
            failures += exc.errno != errno.EPERM
        else:
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            failures += 1
        # clone(CLONE_VM) without CLONE_THREAD: a helper sharing the memory whose CPU time is not the process's.
        # (A null stack: were it allowed, the child would fault at once, never run on in this process.)
        if os.uname().machine == "x86_64":  # clone is syscall 56 there
            failures += _errno_of(lambda: _libc.syscall(56, clone_vm | sigchld, 0, 0, 0, 0)) != errno.EPERM
        ran = []
        thread = threading.Thread(target=lambda: ran.append(1))
        thread.start()
        thread.join()
        return min(failures + (ran != [1]), 1)

    assert _in_confined_child(check, spawn=False) == 0


def test_a_test_runs_worker_may_still_fork_so_the_fork_is_reported_not_hidden():
    def check() -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        return 0

    assert _in_confined_child(check) == 0


def test_a_confined_worker_cannot_hand_its_sockets_signals_to_another_process():
    parent = os.getpid()

    def check() -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        failures = _errno_of(lambda: _libc.fcntl(sock.fileno(), _F_SETOWN, parent)) != errno.EPERM
        # The command is an int to the kernel: upper bits set by the caller do not get it past the filter.
        failures += _errno_of(lambda: _libc.syscall(72, sock.fileno(), ctypes.c_long(_F_SETOWN | (1 << 32)),
                                                    parent)) != errno.EPERM
        return min(int(failures), 1)

    assert _in_confined_child(check) == 0


def test_an_unconfined_process_still_reaches_its_children():
    # Positive control: the denials above come from the filter, not from this machine.
    assert _errno_of(lambda: _libc.kill(os.getpid(), 0)) == 0


def test_the_sandbox_program_is_a_whole_number_of_bpf_instructions():
    program = sandbox_seccomp.sandbox_program()
    assert program is not None and len(program) % 8 == 0 and len(program) > 8 * len(sandbox_seccomp.DENIED)
    assert sandbox_seccomp.sandbox_program(reaching=True) != program


def test_doctor_lists_the_filter_as_the_sandbox_has_it():
    layers = {layer.name: layer for layer in capabilities().layers}
    if capabilities().isolated:
        assert layers["system-call filter"].active == capabilities().seccomp
        assert capabilities().seccomp, layers["system-call filter"].detail


def test_threads_started_before_the_filter_are_confined_too():
    parent = os.getpid()

    def check() -> int:
        import threading

        go, seen = threading.Event(), []
        thread = threading.Thread(target=lambda: (go.wait(30), seen.append(_errno_of(lambda: _libc.kill(parent, 0)))))
        thread.start()  # a pool thread a library started before the kernel was loaded
        sandbox_seccomp.confine_to_self(sandbox_seccomp.worker_program())
        go.set()
        thread.join(30)
        return 0 if seen == [errno.EPERM] else 1

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = check()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
