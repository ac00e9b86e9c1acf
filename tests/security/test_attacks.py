"""Each attack that once worked against kope-mcp, reproduced: the test fails if the attack succeeds.

Run as root and as an ordinary user (CI does both); see conftest.py for how an attack kernel reports.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import kope_mcp
from kope_mcp.services.workbench import Workbench
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import VECTOR_ADD_OK, make_settings
from tests.security.conftest import TOKEN, attack_kernel


def compile_and_test(workbench: Workbench, source: str):
    compiled = workbench.compile_kernel("vector_add", source)
    assert compiled.ok, compiled.log
    return compiled.kernel_id, workbench.run_tests(compiled.kernel_id)


def c_string(path: Path | str) -> str:
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_a_constructor_reads_nothing_of_the_server_or_its_user(workbench, home, user_secret):
    other_source = next((home / "builds").glob("*/kernel.c"), None)
    if other_source is None:
        workbench.compile_kernel("vector_add", VECTOR_ADD_OK + "\n// another session's kernel\n")
        other_source = next((home / "builds").glob("*/kernel.c"))
    targets = [home / "daemon" / "state.json", home / "memory.kuzu", other_source, user_secret, "/etc/shadow"]
    ctor = "\n".join(f"    if (readable({c_string(t)})) pwned = 1000.0f;" for t in targets)
    ctor += f"\n    if (opendir({c_string(home)}) != NULL) pwned = 1000.0f;"
    _, report = compile_and_test(workbench, attack_kernel(ctor=ctor))
    assert report.passed, report.message


def test_an_ifunc_resolver_runs_without_the_servers_rights(workbench, home):
    planted = home / "written-by-ifunc-resolver"
    extra = f"""
static void helper_impl(void) {{}}
static void (*resolve_helper(void))(void) {{
    if (writable({c_string(planted)})) pwned = 1000.0f;
    if (getuid() == 0 || geteuid() == 0) pwned = 1000.0f;
    return helper_impl;
}}
void helper(void) __attribute__((ifunc("resolve_helper")));
"""
    _, report = compile_and_test(workbench, attack_kernel(body="    helper();", extra=extra))
    assert report.passed, report.message
    assert not planted.exists()


def test_kernel_code_runs_with_no_capability_and_not_as_the_server(workbench):
    body = f"""
    FILE *f = fopen("/proc/self/status", "r"); char line[256];
    while (f && fgets(line, sizeof line, f)) {{
        unsigned long long v;
        if ((sscanf(line, "CapEff: %llx", &v) == 1 || sscanf(line, "CapPrm: %llx", &v) == 1 ||
             sscanf(line, "CapBnd: %llx", &v) == 1 || sscanf(line, "CapAmb: %llx", &v) == 1) && v != 0)
            pwned = 1000.0f;
        int nnp;
        if (sscanf(line, "NoNewPrivs: %d", &nnp) == 1 && nnp != 1) pwned = 1000.0f;
    }}
    if (f) fclose(f);
    if ({os.geteuid()} == 0 && (getuid() == 0 || geteuid() == 0)) pwned = 1000.0f;
