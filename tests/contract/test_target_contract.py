"""The workflow contract, run over every registered target available on this machine and the pure-Python fake:
a target that compiles here builds its task's baseline, reports a syntax error at its line, and either runs and
times it (passing its own baseline against the reference) or refuses with no_device."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kope_mcp.errors import DeviceUnavailableError, NoDeviceError
from kope_mcp.services.workbench import Workbench
from kope_mcp.targets.native_runner import HarnessOutcome
from kope_mcp.targets.registry import load_targets, target_classes
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import make_settings
from tests.fake_target import NUMPY_BASELINES, FakeNumpyTarget

REGISTERED = sorted(target_classes())
CONTRACT_TASKS = ("relu", "vector_add")  # relu's profile (8M elements) is a quarter of vector_add's


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, registry: TaskRegistry) -> Iterator[Workbench]:
    settings = make_settings(tmp_path_factory.mktemp("contract-home"))
    yield Workbench(settings, registry, targets=load_targets(settings, extra=[FakeNumpyTarget]))


def test_the_built_in_targets_register_through_the_entry_point_group():
    assert {"c", "triton", "cuda"} <= set(REGISTERED)


# The interpreter's torch and triton imports take seconds: triton runs with -m slow.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "triton" else n
                                  for n in [*REGISTERED, "fake"]])
def test_every_available_target_fulfils_the_workflow_contract(bench, name):
    target = bench.targets[name]
    status = target.status()
    if not status.compile:
        pytest.skip(f"{name} is not available here: {status.why_not}")
    task = next(bench.tasks.get(t) for t in CONTRACT_TASKS if target.supports(bench.tasks.get(t)))
    baseline = target.baseline_source(task) or task.baseline_source
    assert baseline is not None and target.signature(task)
    compiled = bench.compile_kernel(task.id, baseline, backend=name, strategy="the naive baseline")
    assert compiled.ok, compiled.log
    assert compiled.backend == name
    assert bench.store.attempt(compiled.kernel_id).target == name
    assert bench.store.attempt(compiled.kernel_id).hardware_key == target.hardware().key

    broken_line = baseline.count("\n") + 1
    broken = bench.compile_kernel(task.id, baseline + "@@@ not code @@@\n", backend=name,
                                  session_id=compiled.session_id)
    assert not broken.ok
    assert any(d.severity == "error" and d.line == broken_line for d in broken.diagnostics), broken.diagnostics

    if not status.run:
        with pytest.raises(NoDeviceError):
            bench.run_tests(compiled.kernel_id)
        return
    tested = bench.run_tests(compiled.kernel_id)
    assert tested.passed, tested.message
    if not status.profile:
        with pytest.raises(NoDeviceError):
            bench.profile_kernel(compiled.kernel_id)
        return
    profiled = bench.profile_kernel(compiled.kernel_id)
    assert profiled.failure is None, profiled.message
    assert profiled.speedup_vs_baseline is not None and profiled.speedup_vs_baseline > 0
    assert profiled.hardware.key == target.hardware().key


class _EscapingFake(FakeNumpyTarget):
    """The fake, reporting what a harness measures of a kernel that ran threads beyond the CPU it was given."""

    name = "fake-escaping"

    def profile(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        measured = super().profile(*args, **kwargs)
        measured.outcome.result.update({"cpu_seconds": 0.2, "window_seconds": 0.1})
        measured.cpus_given = 1
        return measured


def test_a_target_inherits_the_verdict_every_set_judged_threads_measured_labels_from_the_ci(tmp_path, registry):
    # The judgement of a profile is the workbench's: a target only runs the sets and reports what it measured.
    settings = make_settings(tmp_path / "home")
    bench = Workbench(settings, registry, targets=load_targets(settings, extra=[FakeNumpyTarget, _EscapingFake]))
    wrong_after_warmup = ("import numpy as np\ncalls = [0]\n\ndef kernel(x, y, n):\n    calls[0] += 1\n"
                          "    np.maximum(x, 0.0, out=y)\n"
                          "    if calls[0] > 2 and n > 4_000_000:\n        y[n // 2] = 7.0\n")
    compiled = bench.compile_kernel("relu", wrong_after_warmup, backend="fake")
    assert bench.run_tests(compiled.kernel_id).passed
    profiled = bench.profile_kernel(compiled.kernel_id)
    assert profiled.failure == "wrong_at_profile_size", profiled
    assert bench.store.attempt(compiled.kernel_id).label == "incorrect"

    baseline = NUMPY_BASELINES["relu"]
    escaping = bench.compile_kernel("relu", baseline, backend="fake-escaping")
    assert bench.run_tests(escaping.kernel_id).passed
    profiled = bench.profile_kernel(escaping.kernel_id)
    assert profiled.failure is None and profiled.threads == 2
    assert profiled.suspect and any("given one" in r for r in profiled.suspect_reasons)
    # The same code as its baseline: its CI cannot lie wholly above 1.05, so it is never effective.
    assert bench.store.attempt(escaping.kernel_id).label != "effective"


class _DeviceLostFake(FakeNumpyTarget):
    """The fake, reporting what the GPU harness reports when the device cannot be brought up in the run."""

    name = "fake-no-device"

    def run_cases(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return HarnessOutcome(status="device_unavailable", message="RuntimeError: No CUDA GPUs are available")


class _GpuRoofFake(FakeNumpyTarget):
    """The fake, as a GPU target's profile reports it: the device's roof (measured in the profile) far below what
    the kernel claims, and a slowdown NVML saw."""

    name = "fake-gpu-roof"

    def device_class(self) -> str:
        return "gpu"

    def profile(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        measured = super().profile(*args, **kwargs)
        measured.outcome.result.update({"gpu_roof": {"bandwidth_gbps": 0.001, "fp32_gflops": 1e-6, "l2_bytes": 1},
                                        "gpu_clocks": {"after": {"sm_mhz": 1980, "max_sm_mhz": 1980,
                                                                 "slowdowns": ["hardware thermal slowdown"]}}})
        return measured


def test_a_device_the_run_cannot_bring_up_is_the_servers_error_and_not_recorded(tmp_path, registry):
    settings = make_settings(tmp_path / "home")
    bench = Workbench(settings, registry, targets=load_targets(settings, extra=[_DeviceLostFake]))
    compiled = bench.compile_kernel("relu", NUMPY_BASELINES["relu"], backend="fake-no-device")
    with pytest.raises(DeviceUnavailableError, match=r"^device_unavailable: run_tests could not use"):
        bench.run_tests(compiled.kernel_id)
    assert bench.store.attempt(compiled.kernel_id).test is None  # nothing blamed on the kernel


def test_a_gpu_targets_result_is_judged_against_the_roof_it_measured_at_its_gpu_size(tmp_path, registry):
    settings = make_settings(tmp_path / "home")
    bench = Workbench(settings, registry, targets=load_targets(settings, extra=[_GpuRoofFake]))
    compiled = bench.compile_kernel("relu", NUMPY_BASELINES["relu"] + "# mine\n", backend="fake-gpu-roof")
    assert bench.run_tests(compiled.kernel_id).passed
    profiled = bench.profile_kernel(compiled.kernel_id, time_reference=False)
    assert profiled.failure is None and profiled.case.sizes == {"n": 1 << 25}  # relu's GPU size, not its CPU one
    assert profiled.suspect and any("float32 matmul rate" in r for r in profiled.suspect_reasons)
    assert any("copies" in r for r in profiled.suspect_reasons)
    assert any("hardware thermal slowdown" in w for w in profiled.warnings)
