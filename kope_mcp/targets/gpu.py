"""Which NVIDIA GPU this machine has, through the driver API (``libcuda``), without importing torch.

None when there is no driver or no device: the GPU targets then compile only (for a named architecture).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kope_mcp.errors import DeviceUnavailableError, NoDeviceError, RefusedFlagError
from kope_mcp.hardware import HardwareProfile
from kope_mcp.runtime.sandbox import capabilities
from kope_mcp.runtime.sandbox_gpu import GpuBinding, assigned_gpu
from kope_mcp.targets.base import CompileOptions, Measurement, Target
from kope_mcp.targets.builds import BuildCache
from kope_mcp.targets.native_runner import HarnessOutcome, NativeRunner, PreparedCase

if TYPE_CHECKING:
    from kope_mcp.settings import KopeSettings
    from kope_mcp.tasks.loader import Task

_CC_MAJOR, _CC_MINOR, _SM_COUNT = 75, 76, 16  # CU_DEVICE_ATTRIBUTE_*


@dataclass(frozen=True)
class GpuInfo:
    name: str
    major: int
    minor: int
    sm_count: int
    memory_bytes: int

    @property
    def arch(self) -> str:
        return f"sm_{self.major}{self.minor}"

    @property
    def capability(self) -> int:
        return self.major * 10 + self.minor


@functools.cache
def detect_gpu() -> GpuInfo | None:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cuda.cuInit(0) != 0:
        return None
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return None
    device = ctypes.c_int(0)
    if cuda.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return None
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, device)

    def attribute(code: int) -> int:
        value = ctypes.c_int(0)
        cuda.cuDeviceGetAttribute(ctypes.byref(value), code, device)
        return value.value

    memory = ctypes.c_size_t(0)
    cuda.cuDeviceTotalMem_v2(ctypes.byref(memory), device)
    return GpuInfo(name.value.decode(errors="replace"), attribute(_CC_MAJOR), attribute(_CC_MINOR),
                   attribute(_SM_COUNT), memory.value)


def gpu_hardware(gpu: GpuInfo | None, default_arch: str) -> HardwareProfile:
    """The memory's hardware record of a GPU target: ``cuda/<GPU name>/<sm_XX>``, or ``cuda/no-gpu/<arch>`` for
    experience gathered where kernels were only compiled and interpreted."""
    if gpu is None:
        profile = HardwareProfile(key="", arch=default_arch, cpu_model=NO_GPU, cores=0, isa=[], caches=[])
    else:
        profile = HardwareProfile(key="", arch=gpu.arch, cpu_model=gpu.name, cores=gpu.sm_count, isa=[], caches=[])
    return profile.model_copy(update={"key": gpu_key(profile)})


NO_GPU = "no GPU"


def gpu_key(profile: HardwareProfile) -> str:
    """A GPU target's hardware key, from the facts of its profile."""
    if profile.cpu_model == NO_GPU:
        return f"cuda/no-gpu/{profile.arch}"
    return f"cuda/{profile.cpu_model}/{profile.arch}"


def parse_arch(value: str) -> int:
    """'sm_90' / '90' / 'sm_90a' -> 90; raises ValueError for anything else."""
    text = value.strip().lower().removeprefix("sm_").removesuffix("a")
    if not text.isdigit() or not 50 <= int(text) <= 130:
        raise ValueError(value)
    return int(text)


def resolve_arch(requested: str | None, default: str) -> str:
    """The architecture to compile for: the one asked for, else the GPU present, else the target's default."""
    if requested is None:
        gpu = detect_gpu()
        return gpu.arch if gpu else default
    try:
        return f"sm_{parse_arch(requested)}"
    except ValueError:
        raise RefusedFlagError(f"target_arch={requested}", "not a CUDA architecture",
                               "'sm_50' to 'sm_130', e.g. 'sm_80', 'sm_90', 'sm_100'") from None


GPU_RULES = (
    "On a GPU, profile_kernel times one call per sample with CUDA events after warm-up, the L2 flushed before "
    "each call and a device-wide synchronisation inside the timed region: work left on another stream counts, a "
    "host thread left running after kernel() returns ends the measurement, and every timed call's output is "
    "checked. The profiling size is the task's GPU size (get_task: gpu_profile_case). Float32 means float32: "
    "TF32 or half precision fails the tolerance or is flagged past the device's measured float32 rate.",
)


