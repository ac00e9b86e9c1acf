"""The verdict's third round (issue 41): nothing a candidate can compute before the clock starts, no process of its
own, no pid 1 to take over, no host memory to fill, and no blame for a baseline that fails.

Each kernel here is the attack itself, made to say what it found: it computes honestly, and writes a wrong element
(so the profile is ``wrong_at_profile_size``, or run_tests fails) whenever the door it tries is open. So every
test fails the day the door opens again, whoever runs it (root, or an ordinary user: ``.ci/security-as-user``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kope_mcp.errors import BaselineFailedError
from kope_mcp.models import ProfileReport
from kope_mcp.runtime.sandbox import capabilities
from kope_mcp.services.workbench import Workbench
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import VECTOR_ADD_OK, make_settings, vector_add_with_baseline
from tests.integrity.test_tricks import matmul_rows as rows

pytestmark = [pytest.mark.skipif(not capabilities().isolated, reason="kernels run only in the sandbox"),
              pytest.mark.slow]

HEAD = """#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
static int opened;  /* set when the door was open: the kernel then answers wrong */
static int profiled(void) { return access("/proc/3", F_OK) == 0; }  /* a profile's other workers exist */
"""


def kernel(body_before: str, helpers: str = "") -> str:
    """A matmul that runs ``body_before`` first (it may set ``opened``), computes every row, and is wrong when the
    door was open."""
    return HEAD + helpers + """
void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
""" + body_before + rows("0", "M") + "    if (opened) C[0] += 1.0f;\n}\n"


# The pool as files beside job.json (the path is in /proc/self/cmdline), at load: any file there but the job (a test
# run's inputs are files there, which a kernel may see; a profile's pool must not be).
POOL_FILES = kernel("    if (files_seen && profiled()) opened = 1;\n", """
static int files_seen;
__attribute__((constructor)) static void look(void) {
    DIR *d = opendir("/kope/in");
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, "job.json") != 0) files_seen = 1;
    if (d) closedir(d);
}
""")

# The input sets after this one in this process's memory at the first (warm-up) call: the layout puts every set's
# inputs, in order, before the first output buffer, so [end of B, C) holds the later sets (nothing but padding
# when the warm-up set happens to be the last: 1 chance in the pool's size that this look sees nothing).
LAYOUT_AT_WARMUP = kernel("""
    static int first = 1;
    if (first && profiled()) {
        first = 0;
        const unsigned char *p = (const unsigned char *)(B + K * N), *end = (const unsigned char *)C;
        if (p < end && end - p < (1L << 31))
            for (; p < end; p++)
                if (*p) { opened = 1; break; }
    }
""")

# A process of its own, made at load (it would compute every set there, its CPU time nobody's): fork, and the
# clone(CLONE_VM) helper that shares its memory without being a thread.
# (The build's own header comes first, so _GNU_SOURCE is too late for sched.h's clone.)
static_stack = """extern int clone(int (*)(void *), void *, int, void *, ...);
#define KOPE_CLONE_VM 0x00000100
static char stack[1 << 16];
static int helper(void *arg) { (void)arg; return 0; }
"""
PROCESSES = kernel("""
    static int first = 1;
    if (first && profiled()) {
        first = 0;
        pid_t child = fork();
        if (child == 0) _exit(0);
        if (child > 0) { opened = 1; waitpid(child, 0, 0); }
        int helped = clone(helper, stack + sizeof stack, KOPE_CLONE_VM | SIGCHLD, 0);
        if (helped > 0) { opened = 1; waitpid(helped, 0, 0); }
    }
""", static_stack)

# pid 1 of the run's namespace: bubblewrap's reaper, of the run's own identity as an ordinary user, was open to
# /proc/1/mem (the filter blocks ptrace, not open); code written there runs outside every check of the workers.
PID_1 = kernel("""
    static int first = 1;
    if (first && profiled()) {
        first = 0;
        int fd = open("/proc/1/mem", O_RDWR);
        if (fd >= 0) { opened = 1; close(fd); }
    }
