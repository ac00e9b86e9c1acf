"""The scripted agent's loop-nest rewrites: where they apply, and that they keep every task's kernel correct."""

import pytest

from kope_mcp.bench import loops
from kope_mcp.bench.candidates import BY_NAME, Kernel
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import everyday_sample

REWRITES = ("multiple accumulators", "loop interchange", "blocking 32")
CASES = sorted(
    (task.id, name) for task in TaskRegistry.default().list() for name in REWRITES
    if task.baseline_source is not None and BY_NAME[name].apply(Kernel(task.baseline_source)) is not None
)

MATMUL = """void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            C[i * N + j] = acc;
        }
    }
}
"""
ELEMENTWISE = """void kernel(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    }
}
"""


def _squash(source: str) -> str:
    return " ".join(source.split())


def test_interchange_turns_ijk_matmul_into_ikj_with_the_output_zeroed_first():
    out = loops.interchange(MATMUL, 0)
    assert out is not None
    assert "for (int64_t j = 0; j < N; j++) C[i * N + j] = 0.0f; for (int64_t k = 0; k < K; k++) { " \
           "for (int64_t j = 0; j < N; j++) { C[i * N + j] += A[i * K + k] * B[k * N + j]; } }" in _squash(out)


def test_multiple_accumulators_keep_a_scalar_tail_for_sizes_not_divisible_by_four():
    out = loops.multiple_accumulators(MATMUL, 0)
    assert out is not None
    flat = _squash(out)
    assert "acc_3 += A[i * K + (k + 3)] * B[(k + 3) * N + j];" in flat
    assert "for (int64_t k = k_end; k < K; k++) acc += A[i * K + k] * B[k * N + j];" in flat
    assert loops.multiple_accumulators(out, 0) is None  # split once only


def test_blocking_tiles_the_deepest_perfect_nest_and_only_once():
    out = loops.block(MATMUL, 0, 32)
    assert out is not None
    flat = _squash(out)
    assert "for (int64_t i_tile = 0; i_tile < M; i_tile += 32)" in flat
    assert "for (int64_t j = j_tile; j < (j_tile + 32 < N ? j_tile + 32 : N); j++)" in flat
    assert loops.block(out, 0, 64) is None


def test_rewrites_do_not_apply_to_a_loop_shape_they_do_not_fit():
    assert loops.interchange(ELEMENTWISE, 0) is None
    assert loops.block(ELEMENTWISE, 0, 64) is None
    assert loops.multiple_accumulators(ELEMENTWISE, 0) is None
    # A loop whose body has an if-block is not parsed (left alone), never half-rewritten.
    branchy = ELEMENTWISE.replace("y[i] = x[i] > 0.0f ? x[i] : 0.0f;", "if (x[i] > 0) { y[i] = x[i]; }")
    assert loops.block(branchy, 0, 64) is None


def test_every_family_with_the_loop_shape_gets_its_own_rewrites():
    applies = {(task, name) for task, name in CASES}
    assert {("matmul", "loop interchange"), ("sum_columns", "loop interchange"), ("transpose", "blocking 32"),
            ("dot", "multiple accumulators"), ("conv2d", "blocking 32")} <= applies
    assert not {t for t, _ in applies} & {"relu", "exp", "gelu", "vector_add"}


@pytest.mark.parametrize(("task_id", "strategy"), everyday_sample(CASES, lambda case: case[1]))
def test_the_rewrite_compiles_and_passes_every_case_of_the_task(workbench, registry, task_id, strategy):
    candidate = BY_NAME[strategy].apply(Kernel(registry.get(task_id).baseline_source or ""))
    assert candidate is not None
    compiled = workbench.compile_kernel(task_id, candidate.source, flags=list(candidate.flags))
    assert compiled.ok, compiled.log
    report = workbench.run_tests(compiled.kernel_id)
    assert report.passed, report.message
