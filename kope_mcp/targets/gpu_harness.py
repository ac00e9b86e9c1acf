"""The child side of run_tests for the GPU targets: ``triton`` (a Python module's launcher ``kernel(...)``) and
``cuda`` (an nvcc-built library's ``extern "C" kernel(...)``, called through ctypes with device pointers).

Runs in the sandbox like :mod:`kope_mcp.runtime.harness` (same job file, same result descriptor and trailer, same
guard zones around every buffer). On a GPU, the device is initialised before the kernel is loaded: a device that
cannot be initialised is the server's fault (``device_unavailable``), never the kernel's crash. Every buffer is a
device allocation between device-side guard zones; this harness owns allocation, copies, launch and the
device-wide synchronisation after each call, and names a CUDA error the call caused (``CUDA_ERROR_ILLEGAL_ADDRESS``)
with its case. On the CPU, with ``TRITON_INTERPRET=1``, a Triton launcher gets numpy buffers shared with torch
(``torch.from_numpy``), so the guard zones catch an unmasked tail the interpreter would not fault on.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kope_mcp.runtime.harness import CANARY, GUARD_BYTES, Channel, InputSet, LoadError, ResultWriter, _load_kernel

MODULE_NAME = "kope_kernel"


class DeviceUnavailable(Exception):
    """The GPU could not be initialised in this run: the server's fault, not the kernel's."""


class CudaFault(Exception):
    """A CUDA error the kernel's call caused (its name, e.g. CUDA_ERROR_ILLEGAL_ADDRESS, and description)."""


class Driver:
    """The CUDA driver API (``libcuda``), for the device-wide synchronisation and the names of its errors."""

    def __init__(self, path: str = "libcuda.so.1") -> None:
        self.lib = ctypes.CDLL(path)

    def describe(self, code: int) -> str:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        self.lib.cuGetErrorString(code, ctypes.byref(text))
        return (f"{(name.value or b'CUDA error %d' % code).decode()} "
                f"({(text.value or b'').decode(errors='replace')})")

    def synchronize(self) -> None:
        """Wait for all work of this process's context on the device, every stream; raise the error it ended in."""
        code = self.lib.cuCtxSynchronize()
        if code != 0:
            raise CudaFault(self.describe(code))


def start_device() -> tuple[Any, Driver]:
    """torch with its context on the assigned device, and the driver; raises DeviceUnavailable."""
    try:
        import torch

        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"torch {torch.__version__} sees no CUDA device in the run "
                                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        torch.zeros(1, device="cuda")
        driver = Driver()
        driver.synchronize()
    except DeviceUnavailable:
        raise
    except Exception as exc:  # any failure to bring the device up before a kernel is loaded is the server's
        raise DeviceUnavailable(f"{type(exc).__name__}: {str(exc).strip()[:400]}") from None
    return torch, driver


