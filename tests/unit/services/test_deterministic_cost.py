import shutil

import pytest

from kope_mcp.hardware import detect_hardware
from kope_mcp.targets.cost import parse_summary

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")


@pytest.mark.slow
def test_instruction_counts_repeat_exactly_and_compare_with_the_baseline(workbench):
    task = workbench.tasks.get("vector_add")
    compiled = workbench.compile_kernel("vector_add", task.baseline_source, flags=["-O3"])
    assert workbench.run_tests(compiled.kernel_id).passed
    first = workbench.profile_kernel(compiled.kernel_id, deterministic=True).deterministic
    second = workbench.profile_kernel(compiled.kernel_id, deterministic=True).deterministic
    assert first is not None and second is not None
    assert first.instructions == second.instructions > 0
    assert first.l1_data_misses == second.l1_data_misses
    # Vectorised at -O3 it runs fewer instructions than the -O2 scalar baseline.
    assert first.baseline_instructions is not None and first.instructions < first.baseline_instructions


SUMMARY = """==7== Callgrind, a call-graph generating cache profiler
==7== Command: ./driver
==7==
==7== Events    : Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
==7== Collected : 100 40 20 1 5 6 1 2
==7==
==7== I   refs:      100
"""


def test_the_summary_is_parsed_by_event_name_with_trailing_zeros_left_out():
    counts = parse_summary(SUMMARY)
    assert not isinstance(counts, str), counts
    assert (counts.instructions, counts.data_reads, counts.data_writes) == (100, 40, 20)
    assert counts.l1_data_misses == 11 and counts.last_level_misses == 2


@pytest.mark.parametrize("tampered", [
    SUMMARY + "==7== Collected : 42\n",  # a second summary, valgrind's pid and all
    SUMMARY.replace("==7== Collected", "junk==7== Collected"),  # valgrind's line glued to a kernel's partial one
    SUMMARY.replace("==7== Callgrind", "==8== Callgrind"),  # a summary under another pid than the header's
    "==7== Collected : 42\n" + SUMMARY,  # anything before valgrind's header
])
def test_a_log_with_text_that_is_not_valgrinds_gives_no_counts(tampered):
    assert isinstance(parse_summary(tampered), str)


@pytest.mark.skipif("avx512f" not in detect_hardware().isa, reason="needs an AVX-512 CPU")
def test_an_instruction_valgrind_cannot_run_gives_a_warning_with_the_fix(workbench):
    task = workbench.tasks.get("relu")
    compiled = workbench.compile_kernel("relu", task.baseline_source, flags=["-O3", "-march=native", "-mavx512f"])
    assert workbench.run_tests(compiled.kernel_id).passed
    report = workbench.profile_kernel(compiled.kernel_id, deterministic=True)
    # Either valgrind runs AVX-512 and counts, or (valgrind <= 3.21) the warning says how to get counts.
    if report.deterministic is not None:
        assert report.deterministic.instructions > 0
    else:
        assert any("-mno-avx512f" in w for w in report.warnings)