"""
    _, report = compile_and_test(workbench, attack_kernel(ctor=body))
    assert report.passed, report.message


def test_nothing_outside_the_run_directory_can_be_written(workbench, home):
    harness = Path(kope_mcp.__file__).resolve().parent / "runtime" / "harness.py"
    escape = Path("/tmp") / f"kope-escape-{os.getpid()}"
    before = hashlib.sha256(harness.read_bytes()).hexdigest()
    targets = [home / "pwned", home / "builds" / "pwned", harness, harness.parent / "pwned.py", "/usr/pwned",
               Path(sys.executable).resolve().parent / "pwned"]
    body = "\n".join(f"    if (writable({c_string(t)})) pwned = 1000.0f;" for t in targets)
    body += f"\n    writable({c_string(escape)});"  # the sandbox's private /tmp: allowed, and gone afterwards
    _, report = compile_and_test(workbench, attack_kernel(ctor=body))
    assert report.passed, report.message
    assert hashlib.sha256(harness.read_bytes()).hexdigest() == before
    assert not escape.exists() and not (home / "pwned").exists()


def test_the_compiler_cannot_include_secrets(workbench, home, user_secret):
    for secret in (home / "daemon" / "state.json", user_secret, Path("/etc/shadow")):
        compiled = workbench.compile_kernel("vector_add", f"#include {c_string(secret)}\n" + VECTOR_ADD_OK)
        assert not compiled.ok
        assert TOKEN not in compiled.log and all(TOKEN not in d.message for d in compiled.diagnostics)
        assert "No such file" in compiled.log


def test_links_planted_in_the_run_directory_are_never_followed(workbench, home):
    token = home / "daemon" / "state.json"
    body = f"""
    const char *names[] = {{".stdout", ".stderr", "result.json", "progress.txt", "kernel.so"}};
    for (int k = 0; k < 5; k++) {{ unlink(names[k]); symlink({c_string(token)}, names[k]); }}
    fprintf(stderr, "planted\\n"); fflush(stderr);
    abort();
"""
    _, report = compile_and_test(workbench, attack_kernel(body=body))
    assert report.failure == "crash"
    assert TOKEN not in report.message and "SIGABRT" in report.message


@pytest.mark.slow
def test_a_result_file_written_by_the_kernel_is_ignored(workbench):
    body = r"""
    FILE *f = fopen("result.json", "w");
    if (f) { fputs("{\"samples\": {\"candidate\": [1e-9], \"baseline\": [1.0]}, \"inner\": {\"candidate\": 1, "
                   "\"baseline\": 1}, \"rounds\": 1, \"seconds\": 1}", f); fclose(f); }
"""
    kernel_id, report = compile_and_test(workbench, attack_kernel(body=body))
    assert report.passed, report.message
    profile = workbench.profile_kernel(kernel_id)
    assert profile.failure is None and profile.speedup_vs_baseline is not None
    assert profile.speedup_vs_baseline < 3.0


# Every call closes the harness's batch at once with a well-formed 0 ns claim, and opens one of its own, on the
# timing descriptor the job names.
FAKE_BATCHES = r"""
    static int fd = -1;
    if (fd < 0) {
        char job[65536]; FILE *f = fopen("/kope/in/job.json", "r");
        size_t got = f ? fread(job, 1, sizeof job - 1, f) : 0; job[got] = 0;
        if (f) fclose(f);
        char *at = strstr(job, "\"timing\": ");
        fd = at ? atoi(at + 10) : -2;
    }
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    char fake[128];
    int len = snprintf(fake, sizeof fake, "E candidate 1 %lld %lld\nB candidate\n", now, now);
    if (fd >= 0 && write(fd, fake, (size_t)len) < 0) {}
"""


@pytest.mark.slow
def test_a_kernel_that_slips_fake_batches_into_the_timing_pipe_is_refused(workbench):
    kernel_id, report = compile_and_test(workbench, attack_kernel(body=FAKE_BATCHES))
    assert report.passed, report.message
    profile = workbench.profile_kernel(kernel_id)
    assert profile.failure == "timing_unverified", profile
    assert profile.speedup_vs_baseline is None
    record = workbench.store.attempt(kernel_id)
    assert record.label != "effective" and record.speedup is None


@pytest.mark.slow
def test_a_kernel_wrong_at_the_profiling_size_is_called_wrong_even_when_its_timings_are_forged_too(workbench):
    # The outputs are the coordinator's reading whatever the timing stream says: "wrong" tells the agent what to
    # fix, where "could not be corroborated, profile again" would send it round in circles.
    wrong_when_big = FAKE_BATCHES + "    if (n > 8000000) pwned = 1000.0f;\n"
    kernel_id, report = compile_and_test(workbench, attack_kernel(body=wrong_when_big))
    assert report.passed, report.message
    profile = workbench.profile_kernel(kernel_id)
    assert profile.failure == "wrong_at_profile_size", profile
    assert profile.speedup_vs_baseline is None
    assert workbench.store.attempt(kernel_id).label == "incorrect"


def test_a_forged_trailer_in_the_result_descriptor_is_refused(workbench):
    # A wrong kernel (every output +1000) that writes a result claiming no cases into every file it holds: it
    # must not pass, whether its bytes corrupt the result (refused) or are passed over (its outputs are judged).
    body = r"""
    static int done;
    pwned = 1000.0f;
    if (!done) {
        done = 1;
        const char fake[] = "{\"cases\": []}";
        for (int fd = 3; fd < 64; fd++) {
            struct stat st;
            if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) { if (write(fd, fake, sizeof fake - 1) < 0) {} }
        }
    }
