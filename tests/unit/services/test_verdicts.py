"""The integrity signals of a measurement: the memory roofline, calibrated per working-set size on this machine,
bounds what an honest kernel can report; CPU outside the timed calls is measured against the baseline's."""

import pytest

from kope_mcp import hardware
from kope_mcp.hardware import detect_hardware, streaming_bandwidth_gbps
from kope_mcp.services.verdicts import (
    ROOFLINE_MARGIN,
    profile_warnings,
    same_source_as_baseline,
    suspect_reasons,
    untimed_work_reasons,
)

MEASURED = (2.0, 2.5)  # a speedup CI clear of 1: only the roofline can make these results suspect
BIG = 1 << 30  # bytes: far beyond any last-level cache


@pytest.fixture(scope="module")
def cpu():
    return detect_hardware()


def test_a_kernel_streaming_as_fast_as_this_machine_reads_memory_is_not_suspect(cpu):
    # A read-only reduction reaches more than a copy's counted bytes suggest (write-allocate traffic is not
    # counted in a copy): an honest sum at full read speed was flagged when the bound was the copy alone.
    median = BIG / (streaming_bandwidth_gbps() * 1e9)
    assert suspect_reasons(MEASURED, 0, BIG, median, 1, cpu) == []
    assert not any("roofline" in w for w in profile_warnings(0.01, 0.01, 2.2, MEASURED, BIG, median, 1, cpu))


def test_a_kernel_reporting_several_times_the_memory_bandwidth_is_suspect(cpu):
    median = BIG / (streaming_bandwidth_gbps() * 1e9 * ROOFLINE_MARGIN * 4)
    reasons = suspect_reasons(MEASURED, 0, BIG, median, 1, cpu)
    assert len(reasons) == 1 and "GB/s is above what this machine streams over a working set of 1024 MiB" in reasons[0]
    assert any("faster than the memory roofline" in w
               for w in profile_warnings(0.01, 0.01, 2.2, MEASURED, BIG, median, 1, cpu))


def test_a_bandwidth_probed_on_a_busy_machine_is_probed_again_before_an_honest_kernel_is_called_suspect(
        cpu, monkeypatch):
    honest = streaming_bandwidth_gbps()
    # As if the first probe had shared the memory bus with a build: it read a tenth of the real bandwidth.
    monkeypatch.setattr(hardware, "_bandwidth_best_gbps", honest / 10)
    median = BIG / (honest * 1e9)
    assert suspect_reasons(MEASURED, 0, BIG, median, 1, cpu) == []
    assert streaming_bandwidth_gbps() > honest / 2


@pytest.mark.parametrize("footprint", [8 << 20, 24 << 20])
def test_a_working_set_in_cache_is_bounded_by_what_this_machine_streams_at_that_size(cpu, footprint):
    # Calibrated, not derived from the cache's size: the roof applies on a machine whose last-level cache
    # (480 MiB reported on one) is larger than any profiling size.
    at_size = streaming_bandwidth_gbps(footprint=footprint)
    assert at_size >= streaming_bandwidth_gbps() * 0.5  # a cached footprint streams about as fast as memory or more
    honest = footprint / (at_size * 1e9)
    assert suspect_reasons(MEASURED, 0, footprint, honest, 1, cpu) == []
    forged = footprint / (at_size * 1e9 * ROOFLINE_MARGIN * 4)
    reasons = suspect_reasons(MEASURED, 0, footprint, forged, 1, cpu)
    assert len(reasons) == 1 and f"working set of {footprint >> 20} MiB" in reasons[0], reasons


def test_a_working_set_below_the_smallest_probe_is_not_bounded(cpu):
    assert suspect_reasons(MEASURED, 0, hardware.ROOF_MIN_BYTES - 1, 1e-9, 1, cpu) == []


def test_each_working_set_is_bounded_by_the_largest_probe_not_above_it():
    assert hardware.probe_bytes(5 << 20) == 4 << 20
    assert hardware.probe_bytes(24 << 20) == 16 << 20
    assert hardware.probe_bytes(1 << 30) == hardware.MEMORY_PROBE_BYTES
    assert hardware.probe_bytes(None) == hardware.MEMORY_PROBE_BYTES


