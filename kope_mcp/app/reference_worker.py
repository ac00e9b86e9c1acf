"""The sandbox side of a task's reference: import a task folder's reference.py, make inputs, compute outputs.

Runs where kernels run (``python -m kope_mcp.app.reference_worker JOB``, in the sandbox: its own identity, no home, no
network), for every task folder that is not part of the package: the server never imports such a reference.py.
Writes the arrays ``<i>/in/<name>`` and ``<i>/out/<k>`` raw to the result descriptor, then a manifest (per request
its case and seed, or the error that stopped it; where each array lies). The server maps that file and checks every
array's dtype and shape against task.toml before using any of it.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from kope_mcp.runtime.worker_formats import REFERENCE_MAGIC

MAGIC = REFERENCE_MAGIC


def _pool_count(first_bytes: int, first_seconds: float, rule: dict[str, Any]) -> int:
    by_memory = int(rule["pool_bytes"]) // max(1, first_bytes)
    by_time = int(float(rule["time_budget_s"]) / max(first_seconds, 1e-6))
    return max(int(rule["min"]), min(int(rule["max"]), by_memory, by_time))


def compute(job: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from kope_mcp.errors import InvalidTaskError
    from kope_mcp.tasks.loader import load_task
    from kope_mcp.tasks.spec import CaseSpec

    arrays: dict[str, np.ndarray] = {}
    results: list[dict[str, Any]] = []
    try:
        task = load_task(Path(job["task_folder"]))
        items: list[tuple[CaseSpec, int]] = [(CaseSpec.model_validate(r["case"]), int(r["seed"]))
                                             for r in job.get("requests", [])]
        pool = job.get("pool")
        count = len(items) if pool is None else 1
        if pool is not None:
            items = [(CaseSpec.model_validate(pool["case"]), int(pool["seed"]))]
        index = 0
        while index < count:
            case, seed = items[index] if pool is None else (items[0][0], items[0][1] + index)
            inputs = task.case_inputs(case, seed)
            t0 = time.thread_time()
            expected = task.run_reference(inputs, case.sizes)
            if pool is not None and index == 0:
                out_bytes = sum(int(a.nbytes) for a in expected) // 2  # float64 here, the kernel's dtype there
                count = _pool_count(sum(a.nbytes for a in inputs.values()) + out_bytes,
                                    time.thread_time() - t0, pool["rule"])
            for name, arr in inputs.items():
                arrays[f"{index}/in/{name}"] = arr
            for k, arr in enumerate(expected):
                arrays[f"{index}/out/{k}"] = arr
            results.append({"case": case.name, "seed": seed, "inputs": sorted(inputs), "outputs": len(expected)})
            index += 1
    except InvalidTaskError as exc:
        return {"error": str(exc)}, {}
    except Exception as exc:  # the task's own code may raise anything: say where, in its files
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(job["task_folder"])]
        where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        return {"error": f"the task's reference raised {type(exc).__name__}{where}: {str(exc)[:500]}"}, {}
    return {"results": results}, arrays


def write_result(fd: int, manifest: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Raw arrays one after another, then the manifest (JSON: each array's key, dtype, shape, offset), its
    length and MAGIC: the server maps the file and reads the arrays in place."""
    entries, offset = [], 0
    for key, arr in arrays.items():
        data = memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
        _write_all(fd, data)
        entries.append({"key": key, "dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset,
                        "nbytes": len(data)})
        offset += len(data)
    tail = json.dumps({**manifest, "arrays": entries}).encode()
    _write_all(fd, memoryview(tail + struct.pack("<Q", len(tail)) + MAGIC))


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data[: 1 << 26]):]


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[1]).read_text())
    manifest, arrays = compute(job)
    write_result(int(job["result_fd"]), manifest, arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