"""
    _, report = compile_and_test(workbench, attack_kernel(body=body))
    assert not report.passed


def test_loopback_and_the_servers_network_namespace_are_unreachable(workbench):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    body = f"""
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {{0}};
    addr.sin_family = AF_INET; addr.sin_port = htons({port}); addr.sin_addr.s_addr = inet_addr("127.0.0.1");
    if (s >= 0 && connect(s, (struct sockaddr *)&addr, sizeof addr) == 0) pwned = 1000.0f;
    int ns = open("/proc/{os.getpid()}/ns/net", O_RDONLY);
    if (ns >= 0 && setns(ns, KOPE_CLONE_NEWNET) == 0) pwned = 1000.0f;
    ns = open("/proc/1/ns/net", O_RDONLY);
    if (ns >= 0 && setns(ns, KOPE_CLONE_NEWNET) == 0) pwned = 1000.0f;
"""
    try:
        _, report = compile_and_test(workbench, attack_kernel(ctor=body))
    finally:
        listener.close()
    assert report.passed, report.message


def test_rlimits_cannot_be_lifted(workbench):
    body = """
    struct rlimit r = {RLIM_INFINITY, RLIM_INFINITY};
    if (setrlimit(RLIMIT_AS, &r) == 0 || setrlimit(RLIMIT_NPROC, &r) == 0 || setrlimit(RLIMIT_CPU, &r) == 0 ||
        setrlimit(RLIMIT_FSIZE, &r) == 0) pwned = 1000.0f;
"""
    _, report = compile_and_test(workbench, attack_kernel(ctor=body))
    assert report.passed, report.message


def test_killing_the_parent_or_everything_reaches_no_process_of_the_host(workbench):
    # A process of the server's own user: kill(-1) from an unsandboxed kernel of a non-root server ended it.
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        for body in ("    kill(getppid(), SIGKILL); kill(getppid(), SIGTERM);", "    kill(-1, SIGKILL);",
                     f"    kill({os.getpid()}, SIGKILL); kill({bystander.pid}, SIGKILL);"):
            compile_and_test(workbench, attack_kernel(body=body))
            assert bystander.poll() is None
        _, report = compile_and_test(workbench, VECTOR_ADD_OK + "\n// after the kill attempts\n")
        assert report.passed
    finally:
        bystander.kill()
        bystander.wait()


def test_no_process_a_kernel_starts_survives_the_call(workbench):
    marker = f"kopesurv{os.getpid() % 100000}"
    body = f"""
    if (fork() == 0) {{
        setsid();
        if (fork() == 0) {{ execl("/bin/sleep", {c_string(marker)}, "30", (char *)0); }}
        _exit(0);
    }}
