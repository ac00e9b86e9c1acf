"""The child side of run_tests and profile_kernel: load a kernel library, call it, report what happened.

Runs inside the sandbox (``python -m kope_mcp.harness JOB.json``). It loads everything it needs first (numpy,
the libraries, the inputs, the reference), then drops to an unprivileged user, then calls kernel code. It
trusts nothing the kernel does: correctness is judged by the parent from the output files it writes here.
Only numpy and the standard library are imported, so the child starts fast.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from kope_mcp.sandbox import drop_privileges

_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int32": ctypes.c_int32, "int64": ctypes.c_int64}
POISON_BITS = 0x7FE5A5A5  # a quiet NaN with a payload no arithmetic produces: "never written"


def _load_kernel(path: str, args: list[dict[str, Any]]) -> Any:
    lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    fn = lib.kernel
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p if a["kind"] in ("in", "out") else _CTYPES[a["dtype"]] for a in args]
    return fn


def _digest(arr: np.ndarray) -> str:
    return hashlib.sha256(arr.tobytes()).hexdigest()


class Case:
    def __init__(self, spec: dict[str, Any], args: list[dict[str, Any]], work: Path) -> None:
        self.name = spec["name"]
        self.sizes: dict[str, int] = spec["sizes"]
        self.args = args
        self.inputs = {
            name: np.fromfile(work / meta["file"], dtype=meta["dtype"]).reshape(meta["shape"])
            for name, meta in spec["inputs"].items()
        }
        self.pristine = {name: arr.copy() for name, arr in self.inputs.items()}
        self.output_meta: dict[str, dict[str, Any]] = spec["outputs"]
        self.outputs = {
            name: np.empty(meta["shape"], dtype=meta["dtype"]) for name, meta in self.output_meta.items()
        }
        self.scalars: dict[str, float] = spec.get("scalars", {})

    def poison(self) -> None:
        for arr in self.outputs.values():
            arr.view(np.uint32 if arr.itemsize == 4 else np.uint64).fill(
                POISON_BITS if arr.itemsize == 4 else 0x7FFCA5A5A5A5A5A5
            )

    def restore_inputs(self) -> None:
        for name, arr in self.inputs.items():
            np.copyto(arr, self.pristine[name])

    def call_args(self) -> list[Any]:
        values: list[Any] = []
        for a in self.args:
            if a["kind"] == "in":
                values.append(self.inputs[a["name"]].ctypes.data)
            elif a["kind"] == "out":
                values.append(self.outputs[a["name"]].ctypes.data)
            elif a["kind"] == "size":
                values.append(self.sizes[a["name"]])
            else:
                values.append(self.scalars[a["name"]])
        return values

    def reference_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for a in self.args:
            if a["kind"] == "in":
                kwargs[a["name"]] = self.inputs[a["name"]]
            elif a["kind"] == "size":
                kwargs[a["name"]] = self.sizes[a["name"]]
            elif a["kind"] == "scalar":
                kwargs[a["name"]] = np.float32(self.scalars[a["name"]])
        return kwargs


class Progress:
    """Unbuffered markers, so the parent knows which case was running when the process died."""

    def __init__(self, path: Path) -> None:
        self._fh = path.open("w", buffering=1)

    def mark(self, text: str) -> None:
        self._fh.write(text + "\n")
        self._fh.flush()


def _guard_fork(pid0: int) -> None:
    # A kernel that forked returns twice; the copy must vanish silently, the parent reports the fork.
    if os.getpid() != pid0:
        os._exit(0)


def _has_children() -> bool:
    try:
        return os.waitpid(-1, os.WNOHANG) is not None
    except ChildProcessError:
        return False


def run_test(job: dict[str, Any], work: Path, progress: Progress) -> dict[str, Any]:
    kernel = _load_kernel(job["libraries"]["candidate"], job["args"])
    cases = [Case(c, job["args"], work) for c in job["cases"]]
    dropped = drop_privileges()
    pid0 = os.getpid()
    results = []
    for index, case in enumerate(cases):
        case.poison()
        before = {name: _digest(arr) for name, arr in case.inputs.items()}
        progress.mark(f"start {index} {case.name}")
        t0 = time.perf_counter()
        kernel(*case.call_args())
        seconds = time.perf_counter() - t0
        _guard_fork(pid0)
        progress.mark(f"end {index} {case.name}")
        if _has_children():
            return {"fatal": "fork", "case": case.name}
        files = {}
        for name, arr in case.outputs.items():
            out_file = f"out_{index}_{name}.bin"
            arr.tofile(work / out_file)
            files[name] = out_file
        results.append({
            "name": case.name,
            "seconds": seconds,
            "outputs": files,
            "inputs_modified": [n for n, arr in case.inputs.items() if _digest(arr) != before[n]],
        })
    return {"cases": results, "privileges_dropped": dropped}


def _load_reference(task_folder: str) -> Any:
    spec = importlib.util.spec_from_file_location("kope_reference", Path(task_folder) / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # An optional benchmark() is what gets timed (a KernelBench import's float32 forward); reference() checks.
    return getattr(module, "benchmark", module.reference)


def _calibrate(call: Any, before: Any, target_s: float) -> tuple[int, float]:
    """How many back-to-back calls make one sample of about ``target_s``."""
    before()
    t0 = time.perf_counter()
    call()
    single = max(time.perf_counter() - t0, 1e-7)
    return max(1, min(10_000, math.ceil(target_s / single))), single


def _relative_iqr(samples: list[float]) -> float:
    q1, q3 = np.percentile(samples, [25, 75])
    median = float(np.median(samples))
    return float((q3 - q1) / median) if median > 0 else math.inf


def run_profile(job: dict[str, Any], work: Path, progress: Progress) -> dict[str, Any]:
    case = Case(job["cases"][0], job["args"], work)
    impls: dict[str, Any] = {}
    for name, path in job["libraries"].items():
        fn = _load_kernel(path, job["args"])
        impls[name] = (lambda f: lambda: f(*case.call_args()))(fn)
    if job.get("task_folder"):
        reference = _load_reference(job["task_folder"])
        impls["reference"] = lambda: reference(**case.reference_kwargs())
        # One call while the interpreter can still read everything: a reference that imports lazily (torch for
        # erf, a KernelBench model) cannot load those modules once we are `nobody` and the stdlib is unreadable.
        impls["reference"]()
    cpu = job.get("pin_cpu")
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    drop_privileges()
    pid0 = os.getpid()
    cap, target = float(job["time_cap_s"]), float(job.get("sample_target_s", 0.002))
    min_rounds, max_rounds, rel_iqr_goal = int(job.get("min_rounds", 7)), int(job.get("max_rounds", 5000)), 0.02

    progress.mark("warmup")
    inner: dict[str, int] = {}
    for name, call in impls.items():
        case.poison()
        inner[name], _ = _calibrate(call, case.restore_inputs, target)
        _guard_fork(pid0)
    samples: dict[str, list[float]] = {name: [] for name in impls}
    order = list(impls)
    start = time.perf_counter()
    rounds = 0
    progress.mark("measure")
    while rounds < max_rounds:
        # Rotate the order every round so no implementation always runs right after another one.
        for name in order[rounds % len(order):] + order[: rounds % len(order)]:
            call, n = impls[name], inner[name]
            case.restore_inputs()
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            samples[name].append((time.perf_counter() - t0) / n)
            _guard_fork(pid0)
        rounds += 1
        elapsed = time.perf_counter() - start
        if rounds >= min_rounds and (
            elapsed >= cap or all(_relative_iqr(samples[k]) <= rel_iqr_goal for k in ("candidate", "baseline")
                                  if k in samples)
        ):
            break
    if _has_children():
        return {"fatal": "fork", "case": case.name}
    return {
        "samples": samples,
        "inner": inner,
        "rounds": rounds,
        "seconds": time.perf_counter() - start,
        "cpus": sorted(os.sched_getaffinity(0)),
    }


def main(argv: list[str]) -> int:
    job_path = Path(argv[1])
    work = job_path.parent
    job = json.loads(job_path.read_text())
    progress = Progress(work / "progress.txt")
    result = run_test(job, work, progress) if job["mode"] == "test" else run_profile(job, work, progress)
    tmp = work / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, work / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