""")

# The host's memory through the run's folders: each capped as a whole, not only file by file.
FILL = 640 * 1024 * 1024
FILLS_FOLDERS = kernel("""
    static int first = 1;
    if (first) {
        first = 0;
        static char chunk[1 << 20];
        memset(chunk, 7, sizeof chunk);
        const char *where[2] = {"/tmp", "."};
        for (int w = 0; w < 2; w++) {
            long written = 0;
            for (int f = 0; f < 10 && written < FILL; f++) {
                char path[64];
                snprintf(path, sizeof path, "%s/fill%d", where[w], f);
                int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
                if (fd < 0) break;
                for (int i = 0; i < 64 && written < FILL; i++) {
                    if (write(fd, chunk, sizeof chunk) != (ssize_t)sizeof chunk) { f = 10; break; }
                    written += sizeof chunk;
                }
                close(fd);
            }
            for (int f = 0; f < 10; f++) {  /* the folder is the run's own, but free it before the other */
                char path[64];
                snprintf(path, sizeof path, "%s/fill%d", where[w], f);
                unlink(path);
            }
            if (written >= FILL) opened = 1;
        }
    }
""", f"#define FILL {FILL}L\n#include <signal.h>\n")

# Where the server keeps things, from bubblewrap's command line (pid 1's, or the reaper's) and the mount table: the
# options were on the command line (every bind's host path, the scratch folder) and a kernel's library was bound
# from the home's builds folder, which the mount table showed. Both are read at the first call and in a profile.
HOST_PATHS = kernel("""
    static int first = 1;
    if (first) {
        first = 0;
        static char seen[1 << 20];
        const char *files[2] = {"/proc/1/cmdline", "/proc/self/mountinfo"};
        for (int f = 0; f < 2; f++) {
            int fd = open(files[f], O_RDONLY);
            if (fd < 0) continue;
            ssize_t n = read(fd, seen, sizeof seen - 1);
            close(fd);
            for (ssize_t i = 0; i < n; i++) if (!seen[i]) seen[i] = ' ';
            seen[n > 0 ? n : 0] = 0;
            if (strstr(seen, "/builds/") || strstr(seen, "--ro-bind") || strstr(seen, "/dev/shm")) opened = 1;
        }
    }
