"""The ``c`` target: C kernels built by gcc (or clang) into a shared object, run and timed on this CPU.

The build is content-addressed (source, flags, prototype, compiler version) under ``KOPE_HOME/builds`` (0700),
and the compiler itself runs in the sandbox, because ``#include "/etc/shadow"`` in untrusted source would
otherwise leak files into diagnostics. The library the sandbox leaves is read back with ``O_NOFOLLOW`` and
checked, its sha256 is recorded, and it is verified against that hash before every later use.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from kope_mcp.diagnostics import Diagnostic, parse_diagnostics
from kope_mcp.hardware import HardwareProfile, cpu_key, detect_hardware, probe_compiler
from kope_mcp.models import CostCounts
from kope_mcp.runtime.sandbox import SandboxLimits
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.base import CompileOptions, Measurement, Target, TargetStatus
from kope_mcp.targets.builds import BuildCache, BuildResult, build_key, trim_log
from kope_mcp.targets.cost import CallgrindCounts, count_kernel, valgrind_available
from kope_mcp.targets.elf import exported_functions, function_code
from kope_mcp.targets.flags import validate_flags
from kope_mcp.targets.native_runner import HarnessOutcome, NativeRunner, PreparedCase
from kope_mcp.targets.toolchain import build_library
from kope_mcp.tasks.loader import Task

SOURCE_NAME = "kernel.c"
PROTOTYPE_HEADER = "kope_prototype.h"
ARTIFACT_NAME = "kernel.so"
BASE_FLAGS = ("-std=gnu17", "-O2", "-Wall")
MAX_ARTIFACT_BYTES = 64 * 1024**2
COST_TIMEOUT_S = 300.0


@functools.cache
def compiler_version(compiler: str) -> str | None:
    """``gcc -dumpfullversion`` (None when the compiler does not run)."""
    try:
        out = subprocess.run([compiler, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def prototype_header(task: Task) -> str:
    # Declaring the expected prototype before the user's source makes gcc report "conflicting types for
    # 'kernel'" when the definition does not match, without shifting the user's line numbers.
    return (
        "#include <stdint.h>\n#include <stddef.h>\n"
        f"{task.spec.prototype};\n"
    )


class CpuCTarget(Target):
    name = "c"
    language = "C17 (gnu17)"
    source_kind = "C source defining `kernel` with the task's prototype"

    def __init__(self, settings: KopeSettings) -> None:
        super().__init__(settings)
        self.compiler = settings.compiler
        self.timeout_s = settings.compile_timeout_s
        self.cache = BuildCache(settings.builds_dir, ARTIFACT_NAME, SOURCE_NAME)
        self.runner = NativeRunner(settings.memory_limit_bytes, settings.scratch_dir)

    @property
    def builds_dir(self) -> Path:
        return self.settings.builds_dir

    @functools.cached_property
    def _status(self) -> TargetStatus:
        info = probe_compiler(self.compiler)
        if info.version is None:
            return TargetStatus(False, False, False, f"{self.compiler}: not found",
                                why_not=f"the C compiler {self.compiler!r} does not run (set KOPE_CC)")
        summary = f"{info.version}{', OpenMP' if info.openmp else ''}; runs on this CPU"
        return TargetStatus(True, True, True, summary)

    def status(self) -> TargetStatus:
        return self._status

    def hardware(self) -> HardwareProfile:
        return detect_hardware()

    def hardware_key(self, profile: HardwareProfile) -> str:
        return cpu_key(profile.arch, profile.cpu_model, profile.cores, profile.isa)

    def roofline(self) -> HardwareProfile | None:
        return detect_hardware()

    def signature(self, task: Task) -> str:
        return task.spec.prototype

    def baseline_source(self, task: Task) -> str | None:
        return task.baseline_source

    def default_flags(self) -> list[str]:
        return list(BASE_FLAGS)

    def check_flags(self, flags: list[str], options: CompileOptions) -> None:
        validate_flags(flags)
        if options.target_arch is not None:
            super().check_flags([], options)

    def uses_openmp(self, build_hash: str) -> bool:
        return bool(self.cache.traits(build_hash).get("uses_openmp"))

    # --- compile -------------------------------------------------------------------------------------------
    def compile(self, task: Task, source: str, flags: list[str] | None = None,
                options: CompileOptions | None = None) -> BuildResult:
        flags = validate_flags(list(flags or []))
        digest = build_key({"backend": self.name, "cc": self.compiler, "cc_version": compiler_version(self.compiler),
                            "prototype": task.spec.prototype, "flags": flags, "base": BASE_FLAGS, "source": source})
        cached = self.cache.load(digest)
        if cached is not None:
            return cached
        return self._build(task, source, flags, digest)

    def compile_baseline(self, task: Task) -> BuildResult:
        if task.baseline_source is None:
            raise ValueError(f"task {task.id} has no C baseline")
        return self.compile(task, task.baseline_source, [])

    def artifact(self, build_hash: str) -> Path:
        return self.cache.artifact(build_hash)

    def check_build(self, build_hash: str) -> None:
        self.cache.artifact(build_hash)

    def _build(self, task: Task, source: str, flags: list[str], digest: str) -> BuildResult:
        argv = [
            self.compiler, *BASE_FLAGS, "-fPIC", "-shared", "-fdiagnostics-color=never",
            # A call to an undeclared function, or a symbol nothing defines, must fail here with a line number,
            # not later as a library that cannot load.
            "-Werror=implicit-function-declaration", "-Wl,--no-undefined",
            "-include", PROTOTYPE_HEADER, *flags, SOURCE_NAME, "-o", ARTIFACT_NAME, "-lm",
        ]
        run = build_library(
            self.settings.scratch_dir, files={SOURCE_NAME: source, PROTOTYPE_HEADER: prototype_header(task)},
            argv=argv, artifact=ARTIFACT_NAME, max_bytes=MAX_ARTIFACT_BYTES, binds=toolchain_binds(self.compiler),
            limits=SandboxLimits(wall_seconds=self.timeout_s, cpu_seconds=int(self.timeout_s) + 5,
                                 address_space_bytes=4 * 1024**3, max_file_bytes=256 * 1024**2))
        log, library = run.log, run.library
        diagnostics = parse_diagnostics(log, SOURCE_NAME)
        if run.refused:
            diagnostics.append(Diagnostic(0, 0, "error", run.refused))
        if library is not None and "kernel" not in exported_functions(library):
            library = None
            diagnostics.append(Diagnostic(0, 0, "error", "the source does not define a function named "
                                          f"`kernel` (expected: {task.spec.prototype})"))
            log += "\nerror: no exported symbol `kernel` in the built library"
        if library is None and not any(d.severity == "error" for d in diagnostics):
            diagnostics.append(Diagnostic(0, 0, "error", f"compiler {run.result.describe()}"))
        build = BuildResult(build_hash=digest, ok=library is not None, diagnostics=diagnostics, log=trim_log(log),
                            seconds=run.seconds, cached=False, artifact=None, flags=flags,
                            traits={"uses_openmp": "-fopenmp" in flags})
        self.cache.commit(build, library, source)
        return build

    # --- run -----------------------------------------------------------------------------------------------
    def run_cases(self, task: Task, build_hash: str, cases: list[PreparedCase], *, wall_s: float) -> HarnessOutcome:
        openmp = self.uses_openmp(build_hash)
        # The CPU mask a profile gives it (one CPU unless OpenMP): a kernel cannot tell a test from a timed run by
        # counting its CPUs.
        pin = None if openmp else sorted(_allowed_cpus())[-1]
        return self.runner.run_tests(task, self.artifact(build_hash), cases, wall_s, openmp,
                                     job_extra={"pin_cpu": pin})

    def profile(self, task: Task, build_hash: str, sets: list[PreparedCase], *, with_reference: bool,
                time_cap_s: float, consistency: tuple[float, float], wall_s: float) -> Measurement:
        libraries = {"candidate": self.artifact(build_hash)}
        if task.baseline_source is not None:
            baseline = self.compile_baseline(task)
            if not baseline.ok:
                raise RuntimeError(f"the baseline of task {task.id} does not compile: {baseline.log}")
            libraries["baseline"] = self.artifact(baseline.build_hash)
        # Without a C baseline (a KernelBench import) the reference is the baseline, as KernelBench measures it.
        base_key = "baseline" if "baseline" in libraries else "reference"
        openmp = self.uses_openmp(build_hash)
        pin = None if openmp else sorted(_allowed_cpus())[-1]
        # The timekeeper shares the kernel's CPU: woken by a marker it preempts the harness at once (outside the
        # timed region: the harness waits for its acknowledgement before reading the clock), where on another
        # CPU it would queue behind whatever else runs there.
        outcome = self.runner.profile(
            task, libraries, sets, time_cap_s=time_cap_s, with_reference=with_reference or base_key == "reference",
            openmp=openmp, pin_cpu=pin, timing_cpu=pin, wall_s=wall_s, consistency=consistency,
        )
        threads = int(outcome.result.get("omp_threads") or 1) if openmp else 1
        code = _kernel_code(libraries["candidate"]) if "baseline" in libraries else None
        same = code is not None and code == _kernel_code(libraries["baseline"])
        return Measurement(outcome=outcome, baseline_key=base_key, threads=threads, pinned_cpu=pin,
                           cpus_given=1 if pin is not None else len(_allowed_cpus()), same_code_as_baseline=same)

    def deterministic_costs(self, task: Task, build_hash: str, case: PreparedCase) -> CostCounts | str:
        if not valgrind_available():
            return super().deterministic_costs(task, build_hash, case)
        compiler, scratch = self.settings.compiler, self.settings.scratch_dir
        kernel = count_kernel(task, self.artifact(build_hash), case.inputs, case.sizes, compiler, COST_TIMEOUT_S,
                              scratch)
        if isinstance(kernel, str):
            return kernel
        base: CallgrindCounts | str = "no C baseline"
        if task.baseline_source is not None:
            baseline = self.artifact(self.compile_baseline(task).build_hash)
            base = count_kernel(task, baseline, case.inputs, case.sizes, compiler, COST_TIMEOUT_S, scratch)
        return CostCounts(
            tool="valgrind callgrind (--toggle-collect=kernel --cache-sim=yes)",
            instructions=kernel.instructions, data_reads=kernel.data_reads, data_writes=kernel.data_writes,
            l1_data_misses=kernel.l1_data_misses, last_level_misses=kernel.last_level_misses,
            baseline_instructions=base.instructions if not isinstance(base, str) else None,
        )


@functools.cache
def toolchain_binds(compiler: str) -> tuple[Path, ...]:
    """A compiler outside /usr (``KOPE_CC=/opt/gcc-14/bin/gcc``) is bound read-only with its whole prefix."""
    found = shutil.which(compiler)
    if found is None:
        return ()
    real = Path(os.path.realpath(found))
    if str(real).startswith("/usr/"):
        return ()
    return (real.parent.parent,)


def _kernel_code(library: Path) -> bytes | None:
    return function_code(library.read_bytes(), "kernel")


def _allowed_cpus() -> set[int]:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {0}
