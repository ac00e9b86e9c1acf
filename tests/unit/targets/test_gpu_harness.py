"""The GPU harness's own logic on the CPU: the driver's error names through a stub ``libcuda`` (gcc-built here), a
CUDA library called through ctypes with the task's arguments in order and its refused launch named, the verdict's
GPU checks and the profiling size per device class."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from kope_mcp.errors import DeviceUnavailableError
from kope_mcp.runtime.sandbox_gpu import GpuNodesUnavailable
from kope_mcp.services.gpu_verdicts import gpu_clock_warnings, gpu_suspect_reasons
from kope_mcp.services.profile_inputs import GPU_POOL_BYTES, POOL_BYTES, pool_size
from kope_mcp.settings import InvalidSettingError, KopeSettings
from kope_mcp.targets.gpu_harness import CudaFault, Driver, Implementation
from kope_mcp.targets.nvml import slowdowns

STUB_DRIVER = r'''
#include <stdlib.h>
static const char *names[] = {"CUDA_SUCCESS", "CUDA_ERROR_ILLEGAL_ADDRESS"};
int cuCtxSynchronize(void) { const char *v = getenv("KOPE_STUB_SYNC"); return v ? atoi(v) : 0; }
int cuGetErrorName(int code, const char **out) { *out = code == 700 ? names[1] : 0; return code == 700 ? 0 : 1; }
int cuGetErrorString(int code, const char **out) { *out = "an illegal memory access was encountered"; return 0; }
'''

# What an nvcc build of vector_add exports, in C: kernel() with the prototype, and kope_last_error() (the
# library's own cudaGetLastError).
STUB_KERNEL = r'''
#include <stdint.h>
static int64_t seen[4]; static int error;
void kernel(const float *a, const float *b, float *out, int64_t n) {
    seen[0] = (int64_t)a; seen[1] = (int64_t)b; seen[2] = (int64_t)out; seen[3] = n; error = n > 1000 ? 1 : 0;
}
int kope_last_error(void) { int e = error; error = 0; return e; }
int64_t seen_arg(int i) { return seen[i]; }
'''


def build(tmp_path: Path, name: str, source: str) -> Path:
    (tmp_path / f"{name}.c").write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(tmp_path / f"{name}.c")], check=True)
    return out


def test_the_devices_error_is_named_by_the_driver(tmp_path, monkeypatch):
    driver = Driver(str(build(tmp_path, "libcuda_stub", STUB_DRIVER)))
    monkeypatch.setenv("KOPE_STUB_SYNC", "0")
    driver.synchronize()
    monkeypatch.setenv("KOPE_STUB_SYNC", "700")
    with pytest.raises(CudaFault, match=r"CUDA_ERROR_ILLEGAL_ADDRESS \(an illegal memory access"):
        driver.synchronize()
    monkeypatch.setenv("KOPE_STUB_SYNC", "999")
    with pytest.raises(CudaFault, match="CUDA error 999"):
        driver.synchronize()


def test_a_cuda_library_gets_device_pointers_and_sizes_in_the_prototypes_order(tmp_path):
    import ctypes

    library = build(tmp_path, "kernel", STUB_KERNEL)
    args = [{"name": "a", "kind": "in", "dtype": "float32"}, {"name": "b", "kind": "in", "dtype": "float32"},
            {"name": "out", "kind": "out", "dtype": "float32"}, {"name": "n", "kind": "size", "dtype": "int64"}]
    impl = Implementation("cuda", str(library), args)
    tensors = {name: SimpleNamespace(data_ptr=lambda address=address: address)
               for name, address in (("a", 0x1000), ("b", 0x2000), ("out", 0x3000))}
    impl.call(tensors, {"n": 7}, {})
    seen = ctypes.CDLL(str(library)).seen_arg
    seen.restype = ctypes.c_int64
    assert [seen(i) for i in range(4)] == [0x1000, 0x2000, 0x3000, 7]
    with pytest.raises(CudaFault, match=r"the launch failed: cudaError 1 \(cudaErrorInvalidValue\)"):
        impl.call(tensors, {"n": 4096}, {})


def test_a_result_past_the_devices_measured_roof_is_suspect():
    roof = {"gpu_roof": {"bandwidth_gbps": 3400.0, "fp32_gflops": 50_000.0, "l2_bytes": 60 * 1024**2}}
    flops = 2 * 2048**3  # 17.2 GFLOP
    assert gpu_suspect_reasons(roof, flops, 0, 0.00060) == []  # 28.6 TFLOP/s: a tiled fp32 kernel (H200)
    tf32 = gpu_suspect_reasons(roof, flops, 0, 0.00005)  # 344 TFLOP/s: TF32 tensor cores
    assert len(tf32) == 1 and "float32" in tf32[0]
    big = 3 * 4 * 2**25  # vector_add at its GPU size: 384 MiB, far beyond L2
    assert gpu_suspect_reasons(roof, 0, big, 0.000186) == []
    assert "copies" in gpu_suspect_reasons(roof, 0, big, 0.00005)[0]
    assert gpu_suspect_reasons(roof, 0, 4 * 1024**2, 1e-7) == []  # fits in L2: no bandwidth bound
    assert gpu_suspect_reasons({}, flops, big, 1e-9) == []  # no roof measured (a CPU target)


def test_clock_slowdowns_around_the_measurement_are_reported():
    reading = {"sm_mhz": 1980, "max_sm_mhz": 1980, "slowdowns": slowdowns(0x4 | 0x1)}
    assert reading["slowdowns"] == ["software power cap"]
    warnings = gpu_clock_warnings({"gpu_clocks": {"before": reading, "after": {**reading, "sm_mhz": 900}}})
    assert any("software power cap" in w for w in warnings) and any("900 MHz" in w for w in warnings)
    assert gpu_clock_warnings({"gpu_clocks": {"before": {"unavailable": "no NVML"}}}) == []


def test_a_gpu_fills_the_device_and_a_cpu_keeps_its_size(registry):
    spec = registry.get("matmul").spec
    assert spec.profile_for("cpu") == spec.profile and spec.profile_for("gpu").sizes == {"M": 2048, "N": 2048,
                                                                                       "K": 2048}
    assert registry.get("conv2d").spec.profile_for("gpu") == registry.get("conv2d").spec.profile  # no GPU size
    one_set = 3 * 4 * 2**25
    assert pool_size(one_set, 0.01, "gpu") == GPU_POOL_BYTES // one_set
    assert pool_size(one_set, 0.01, "cpu") == 2 == max(2, POOL_BYTES // one_set)


def test_the_gpu_setting_names_a_device_index(monkeypatch, tmp_path):
    monkeypatch.setenv("KOPE_GPU", "3")
    assert KopeSettings.from_env(home=tmp_path).gpu == 3
    monkeypatch.setenv("KOPE_GPU", "first")
    with pytest.raises(InvalidSettingError, match="KOPE_GPU='first' is not a GPU index"):
        KopeSettings.from_env(home=tmp_path)


def test_a_gpu_that_cannot_be_handed_to_a_run_is_device_unavailable(tmp_path, monkeypatch):
    from kope_mcp.targets import gpu as gpu_module
    from kope_mcp.targets.cuda import CudaTarget

    def refuse(index: int, per_run_uid: bool) -> str:
        return str(GpuNodesUnavailable(f"/dev/nvidia{index} is missing"))

    monkeypatch.setattr(gpu_module, "assigned_gpu", refuse)
    target = CudaTarget(KopeSettings.from_env(home=tmp_path, gpu=5, embeddings=False))
    with pytest.raises(DeviceUnavailableError, match=r"^device_unavailable: GPU 5 \(KOPE_GPU\).*/dev/nvidia5"):
        target.binding()


@pytest.mark.parametrize(("fresh_sandbox_works", "status"), [(True, "crash"), (False, "device_unavailable")])
def test_a_device_unavailable_report_is_believed_only_when_a_fresh_sandbox_fails_too(tmp_path, monkeypatch,
                                                                                     fresh_sandbox_works, status):
    # run_tests' report comes from the process the kernel ran in: a kernel could write it to have nothing recorded.
    from kope_mcp.runtime.sandbox_gpu import GpuBinding
    from kope_mcp.targets import gpu as gpu_module
    from kope_mcp.targets.cuda import CudaTarget
    from kope_mcp.targets.native_runner import HarnessOutcome

    target = CudaTarget(KopeSettings.from_env(home=tmp_path, embeddings=False))
    monkeypatch.setattr(target, "binding", lambda: GpuBinding(0, ("/dev/nvidia0",), ()))
    monkeypatch.setattr(target.cache, "artifact", lambda build_hash: tmp_path / "kernel.so")
    monkeypatch.setattr(target.runner, "run_tests", lambda *a, **k: HarnessOutcome(
        status="device_unavailable", message="RuntimeError: No CUDA GPUs are available"))
    monkeypatch.setattr(gpu_module, "check_device_in_sandbox", lambda settings: (fresh_sandbox_works, "H200"))
    outcome = target.run_on_gpu(None, "hash", [], wall_s=1.0)  # type: ignore[arg-type]
    assert outcome.status == status
    assert ("initialises in a fresh sandbox" in outcome.message) == fresh_sandbox_works
