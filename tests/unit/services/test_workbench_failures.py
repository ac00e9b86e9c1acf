"""Every way a kernel can go wrong comes back as a classified result, and the workbench keeps working."""

import os
import subprocess

import pytest

from kope_mcp.errors import (
    FailedTestsError,
    NotTestedError,
    RefusedFlagError,
    SourceTooLargeError,
    TaskMismatchError,
    UnknownKernelError,
    UnknownSessionError,
    UnknownTaskError,
)
from kope_mcp.runtime.sandbox import capabilities
from tests.conftest import VECTOR_ADD_OK, vector_add_with_body


def compile_and_test(workbench, source, flags=None):
    compiled = workbench.compile_kernel("vector_add", source, flags=flags)
    assert compiled.ok, compiled.log
    return workbench.run_tests(compiled.kernel_id)


def test_a_correct_kernel_passes_every_case_with_two_seeds(workbench):
    report = compile_and_test(workbench, VECTOR_ADD_OK)
    assert report.passed and report.failure is None
    assert report.seeds_per_case == 2
    assert all(c.passed and c.max_abs_error == 0.0 for c in report.cases)


def test_a_missing_tail_leaves_poison_and_is_a_mismatch_with_the_first_bad_index(workbench):
    body = "for (int64_t i = 0; i + 8 <= n; i += 8) for (int k = 0; k < 8; k++) out[i+k] = a[i+k] + b[i+k];"
    report = compile_and_test(workbench, vector_add_with_body(body))
    assert not report.passed and report.failure == "mismatch"
    seven = next(c for c in report.cases if c.name == "seven")
    assert seven.unwritten == 7 and seven.first_bad_index == 0 and seven.got is None
    prime = next(c for c in report.cases if c.name == "prime_1009")
    assert prime.unwritten == 1009 % 8 and prime.first_bad_index == 1008
    assert "never written" in report.message


def test_a_kernel_that_writes_nothing_fails(workbench):
    report = compile_and_test(workbench, vector_add_with_body("(void)a; (void)b; (void)out; (void)n;"))
    assert report.failure == "mismatch"
    assert all(c.unwritten == c.sizes["n"] for c in report.cases)


def test_a_slightly_wrong_value_reports_errors_and_location(workbench):
    report = compile_and_test(workbench, vector_add_with_body(
        "for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i] + (i == n - 1 ? 0.01f : 0.0f);"))
    assert report.failure == "mismatch"
    case = next(c for c in report.cases if c.name == "vector_tail_4099")
    assert case.mismatches == 1 and case.first_bad_index == 4098
    assert case.max_abs_error == pytest.approx(0.01, rel=1e-3)


def test_nan_outputs_are_classified_as_nan(workbench):
    report = compile_and_test(workbench, vector_add_with_body(
        "for (int64_t i = 0; i < n; i++) out[i] = sqrtf(-1.0f - a[i] * a[i]);"))
    assert report.failure == "nan"


def test_writing_into_an_input_is_detected(workbench):
    report = compile_and_test(workbench, vector_add_with_body(
        "float *w = (float *)a; for (int64_t i = 0; i < n; i++) { out[i] = a[i] + b[i]; w[i] = 0.0f; }"))
    assert report.failure == "input_modified"
    assert report.cases[0].inputs_modified == ["a"]


def test_a_write_one_past_the_end_is_an_out_of_bounds_write(workbench):
    report = compile_and_test(workbench, vector_add_with_body(
        "for (int64_t i = 0; i <= n; i++) out[i] = a[i] + b[i];"))
    assert report.failure == "out_of_bounds_write"
    assert report.cases[0].out_of_bounds == ["out after its end (+1 elements)"]
    assert "wrote outside its buffers" in report.message


def test_a_write_before_the_start_of_an_output_is_an_out_of_bounds_write(workbench):
    report = compile_and_test(workbench, vector_add_with_body(
        "out[-2] = 0.0f; for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];"))
    assert report.failure == "out_of_bounds_write"
    assert report.cases[0].out_of_bounds == ["out before its start (-2 elements)"]


def test_a_segfault_is_a_crash_naming_the_case(workbench):
    report = compile_and_test(workbench, vector_add_with_body(
        "if (n > 1000) { volatile float *p = (float *)0; p[0] = 1.0f; }"
        "for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];"))
    assert report.failure == "crash"
    assert "SIGSEGV" in report.message and "prime_1009" in report.message


@pytest.mark.slow
def test_an_infinite_loop_is_a_timeout(workbench):
    report = compile_and_test(workbench, vector_add_with_body("volatile int x = 1; while (x) {}"))
    assert report.failure == "timeout"
    assert "wall-clock limit" in report.message


def test_exit_inside_the_kernel_is_a_crash(workbench):
    report = compile_and_test(workbench, vector_add_with_body("exit(0);"))
    assert report.failure == "crash"
    assert "instead of returning" in report.message


