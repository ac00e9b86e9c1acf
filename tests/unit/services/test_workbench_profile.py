"""profile_kernel's report: what was measured, on what, and under which conditions."""

import threading

import pytest

from kope_mcp.hardware import detect_hardware
from tests.conftest import VECTOR_ADD_OK

OPENMP_VECTOR_ADD = """#include <stdint.h>
void kernel(const float *a, const float *b, float *out, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
"""


def test_a_single_threaded_kernel_is_pinned_and_measured_against_baseline_and_reference(workbench):
    task = workbench.tasks.get("relu")
    compiled = workbench.compile_kernel("relu", task.baseline_source)
    assert workbench.run_tests(compiled.kernel_id).passed
    report = workbench.profile_kernel(compiled.kernel_id)
    assert report.threads == 1 and report.pinned_cpu is not None
    assert report.case.sizes == task.spec.profile.sizes
    for stats in (report.kernel, report.baseline, report.reference):
        assert stats is not None and stats.n >= 7 and stats.ci95_low_s <= stats.median_s <= stats.ci95_high_s
    assert report.gbytes_per_s is not None and report.gbytes_per_s > 0
    assert report.hardware.key == detect_hardware().key
    assert workbench.store.attempt(compiled.kernel_id).median_s == report.kernel.median_s


def test_without_timing_the_reference_only_kernel_and_baseline_are_measured(workbench):
    task = workbench.tasks.get("relu")
    compiled = workbench.compile_kernel("relu", task.baseline_source, flags=["-O3"])
    assert workbench.run_tests(compiled.kernel_id).passed
    report = workbench.profile_kernel(compiled.kernel_id, time_reference=False)
    assert report.reference is None and report.speedup_vs_reference is None
    assert report.kernel.n >= 7 and report.baseline.n >= 7 and report.speedup_vs_baseline > 0


@pytest.mark.slow
def test_an_openmp_kernel_runs_on_every_core_and_the_report_says_so(workbench):
    compiled = workbench.compile_kernel("vector_add", OPENMP_VECTOR_ADD, flags=["-O2", "-fopenmp"])
    assert compiled.ok, compiled.log
    assert workbench.run_tests(compiled.kernel_id).passed
    report = workbench.profile_kernel(compiled.kernel_id)
    # Unpinned, and `threads` is what its timed calls kept busy: every core on a quiet machine, fewer when other
    # work shares them (measured, not the team size it declared).
    assert report.pinned_cpu is None and 1 <= report.threads <= detect_hardware().cores
    assert not report.suspect_reasons or not any("given one" in r for r in report.suspect_reasons)
    if report.threads > 1:
        assert any(f"kept {report.threads} CPUs busy" in w for w in report.warnings)


def _tested_kernel_whose_draws_are_watched(workbench, monkeypatch, strategy: str) -> tuple[str, threading.Event]:
    """A tested vector_add kernel, and an event set when a profile draws its input pool."""
    from kope_mcp.services import workbench as workbench_module

    compiled = workbench.compile_kernel("vector_add", VECTOR_ADD_OK, strategy=strategy)
    assert workbench.run_tests(compiled.kernel_id).passed
    drawn = threading.Event()
    real_draw = workbench_module.draw_profile_inputs

    def draw(*args: object) -> object:
        drawn.set()
        return real_draw(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(workbench_module, "draw_profile_inputs", draw)
    return compiled.kernel_id, drawn


def test_a_queued_profile_draws_its_inputs_only_once_it_holds_the_device(workbench, monkeypatch):
    kernel_id, drawn = _tested_kernel_whose_draws_are_watched(workbench, monkeypatch, "plain loop")
    reports: list[object] = []
    with workbench.measure_slot("c").hold("another client"):
        waiting = threading.Thread(target=lambda: reports.append(
            workbench.profile_kernel(kernel_id, time_reference=False)))
        waiting.start()
        # Queued behind the other client: it holds no input pool (a pool is 0.6-1.2 GB for vector_add).
        assert not drawn.wait(timeout=1.5)
    waiting.join(timeout=300)
    assert drawn.is_set() and len(reports) == 1


def test_a_profile_waits_for_a_pool_turn_when_other_devices_profiles_hold_them(workbench, monkeypatch):
    from kope_mcp.services.turns import Turns

    kernel_id, drawn = _tested_kernel_whose_draws_are_watched(workbench, monkeypatch, "plain loop, pool turn")
    monkeypatch.setattr(workbench, "profile_pools", Turns(1, "the wait to draw a profile's inputs"))
    said: list[str] = []
    reports: list[object] = []
    with workbench.profile_pools.turn():  # another device's profile holds the one pool allowed
        waiting = threading.Thread(target=lambda: reports.append(workbench.profile_kernel(
            kernel_id, time_reference=False, progress=lambda p, t, m: said.append(m or ""))))
        waiting.start()
        # It holds its own device's slot, but draws nothing until a pool turn is free.
        assert not drawn.wait(timeout=1.5)
        assert any("waiting for a turn to draw" in m for m in said)
    waiting.join(timeout=300)
    assert drawn.is_set() and len(reports) == 1 and workbench.profile_pools.taken == 0
