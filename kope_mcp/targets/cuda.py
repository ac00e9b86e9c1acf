"""The ``cuda`` target: CUDA C++ with an ``extern "C"`` host function ``kernel(...)`` of the task's prototype that
takes device pointers and launches its own kernels.

``compile_kernel`` runs ``nvcc`` in the sandbox (arch from the GPU present, else ``target_arch``, default sm_80)
with an allow-listed flag set and ``-Xptxas -v``, so every machine with nvcc gets real diagnostics at the user's
lines and each kernel's registers, spills and shared memory, GPU or not. On a GPU, ``run_tests`` and
``profile_kernel`` load the library in the sandbox given the assigned GPU alone and call ``kernel`` through ctypes
with device pointers: the harness owns allocation, copies, launch and synchronisation (targets/gpu.py). Without
one they answer ``no_device:``.

The build adds ``kope_last_error()`` (the library's own ``cudaGetLastError``; nvcc links the CUDA runtime
statically, so only the library can ask it) to the prototype header: a launch the runtime refused is named.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from kope_mcp.diagnostics import Diagnostic, parse_diagnostics
from kope_mcp.errors import NoDeviceError, RefusedFlagError
from kope_mcp.runtime.sandbox import (
    SandboxLimits,
)
from kope_mcp.targets.base import CompileOptions, TargetStatus
from kope_mcp.targets.builds import BuildResult, build_key, trim_log
from kope_mcp.targets.gpu import GPU_RULES, GpuTarget, detect_gpu, resolve_arch
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase
from kope_mcp.targets.toolchain import build_library
from kope_mcp.tasks.loader import Task

BASELINE_FILE = "baseline.cu"
SOURCE_NAME = "kernel.cu"
PROTOTYPE_HEADER = "kope_prototype.cuh"
ARTIFACT_NAME = "kernel.so"
DEFAULT_ARCH = "sm_80"
BASE_FLAGS = ("-O3", "-std=c++17")
MAX_ARTIFACT_BYTES = 256 * 1024**2
FLAGS_SUMMARY = ("-O0..-O3, -use_fast_math/--use_fast_math, -lineinfo, --maxrregcount=N, -ftz=true|false, "
                 "-prec-div=true|false, -prec-sqrt=true|false, -fmad=true|false, -std=c++17|c++20, "
                 "--extra-device-vectorization, -DNAME[=VALUE]")
_FLAG = re.compile(r"^(?:-O[0-3]|--?use_fast_math|-lineinfo|--maxrregcount=\d{1,3}|-(?:ftz|prec-div|prec-sqrt|fmad)="
                   r"(?:true|false)|-std=c\+\+(?:17|20)|--extra-device-vectorization"
                   r"|-D[A-Za-z_][A-Za-z0-9_]*(?:=[A-Za-z0-9_.+\-]*)?)$")
_FUNCTION = re.compile(r"Function properties for (?P<name>\S+)\s*\n\s*(?P<stack>\d+) bytes stack frame, "
                       r"(?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads")
_USAGE = re.compile(r"Compiling entry function '(?P<name>[^']+)'.*?Used (?P<reg>\d+) registers(?P<rest>[^\n]*)",
                    re.DOTALL)


@functools.cache
def nvcc_path() -> str | None:
    found = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK)
                                     else None)
    return os.path.realpath(found) if found else None


@functools.cache
def nvcc_version() -> str | None:
    path = nvcc_path()
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\S+), V(\S+)", out)
    return match.group(2) if match else None


def demangle(name: str) -> str:
    """`_Z3addPKfS0_Pfl` -> `add` (the kernel's name is what a model recognises)."""
    match = re.match(r"_Z(\d+)", name)
    if match:
        length, start = int(match.group(1)), match.end()
        return name[start:start + length]
    return name


def parse_resources(log: str) -> list[dict[str, int | str]]:
    spills = {m["name"]: m for m in _FUNCTION.finditer(log)}
    found: list[dict[str, int | str]] = []
    for m in _USAGE.finditer(log):
        rest = m["rest"]
        smem = re.search(r"(\d+) bytes smem", rest)
        info: dict[str, int | str] = {"name": demangle(m["name"]), "registers": int(m["reg"]),
                                      "shared_bytes": int(smem.group(1)) if smem else 0}
        if (s := spills.get(m["name"])) is not None:
            info |= {"local_bytes": int(s["stack"]), "spill_stores": int(s["st"]), "spill_loads": int(s["ld"])}
        found.append(info)
    return found


def validate_cuda_flags(flags: list[str]) -> list[str]:
    for flag in flags:
        if not isinstance(flag, str) or not _FLAG.fullmatch(flag):
            raise RefusedFlagError(flag, "not on the cuda backend's allow-list", FLAGS_SUMMARY)
    return list(flags)


class CudaTarget(GpuTarget):
    name = "cuda"
    language = "CUDA C++"
    source_kind = 'CUDA C++ defining `extern "C" void kernel(...)` (device pointers) that launches its kernels'
    baseline_file, source_name, artifact_name, default_arch = BASELINE_FILE, SOURCE_NAME, ARTIFACT_NAME, DEFAULT_ARCH
    kind = "cuda"

    def status(self) -> TargetStatus:
        version = nvcc_version()
        if version is None:
            return TargetStatus(False, False, False, "nvcc not found",
                                why_not="nvcc (the CUDA toolkit) is not installed on the server")
        gpu = detect_gpu()
        if gpu is None:
            return TargetStatus(True, False, False, f"nvcc {version}; no GPU, compiles for {DEFAULT_ARCH} by default",
                                why_not="no CUDA GPU on this machine; compile_kernel works without one",
                                details=(f"nvcc {version} at {nvcc_path()}",))
        if importlib.util.find_spec("torch") is None:
            return TargetStatus(True, False, False, f"nvcc {version}; {gpu.name} ({gpu.arch})",
                                why_not="running CUDA kernels needs torch on the server (its harness allocates and "
                                        "copies device memory with it)", details=(f"nvcc {version} at {nvcc_path()}",))
        return TargetStatus(True, True, True, f"nvcc {version}; {gpu.name} ({gpu.arch})",
                            details=(f"nvcc {version} at {nvcc_path()}", f"GPU {gpu.name}, {gpu.sm_count} SMs; runs "
                                     f"see GPU {self.settings.gpu} alone"))

    def check_flags(self, flags: list[str], options: CompileOptions) -> None:
        validate_cuda_flags(flags)
        resolve_arch(options.target_arch, DEFAULT_ARCH)

    def signature(self, task: Task) -> str | None:
        return f'extern "C" {task.spec.prototype}' if self.has_version(task) else None

    def default_flags(self) -> list[str]:
        return list(BASE_FLAGS)

    def rules(self, task: Task) -> list[str]:
        return [
            'Define `extern "C"` host function `kernel` with the prototype above; its pointers are device memory. '
            "Launch your __global__ kernels from it on the default stream and return; do not synchronise, "
            "allocate with cudaMalloc per call, or copy to the host.",
            f"nvcc with {' '.join(BASE_FLAGS)} -Xptxas -v for target_arch (default: the GPU present, else "
            f"{DEFAULT_ARCH}); allowed flags: {FLAGS_SUMMARY}.",
            "Arrays are contiguous, row-major, of any size including 1: guard every tail.",
            *GPU_RULES,
        ]

    def compile(self, task: Task, source: str, flags: list[str], options: CompileOptions) -> BuildResult:
        flags = validate_cuda_flags(flags)
        arch = resolve_arch(options.target_arch, DEFAULT_ARCH)
        digest = build_key({"backend": self.name, "nvcc": nvcc_version(), "arch": arch, "flags": flags,
                            "base": BASE_FLAGS, "header": prototype_header(task), "source": source})
        cached = self.cache.load(digest)
        if cached is not None:
            return cached
        nvcc = nvcc_path()
        assert nvcc is not None  # the workbench checked status().compile
        header = prototype_header(task)
        timeout = self.settings.compile_timeout_s
        run = build_library(
            self.settings.scratch_dir, files={SOURCE_NAME: source, PROTOTYPE_HEADER: header},
            argv=[nvcc, *BASE_FLAGS, *flags, f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v",
                  "-include", PROTOTYPE_HEADER, SOURCE_NAME, "-o", ARTIFACT_NAME],
            artifact=ARTIFACT_NAME, max_bytes=MAX_ARTIFACT_BYTES, binds=(Path(nvcc).parent.parent,),
            path=f"{Path(nvcc).parent}:/usr/local/bin:/usr/bin:/bin",
            limits=SandboxLimits(wall_seconds=timeout, cpu_seconds=int(timeout) * 2 + 5,
                                 address_space_bytes=16 * 1024**3, max_file_bytes=512 * 1024**2))
        log, library, result, seconds = run.log, run.library, run.result, run.seconds
        diagnostics = parse_diagnostics(log, SOURCE_NAME)
        if library is None and not any(d.severity == "error" for d in diagnostics):
            diagnostics.append(Diagnostic(0, 0, "error", f"nvcc {result.describe()}"))
        resource_log = "\n".join(line for line in log.splitlines() if line.startswith(("ptxas info", "    ")))
        kept = "\n".join(line for line in log.splitlines() if not line.startswith("ptxas info")
                         and not re.match(r"^\s+\d+ bytes stack frame", line))
        build = BuildResult(build_hash=digest, ok=library is not None, diagnostics=diagnostics,
                            log=trim_log(kept), seconds=seconds,
                            cached=False, artifact=None, flags=flags,
                            traits={"target_arch": arch, "resources": parse_resources(resource_log)})
        self.cache.commit(build, library, source)
        return build

    def run_cases(self, task: Task, build_hash: str, cases: list[PreparedCase], *, wall_s: float) -> HarnessOutcome:
        if detect_gpu() is None:
            raise NoDeviceError(f"run_tests is not available for cuda here: {self.status().why_not}")
        return self.run_on_gpu(task, build_hash, cases, wall_s=wall_s)


def prototype_header(task: Task) -> str:
    """Included before the user's source (its line numbers stay the user's): the prototype, so a definition that
    does not match is a compile error, and the harness's window on the library's own CUDA runtime."""
    return ("#include <stdint.h>\n#include <stddef.h>\n#include <cuda_runtime.h>\n"
            f'extern "C" {task.spec.prototype};\n'
            'extern "C" int kope_last_error(void) { return (int)cudaGetLastError(); }\n')
