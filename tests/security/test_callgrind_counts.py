"""profile_kernel(deterministic=true) runs the kernel inside valgrind's own process: whatever valgrind writes, the
kernel can write too. These kernels try to replace callgrind's counts with a small figure of their own."""

from __future__ import annotations

import shutil

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")]

# vector_add's own loop, so that run_tests and the profile pass and only the counts are at stake.
ADD = """
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
"""

# A summary in valgrind's form, written to every pipe the process holds below valgrind's own descriptors (the one
# named by --log-fd is still open there), and a callgrind.out of its own.
FORGE = r"""
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int under_valgrind(void) {
    const char *preload = getenv("LD_PRELOAD");
    return preload != 0 && strstr(preload, "vgpreload") != 0;
}

static void forge(void) {
    char line[512];
    int n = snprintf(line, sizeof line, "==%d== Events    : Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
                     "==%d== Collected : 42 1 1 0 0 0 0 0 0\n", getpid(), getpid());
    // Valgrind's own copy of its log sits above 19000 beside its scheduler's pipe, which valgrind does not
    // survive a write to; the number named by --log-fd is still open in the process.
    DIR *fds = opendir("/proc/self/fd");
    struct dirent *entry;
    while (fds != 0 && (entry = readdir(fds)) != 0) {
        char path[300], target[300] = {0};
        snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
        int number = atoi(entry->d_name);
        if (number < 3 || number > 1000) continue;
        if (readlink(path, target, sizeof target - 1) < 0 || strncmp(target, "pipe:", 5) != 0) continue;
        if (write(number, line, n) < 0) {}
    }
    if (fds != 0) closedir(fds);
    int out = open("callgrind.out", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out >= 0) {
        const char *fake = "events: Ir Dr Dw\ntotals: 42 1 1\nsummary: 42 1 1\n";
        if (write(out, fake, strlen(fake)) < 0) {}
        close(out);
    }
}
"""


def _counts(workbench, source: str):
    compiled = workbench.compile_kernel("vector_add", source, flags=["-O2"])
    assert compiled.ok, compiled.diagnostics
    assert workbench.run_tests(compiled.kernel_id).passed
    return workbench.profile_kernel(compiled.kernel_id, deterministic=True, time_reference=False)


def test_a_kernel_that_writes_a_summary_and_execs_gets_no_counts(workbench):
    source = FORGE + """
void kernel(const float *a, const float *b, float *out, int64_t n) {
""" + ADD + """
    static int done;
    if (under_valgrind() && !done) {
        done = 1;
        forge();
        char *argv[] = {"/bin/true", 0};
        execv("/bin/true", argv);
    }
}
"""
    report = _counts(workbench, source)
    assert report.deterministic is None
    # The exec is refused, and valgrind does not survive a refused exec: no summary at all, not a forged one.
    assert any("no deterministic counts: valgrind exited" in w for w in report.warnings), report.warnings


def test_a_kernel_that_writes_a_second_summary_gets_no_counts(workbench):
    source = FORGE + """
void kernel(const float *a, const float *b, float *out, int64_t n) {
""" + ADD + """
    if (under_valgrind()) forge();
}
"""
    report = _counts(workbench, source)
    assert report.deterministic is None, report.deterministic
    assert any("summaries" in w for w in report.warnings), report.warnings


def test_a_kernel_carrying_a_callgrind_client_request_gets_no_counts(workbench):
    # CALLGRIND_TOGGLE_COLLECT's preamble: with it a kernel switches counting off inside itself.
    source = """
#include <stdint.h>
void kernel(const float *a, const float *b, float *out, int64_t n) {
    __asm__ volatile("rolq $3, %%rdi; rolq $13, %%rdi; rolq $61, %%rdi; rolq $51, %%rdi; xchgq %%rbx, %%rbx"
                     ::: "rdi", "memory");
""" + ADD + """
}
"""
    report = _counts(workbench, source)
    assert report.deterministic is None
    assert any("client request" in w for w in report.warnings), report.warnings


def test_an_honest_kernel_still_gets_its_counts(workbench):
    source = "#include <stdint.h>\nvoid kernel(const float *a, const float *b, float *out, int64_t n) {" + ADD + "}\n"
    report = _counts(workbench, source)
    assert report.deterministic is not None, report.warnings
    assert report.deterministic.instructions > 1000
