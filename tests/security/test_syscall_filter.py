"""The system-call filters: each denied call fails inside the sandbox, and what kernels need still works.

Each attack kernel adds ``1000 + i`` to its outputs when the i-th attempt went through, so a failing test names
the call in its message. Run as root and as an ordinary user (``.ci/security-as-user``).
"""

from __future__ import annotations

import platform

import pytest

from kope_mcp.runtime.sandbox import capabilities
from kope_mcp.services.workbench import Workbench
from tests.security.conftest import attack_kernel

if not capabilities().seccomp:
    pytest.skip("no system-call filter here (libseccomp missing): `kope doctor` says so", allow_module_level=True)

HEADERS = r"""
#include <errno.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/uio.h>
#include <linux/sched.h>
#include <pthread.h>
static int tried;
static void expect(long result, int wanted) {
    tried++;
    if (!(result == -1 && errno == wanted) && pwned == 0.0f) pwned = 1000.0f + tried;
}
static void works(long result) {
    tried++;
    if (result < 0 && pwned == 0.0f) pwned = 2000.0f + tried;
}
static void *idle(void *arg) { return arg; }
"""

# (what it tries, C statement evaluating to the call's result, errno a filtered call gets)
DENIED = [
    ("io_uring_setup", "syscall(SYS_io_uring_setup, 8, buf)", "EPERM"),
    ("keyctl", "syscall(SYS_keyctl, 0 /* GET_KEYRING_ID */, -3 /* session */, 1)", "EPERM"),
    ("add_key", 'syscall(SYS_add_key, "user", "k", "v", 1, -2)', "EPERM"),
    ("userfaultfd", "syscall(SYS_userfaultfd, 0)", "EPERM"),
    ("perf_event_open (on itself)", "syscall(SYS_perf_event_open, buf, 0, -1, -1, 0)", "EPERM"),
    ("bpf", "syscall(SYS_bpf, 0, buf, 16)", "EPERM"),
    ("unshare a user and mount namespace", "unshare(CLONE_NEWUSER | CLONE_NEWNS)", "EPERM"),
    ("clone into a new user namespace", "syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)", "EPERM"),
    ("setns", 'setns(open("/proc/self/ns/uts", O_RDONLY), 0)', "EPERM"),
    ("mount a tmpfs", 'syscall(SYS_mount, "none", "/tmp", "tmpfs", 0, 0)', "EPERM"),
    ("ptrace(TRACEME)", "syscall(SYS_ptrace, 0 /* PTRACE_TRACEME */, 0, 0, 0)", "EPERM"),
    ("process_vm_readv of itself", "syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0)", "EPERM"),
    ("sched_setaffinity by pid", "syscall(SYS_sched_setaffinity, getpid(), sizeof mask, &mask)", "EPERM"),
    ("setpriority of every process of this uid", "setpriority(PRIO_USER, 0, 19)", "EPERM"),
    ("setpriority of the process group", "setpriority(PRIO_PGRP, 0, 19)", "EPERM"),
    ("prlimit64 of a pid", "syscall(SYS_prlimit64, getpid(), RLIMIT_NOFILE, &limit, 0)", "EPERM"),
    ("clone3 (flags a filter cannot read)", "syscall(SYS_clone3, buf, 88)", "ENOSYS"),
]
# What compilers and kernels use must keep working under the filter.
ALLOWED = [
    "sched_setaffinity(0, sizeof mask, &mask)",
    "setpriority(PRIO_PROCESS, 0, 1)",
    "syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, &limit)",
    "syscall(SYS_prlimit64, getpid(), RLIMIT_NOFILE, 0, &limit)",
    "pthread_create(&thread, 0, idle, 0) == 0 ? pthread_join(thread, 0) : -1",
    "(child = fork()) == 0 ? (_exit(0), 0) : waitpid(child, 0, 0)",
]


