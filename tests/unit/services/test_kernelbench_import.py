"""`kope tasks import-kernelbench`: KernelBench-format problems become C tasks that work through MCP."""

import tomllib
from pathlib import Path

import anyio
import numpy as np
import pytest
from mcp import Client

from kope_mcp.app.cli import main
from kope_mcp.app.server import build_server
from kope_mcp.services.kernelbench_import import import_kernelbench
from kope_mcp.services.kernelbench_plan import ELEMENT_BUDGET
from kope_mcp.services.references import ReferenceRunner
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import make_settings

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernelbench"
MATMUL = FIXTURES / "level1" / "1_Square_matrix_multiplication_.py"
CONV1D = FIXTURES / "level1" / "67_conv_standard_1D.py"
ARGMAX = FIXTURES / "level1" / "51_Argmax_over_a_dimension.py"

MATMUL_C = """
#include <stdint.h>
void kernel(const float *A, const float *B, float *out, int64_t N) {
    for (int64_t i = 0; i < N; i++) {
        for (int64_t j = 0; j < N; j++) out[i * N + j] = 0.0f;
        for (int64_t k = 0; k < N; k++)
            for (int64_t j = 0; j < N; j++) out[i * N + j] += A[i * N + k] * B[k * N + j];
    }
}
"""
CONV1D_C = """
#include <stdint.h>
void kernel(const float *x, const float *w, const float *b, float *out,
            int64_t batch_size, int64_t length, int64_t out_channels, int64_t out_len) {
    for (int64_t n = 0; n < batch_size; n++)
        for (int64_t f = 0; f < out_channels; f++)
            for (int64_t t = 0; t < out_len; t++) {
                float s = b[f];
                for (int64_t c = 0; c < 3; c++)
                    for (int64_t k = 0; k < 3; k++) s += x[(n * 3 + c) * length + t + k] * w[(f * 3 + c) * 3 + k];
                out[(n * out_channels + f) * out_len + t] = s;
            }
}
"""
ARGMAX_C = """
#include <stdint.h>
void kernel(const float *x, int64_t *out, int64_t batch_size, int64_t dim1, int64_t dim2) {
    for (int64_t n = 0; n < batch_size; n++)
        for (int64_t j = 0; j < dim2; j++) {
            int64_t best = 0;
            for (int64_t i = 1; i < dim1; i++)
                if (x[(n * dim1 + i) * dim2 + j] > x[(n * dim1 + best) * dim2 + j]) best = i;
            out[n * dim2 + j] = best;
        }
}
"""


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("kb-home"))
    report = import_kernelbench(settings, [FIXTURES])
    return settings, report


def test_expressible_problems_are_imported_and_the_rest_skipped_with_the_reason(imported):
    _, report = imported
    assert sorted(t.task_id for t in report.imported) == [
        "kb_19_relu", "kb_1_conv2d_relu_biasadd", "kb_1_square_matrix_multiplication",
        "kb_47_sum_reduction_over_a_dimension", "kb_51_argmax_over_a_dimension", "kb_67_conv_standard_1d"]
    reasons = {Path(s.source).name: s.reason for s in report.skipped}
    assert "only a single output tensor" in reasons["two_outputs.py"]
    assert "'targets' is torch.int64: only float32 inputs" in reasons["integer_targets.py"]
    assert "defines no get_inputs" in reasons["no_get_inputs.py"]


def test_skipped_problems_leave_nothing_behind(imported):
    settings, _ = imported
    installed = {p.name for p in (settings.home / "tasks").iterdir()}
    assert not any("two_outputs" in name or "integer" in name or "no_get" in name for name in installed)


def test_the_prototype_is_inputs_then_parameters_then_output_then_dimensions(imported):
    _, report = imported
    by_id = {t.task_id: t for t in report.imported}
    assert by_id["kb_1_square_matrix_multiplication"].prototype == (
        "void kernel(const float *A, const float *B, float *out, int64_t N)")
    assert by_id["kb_67_conv_standard_1d"].prototype == (
        "void kernel(const float *x, const float *conv1d_weight, const float *conv1d_bias, float *out, "
        "int64_t batch_size, int64_t length, int64_t out_channels, int64_t out_dim2)")
    assert by_id["kb_51_argmax_over_a_dimension"].prototype.startswith("void kernel(const float *x, int64_t *out")


def test_sizes_are_scaled_by_a_power_of_two_within_the_budget(imported):
    settings, report = imported
    registry = TaskRegistry([settings.home / "tasks"])
    for done in report.imported:
        spec = registry.get(done.task_id).spec
        elements = sum(int(np.prod(spec.shape_of(a, spec.profile.sizes))) for a in spec.args if a.is_pointer)
        assert elements <= ELEMENT_BUDGET
        assert done.scale.startswith("1/") and int(done.scale[2:]) & (int(done.scale[2:]) - 1) == 0
        assert len(spec.cases) >= 8
        assert any(v % 8 for c in spec.cases for v in c.sizes.values())
    conv = registry.get("kb_67_conv_standard_1d").spec
    # kernel_size (3) and in_channels (3) are below 16: constants in the shapes, not arguments.
    assert [a.shape for a in conv.args if a.name == "conv1d_weight"] == [["out_channels", 3, 3]]
    assert all(c.sizes["out_dim2"] == c.sizes["length"] - 2 for c in [*conv.cases, conv.profile])


