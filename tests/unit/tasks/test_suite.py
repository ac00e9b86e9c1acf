"""Every packaged task is well formed, deterministic, and its naive baseline passes its own cases."""

import numpy as np
import pytest

from kope_mcp.tasks.registry import FAMILIES, TaskRegistry
from tests.conftest import everyday_sample

REQUIRED_PROTOTYPES = {
    "vector_add": "void kernel(const float *a, const float *b, float *out, int64_t n)",
    "softmax": "void kernel(const float *x, float *y, int64_t rows, int64_t cols)",
    "matmul": "void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K)",
}
TASK_IDS = sorted(t.id for t in TaskRegistry.default().list())
_FAMILY = {t.id: t.spec.family for t in TaskRegistry.default().list()}
ONE_PER_FAMILY_EVERY_DAY = everyday_sample(TASK_IDS, _FAMILY.__getitem__)


def test_the_suite_has_53_tasks_in_every_family_and_level(registry):
    assert registry.problems == []
    assert len(registry) == 53
    assert {t.spec.family for t in registry.list()} == set(FAMILIES)
    assert {t.spec.level for t in registry.list()} == {1, 2, 3, 4}


@pytest.mark.parametrize("task_id", sorted(REQUIRED_PROTOTYPES))
def test_required_tasks_have_the_contract_prototypes(registry, task_id):
    assert registry.get(task_id).spec.prototype == REQUIRED_PROTOTYPES[task_id]


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_task_has_awkward_cases_and_costs(registry, task_id):
    spec = registry.get(task_id).spec
    assert len(spec.cases) >= 8
    assert len({c.name for c in spec.cases}) == len(spec.cases)
    all_sizes = [v for c in spec.cases for v in c.sizes.values()]
    assert any(v % 8 for v in all_sizes), "needs a size that is not a multiple of 8"
    assert any(v in (1, 2, 3) for v in all_sizes), "needs a degenerate size (1-3)"
    if len(spec.size_names) >= 2:
        # Where shapes apply: for some pair of extents, a case where the first dwarfs the second (tall-skinny)
        # and a case the other way round (short-wide).
        pairs = [(a, b) for a in spec.size_names for b in spec.size_names if a < b]
        assert any(max(c.sizes[a] / c.sizes[b] for c in spec.cases) >= 8
                   and min(c.sizes[a] / c.sizes[b] for c in spec.cases) <= 1 / 8 for a, b in pairs), \
            "needs a tall-skinny and a short-wide case"
    assert spec.byte_count(spec.profile.sizes) > 0
    assert spec.flop_count(spec.profile.sizes) >= 0


@pytest.mark.parametrize("task_id", ONE_PER_FAMILY_EVERY_DAY)
def test_reference_is_deterministic_per_seed(registry, task_id):
    task = registry.get(task_id)
    case = task.spec.cases[2]
    first = task.run_reference(task.make_inputs(case.sizes, 7), case.sizes)
    second = task.run_reference(task.make_inputs(case.sizes, 7), case.sizes)
    other = task.make_inputs(case.sizes, 8)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(x, y) for x, y in zip(task.make_inputs(case.sizes, 7).values(), other.values(),
                                                         strict=True))


@pytest.mark.parametrize("task_id", ONE_PER_FAMILY_EVERY_DAY)
def test_baseline_passes_its_own_cases(workbench, task_id):
    task = workbench.tasks.get(task_id)
    compiled = workbench.compile_kernel(task_id, task.baseline_source, strategy="baseline")
    assert compiled.ok, compiled.log
    report = workbench.run_tests(compiled.kernel_id)
    assert report.passed, report.message
    assert len(report.cases) == len(task.spec.cases) + 1 and report.cases[-1].name.startswith("drawn_")


# Tasks whose formula overflows or cancels when written the textbook way: each needs a case whose values break it.
NUMERICALLY_SENSITIVE = {"softmax", "log_softmax", "cross_entropy", "sdpa", "sdpa_causal", "layernorm", "softplus"}


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_a_task_that_promises_numerical_stability_has_a_case_that_breaks_the_naive_formula(registry, task_id):
    spec = registry.get(task_id).spec
    promises = "stable" in (spec.summary + spec.description).lower() or task_id in NUMERICALLY_SENSITIVE
    if not promises:
        return
    assert task_id in NUMERICALLY_SENSITIVE, "a new task promising stability: add it here, with its cases"
    assert any(case.ranges for case in spec.cases), "needs a case with value ranges that break the naive formula"


@pytest.mark.slow
@pytest.mark.parametrize("task_id", TASK_IDS)
def test_the_baseline_is_correct_at_the_profiling_size(workbench, task_id):
    from kope_mcp.services.correctness import judge_case
    from kope_mcp.targets.native_runner import PreparedCase

    task = workbench.tasks.get(task_id)
    build = workbench.targets["c"].compile_baseline(task)
    assert build.artifact is not None, build.log
    profile = task.spec.profile
    inputs = task.case_inputs(profile, task.case_seed(profile, 0))  # with its sparse support and outliers
    case = PreparedCase(profile.name, profile.sizes, inputs)
    outcome = workbench.targets["c"].runner.run_tests(task, build.artifact, [case], 120.0, openmp=False)
    assert outcome.status == "ok", outcome.message
    result, failure = judge_case(profile.name, profile.sizes, outcome.outputs[0],
                                 task.run_reference(inputs, profile.sizes), [a.name for a in task.outputs()],
                                 task.spec.tolerance_for(profile), [])
    assert failure is None, result


TRITON_TASK_IDS = [t.id for t in TaskRegistry.default().list() if (t.folder / "baseline_triton.py").is_file()]


def test_at_least_twelve_tasks_in_six_families_have_a_triton_baseline():
    families = {TaskRegistry.default().get(t).spec.family for t in TRITON_TASK_IDS}
    assert len(TRITON_TASK_IDS) >= 12 and len(families) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("task_id", TRITON_TASK_IDS)
def test_every_triton_baseline_compiles_and_passes_its_tests(workbench, task_id):
    target = workbench.targets["triton"]
    if not target.status().run:
        pytest.skip(f"triton cannot run here: {target.status().why_not}")
    source = target.baseline_source(workbench.tasks.get(task_id))
    compiled = workbench.compile_kernel(task_id, source, backend="triton", strategy="naive Triton baseline")
    assert compiled.ok, compiled.diagnostics
    assert compiled.resources and all(r.registers for r in compiled.resources)
    report = workbench.run_tests(compiled.kernel_id)
    assert report.passed, report.message
