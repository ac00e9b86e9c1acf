"""The contract's plausibility checks of a result timed on a GPU: against the device's own roof, measured in the
same profile by the trusted baseline's worker (targets/gpu_profile_harness.py: the best of several copy and
float32-matmul probes), and the clocks NVML read around the measurement.

A kernel reported past the roof did not do the work it claims (results computed outside the timed call, reduced
precision where float32 is the contract: TF32's tensor cores run ~7x the float32 rate on an H200), so it is
suspect, never taught. The margin allows for the probes not being the device's best (cuBLAS is not always at the
float32 peak; a copy reads and writes, a reduction mostly reads).
"""

from __future__ import annotations

from typing import Any

ROOF_MARGIN = 1.25


def gpu_suspect_reasons(result: dict[str, Any], flops: int, nbytes: int, median_s: float) -> list[str]:
    roof = result.get("gpu_roof")
    if not isinstance(roof, dict) or median_s <= 0:
        return []
    reasons = []
    peak = roof.get("fp32_gflops")
    if flops and isinstance(peak, int | float) and peak > 0 and flops / median_s / 1e9 > ROOF_MARGIN * peak:
        reasons.append(f"{flops / median_s / 1e9:,.0f} GFLOP/s is above this GPU's float32 matmul rate "
                       f"(~{peak:,.0f} GFLOP/s measured in this profile, TF32 off): the task's contract is float32")
    bandwidth, l2 = roof.get("bandwidth_gbps"), roof.get("l2_bytes")
    if nbytes and isinstance(bandwidth, int | float) and bandwidth > 0 and isinstance(l2, int) and nbytes > 2 * l2 \
            and nbytes / median_s / 1e9 > ROOF_MARGIN * bandwidth:
        reasons.append(f"{nbytes / median_s / 1e9:,.0f} GB/s is above what this GPU copies (~{bandwidth:,.0f} GB/s "
                       "measured in this profile) for a working set far larger than its L2")
    return reasons


def gpu_clock_warnings(result: dict[str, Any]) -> list[str]:
    """What NVML saw around the measurement: a slowdown in force, or an SM clock well below its maximum."""
    clocks = result.get("gpu_clocks")
    if not isinstance(clocks, dict):
        return []
    warnings = []
    for when in ("before", "after"):
        reading = clocks.get(when)
        if not isinstance(reading, dict) or "unavailable" in reading:
            continue
        slowdowns = reading.get("slowdowns") or []
        if slowdowns:
            warnings.append(f"the GPU was slowed down {when} the measurement ({', '.join(map(str, slowdowns))}); "
                            "candidate and baseline were interleaved, so their ratio holds, absolute times less so")
        sm, top = reading.get("sm_mhz"), reading.get("max_sm_mhz")
        if isinstance(sm, int) and isinstance(top, int) and top and sm < 0.7 * top and when == "after":
            warnings.append(f"the SM clock was {sm} MHz after the measurement (max {top} MHz)")
    return warnings