""")

ATTACKS = {"pool_files": POOL_FILES, "layout_at_warmup": LAYOUT_AT_WARMUP, "processes": PROCESSES, "pid_1": PID_1,
           "host_paths": HOST_PATHS}


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workbench]:
    workbench = Workbench(make_settings(Path(tmp_path_factory.mktemp("clock-home"))), TaskRegistry.default())
    yield workbench
    workbench.store.close()


@pytest.fixture(scope="module")
def profiled(bench: Workbench) -> dict[str, tuple[str, ProfileReport]]:
    results = {}
    for name, source in ATTACKS.items():
        compiled = bench.compile_kernel("matmul", source, strategy=f"attack: {name}", flags=["-O2"])
        assert compiled.ok, compiled.log
        tested = bench.run_tests(compiled.kernel_id)
        assert tested.passed, (name, tested.message)
        results[name] = (compiled.kernel_id, bench.profile_kernel(compiled.kernel_id))
    return results


@pytest.mark.parametrize("name", list(ATTACKS))
def test_every_door_to_work_before_the_clock_is_shut(profiled, bench, name):
    kernel_id, report = profiled[name]
    # Wrong (the door was open) would be wrong_at_profile_size; the loop it runs instead is measured for what it is,
    # within what code placement gives the baseline's own loop here (0.96-1.31x, test_forgeries.TRICK_PAYS).
    assert report.failure is None, (name, report.failure, report.message)
    assert (report.speedup_vs_baseline or 0) < 1.5, report
    assert bench.store.attempt(kernel_id).correct


def test_a_run_cannot_fill_the_hosts_memory_through_its_folders(bench):
    if not capabilities().sized_tmpfs:
        pytest.skip("this bubblewrap cannot size a tmpfs (--size, bubblewrap 0.5+)")
    compiled = bench.compile_kernel("matmul", FILLS_FOLDERS, strategy="attack: fill the folders", flags=["-O2"])
    assert compiled.ok, compiled.log
    tested = bench.run_tests(compiled.kernel_id)
    assert tested.passed, tested.message


# The task's own baseline, aborting at the profiling size only (run_tests never runs it).
BASELINE_ABORTS = """
#include <stdint.h>
#include <stdlib.h>
void kernel(const float *a, const float *b, float *out, int64_t n) {
    if (n > 100000) abort();
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
"""


def test_a_baseline_that_fails_leaves_the_candidate_unmeasured_and_unblamed(tmp_path: Path):
    bench = Workbench(make_settings(tmp_path / "home"),
                      vector_add_with_baseline(tmp_path, "vector_add_broken", BASELINE_ABORTS))
    try:
        compiled = bench.compile_kernel("vector_add_broken", VECTOR_ADD_OK, strategy="honest")
        assert bench.run_tests(compiled.kernel_id).passed
        with pytest.raises(BaselineFailedError, match=r"^baseline_failed: .*baseline process was killed by SIGABRT"):
            bench.profile_kernel(compiled.kernel_id)
        record = bench.store.attempt(compiled.kernel_id)
        assert record.correct and record.label == "unmeasured" and record.speedup is None, record
    finally:
        bench.store.close()


# Results kept by the content of 64 sampled inputs, on the task whose profile draws the fewest sets (two 64 MiB
# sets: every implementation runs each many times). With the check of old (a repeat must reproduce the first
# result on its set) it replayed from the second round; every repeat now runs on a variant of its set.
REPLAY = """#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define SLOTS 4
static uint64_t keys[SLOTS]; static float *vals[SLOTS]; static int64_t lens[SLOTS]; static int used, next;
void kernel(const float *x, float *y, int64_t n) {
    uint64_t key = 1469598103934665603ull;
    for (int64_t i = 0; i < 64 && n > 0; i++) {
        uint32_t v; memcpy(&v, x + (i * 7919) % n, 4); key = (key ^ v) * 1099511628211ull;
    }
    for (int s = 0; s < used; s++)
        if (keys[s] == key && lens[s] == n) { memcpy(y, vals[s], (size_t)n * 4); return; }
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
    if (n < 1000000) return;
    int s = used < SLOTS ? used++ : next++ % SLOTS;
    free(vals[s]); vals[s] = malloc((size_t)n * 4);
    if (!vals[s]) { used = s; return; }
    memcpy(vals[s], y, (size_t)n * 4); keys[s] = key; lens[s] = n;
}
"""


def test_a_cache_keyed_by_content_replays_nothing_on_the_smallest_pool(bench):
    compiled = bench.compile_kernel("gelu", REPLAY, strategy="attack: replay by content", flags=["-O2"])
    assert compiled.ok, compiled.log
    assert bench.run_tests(compiled.kernel_id).passed
    report = bench.profile_kernel(compiled.kernel_id)
    assert report.failure is None, (report.failure, report.message)
    assert report.repeated_calls > 0, report  # the pool is small: sets come round again, as variants
    # Its honest path is the baseline's loop: no replay, no gain.
    assert (report.speedup_vs_baseline or 0) < 1.5, report
    record = bench.store.attempt(compiled.kernel_id)
    assert record.label != "effective" or not record.teaches, record


# Work where nothing is timed, with nothing to compute ahead from (the inputs arrive with the call timed on them):
# CPU spent at load, or in the first (untimed) call, is still measured against the naive baseline's loading in the
# same run and the kernel's own typical call (services/verdicts.py), and such a result is never taught.
SPIN = "static void spin(double s) { volatile double x = 0; for (long i = 0; i < (long)(s * 4e8); i++) x += i; }\n"
UNTIMED = {
    "spins_at_load": "#include <stdint.h>\n" + SPIN + "__attribute__((constructor)) static void ahead(void) "
                     "{ spin(0.4); }\nvoid kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, "
                     "int64_t K) {\n" + rows("0", "M") + "}\n",
    "spins_in_the_first_call": "#include <stdint.h>\n" + SPIN + "static int calls;\nvoid kernel(const float *A, "
                               "const float *B, float *C, int64_t M, int64_t N, int64_t K) {\n    if (!calls++) "
                               "spin(0.4);\n" + rows("0", "M") + "}\n",
}


@pytest.mark.parametrize("name", list(UNTIMED))
def test_work_at_load_or_in_the_first_call_is_measured_against_the_baselines_and_never_taught(bench, name):
    compiled = bench.compile_kernel("matmul", UNTIMED[name], strategy=f"untimed: {name}", flags=["-O2"])
    assert compiled.ok, compiled.log
    assert bench.run_tests(compiled.kernel_id).passed
    report = bench.profile_kernel(compiled.kernel_id)
    assert report.failure is None, report
    said = "loading the kernel's library" if name == "spins_at_load" else "first (untimed) call"
    assert report.suspect and any(said in r for r in report.suspect_reasons), report.suspect_reasons
    assert not bench.store.attempt(compiled.kernel_id).teaches