def test_a_fork_is_a_crash_and_leaves_no_process_behind(workbench):
    # The child names itself, so only this run's leftovers count (not another test run's harnesses).
    marker = f"kfork{os.getpid() % 10**9}"
    report = compile_and_test(workbench, vector_add_with_body(
        f'if (fork() == 0) {{ prctl(PR_SET_NAME, "{marker}"); for (;;) pause(); }} '
        "for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];",
        prelude="#include <sys/prctl.h>"))
    assert report.failure == "crash"
    assert "child process" in report.message
    leftovers = subprocess.run(["pgrep", "-x", marker], capture_output=True, text=True).stdout.split()
    assert leftovers == []


def test_a_50_gb_malloc_is_a_classified_failure(workbench):
    report = compile_and_test(workbench, vector_add_with_body(
        "float *p = malloc((size_t)50 << 30); p[(size_t)1 << 30] = 1.0f;"
        "for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i] + p[0];"))
    assert report.failure == "crash"


@pytest.mark.slow
def test_an_output_flood_is_stopped(workbench):
    report = compile_and_test(workbench, vector_add_with_body(
        "for (;;) fwrite(a, 1, 1 << 20, stdout);"))
    assert report.failure in ("crash", "timeout")


@pytest.mark.skipif(not capabilities().isolated, reason="needs the sandbox")
def test_kernels_have_no_network(workbench):
    prelude = "#include <sys/socket.h>\n#include <netinet/in.h>\n#include <arpa/inet.h>\n"
    body = """
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET; addr.sin_port = htons(53); addr.sin_addr.s_addr = inet_addr("8.8.8.8");
    int connected = s >= 0 && connect(s, (struct sockaddr *)&addr, sizeof addr) == 0;
    /* Correct output only when the connection attempt failed. */
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i] + (connected ? 1.0f : 0.0f);
    """
    assert compile_and_test(workbench, vector_add_with_body(body, prelude)).passed


@pytest.mark.skipif(not capabilities().isolated, reason="needs the sandbox")
def test_kernels_cannot_write_the_servers_files(workbench):
    target = workbench.settings.home / "owned-by-kernel"
    body = f"""
    FILE *f = fopen("{target}", "w");
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i] + (f ? 1.0f : 0.0f);
    """
    assert compile_and_test(workbench, vector_add_with_body(body)).passed
    assert not target.exists()


def test_the_workbench_still_works_after_every_failure(workbench):
    assert compile_and_test(workbench, VECTOR_ADD_OK).passed


def test_unknown_task_lists_the_valid_ids(workbench):
    with pytest.raises(UnknownTaskError) as info:
        workbench.compile_kernel("nope", VECTOR_ADD_OK)
    assert str(info.value).startswith("unknown_task:") and "vector_add" in str(info.value)


def test_unknown_kernel_and_session_ids_are_refused(workbench):
    with pytest.raises(UnknownKernelError):
        workbench.run_tests("k-000000000000")
    with pytest.raises(UnknownSessionError):
        workbench.compile_kernel("vector_add", VECTOR_ADD_OK, session_id="s-nope")


def test_a_session_belongs_to_one_task(workbench):
    first = workbench.compile_kernel("vector_add", VECTOR_ADD_OK)
    with pytest.raises(TaskMismatchError):
        workbench.compile_kernel("relu", VECTOR_ADD_OK, session_id=first.session_id)


def test_oversize_source_is_refused_with_the_limit(workbench):
    with pytest.raises(SourceTooLargeError, match="262,144"):
        workbench.compile_kernel("vector_add", VECTOR_ADD_OK + "//" + "x" * (256 * 1024))


def test_refused_flags_never_reach_the_compiler(workbench):
    with pytest.raises(RefusedFlagError):
        workbench.compile_kernel("vector_add", VECTOR_ADD_OK, flags=["-fplugin=/tmp/x.so"])


def test_profile_refuses_untested_and_failing_kernels(workbench):
    untested = workbench.compile_kernel("vector_add", VECTOR_ADD_OK + "\n// untested\n")
    with pytest.raises(NotTestedError, match="run_tests"):
        workbench.profile_kernel(untested.kernel_id)
    failing = workbench.compile_kernel("vector_add", vector_add_with_body("(void)a; (void)b; (void)out; (void)n;"))
    workbench.run_tests(failing.kernel_id)
    with pytest.raises(FailedTestsError):
        workbench.profile_kernel(failing.kernel_id)


def test_a_compile_error_is_a_normal_result_and_tests_report_not_compiled(workbench):
    compiled = workbench.compile_kernel("vector_add", "void kernel(")
    assert not compiled.ok and compiled.diagnostics
    report = workbench.run_tests(compiled.kernel_id)
    assert report.failure == "not_compiled"
