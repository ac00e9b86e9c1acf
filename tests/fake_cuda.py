"""The GPU profile's coordinator and workers (targets/gpu_profile_harness.py) on the CPU, with torch's CUDA calls
stood in for: a GPU cannot exist here. Tensors stay on the CPU, events read the host clock, the driver's
synchronisation does nothing; everything else (the fork per implementation, SIGSTOP/SIGCONT turns, poison, the
protocol, the thread and fork checks, the coordinator's reads of the candidate's memory) is the real code.

    python -m tests.fake_cuda JOB.json     JOB: {"candidate": source, "baseline": source, "sets": N, "n": size}

prints the coordinator's result as JSON, with ``anchors_poisoned``: how many checked sets came back unwritten.
With ``"mode": "test"`` it runs run_tests' GPU path (targets/gpu_harness.py, device buffers between guard zones)
on ``sizes`` (a list of n) instead, and prints its result.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kope_mcp.runtime.harness import POISON_BITS, Channel, ResultWriter
from kope_mcp.targets import gpu_harness
from kope_mcp.targets import gpu_profile_harness as harness
from kope_mcp.targets.native_runner import PreparedCase, _split_result, _write_cases
from kope_mcp.tasks.registry import TaskRegistry


def _on_cpu(fn: Any) -> Any:
    def made(*args: Any, device: Any = None, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    return made


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _Event) -> float:
        return (other.t - self.t) * 1e3


class _Driver:
    def synchronize(self) -> None:
        pass


def stand_in() -> None:
    torch.empty, torch.full, torch.zeros, torch.rand = map(_on_cpu, (torch.empty, torch.full, torch.zeros, torch.rand))
    torch.Tensor.cuda = lambda self, *a, **k: self.clone()  # type: ignore[method-assign]
    torch.cuda.is_available = lambda: True
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(L2_cache_size=1 << 20)
    torch.cuda.Event = _Event  # type: ignore[misc,assignment]

    def start_device() -> tuple[Any, Any]:
        return torch, _Driver()

    gpu_harness.start_device = start_device
    harness.start_device = start_device
    harness.measure_roof = lambda torch, pool: {"bandwidth_gbps": 100.0, "fp32_gflops": 50.0, "l2_bytes": 1 << 20}


def run_tests(spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    task = TaskRegistry.default().get("vector_add")
    rng = np.random.default_rng(0)
    cases = [PreparedCase(f"n{n}", {"n": n}, {"a": rng.random(n, dtype=np.float32),
                                              "b": rng.random(n, dtype=np.float32)}) for n in spec["sizes"]]
    (folder / "candidate.py").write_text(spec["candidate"])
    job = {"mode": "test", "kind": "triton", "device": "cuda",
           "args": [{"name": a.name, "kind": a.kind, "dtype": a.dtype} for a in task.spec.args],
           "cases": _write_cases(task, cases, folder), "libraries": {"candidate": str(folder / "candidate.py")}}
    out = ResultWriter(os.memfd_create("result"))
    return gpu_harness.run_test(job, folder, out, Channel(None))


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    stand_in()
    folder = Path(tempfile.mkdtemp(prefix="kope-fake-cuda-"))
    if spec.get("mode") == "test":
        print(json.dumps(run_tests(spec, folder), default=str))
        return 0
    task = TaskRegistry.default().get("vector_add")
    rng = np.random.default_rng(0)
    n = int(spec.get("n", 4096))
    sets = [PreparedCase(f"p#{i}", {"n": n}, {"a": rng.random(n, dtype=np.float32),
                                              "b": rng.random(n, dtype=np.float32)}) for i in range(spec["sets"])]
    for name in ("candidate", "baseline"):
        (folder / f"{name}.py").write_text(spec[name])
    job = {"mode": "profile", "kind": "triton", "args": [{"name": a.name, "kind": a.kind, "dtype": a.dtype}
                                                        for a in task.spec.args],
           "cases": _write_cases(task, sets, folder),
           "libraries": {name: str(folder / f"{name}.py") for name in ("candidate", "baseline")},
           "time_cap_s": 0.3, "pid_namespace": False, "consistency_atol": 1e-6, "consistency_rtol": 1e-5,
           "min_rounds": 7, "worker_filter": None}
    fd = os.memfd_create("result")
    out = ResultWriter(fd)
    result = harness.run_profile(job, folder, out, Channel(None), Channel(None))
    out.finish(result)
    raw, _ = _split_result(os.pread(fd, os.fstat(fd).st_size, 0))
    words = np.frombuffer(raw, dtype=np.uint32)
    result["anchors_poisoned"] = int(np.sum(words.reshape(-1, n)[:, 0] == POISON_BITS)) if words.size else 0
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
