"""The ``triton`` target: a Python module with ``@triton.jit`` kernels and a launcher ``kernel(...)``.

With a GPU that Triton supports, kernels compile, run and are timed there (targets/gpu.py). Without one,
``compile_kernel`` compiles ahead of time for a named GPU (``target_arch``, default sm_90) and reports real frontend
diagnostics and each kernel's registers, shared memory and local memory, and ``run_tests`` runs the launcher in
Triton's interpreter on the CPU (``TRITON_INTERPRET=1``): correctness only, checked against the reference like
every other target, with guard zones around every buffer. ``profile_kernel`` then refuses with ``no_device:``.

The artifact of a build is the submitted source itself (kept under ``KOPE_HOME/builds`` with its sha256): the
compile child runs next to the module's own top-level code in the sandbox, so nothing it writes is kept.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import time
from typing import Any

from pydantic import ValidationError

from kope_mcp.diagnostics import Diagnostic
from kope_mcp.errors import RefusedFlagError
from kope_mcp.models import KernelResources
from kope_mcp.runtime import sandbox_seccomp
from kope_mcp.runtime.sandbox import SandboxLimits, Scratch, memory_file, read_memory_file, run_sandboxed, scrubbed_env
from kope_mcp.targets.base import CompileOptions, TargetStatus
from kope_mcp.targets.builds import BuildResult, build_key, trim_log
from kope_mcp.targets.gpu import GPU_RULES, GpuTarget, detect_gpu, resolve_arch
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase, python_runtime
from kope_mcp.tasks.loader import Task

BASELINE_FILE = "baseline_triton.py"
SOURCE_NAME = "kernel.py"
DEFAULT_ARCH = "sm_90"
# The address-space cap is the sandbox's only memory bound: measured, the compile and the interpreter run a matmul
# within 2 GiB; compiling gets headroom for large kernels (ptxas), runs get the server's KOPE memory limit.
_COMPILE_AS_BYTES = 8 * 1024**3
TORCH_DTYPES = {"float32": "torch.float32", "float64": "torch.float64", "int32": "torch.int32",
                "int64": "torch.int64"}


@functools.cache
def triton_version() -> str | None:
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        return None
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


class TritonTarget(GpuTarget):
    name = "triton"
    language = "Triton (Python)"
    source_kind = "a Python module with @triton.jit kernels and a launcher `kernel(...)` taking torch tensors"
    # The artifact is the submitted source itself.
    baseline_file, source_name, artifact_name, default_arch = BASELINE_FILE, SOURCE_NAME, SOURCE_NAME, DEFAULT_ARCH
    kind = "triton"

    @property
    def draws_cases(self) -> bool:  # type: ignore[override]
        # The interpreter is 1,000-5,000x slower than a device: a case near the profiling size would take minutes.
        return detect_gpu() is not None

    def status(self) -> TargetStatus:
        version = triton_version()
        if version is None:
            return TargetStatus(False, False, False, "not installed",
                                why_not="Triton is not installed on the server (pip install -e '.[triton]')")
        gpu = detect_gpu()
        if gpu is not None:
            return TargetStatus(True, True, True, f"Triton {version} on {gpu.name} ({gpu.arch})",
                                details=(f"GPU {gpu.name}, compute capability {gpu.major}.{gpu.minor}, "
                                         f"{gpu.sm_count} SMs; runs see GPU {self.settings.gpu} alone",))
        return TargetStatus(True, True, False, f"Triton {version}, interpreter on the CPU (TRITON_INTERPRET=1)",
                            why_not="no GPU that Triton supports on this machine; run_tests uses Triton's "
                                    "interpreter on the CPU and compile_kernel compiles for target_arch",
                            details=(f"no GPU: compiles for {DEFAULT_ARCH} by default", "interpreter mode"))

    # --- tasks ---------------------------------------------------------------------------------------------
    def signature(self, task: Task) -> str | None:
        if not self.has_version(task):
            return None
        params = []
        notes = []
        for a in task.spec.args:
            if a.kind in ("in", "out"):
                params.append(f"{a.name}: torch.Tensor")
                shape = ", ".join(str(e) for e in a.shape)
                notes.append(f"#   {a.name}: {TORCH_DTYPES[a.dtype]} [{shape}], contiguous"
                             f"{', read-only' if a.kind == 'in' else ', write every element'}")
            elif a.kind == "size":
                params.append(f"{a.name}: int")
            else:
                params.append(f"{a.name}: float")
                notes.append(f"#   {a.name} = {a.value}")
        return f"def kernel({', '.join(params)}) -> None\n" + "\n".join(notes)

    def rules(self, task: Task) -> list[str]:
        return [
            "Define a launcher `kernel(...)` with the signature above (the task's argument names) that launches "
            "one or more @triton.jit kernels with their grid and returns nothing; outputs are written in place.",
            "Import only triton, triton.language, torch, math and the standard library. Tensors are contiguous, "
            "row-major, and may have any size including 1: mask every load and store of a tail.",
            "Every buffer sits between guard zones: a store outside a tensor fails the test "
            "(out_of_bounds_write) even where the device or interpreter would not fault.",
            "compile_kernel compiles for target_arch (default: the GPU present, else sm_90) and reports registers, "
            "shared memory and spills per kernel. Without a GPU, run_tests runs Triton's interpreter on the CPU "
            "(correctness only) and profile_kernel is not available.",
            *GPU_RULES,
        ]

    # --- compile -------------------------------------------------------------------------------------------
    def compile(self, task: Task, source: str, flags: list[str], options: CompileOptions) -> BuildResult:
        if flags:
            raise RefusedFlagError(" ".join(flags), "the triton backend takes no compiler flags",
                                   "none (set num_warps / num_stages in the launch instead)")
        arch = resolve_arch(options.target_arch, DEFAULT_ARCH)
        digest = build_key({"backend": self.name, "triton": triton_version(), "arch": arch,
                            "signature": self.signature(task), "profile": task.spec.profile.sizes, "source": source})
        cached = self.cache.load(digest)
        if cached is not None:
            return cached
        start = time.monotonic()
        result, log = self._compile_in_sandbox(task, source, arch)
        diagnostics = _diagnostics(result.get("diagnostics"))
        ok = result.get("ok") is True and not any(d.severity == "error" for d in diagnostics)
        if not ok and not diagnostics:
            diagnostics.append(Diagnostic(0, 0, "error", log.strip().splitlines()[-1] if log.strip() else
                                          "the Triton compiler gave no result"))
        build = BuildResult(build_hash=digest, ok=ok, diagnostics=diagnostics, log=trim_log(log),
                            seconds=round(time.monotonic() - start, 3), cached=False, artifact=None,
                            traits={"target_arch": arch, "resources": _resources(result.get("kernels"))})
        self.cache.commit(build, source.encode("utf-8") if ok else None, source)
        return build

    def _compile_in_sandbox(self, task: Task, source: str, arch: str) -> tuple[dict[str, Any], str]:
        runtime = python_runtime()
        result_fd = memory_file("compile-result")
        try:
            with Scratch(self.settings.scratch_dir) as scratch:
                src = scratch.inputs / SOURCE_NAME
                src.write_text(source, encoding="utf-8")
                src.chmod(0o644)
                sizes = task.spec.profile.sizes
                worker_filter = sandbox_seccomp.worker_program()
                job = {"source": scratch.inside(src), "arch": arch.removeprefix("sm_"), "result_fd": result_fd,
                       "worker_filter": worker_filter.hex() if worker_filter else None,
                       "signature": self.signature(task), "sizes": sizes,
                       "args": [{"name": a.name, "kind": a.kind, "dtype": a.dtype, "value": a.value,
                                 "shape": list(task.spec.shape_of(a, sizes)) if a.kind in ("in", "out") else []}
                                for a in task.spec.args]}
                job_path = scratch.inputs / "compile.json"
                job_path.write_text(json.dumps(job))
                job_path.chmod(0o644)
                env = scrubbed_env({"PYTHONPATH": runtime.place(scratch), "PYTHONDONTWRITEBYTECODE": "1",
                                    **triton_env(scratch.inside(scratch.run))}, tmpdir=scratch.inside(scratch.run))
                timeout = self.settings.compile_timeout_s
                run = run_sandboxed(
                    [runtime.executable, "-S", "-B", "-m", "kope_mcp.targets.triton_compile", scratch.inside(job_path)],
                    scratch=scratch,
                    limits=SandboxLimits(wall_seconds=timeout, cpu_seconds=int(timeout) * 2 + 5,
                                         address_space_bytes=_COMPILE_AS_BYTES),
                    env=env, pass_fds=(result_fd,))
            raw = read_memory_file(result_fd, 4 * 1024**2)
        finally:
            os.close(result_fd)
        log = (run.stderr_tail + run.stdout_tail).replace(scratch.inside(src), SOURCE_NAME)
        log = "\n".join(line for line in log.splitlines() if "TRITON_DEFAULT_FP_FUSION" not in line
                        and "warn_once(FP_FUSION" not in line)
        try:
            result = json.loads(raw) if raw else {}
        except ValueError:
            result = {}
        if not isinstance(result, dict) or not result:
            return {"ok": False, "diagnostics": [{"line": 0, "column": 0, "severity": "error",
                                                  "message": f"the Triton compile step {run.describe()}"}]}, log
        return result, log

    # --- run -----------------------------------------------------------------------------------------------
    def harness_env(self) -> dict[str, str]:
        return triton_env("{run}")

    def run_cases(self, task: Task, build_hash: str, cases: list[PreparedCase], *, wall_s: float) -> HarnessOutcome:
        if detect_gpu() is not None:
            return self.run_on_gpu(task, build_hash, cases, wall_s=wall_s)
        # Importing torch and triton takes seconds before the first case; the interpreter is slow.
        return self.runner.run_tests(task, self.cache.artifact(build_hash), cases, wall_s * 4 + 30, openmp=False,
                                     harness="kope_mcp.targets.gpu_harness",
                                     env=triton_env("{run}") | {"TRITON_INTERPRET": "1"},
                                     job_extra={"device": "cpu", "kind": "triton"})


def triton_env(run_dir: str) -> dict[str, str]:
    return {"TRITON_CACHE_DIR": f"{run_dir}/.triton", "TRITON_HOME": run_dir, "TRITON_DEFAULT_FP_FUSION": "1"}


# The compile child shares its sandbox with the module's own top-level code, so its report is parsed as untrusted
# input: anything malformed is dropped, never allowed to break the server.
def _diagnostics(raw: Any) -> list[Diagnostic]:
    found = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        line, column = item.get("line"), item.get("column")
        severity = str(item["severity"]) if item.get("severity") in ("error", "warning", "note") else "error"
        found.append(Diagnostic(line if isinstance(line, int) and 0 <= line < 10**7 else 0,
                                column if isinstance(column, int) and 0 <= column < 10**5 else 0,
                                severity, str(item.get("message", ""))[:1000], SOURCE_NAME))
    return found[:50]


def _resources(raw: Any) -> list[dict[str, Any]]:
    kept = []
    for item in raw if isinstance(raw, list) else []:
        try:
            kept.append(KernelResources.model_validate(item).model_dump())
        except ValidationError:
            continue
    return kept[:64]
