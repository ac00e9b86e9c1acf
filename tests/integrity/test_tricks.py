"""Kernels that cheat the measurement, each caught or gaining nothing; none becomes a win anyone is taught.

Each trick once passed run_tests and profiled as a win (replay 700-1,300x, partial recomputation ~5x, size
gating ~2.5x, unstable softmax passing, a missing include "crashing" every test).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kope_mcp.experience.service import ExperienceService
from kope_mcp.runtime.sandbox import capabilities
from kope_mcp.services.workbench import Workbench
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import make_settings

pytestmark = pytest.mark.skipif(not capabilities().isolated, reason="kernels run only in the sandbox")

MATMUL_HEAD = "#include <stdint.h>\n#include <string.h>\n#include <stdlib.h>\n"
MATMUL_LOOP = """
    for (int64_t i = ROW0; i < ROW1; i++)
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
"""


def matmul_rows(first: str, last: str) -> str:
    return MATMUL_LOOP.replace("ROW0", first).replace("ROW1", last)


TRICKS = {
    # The previous call's result again when the pointers are the same (or the output looks already written).
    "replay_by_pointer": ("matmul", MATMUL_HEAD + """
static const float *last_a, *last_b; static float *last_c; static size_t last_n;
void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    size_t n = (size_t)(M * N);
    if (A == last_a && B == last_b && last_c != NULL && last_n == n) { memcpy(C, last_c, n * sizeof(float)); return; }
""" + matmul_rows("0", "M") + """
    free(last_c); last_c = malloc(n * sizeof(float)); memcpy(last_c, C, n * sizeof(float));
    last_a = A; last_b = B; last_n = n;
}
"""),
    "skip_when_output_written": ("matmul", MATMUL_HEAD + """
void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    if (C[0] == C[0] && C[M * N - 1] == C[M * N - 1]) return;  /* not NaN: "already computed" */
""" + matmul_rows("0", "M") + "}\n"),
    # A fifth of the rows per call once it has seen the output buffer, trusting the rest is still there.
    "partial_recomputation": ("matmul", MATMUL_HEAD + """
static float *seen; static int64_t turn;
void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    int64_t lo = 0, hi = M;
    if (C == seen) { lo = (turn % 5) * M / 5; hi = (turn % 5 + 1) * M / 5; turn++; }
    seen = C;
""" + matmul_rows("lo", "hi") + "}\n"),
    # Half the work above every size get_task lists (the largest is 65 x 65 x 65).
    "size_gating": ("matmul", MATMUL_HEAD + """
void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    int64_t rows = M * N * K > 300000 ? M / 2 : M;
""" + matmul_rows("0", "rows") + """
    for (int64_t i = rows; i < M; i++) for (int64_t j = 0; j < N; j++) C[i * N + j] = 0.0f;
}
"""),
    # Half the work only at the exact profiling size: the drawn case cannot see it, the timed calls do.
    "profile_size_gating": ("matmul", MATMUL_HEAD + """
