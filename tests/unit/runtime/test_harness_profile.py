"""The C target's side of the measurement protocol (kope_mcp/runtime/harness_profile.py), through a real profile."""

from __future__ import annotations

from pathlib import Path

from kope_mcp.runtime.harness import POISON_BITS
from kope_mcp.services.workbench import Workbench
from tests.conftest import VECTOR_ADD_OK, make_settings, vector_add_with_baseline

# A baseline that refuses to run on an output buffer nobody poisoned: the bits the coordinator writes into the
# candidate's buffers before every batch must be in the baseline's too, or the two start each call from different
# cache states (vector_add, identical code: 2-3% in the candidate's favour).
BASELINE_THAT_CHECKS = f"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
void kernel(const float *a, const float *b, float *out, int64_t n) {{
    uint32_t bits;
    memcpy(&bits, out, sizeof bits);
    if (bits != {POISON_BITS:#x}u) abort();
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}}
"""


def test_the_baselines_output_buffers_are_poisoned_before_every_timed_call_like_the_candidates(tmp_path: Path):
    bench = Workbench(make_settings(tmp_path / "home"),
                      vector_add_with_baseline(tmp_path, "vector_add_checked", BASELINE_THAT_CHECKS))
    try:
        compiled = bench.compile_kernel("vector_add_checked", VECTOR_ADD_OK, strategy="same as the baseline")
        assert compiled.ok, compiled.log
        assert bench.run_tests(compiled.kernel_id).passed
        profiled = bench.profile_kernel(compiled.kernel_id)
        assert profiled.failure is None, profiled
        assert profiled.speedup_vs_baseline is not None
    finally:
        bench.store.close()