class GpuTarget(Target):
    """What the GPU targets share: a task has a version for them when its folder holds their baseline file; the
    hardware is the GPU present (else a no-GPU key for the default architecture); builds are content-addressed;
    on a GPU, run_tests and profile_kernel run in a sandbox given the assigned GPU alone (runtime/sandbox_gpu.py)
    through one harness (targets/gpu_harness.py, gpu_profile_harness.py), whatever the language."""

    baseline_file: ClassVar[str]
    source_name: ClassVar[str]
    artifact_name: ClassVar[str]
    default_arch: ClassVar[str]
    #: What the harness loads: "triton" (a Python module) or "cuda" (a shared library).
    kind: ClassVar[str]

    def __init__(self, settings: KopeSettings) -> None:
        super().__init__(settings)
        self.cache = BuildCache(settings.builds_dir, self.artifact_name, self.source_name)
        self.runner = NativeRunner(settings.memory_limit_bytes, settings.scratch_dir)

    def device_class(self) -> str:
        return "gpu" if detect_gpu() is not None else "cpu"

    def binding(self) -> GpuBinding:
        """The assigned GPU's nodes and libraries for a run; DeviceUnavailableError when they cannot be given."""
        found = assigned_gpu(self.settings.gpu, capabilities().mode == "per-run-uid")
        if isinstance(found, str):
            raise DeviceUnavailableError(f"GPU {self.settings.gpu} (KOPE_GPU) cannot be given to a run: {found}")
        return found

    def harness_env(self) -> dict[str, str]:
        """What the target's runs need in their environment besides the GPU's (``{run}``: the run's folder)."""
        return {}

    def run_on_gpu(self, task: Task, build_hash: str, cases: list[PreparedCase], *, wall_s: float) -> HarnessOutcome:
        # Importing torch and bringing up the device take seconds before the first case.
        outcome = self.runner.run_tests(task, self.cache.artifact(build_hash), cases, wall_s * 2 + 30, openmp=False,
                                        harness="kope_mcp.targets.gpu_harness", env=self.harness_env(),
                                        job_extra={"device": "cuda", "kind": self.kind}, gpu=self.binding())
        if outcome.status == "device_unavailable":
            # The report comes from the process the kernel ran in, which could write it to have nothing recorded:
            # believed only when the device fails a fresh sandbox of its own too.
            works, seen = check_device_in_sandbox(self.settings)
            if works:
                outcome.status = "crash"
                outcome.message = (f"the run reported the GPU unavailable ({outcome.message[:300]}), but it "
                                   f"initialises in a fresh sandbox ({seen}): the kernel's process ended that way")
        return outcome

    def profile(self, task: Task, build_hash: str, sets: list[PreparedCase], *, with_reference: bool,
                time_cap_s: float, consistency: tuple[float, float], wall_s: float) -> Measurement:
        """The candidate against the target's naive baseline on the GPU (the float64 reference is not timed
        there: a host reference says nothing about a device)."""
        if detect_gpu() is None:
            raise NoDeviceError(f"profile_kernel is not available for {self.name} here: {self.status().why_not}")
        baseline = self.baseline_source(task)
        if baseline is None:
            raise NoDeviceError(f"task {task.id} has no {self.name} baseline to time against")
        built = self.compile(task, baseline, [], CompileOptions())
        if not built.ok:
            raise RuntimeError(f"the {self.name} baseline of task {task.id} does not compile: {built.log}")
        libraries = {"candidate": self.cache.artifact(build_hash), "baseline": self.cache.artifact(built.build_hash)}
        # Each worker imports torch and brings up its own context (seconds) before the measurement starts.
        outcome = self.runner.profile_gpu(task, libraries, sets, kind=self.kind, gpu=self.binding(),
                                          time_cap_s=time_cap_s, wall_s=wall_s + 60, consistency=consistency,
                                          env=self.harness_env())
        return Measurement(outcome=outcome, baseline_key="baseline", threads=1, cpus_given=1)

    def hardware(self) -> HardwareProfile:
        gpu = detect_gpu()
        return gpu_hardware(gpu, gpu.arch if gpu else self.default_arch)

    def hardware_key(self, profile: HardwareProfile) -> str:
        return gpu_key(profile)

    def has_version(self, task: Task) -> bool:
        return (task.folder / self.baseline_file).is_file()

    def baseline_source(self, task: Task) -> str | None:
        path = task.folder / self.baseline_file
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def check_build(self, build_hash: str) -> None:
        self.cache.artifact(build_hash)

    def check_flags(self, flags: list[str], options: CompileOptions) -> None:
        resolve_arch(options.target_arch, self.default_arch)
        if flags:
            super().check_flags(flags, CompileOptions())


# Brings the driver up in a run exactly as a kernel's run does (same sandbox, the assigned GPU alone), with the
# driver API only: a context, an allocation, a synchronisation.
_DEVICE_PROBE = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def check(code, what):
    if code != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(name))
        sys.exit(f"{what}: {(name.value or b'CUDA error %d' % code).decode()}")
check(cuda.cuInit(0), "cuInit")
count = ctypes.c_int(0)
check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
if count.value != 1:
    sys.exit(f"the run sees {count.value} GPUs, not 1")
device, ctx, ptr = ctypes.c_int(0), ctypes.c_void_p(), ctypes.c_uint64(0)
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 20), "cuMemAlloc")
check(cuda.cuMemsetD8_v2(ptr, 0, 1 << 20), "cuMemsetD8")
check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
name = ctypes.create_string_buffer(256)
cuda.cuDeviceGetName(name, 256, device)
print(name.value.decode())
"""


def check_device_in_sandbox(settings: KopeSettings) -> tuple[bool, str]:
    """Initialise the assigned GPU inside a run's sandbox (``kope doctor``): (works, what was seen or why not)."""
    from kope_mcp.runtime.sandbox import SandboxLimits, Scratch, run_sandboxed, scrubbed_env
    from kope_mcp.targets.native_runner import python_runtime

    found = assigned_gpu(settings.gpu, capabilities().mode == "per-run-uid")
    if isinstance(found, str):
        return False, found
    runtime = python_runtime()
    with Scratch(settings.scratch_dir) as scratch:
        env = scrubbed_env(found.env(), tmpdir=scratch.inside(scratch.run))
        run = run_sandboxed([runtime.executable, "-S", "-c", _DEVICE_PROBE], scratch=scratch, env=env,
                            limits=SandboxLimits(wall_seconds=60, cpu_seconds=60, address_space_bytes=None,
                                             data_bytes=settings.memory_limit_bytes),
                            binds=runtime.interpreter, gpu=found)
    if run.returncode == 0:
        return True, f"{run.stdout_tail.strip()} initialised in a run's sandbox ({', '.join(found.nodes)})"
    return False, (run.stderr_tail.strip().splitlines() or [run.describe()])[-1]