void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    int64_t rows = (M == 320 && N == 320 && K == 320) ? M / 2 : M;
""" + matmul_rows("0", "rows") + """
    for (int64_t i = rows; i < M; i++) for (int64_t j = 0; j < N; j++) C[i * N + j] = 0.0f;
}
"""),
    "unstable_softmax": ("softmax", """#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        float s = 0.0f;
        for (int64_t j = 0; j < cols; j++) { y[r * cols + j] = expf(x[r * cols + j]); s += y[r * cols + j]; }
        for (int64_t j = 0; j < cols; j++) y[r * cols + j] /= s;
    }
}
"""),
    "one_pass_layernorm_variance": ("layernorm", None),
}


def one_pass_layernorm(registry: TaskRegistry) -> str:
    baseline = registry.get("layernorm").baseline_source
    assert baseline is not None
    return baseline


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workbench]:
    workbench = Workbench(make_settings(Path(tmp_path_factory.mktemp("integrity-home"))), TaskRegistry.default())
    yield workbench
    workbench.store.close()


@pytest.fixture(scope="module")
def outcomes(bench: Workbench) -> dict[str, tuple[str, object, object]]:
    """Every trick through compile -> test -> (profile when the tests passed)."""
    results: dict[str, tuple[str, object, object]] = {}
    for name, (task_id, source) in TRICKS.items():
        if source is None:
            continue
        compiled = bench.compile_kernel(task_id, source, strategy=f"trick: {name}", flags=["-O2"])
        assert compiled.ok, compiled.log
        tested = bench.run_tests(compiled.kernel_id)
        profiled = bench.profile_kernel(compiled.kernel_id) if tested.passed else None
        results[name] = (compiled.kernel_id, tested, profiled)
    return results


# A trick that works pays far more than this: a memcpy instead of a 320^3 matmul is ~100x, skipping the work
# altogether more, a fifth of the rows 5x, half the rows 2x. Below it lies what code layout alone does to the same
# full-work loop here: the tricks' loops, identical to the baseline's but placed elsewhere in their library,
# measured 0.96-1.31x against it across runs (old and new code alike), with tight CIs.
TRICK_PAYS = 1.5


def gained(profiled: object) -> bool:
    return profiled is not None and getattr(profiled, "failure", None) is None and \
        not getattr(profiled, "suspect", False) and (getattr(profiled, "speedup_vs_baseline", 0) or 0) >= TRICK_PAYS


@pytest.mark.parametrize("name", ["replay_by_pointer", "skip_when_output_written"])
def test_replaying_a_previous_result_gains_nothing(outcomes, name):
    _, tested, profiled = outcomes[name]
    assert tested.passed  # each test case is a fresh call
    assert profiled is not None
    assert not gained(profiled), profiled


def test_recomputing_part_of_the_output_is_wrong_at_the_profiling_size(outcomes):
    _, tested, profiled = outcomes["partial_recomputation"]
    assert tested.passed
    assert profiled.failure == "wrong_at_profile_size", profiled
    assert profiled.speedup_vs_baseline is None


def test_gating_on_the_published_sizes_fails_the_case_drawn_near_the_profiling_size(outcomes):
    _, tested, _ = outcomes["size_gating"]
    assert not tested.passed and tested.failure == "mismatch"
    assert any(c.name.startswith("drawn_") and not c.passed for c in tested.cases)
    assert tested.drawn_case_seed is not None


def test_gating_on_the_profiling_size_is_caught_in_the_timed_calls(outcomes, bench):
    kernel_id, tested, profiled = outcomes["profile_size_gating"]
    assert tested.passed
    assert profiled.failure == "wrong_at_profile_size"
    record = bench.store.attempt(kernel_id)
    assert record.label == "incorrect" and record.correct is False


def test_softmax_without_the_row_maximum_fails_on_large_logits(outcomes):
    _, tested, _ = outcomes["unstable_softmax"]
    assert not tested.passed and tested.failure in ("nan", "mismatch")
    bad = [c.name for c in tested.cases if not c.passed]
    assert bad == ["stability_large_logits"]


def test_a_one_pass_variance_fails_on_a_large_mean(bench):
    baseline = one_pass_layernorm(bench.tasks)
    assert "mean" in baseline
    source = """#include <math.h>
#include <stdint.h>
void kernel(const float *x, const float *gamma, const float *beta, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float s = 0.0f, s2 = 0.0f;
        for (int64_t j = 0; j < cols; j++) { s += xr[j]; s2 += xr[j] * xr[j]; }
        float mean = s / cols, var = s2 / cols - mean * mean;
        float inv = 1.0f / sqrtf(var + 1e-5f);
        for (int64_t j = 0; j < cols; j++) y[r * cols + j] = (xr[j] - mean) * inv * gamma[j] + beta[j];
    }
}
"""
    compiled = bench.compile_kernel("layernorm", source)
    if not compiled.ok:
        pytest.skip(f"layernorm's prototype changed: {compiled.log[:200]}")
    tested = bench.run_tests(compiled.kernel_id)
    assert not tested.passed
    assert "stability_large_mean" in [c.name for c in tested.cases if not c.passed]


def test_an_intrinsic_without_its_header_does_not_compile(bench):
    source = """#include <stdint.h>
void kernel(const float *a, const float *b, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) out[i] = a[i] + b[i];
}
"""
    compiled = bench.compile_kernel("vector_add", source, flags=["-mavx2"])
    assert not compiled.ok
    errors = [d for d in compiled.diagnostics if d.severity == "error"]
    assert errors and errors[0].line == 5 and "_mm256" in errors[0].message


def test_no_trick_pays_or_is_offered_as_what_worked(outcomes, bench):
    for _, _, profiled in outcomes.values():
        assert not gained(profiled), profiled
    # A trick caught at the profiling size or in the tests is never served as a case; one that ended up doing the
    # full work is measured like any honest kernel (its label may be partial or effective by layout, never 1.5x).
    trick_ids = {kernel_id for kernel_id, _, profiled in outcomes.values()
                 if profiled is None or getattr(profiled, "failure", None) is not None}
    for kernel_id in trick_ids:
        assert bench.store.attempt(kernel_id).label in ("incorrect", "compile_error")
    service = ExperienceService(bench.memory, bench.tasks)
    for task_id in ("matmul", "softmax"):
        for phase in ("start", "optimize"):
            answer = service.query_experience("what worked for this task", task_id=task_id, phase=phase,
                                              token_budget=8000)
            offered = {item.id for item in answer.items if item.kind == "case"}
            assert not offered & trick_ids