def test_the_stream_bound_is_kept_per_machine_and_never_lowered_by_a_busy_probe(tmp_path, monkeypatch):
    import json

    bounds = tmp_path / "bounds.json"
    monkeypatch.setattr(hardware, "_bandwidth_best_gbps", 0.0)
    monkeypatch.setattr(hardware, "_bandwidth_file", None)
    key = hardware.detect_hardware().key
    bounds.write_text(json.dumps({key: {"stream_gbps": 9999.0}}))  # measured earlier, on a quiet machine
    hardware.keep_bounds_in(bounds)
    assert hardware.streaming_bandwidth_gbps() == 9999.0
    assert hardware.streaming_bandwidth_gbps(again=True) == 9999.0  # a slower probe does not lower it
    assert json.loads(bounds.read_text())[key]["stream_gbps"] == 9999.0
    bounds.write_text(json.dumps({key: {"stream_gbps": 0.001}}))  # a bound below what this machine streams
    monkeypatch.setattr(hardware, "_bandwidth_best_gbps", 0.0)
    hardware.keep_bounds_in(bounds)
    measured = hardware.streaming_bandwidth_gbps(again=True)
    assert measured > 0.001 and json.loads(bounds.read_text())[key]["stream_gbps"] == round(measured, 3)
    # Each footprint's bound is kept beside the memory's, under its size in bytes.
    monkeypatch.setattr(hardware, "_bandwidth_by_size", {})
    cached = hardware.streaming_bandwidth_gbps(footprint=8 << 20)
    assert json.loads(bounds.read_text())[key]["stream_gbps_by_bytes"][str(8 << 20)] == round(cached, 3)
    assert json.loads(bounds.read_text())[key]["stream_gbps"] == round(measured, 3)


def test_the_baselines_source_with_other_trailing_space_and_only_default_flags_is_the_baselines_code():
    baseline = "void kernel(const float *x, float *y, long n) {\n  for (long i = 0; i < n; i++) y[i] = x[i];\n}\n"
    spaced = baseline.replace(") {\n", ") {   \n\n") + "\n\n"
    defaults = ["-std=gnu17", "-O2", "-Wall"]
    assert same_source_as_baseline(spaced, defaults, baseline, defaults)
    python = "def kernel(x, out):\n    for i in range(len(x)):\n        out[i] = x[i]\n    out[0] += 1\n"
    in_the_loop = python.replace("    out[0] += 1", "        out[0] += 1")  # indentation is code: not the same
    assert not same_source_as_baseline(in_the_loop, [], python, [])
    assert same_source_as_baseline(baseline, [], baseline, defaults)
    assert not same_source_as_baseline(baseline, [*defaults, "-O3"], baseline, defaults)  # flags can be a real win
    assert not same_source_as_baseline(baseline.replace("x[i]", "2 * x[i]"), defaults, baseline, defaults)
    assert not same_source_as_baseline(baseline, defaults, None, defaults)  # no baseline of its own: the reference


def untimed_result(load: float, warmup: float, base_load: float = 0.002, base_warmup: float = 0.025,
                   calls: int = 41, cpu: float = 0.048) -> dict[str, object]:
    return {"untimed_cpu_seconds": load + warmup, "warmup_cpu_seconds": warmup,
            "baseline_untimed_cpu_seconds": base_load + base_warmup, "baseline_warmup_cpu_seconds": base_warmup,
            "candidate_calls": calls, "cpu_seconds": cpu}


def test_loading_and_a_first_call_like_the_baselines_and_its_own_calls_are_not_flagged():
    assert untimed_work_reasons(untimed_result(load=0.003, warmup=0.004), median_call_s=0.0012, threads=1) == []


def test_loading_far_past_the_baselines_loading_in_the_same_run_is_flagged():
    reasons = untimed_work_reasons(untimed_result(load=0.3, warmup=0.002), median_call_s=0.0012, threads=1)
    assert len(reasons) == 1 and "loading the kernel's library used 0.300 s" in reasons[0]
    assert "0.002 s" in reasons[0]


def test_a_slow_baseline_load_on_a_busy_machine_widens_the_candidates_allowance():
    result = untimed_result(load=0.3, warmup=0.002, base_load=0.2)
    assert untimed_work_reasons(result, median_call_s=0.0012, threads=1) == []


def test_a_first_call_far_slower_than_the_typical_call_is_flagged_with_the_ratio():
    reasons = untimed_work_reasons(untimed_result(load=0.001, warmup=0.4), median_call_s=0.0012, threads=1)
    assert len(reasons) == 1 and "first (untimed) call used 0.400 s" in reasons[0] and "333x" in reasons[0]


def test_the_first_call_of_a_threaded_kernel_is_compared_with_its_cpu_per_call_not_its_wall_time():
    # Four threads: 4.8 ms of CPU per 1.2 ms call, so a 60 ms first call is within five calls plus the floor.
    result = untimed_result(load=0.001, warmup=0.06, calls=41, cpu=0.192)
    assert untimed_work_reasons(result, median_call_s=0.0012, threads=4) == []
    assert untimed_work_reasons(result, median_call_s=0.0012, threads=1) == []  # measured CPU per call decides


def test_without_the_baselines_figures_the_fixed_allowance_applies_to_the_sum():
    assert untimed_work_reasons({"untimed_cpu_seconds": 0.1}, median_call_s=0.001, threads=1) == []
    reasons = untimed_work_reasons({"untimed_cpu_seconds": 0.5}, median_call_s=0.001, threads=1)
    assert len(reasons) == 1 and "outside its timed calls" in reasons[0]
