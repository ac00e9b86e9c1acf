"""The integrity signals of a measurement: the memory roofline bounds what an honest kernel can report."""

import pytest

from kope_mcp import hardware
from kope_mcp.hardware import detect_hardware, streaming_bandwidth_gbps
from kope_mcp.services.verdicts import ROOFLINE_MARGIN, profile_warnings, same_source_as_baseline, suspect_reasons

MEASURED = (2.0, 2.5)  # a speedup CI clear of 1: only the roofline can make these results suspect
BIG = 1 << 30  # bytes: far beyond any last-level cache


@pytest.fixture(scope="module")
def cpu():
    profile = detect_hardware()
    if not hardware.last_level_cache_bytes(profile):
        pytest.skip("this machine reports no cache sizes: the memory roofline does not apply")
    return profile


def test_a_kernel_streaming_as_fast_as_this_machine_reads_memory_is_not_suspect(cpu):
    # A read-only reduction reaches more than a copy's counted bytes suggest (write-allocate traffic is not
    # counted in a copy): an honest sum at full read speed was flagged when the bound was the copy alone.
    median = BIG / (streaming_bandwidth_gbps() * 1e9)
    assert suspect_reasons(MEASURED, 0, BIG, median, 1, cpu) == []
    assert not any("roofline" in w for w in profile_warnings(0.01, 0.01, 2.2, MEASURED, BIG, median, 1, cpu))


def test_a_kernel_reporting_several_times_the_memory_bandwidth_is_suspect(cpu):
    median = BIG / (streaming_bandwidth_gbps() * 1e9 * ROOFLINE_MARGIN * 4)
    reasons = suspect_reasons(MEASURED, 0, BIG, median, 1, cpu)
    assert len(reasons) == 1 and "GB/s is above what this machine streams from memory" in reasons[0]
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


def test_a_working_set_that_fits_in_cache_is_never_bounded_by_memory_bandwidth(cpu):
    small = hardware.last_level_cache_bytes(cpu)
    assert suspect_reasons(MEASURED, 0, small, 1e-9, 1, cpu) == []


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
