"""A whole execution target in one module: the "Add a target" example of docs/backends.md and the tests' proof that the
workbench is device-agnostic. Pure Python (numpy), so it runs anywhere.

The source is a Python module defining ``kernel(**arguments)`` over numpy arrays (outputs written in place). A
real target would compile and run in the sandbox (``kope_mcp.runtime.sandbox``) and corroborate its timings; this one
runs in-process, which is why it lives in the tests and is never registered for users.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kope_mcp.diagnostics import Diagnostic
from kope_mcp.hardware import HardwareProfile
from kope_mcp.runtime.harness import GuardedBuffers, poison
from kope_mcp.runtime.measurement import Consistency, Schedule, measure
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.base import CompileOptions, Measurement, Target, TargetStatus
from kope_mcp.targets.builds import BuildCache, BuildResult, build_key
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase
from kope_mcp.targets.timing import CorroboratedTimings
from kope_mcp.tasks.loader import Task

NUMPY_BASELINES = {
    "vector_add": "import numpy as np\n\ndef kernel(a, b, out, n):\n    np.add(a, b, out=out)\n",
    "relu": "import numpy as np\n\ndef kernel(x, y, n):\n    np.maximum(x, 0.0, out=y)\n",
    "matmul": "import numpy as np\n\ndef kernel(A, B, C, M, N, K):\n    np.matmul(A, B, out=C)\n",
    "mse_loss": ("import numpy as np\n\ndef kernel(a, b, out, n):\n"
                 "    d = a.astype(np.float64) - b\n    out[0] = np.dot(d, d) / n\n"),
}


class FakeNumpyTarget(Target):
    name = "fake"
    language = "Python (numpy)"
    source_kind = "a Python module defining kernel(...) over numpy arrays"

    def __init__(self, settings: KopeSettings) -> None:
        super().__init__(settings)
        self.cache = BuildCache(settings.builds_dir, "kernel.py", "kernel.py")

    def status(self) -> TargetStatus:
        return TargetStatus(True, True, True, "numpy in the server process (tests only)")

    def hardware(self) -> HardwareProfile:
        return HardwareProfile(key="fake/numpy", arch="numpy", cpu_model="numpy", cores=1, isa=[], caches=[])

    def signature(self, task: Task) -> str | None:
        if task.id not in NUMPY_BASELINES:
            return None
        return f"def kernel({', '.join(a.name for a in task.spec.args)}) -> None"

    def baseline_source(self, task: Task) -> str | None:
        return NUMPY_BASELINES.get(task.id)

    def compile(self, task: Task, source: str, flags: list[str], options: CompileOptions) -> BuildResult:
        digest = build_key({"backend": self.name, "source": source})
        if (cached := self.cache.load(digest)) is not None:
            return cached
        diagnostics = []
        try:
            compile(source, "kernel.py", "exec")
        except SyntaxError as exc:
            diagnostics.append(Diagnostic(exc.lineno or 0, exc.offset or 0, "error", exc.msg, "kernel.py"))
        build = BuildResult(build_hash=digest, ok=not diagnostics, diagnostics=diagnostics, log="", seconds=0.0,
                            cached=False, artifact=None)
        self.cache.commit(build, source.encode() if build.ok else None, source)
        return build

    def check_build(self, build_hash: str) -> None:
        self.cache.artifact(build_hash)

    def _load(self, build_hash: str) -> Any:
        namespace: dict[str, Any] = {}
        exec(self.cache.artifact(build_hash).read_text(), namespace)
        return namespace["kernel"]

    def _call(self, fn: Any, task: Task, case: PreparedCase) -> tuple[dict[str, np.ndarray], list[str]]:
        guards = GuardedBuffers()
        kwargs: dict[str, Any] = {}
        outputs: dict[str, np.ndarray] = {}
        for a in task.spec.args:
            if a.kind == "in":
                kwargs[a.name] = guards.empty(a.name, case.inputs[a.name].shape, a.dtype)
                kwargs[a.name][...] = case.inputs[a.name]
            elif a.kind == "out":
                outputs[a.name] = kwargs[a.name] = guards.empty(a.name, task.spec.shape_of(a, case.sizes), a.dtype)
                poison(outputs[a.name])
            elif a.kind == "size":
                kwargs[a.name] = case.sizes[a.name]
            else:
                kwargs[a.name] = a.value
        fn(**kwargs)
        return outputs, guards.stray_writes()

    def run_cases(self, task: Task, build_hash: str, cases: list[PreparedCase], *, wall_s: float) -> HarnessOutcome:
        fn = self._load(build_hash)
        outcome = HarnessOutcome(status="ok", result={"cases": []})
        for case in cases:
            outputs, stray = self._call(fn, task, case)
            outcome.outputs.append(outputs)
            outcome.result["cases"].append({"name": case.name, "inputs_modified": [], "out_of_bounds": stray})
        return outcome

    def profile(self, task: Task, build_hash: str, sets: list[PreparedCase], *, with_reference: bool,
                time_cap_s: float, consistency: tuple[float, float], wall_s: float) -> Measurement:
        baseline = self.compile(task, NUMPY_BASELINES[task.id], [], CompileOptions())
        kernels = {"candidate": self._load(build_hash), "baseline": self._load(baseline.build_hash)}
        device = _InProcess(task, sets, kernels)
        # The protocol every target runs (kope_mcp/runtime/measurement.py); only the primitives are this target's.
        measured = measure(device, ["candidate", "baseline"], len(sets), device.buffers,
                           Schedule(time_cap_s=time_cap_s), Consistency(*consistency))
        timings = CorroboratedTimings(samples=measured.samples, inner=measured.inner)
        outcome = HarnessOutcome(status="ok", result=measured.result(), outputs=measured.anchor_outputs(),
                                 timings=timings)
        return Measurement(outcome=outcome, baseline_key="baseline")


class _InProcess:
    """The fake's primitives for the measurement protocol: the kernels are functions in this process, each
    implementation with its own copy of the inputs and its own output buffers (as many as 48 MiB hold)."""

    def __init__(self, task: Task, sets: list[PreparedCase], kernels: dict[str, Any]) -> None:
        self.task, self.sets, self.kernels = task, sets, kernels
        outputs = task.outputs()
        per_call = sum(int(np.prod(task.spec.shape_of(a, sets[0].sizes))) * np.dtype(a.dtype).itemsize for a in outputs)
        self.buffers = max(1, min(10_000, (48 << 20) // max(1, per_call)))
        self.inputs = {name: [{k: v.copy() for k, v in case.inputs.items()} for case in sets] for name in kernels}
        self.outputs = {name: [{a.name: np.empty(task.spec.shape_of(a, sets[0].sizes), a.dtype) for a in outputs}
                               for _ in range(self.buffers)] for name in kernels}

    def poison(self, name: str, n: int) -> None:
        for buffer in self.outputs[name][:n]:
            for arr in buffer.values():
                poison(arr)

    def run(self, name: str, chosen: list[int], variants: list[int] | None = None) -> float:
        calls = []
        for j, i in enumerate(chosen):
            kwargs: dict[str, Any] = {}
            for a in self.task.spec.args:
                if a.kind == "in":
                    kwargs[a.name] = self.inputs[name][i][a.name]
                elif a.kind == "out":
                    kwargs[a.name] = self.outputs[name][j][a.name]
                elif a.kind == "size":
                    kwargs[a.name] = self.sets[i].sizes[a.name]
                else:
                    kwargs[a.name] = a.value
            calls.append(kwargs)
        fn = self.kernels[name]
        start = time.perf_counter()
        for kwargs in calls:
            fn(**kwargs)
        return (time.perf_counter() - start) / len(chosen)

    def read(self, n: int) -> list[dict[str, np.ndarray]]:
        return self.outputs["candidate"][:n]