"""
    _, report = compile_and_test(workbench, attack_kernel(ctor=body))
    assert not report.passed
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert found == []


def test_a_kernel_cannot_see_other_runs_or_swap_another_servers_build(workbench, tmp_path):
    other = Workbench(make_settings(tmp_path / "other-home"), TaskRegistry.default())
    try:
        built = other.compile_kernel("vector_add", VECTOR_ADD_OK + "\n// the other server's kernel\n")
        record = other.store.attempt(built.kernel_id)
        library = other.targets["c"].artifact(record.build_hash)
        digest = hashlib.sha256(library.read_bytes()).hexdigest()
        body = f"""
    if (writable({c_string(library)}) || readable({c_string(library)})) pwned = 1000.0f;
    if (opendir({c_string(library.parent.parent)}) != NULL) pwned = 1000.0f;
    DIR *d = opendir("/tmp"); struct dirent *e;
    while (d && (e = readdir(d)) != NULL) if (strncmp(e->d_name, ".", 1) != 0) pwned = 1000.0f;
"""
        _, report = compile_and_test(workbench, attack_kernel(body=body))
        assert report.passed, report.message
        assert hashlib.sha256(library.read_bytes()).hexdigest() == digest
        assert other.run_tests(built.kernel_id).passed
    finally:
        other.store.close()


@pytest.mark.slow
def test_the_harness_runs_when_kope_mcp_sits_in_a_folder_no_one_else_can_enter(tmp_path):
    # A 0700 home or `mktemp -d`: the sandbox's uid cannot traverse it, so the package is bound read-only.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    shutil.copytree(Path(kope_mcp.__file__).resolve().parent, private / "kope_mcp",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = (
        "import sys, tempfile\n"
        "from pathlib import Path\n"
        "import kope_mcp\n"
        f"assert kope_mcp.__file__.startswith({str(private)!r}), kope_mcp.__file__\n"
        "from kope_mcp.services.workbench import Workbench\n"
        "from kope_mcp.settings import KopeSettings\n"
        f"wb = Workbench(KopeSettings.from_env(home=Path({str(private / 'home')!r}), profile_time_cap_s=0.2, "
        "embeddings=False))\n"
        f"c = wb.compile_kernel('vector_add', {VECTOR_ADD_OK!r})\n"
        "t = wb.run_tests(c.kernel_id)\n"
        "assert t.passed, t.message\n"
        "p = wb.profile_kernel(c.kernel_id)\n"
        "assert p.failure is None, p.message\n"
        "print('ok', p.speedup_vs_baseline)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOPE_")}
    # -S: no site, so the editable install's finder does not shadow the private copy.
    env["PYTHONPATH"] = os.pathsep.join([str(private), sysconfig.get_paths()["purelib"],
                                         sysconfig.get_paths()["platlib"]])
    done = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env, timeout=240,
                          cwd=private)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")


@pytest.mark.slow
def test_a_kernel_cannot_slow_the_baseline_down_with_a_thread_of_its_own(workbench):
    # A thread that burns the (pinned) CPU whenever the kernel itself is not running: in a shared process it made
    # the baseline and the reference run at half speed, a forged 2x. Each implementation now has its own process,
    # and the candidate's is stopped while the others are timed.
    extra = r"""
#include <pthread.h>
static volatile int inside, started;
static void *burn(void *arg) {
    (void)arg;
    for (;;) {
        if (inside) { sched_yield(); continue; }
        volatile double x = 0.0; for (int i = 0; i < 10000; i++) x += i;
    }
    return NULL;
}
"""
    body = """
    if (!started) { started = 1; pthread_t t; pthread_create(&t, NULL, burn, NULL); }
    inside = 1;
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    inside = 0;
    return;
"""
    kernel_id, report = compile_and_test(workbench, attack_kernel(body=body, extra=extra))
    assert report.passed, report.message
    # The forgery was a steady 1.7x; one profile on a busy machine read 1.43x once (as the ordinary user, session
    # 20, not reproduced in 7 runs beside two CPU burners): noise is told from a forgery by measuring again.
    speedups = []
    for _ in range(3):
        profile = workbench.profile_kernel(kernel_id, time_reference=False)
        assert profile.failure is None, profile.message
        assert profile.speedup_vs_baseline is not None
        speedups.append(profile.speedup_vs_baseline)
        if profile.speedup_vs_baseline < 1.3:
            break
    assert min(speedups) < 1.3, speedups