def test_values_computed_from_a_size_follow_it_and_constant_extents_are_literals(imported):
    settings, _ = imported
    spec = TaskRegistry([settings.home / "tasks"]).get("kb_1_conv2d_relu_biasadd").spec
    shapes = {a.name: a.shape for a in spec.args}
    # bias_shape = (out_channels, 1, 1) is computed from out_channels in the file: it scales with it.
    assert shapes["bias"] == ["out_channels", 1, 1]
    assert shapes["x"] == ["batch_size", 3, "height", "width"]
    assert len({tuple(sorted(c.sizes.items())) for c in spec.cases}) >= 6
    assert spec.level == 3 and spec.family == "convolution"


def test_the_task_file_keeps_the_problem_source_for_the_model_to_read(imported):
    settings, _ = imported
    folder = settings.home / "tasks" / "kb_67_conv_standard_1d"
    raw = tomllib.loads((folder / "task.toml").read_text())
    assert "nn.Conv1d(in_channels, out_channels, kernel_size)" in raw["description"]
    assert (folder / "problem.py").read_text() == CONV1D.read_text()
    assert not (folder / "baseline.c").exists()


def test_the_reference_is_the_pytorch_model_in_float64_and_deterministic_per_seed(imported):
    settings, _ = imported
    task = TaskRegistry([settings.home / "tasks"]).get("kb_67_conv_standard_1d")
    assert not task.trusted and task.reference_fn is None  # an imported problem is never imported by the server
    case = task.spec.cases[1]
    first, again, other = ReferenceRunner(settings).cases(task, [(case, 11), (case, 11), (case, 12)])
    inputs = first.inputs
    assert all(np.array_equal(inputs[k], again.inputs[k]) for k in inputs)
    assert np.array_equal(first.expected[0], again.expected[0])
    assert not np.array_equal(inputs["x"], other.inputs["x"])
    (out,) = first.expected
    x, w, b = (inputs[k].astype(np.float64) for k in ("x", "conv1d_weight", "conv1d_bias"))
    windows = np.lib.stride_tricks.sliding_window_view(x, 3, axis=2)  # batch x C x out_len x K
    np.testing.assert_allclose(out, np.einsum("nctk,fck->nft", windows, w) + b[None, :, None], rtol=1e-12)


@pytest.mark.slow
def test_a_kernel_for_an_imported_problem_is_compiled_tested_and_profiled_through_mcp(imported):
    settings, _ = imported

    async def call(client, tool, **args):
        result = await client.call_tool(tool, args)
        assert not result.is_error, result.content
        return result.structured_content

    async def body():
        async with Client(build_server(settings)) as client:
            listing = await call(client, "list_tasks", family="matmul")
            assert "kb_1_square_matrix_multiplication" in {line.split(" ", 1)[0] for line in listing["tasks"]}
            task = await call(client, "get_task", task_id="kb_1_square_matrix_multiplication")
            assert task["baseline_source"] is None and "torch.matmul(A, B)" in task["description"]
            for task_id, source in (("kb_1_square_matrix_multiplication", MATMUL_C),
                                    ("kb_67_conv_standard_1d", CONV1D_C), ("kb_51_argmax_over_a_dimension", ARGMAX_C)):
                compiled = await call(client, "compile_kernel", task_id=task_id, source=source, flags=["-O3"])
                assert compiled["ok"], compiled["log"]
                tested = await call(client, "run_tests", kernel_id=compiled["kernel_id"])
                assert tested["passed"], (task_id, tested["message"])
            profile = await call(client, "profile_kernel", kernel_id=compiled["kernel_id"])
            assert profile["baseline_is_reference"] and profile["reference"] is not None
            assert profile["speedup_vs_baseline"] == pytest.approx(profile["speedup_vs_reference"], rel=1e-9)
            assert profile["baseline"] == profile["reference"]
            wrong = await call(client, "compile_kernel", task_id="kb_1_square_matrix_multiplication",
                               source=MATMUL_C.replace("B[k * N + j]", "B[j * N + k]"))
            failed = await call(client, "run_tests", kernel_id=wrong["kernel_id"])
            assert not failed["passed"] and failed["failure"] == "mismatch"

    anyio.run(body)


def test_the_cli_imports_reports_skips_and_refuses_to_overwrite_without_replace(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KOPE_HOME", str(tmp_path))
    assert main(["tasks", "import-kernelbench", str(MATMUL), str(FIXTURES / "unsupported" / "two_outputs.py")]) == 0
    out, err = capsys.readouterr()
    assert "imported kb_1_square_matrix_multiplication" in out and "1 imported, 1 skipped" in out
    assert "skipped" in err and "two_outputs.py" in err
    assert main(["tasks", "import-kernelbench", str(MATMUL)]) == 1
    assert "already installed" in capsys.readouterr().err
    assert main(["tasks", "import-kernelbench", str(MATMUL), "--replace"]) == 0
    assert "replaced kb_1_square_matrix_multiplication" in capsys.readouterr().out


def test_profiling_times_the_float32_forward_pass_and_checking_uses_float64(imported):
    from kope_mcp.runtime.harness import _load_reference

    settings, _ = imported
    task = TaskRegistry([settings.home / "tasks"]).get("kb_1_square_matrix_multiplication")
    case = task.spec.cases[0]
    (made,) = ReferenceRunner(settings).cases(task, [(case, 3)])
    inputs, (exact,) = made.inputs, made.expected
    timed = _load_reference(str(task.folder))
    assert timed.__name__ == "benchmark"
    fast = timed(**task.call_arguments(inputs, case.sizes))
    assert fast.dtype == np.float32
    np.testing.assert_allclose(fast, exact, rtol=1e-4, atol=1e-4)
