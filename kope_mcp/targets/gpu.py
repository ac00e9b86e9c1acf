"""Which NVIDIA GPU this machine has, through the driver API (``libcuda``), without importing torch.

None when there is no driver or no device: the GPU targets then compile only (for a named architecture).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kope_mcp.errors import RefusedFlagError
from kope_mcp.hardware import HardwareProfile
from kope_mcp.targets.base import CompileOptions, Target
from kope_mcp.targets.builds import BuildCache

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
        return HardwareProfile(key=f"cuda/no-gpu/{default_arch}", arch=default_arch, cpu_model="no GPU", cores=0,
                               isa=[], caches=[])
    return HardwareProfile(key=f"cuda/{gpu.name}/{gpu.arch}", arch=gpu.arch, cpu_model=gpu.name, cores=gpu.sm_count,
                           isa=[], caches=[])


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


class GpuTarget(Target):
    """What the GPU targets share: a task has a version for them when its folder holds their baseline file; the
    hardware is the GPU present (else a no-GPU key for the default architecture); builds are content-addressed."""

    baseline_file: ClassVar[str]
    source_name: ClassVar[str]
    artifact_name: ClassVar[str]
    default_arch: ClassVar[str]

    def __init__(self, settings: KopeSettings) -> None:
        super().__init__(settings)
        self.cache = BuildCache(settings.builds_dir, self.artifact_name, self.source_name)

    def hardware(self) -> HardwareProfile:
        gpu = detect_gpu()
        return gpu_hardware(gpu, gpu.arch if gpu else self.default_arch)

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
