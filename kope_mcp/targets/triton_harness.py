"""The child side of run_tests for the ``triton`` target: import the user's module, call its launcher per case.

Runs in the sandbox like :mod:`kope_mcp.runtime.harness` (same job file, same result descriptor and trailer, same guard
zones around every buffer), with torch and triton imported before the user's module. On the CPU, with
``TRITON_INTERPRET=1``, the tensors are numpy buffers shared with torch (``torch.from_numpy``), so the guard
zones around them catch an unmasked tail that the interpreter would not fault on. On a GPU every buffer is a
device allocation with device-side guard zones, copied back and checked after the call.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from kope_mcp.runtime.harness import CANARY, GUARD_BYTES, Channel, InputSet, LoadError, ResultWriter

MODULE_NAME = "kope_kernel"


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
        self.torch.cuda.synchronize()
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


def call_kwargs(case: InputSet, tensors: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for a in case.args:
        if a["kind"] in ("in", "out"):
            kwargs[a["name"]] = tensors[a["name"]]
        elif a["kind"] == "size":
            kwargs[a["name"]] = int(case.sizes[a["name"]])
        else:
            kwargs[a["name"]] = float(case.scalars[a["name"]])
    return kwargs


def run_test(job: dict[str, Any], folder: Path, out: ResultWriter, progress: Channel) -> dict[str, Any]:
    import torch
    import triton  # noqa: F401  (imported before the user's module, as its own `import triton` expects)

    on_gpu = job.get("device") == "cuda"
    sets = [InputSet(c, job["args"], folder) for c in job["cases"]]
    path = job["libraries"]["candidate"]
    module = load_module(path)
    results = []
    for index, case in enumerate(sets):
        outputs = case.poisoned_outputs()
        progress.mark(f"start {index} {case.name}")
        device = DeviceCase(torch, case) if on_gpu else None
        if device is not None:
            device.outputs(outputs)
            tensors = device.tensors
        else:
            tensors = {n: torch.from_numpy(a) for n, a in [*case.inputs.items(), *outputs.items()]}
        t0 = time.perf_counter()
        try:
            module.kernel(**call_kwargs(case, tensors))
            stray = device.fetch(outputs) if device is not None else case.guards.stray_writes()
        except Exception as exc:  # the kernel's own error (a bad launch, an interpreter fault) is its crash
            where = user_lines(exc, path)
            return {"fatal": "crash", "case": case.name,
                    "message": f"case {case.name!r} {case.sizes}: {type(exc).__name__}: {str(exc)[:600]}"
                               f"{' at ' + where if where else ''}"}
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