def _program() -> str:
    setup = """
    static char buf[4096]; char local_buf[8] = {0}, remote_buf[8] = {0};
    struct iovec local = {local_buf, 8}, remote = {remote_buf, 8};
    cpu_set_t mask; sched_getaffinity(0, sizeof mask, &mask);
    struct rlimit limit; getrlimit(RLIMIT_NOFILE, &limit);
    pthread_t thread; pid_t child;
"""
    denied = "\n".join(f"    expect({call}, {errno}); /* {what} */" for what, call, errno in DENIED)
    allowed = "\n".join(f"    works({call});" for call in ALLOWED)
    return setup + denied + "\n" + allowed


def test_each_denied_system_call_fails_and_the_allowed_ones_work(workbench: Workbench):
    source = attack_kernel(ctor=_program(), extra=HEADERS)
    compiled = workbench.compile_kernel("vector_add", source, flags=["-O1", "-pthread", "-D_GNU_SOURCE"])
    assert compiled.ok, compiled.log
    report = workbench.run_tests(compiled.kernel_id)
    # 1000 + i: the i-th denied call went through; 2000 + i: the (i - len(DENIED))-th allowed call failed.
    assert report.passed, (report.message, [what for what, _, _ in DENIED])


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the 32-bit system-call gate is x86-only")
def test_a_system_call_through_the_32_bit_gate_kills_the_kernel(workbench: Workbench):
    # The filter knows only the native ABI; int 0x80 would reach the i386 table unfiltered, so it kills instead.
    ctor = '    int r; __asm__ volatile("int $0x80" : "=a"(r) : "a"(20) /* i386 getpid */ : "memory");\n' \
           "    if (r > 0) pwned = 0.0f;"
    compiled = workbench.compile_kernel("vector_add", attack_kernel(ctor=ctor))
    assert compiled.ok, compiled.log
    report = workbench.run_tests(compiled.kernel_id)
    assert not report.passed and "SIGSYS" in report.message, report.message


NEIGHBOURS = r"""
#include <errno.h>
#include <sys/syscall.h>
#include <sys/uio.h>
static int tried;
static void refused(long result) {
    tried++;
    if (result != -1 && pwned == 0.0f) pwned = 1000.0f + tried;
}
"""
# Aimed at every other process of the profile: the coordinator and the baseline's and reference's workers.
AT_NEIGHBOURS = """
    DIR *d = opendir("/proc"); struct dirent *e;
    char local_buf[8], remote_buf[8] = {0};
    struct iovec local = {local_buf, 8}, remote = {remote_buf, 8};
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 1 || pid == getpid()) continue;
        refused(kill(pid, 0));
        refused(kill(pid, SIGSTOP));
        refused(syscall(SYS_tgkill, pid, pid, 0));
        refused(syscall(SYS_rt_sigqueueinfo, pid, 0, buf));
        refused(syscall(SYS_pidfd_open, pid, 0));
        refused(syscall(SYS_process_vm_readv, pid, &local, 1, &remote, 1, 0));
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        refused(fcntl(fd, F_SETOWN, pid));
        refused(fcntl(fd, F_SETOWN | (1L << 32) /* the kernel reads an int */, pid));
        close(fd);
        char path[64]; snprintf(path, sizeof path, "/proc/%d/mem", pid);
        refused(open(path, O_RDWR));
    }
    refused(kill(0, SIGSTOP));
    refused(kill(-1, SIGSTOP));
    if (d) closedir(d);
"""


def test_a_profiled_kernel_reaches_none_of_the_processes_it_is_compared_with(workbench: Workbench):
    body = "    static int once; static char buf[128];\n    if (!once++) {\n" + AT_NEIGHBOURS + "    }"
    compiled = workbench.compile_kernel("vector_add", attack_kernel(body=body, extra=NEIGHBOURS))
    assert compiled.ok, compiled.log
    assert workbench.run_tests(compiled.kernel_id).passed
    profiled = workbench.profile_kernel(compiled.kernel_id)
    # An output off by 1000 + i (wrong_at_profile_size) would name the attempt that reached a neighbour.
    assert profiled.failure is None, (profiled.failure, profiled.message)