def user_lines(exc: BaseException, filename: str) -> str:
    """Where in the user's file an exception came from: 'line 12 (`tl.store(...)`)', innermost last."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        return f"line {exc.lineno}"
    return ", ".join(f"line {f.lineno} (`{(f.line or '').strip()[:80]}`)" for f in frames[-2:])


def load_module(path: str) -> Any:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's module may raise anything at import: that is its load error
        where = user_lines(exc, path)
        raise LoadError(f"importing kernel.py raised {type(exc).__name__}: {exc}"
                        f"{' at ' + where if where else ''}") from None
    if not callable(getattr(module, "kernel", None)):
        raise LoadError("kernel.py defines no function `kernel(...)` (the launcher taking the task's arguments)")
    return module


class Implementation:
    """One kernel as the harness calls it: ``call(tensors, sizes, scalars)`` launches it once."""

    def __init__(self, kind: str, path: str, args: list[dict[str, Any]]) -> None:
        self.kind, self.path, self.args = kind, path, args
        self.launch_error: Callable[[], int] | None = None
        if kind == "cuda":
            self.fn = _load_kernel(path, args)
            lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            # The build adds kope_last_error() (cudaGetLastError of the library's own runtime): a launch the
            # runtime refused (too many threads, too much shared memory) never reaches the device.
            probe = getattr(lib, "kope_last_error", None)
            if probe is not None:
                probe.restype, probe.argtypes = ctypes.c_int, []
                self.launch_error = probe
        else:
            self.module = load_module(path)

    def call(self, tensors: dict[str, Any], sizes: dict[str, int], scalars: dict[str, float]) -> None:
        if self.kind == "cuda":
            values: list[Any] = []
            for a in self.args:
                if a["kind"] in ("in", "out"):
                    values.append(tensors[a["name"]].data_ptr())
                elif a["kind"] == "size":
                    values.append(int(sizes[a["name"]]))
                else:
                    values.append(float(scalars[a["name"]]))
            self.fn(*values)
            if self.launch_error is not None and (code := self.launch_error()) != 0:
                name = _RUNTIME_ERRORS.get(code, "see cudaError_t in the CUDA runtime API")
                raise CudaFault(f"the launch failed: cudaError {code} ({name})")
            return
        kwargs: dict[str, Any] = {}
        for a in self.args:
            if a["kind"] in ("in", "out"):
                kwargs[a["name"]] = tensors[a["name"]]
            elif a["kind"] == "size":
                kwargs[a["name"]] = int(sizes[a["name"]])
            else:
                kwargs[a["name"]] = float(scalars[a["name"]])
        self.module.kernel(**kwargs)

    def where(self, exc: BaseException) -> str:
        found = user_lines(exc, self.path) if self.kind != "cuda" else ""
        return f" at {found}" if found else ""


# The cudaError_t values a refused launch gives most often (the library's runtime is static: its names are not ours
# to look up).
_RUNTIME_ERRORS = {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 9: "cudaErrorInvalidConfiguration",
                   98: "cudaErrorInvalidDeviceFunction", 209: "cudaErrorNoKernelImageForDevice",
                   700: "cudaErrorIllegalAddress", 701: "cudaErrorLaunchOutOfResources", 719: "cudaErrorLaunchFailure"}


class DeviceCase:
    """One case's buffers on a CUDA device, each between device-side guard zones."""

    def __init__(self, torch: Any, case: InputSet) -> None:
        self.torch, self.case = torch, case
        self.full: dict[str, tuple[Any, int]] = {}
        self.tensors: dict[str, Any] = {}
        for name, arr in case.inputs.items():
            self.tensors[name] = self._alloc(name, arr)

    def _alloc(self, name: str, host: np.ndarray) -> Any:
        torch = self.torch
        nbytes = host.nbytes
        full = torch.full((nbytes + 2 * GUARD_BYTES,), CANARY, dtype=torch.uint8, device="cuda")
        view = full[GUARD_BYTES:GUARD_BYTES + nbytes]
        view.copy_(torch.from_numpy(np.ascontiguousarray(host).view(np.uint8).reshape(-1)))
        self.full[name] = (full, nbytes)
        return view.view(getattr(torch, str(host.dtype))).reshape(host.shape)

    def outputs(self, host_outputs: dict[str, np.ndarray]) -> None:
        for name, arr in host_outputs.items():
            self.tensors[name] = self._alloc(name, arr)

    def fetch(self, host_outputs: dict[str, np.ndarray]) -> list[str]:
        """Copy outputs and inputs back (for the input check) and return the stray writes."""
        for name, arr in [*host_outputs.items(), *self.case.inputs.items()]:
            arr.reshape(-1)[:] = self.tensors[name].reshape(-1).cpu().numpy()
        stray = []
        for name, (full, nbytes) in self.full.items():
            host = full.cpu().numpy()
            if (host[:GUARD_BYTES] != CANARY).any():
                stray.append(f"{name} before its start")
            if (host[GUARD_BYTES + nbytes:] != CANARY).any():
                stray.append(f"{name} after its end")
        return stray


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def run_test(job: dict[str, Any], folder: Path, out: ResultWriter, progress: Channel) -> dict[str, Any]:
    on_gpu = job.get("device") == "cuda"
    driver: Driver | None = None
    if on_gpu:
        try:
            torch, driver = start_device()
        except DeviceUnavailable as exc:
            return {"fatal": "device_unavailable", "message": str(exc)}
    else:
        import torch
    if job.get("kind", "triton") == "triton":
        import triton  # noqa: F401  (imported before the user's module, as its own `import triton` expects)
    sets = [InputSet(c, job["args"], folder) for c in job["cases"]]
    impl = Implementation(job.get("kind", "triton"), job["libraries"]["candidate"], job["args"])
    results = []
    for index, case in enumerate(sets):
        outputs = case.poisoned_outputs()
        progress.mark(f"start {index} {case.name}")
        device = DeviceCase(torch, case) if on_gpu else None
        if device is not None:
            device.outputs(outputs)
            tensors = device.tensors
            assert driver is not None
            driver.synchronize()
        else:
            tensors = {n: torch.from_numpy(a) for n, a in [*case.inputs.items(), *outputs.items()]}
        t0 = time.perf_counter()
        try:
            before = _threads()
            impl.call(tensors, case.sizes, case.scalars)
            # Not on the first call: torch, Triton and the driver start threads of their own then.
            if index and (running := _threads()) > before:
                return {"fatal": "crash", "case": case.name,
                        "message": f"case {case.name!r} {case.sizes}: kernel() returned with {running - before} more "
                                   "host thread(s) running than before: launch and finish the work in the calling "
                                   "thread (profile_kernel times only until kernel() returns and the device is idle)"}
            if driver is not None:
                driver.synchronize()
            stray = device.fetch(outputs) if device is not None else case.guards.stray_writes()
        except CudaFault as exc:
            return {"fatal": "crash", "case": case.name,
                    "message": f"case {case.name!r} {case.sizes}: {exc}"}
        except Exception as exc:  # the kernel's own error (a bad launch, an interpreter fault) is its crash
            return {"fatal": "crash", "case": case.name,
                    "message": f"case {case.name!r} {case.sizes}: {type(exc).__name__}: {str(exc)[:600]}"
                               f"{impl.where(exc)}"}
        seconds = time.perf_counter() - t0
        progress.mark(f"end {index} {case.name}")
        for name in case.output_meta:
            out.array(outputs[name])
        results.append({"name": case.name, "seconds": seconds, "inputs_modified": case.modified_inputs(),
                        "out_of_bounds": stray})
    return {"cases": results}


def main(argv: list[str]) -> int:
    job_path = Path(argv[1])
    job = json.loads(job_path.read_text())
    fds = job["fds"]
    out = ResultWriter(fds["result"])
    try:
        result = run_test(job, job_path.parent, out, Channel(fds.get("progress")))
    except LoadError as exc:
        result = {"fatal": "load_error", "message": str(exc)}
    out.finish(result)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main(sys.argv))
