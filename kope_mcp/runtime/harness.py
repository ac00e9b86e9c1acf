"""The child side of run_tests (and, through harness_profile, of profile_kernel): load a kernel library, call it.

Runs inside the sandbox as the run's own unprivileged identity from its first instruction
(``python -S -m kope_mcp.runtime.harness JOB.json``): no kernel byte (constructors and IFUNC resolvers included) runs
before that, because the sandbox set the identity before this interpreter started. It reports only through
descriptors the server opened and passed in (``result``: outputs and a JSON trailer; ``progress``: which case is
running; ``timing``: one line before and after every timed batch, stamped by the trusted timekeeper).

It trusts nothing the kernel does, and the server trusts nothing it reports without checking: outputs are judged
by the server against a reference the child never sees, and timings are corroborated by the stamps.
Only numpy and the standard library are imported, all before the first kernel library is loaded.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kope_mcp.runtime import sandbox_seccomp

_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int32": ctypes.c_int32, "int64": ctypes.c_int64}
POISON_BITS = 0x7FE5A5A5  # a quiet NaN with a payload no arithmetic produces: "never written"
POISON_BITS_64 = 0x7FFCA5A5A5A5A5A5
TRAILER_MAGIC = b"KOPERES1"
# Every buffer a kernel gets during run_tests sits between two guard zones filled with a canary byte, checked after
# each call: a write past either end (an unmasked tail, an off-by-one) is reported even where it would not fault.
GUARD_BYTES = 64 * 1024
CANARY = 0xC3


class LoadError(Exception):
    pass


def _load_kernel(path: str, args: list[dict[str, Any]]) -> Any:
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        fn = lib.kernel
    except (OSError, AttributeError) as exc:
        raise LoadError(str(exc).replace(path, Path(path).name)) from exc
    fn.restype = None
    argtypes: list[Any] = [ctypes.c_void_p if a["kind"] in ("in", "out") else _CTYPES[a["dtype"]] for a in args]
    fn.argtypes = argtypes
    return fn


def poison(arr: np.ndarray) -> None:
    if arr.itemsize == 4:
        arr.view(np.uint32).fill(POISON_BITS)
    elif arr.itemsize == 8:
        arr.view(np.uint64).fill(POISON_BITS_64)
    else:
        arr.fill(0)


class ResultWriter:
    """Raw arrays appended to the result descriptor, then a JSON trailer, its length and a magic."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.offset = 0

    def array(self, arr: np.ndarray) -> None:
        view = np.ascontiguousarray(arr).data.cast("B")
        while view:
            written = os.write(self.fd, view)
            self.offset += written
            view = view[written:]

    def finish(self, trailer: dict[str, Any]) -> None:
        data = json.dumps(trailer).encode()
        self.array(np.frombuffer(data + struct.pack("<Q", len(data)) + TRAILER_MAGIC, dtype=np.uint8))


class Channel:
    """An unbuffered line channel (progress markers, timing markers)."""

    def __init__(self, fd: int | None, ack_fd: int | None = None) -> None:
        self.fd = fd
        self.ack_fd = ack_fd

    def mark(self, text: str) -> None:
        if self.fd is not None:
            os.write(self.fd, (text + "\n").encode())

    def begin(self, name: str) -> None:
        """A batch begins: wait until the timekeeper stamped it, so the clock is read after the stamp."""
        self.mark(f"B {name}")
        if self.ack_fd is not None:
            os.read(self.ack_fd, 1)


class GuardedBuffers:
    """Arrays placed inside larger allocations with canary-filled guard zones before and after."""

    def __init__(self) -> None:
        self._zones: list[tuple[str, np.ndarray, int, int]] = []

    def empty(self, name: str, shape: list[int] | tuple[int, ...], dtype: str) -> np.ndarray:
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dt.itemsize
        full = np.empty(nbytes + 2 * GUARD_BYTES, dtype=np.uint8)
        full[:GUARD_BYTES] = CANARY
        full[GUARD_BYTES + nbytes:] = CANARY
        self._zones.append((name, full, nbytes, dt.itemsize))
        return full[GUARD_BYTES:GUARD_BYTES + nbytes].view(dt).reshape(shape)

    def stray_writes(self) -> list[str]:
        """'name after its end (+k elements)' for every buffer whose guard zones changed."""
        found = []
        for name, full, nbytes, itemsize in self._zones:
            before = np.flatnonzero(full[:GUARD_BYTES] != CANARY)
            after = np.flatnonzero(full[GUARD_BYTES + nbytes:] != CANARY)
            if before.size:
                found.append(f"{name} before its start (-{(GUARD_BYTES - int(before[0]) + itemsize - 1) // itemsize}"
                             " elements)")
            if after.size:
                found.append(f"{name} after its end (+{int(after[-1]) // itemsize + 1} elements)")
        return found


def _pread_into(fd: int, target: memoryview, offset: int) -> int:
    done = 0
    while done < len(target):  # one read returns at most ~2 GiB
        n = os.preadv(fd, [target[done:]], offset + done)
        if n <= 0:
            break
        done += n
    return done


class InputSet:
    """One case's inputs, read from the job's folder (``file``) or, for a profile, from the descriptor the server
    passed (``offset`` into ``data_fd``: the pool is no file a kernel could open). ``load=False``: only the shapes
    until :meth:`load` (a profile's coordinator forks the candidate before any input is in its memory)."""

    def __init__(self, spec: dict[str, Any], args: list[dict[str, Any]], folder: Path, *,
                 kernels_see_these: bool = True, data_fd: int | None = None, load: bool = True) -> None:
        self.name: str = spec["name"]
        self.sizes: dict[str, int] = spec["sizes"]
        self.args = args
        self.guards = GuardedBuffers()
        self.input_meta: dict[str, dict[str, Any]] = spec["inputs"]
        self.folder, self.data_fd, self.kernels_see_these = folder, data_fd, kernels_see_these
        self.inputs: dict[str, np.ndarray] = {}
        self.pristine: dict[str, np.ndarray] = {}
        self.output_meta: dict[str, dict[str, Any]] = spec["outputs"]
        self.scalars: dict[str, float] = spec.get("scalars", {})
        if load:
            self.load()

    def load(self) -> None:
        for name, meta in self.input_meta.items():
            arr = self.guards.empty(name, meta["shape"], meta["dtype"])
            target = arr.reshape(-1).view(np.uint8).data
            if "offset" in meta:
                if self.data_fd is None:
                    raise ValueError(f"input {name}: no descriptor to read it from")
                got = _pread_into(self.data_fd, target, int(meta["offset"]))
            else:
                with open(self.folder / meta["file"], "rb") as fh:  # straight into the guarded buffer: no temporary
                    got = fh.readinto(target)
            if got != arr.nbytes:
                raise ValueError(f"input {name}: shorter than its {arr.nbytes} bytes")
            self.inputs[name] = arr
        # A kernel may write into its inputs: keep a copy to tell. Where kernels only see copies of these (the
        # profiler's regions), they stay pristine themselves and a second copy of every input would be waste.
        self.pristine = ({name: arr.copy() for name, arr in self.inputs.items()} if self.kernels_see_these
                         else self.inputs)

    def new_outputs(self, *, guarded: bool = True) -> dict[str, np.ndarray]:
        """Fresh output arrays; ``guarded`` ones sit between guard zones (run_tests). The profiler's many
        per-call buffers are not: the candidate's are checked by the coordinator, the copies here are its own."""
        if not guarded:
            return {name: np.empty(meta["shape"], dtype=meta["dtype"]) for name, meta in self.output_meta.items()}
        return {name: self.guards.empty(name, meta["shape"], meta["dtype"]) for name, meta in self.output_meta.items()}

    def poisoned_outputs(self) -> dict[str, np.ndarray]:
        """Fresh guarded outputs filled with the poison, for one call."""
        outputs = self.new_outputs()
        for arr in outputs.values():
            poison(arr)
        return outputs

    def output_bytes(self) -> int:
        return sum(int(np.prod(m["shape"])) * np.dtype(m["dtype"]).itemsize for m in self.output_meta.values())

    def modified_inputs(self) -> list[str]:
        return [n for n, arr in self.inputs.items() if not np.array_equal(arr, self.pristine[n], equal_nan=True)]

    def call_args(self, outputs: dict[str, np.ndarray]) -> list[Any]:
        values: list[Any] = []
        for a in self.args:
            if a["kind"] == "in":
                values.append(self.inputs[a["name"]].ctypes.data)
            elif a["kind"] == "out":
                values.append(outputs[a["name"]].ctypes.data)
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


def _guard_fork(pid0: int) -> None:
    # A kernel that forked returns twice; the copy must vanish silently, the parent reports the fork.
    if os.getpid() != pid0:
        os._exit(0)


def _has_children() -> bool:
    try:
        return os.waitpid(-1, os.WNOHANG) is not None
    except ChildProcessError:
        return False


def run_test(job: dict[str, Any], folder: Path, out: ResultWriter, progress: Channel) -> dict[str, Any]:
    if job.get("pin_cpu") is not None:
        os.sched_setaffinity(0, {int(job["pin_cpu"])})
    sets = [InputSet(c, job["args"], folder) for c in job["cases"]]
    # As in a profile: the kernel signals and reaches only its own process.
    sandbox_seccomp.confine_to_self(bytes.fromhex(job["worker_filter"]) if job.get("worker_filter") else None)
    kernel = _load_kernel(job["libraries"]["candidate"], job["args"])
    pid0 = os.getpid()
    results = []
    for index, case in enumerate(sets):
        outputs = case.poisoned_outputs()
        progress.mark(f"start {index} {case.name}")
        t0 = time.perf_counter()
        kernel(*case.call_args(outputs))
        seconds = time.perf_counter() - t0
        _guard_fork(pid0)
        progress.mark(f"end {index} {case.name}")
        if _has_children():
            return {"fatal": "fork", "case": case.name}
        for name in case.output_meta:
            out.array(outputs[name])
        results.append({"name": case.name, "seconds": seconds, "inputs_modified": case.modified_inputs(),
                        "out_of_bounds": case.guards.stray_writes()})
    return {"cases": results}


def _load_reference(task_folder: str) -> Any:
    spec = importlib.util.spec_from_file_location("kope_reference", Path(task_folder) / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # An optional benchmark() is what gets timed (a KernelBench import's float32 forward); reference() checks.
    return getattr(module, "benchmark", module.reference)


def _omp_team_size() -> int | None:
    """The OpenMP team size this process would run with (what ran, not what the flags suggest)."""
    try:
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return None  # no OpenMP runtime was loaded: the kernel is single-threaded
    fn = gomp.omp_get_max_threads
    fn.restype = ctypes.c_int
    return int(fn())


def main(argv: list[str], run: Callable[..., dict[str, Any]] | None = None) -> int:
    """Run the job file ``argv[1]``: a test run here; a profile's coordinator (:mod:`kope_mcp.runtime.harness_profile`)
    passes its own ``run``, which gets the timing channel too."""
    job_path = Path(argv[1])
    job = json.loads(job_path.read_text())
    fds = job["fds"]
    out = ResultWriter(fds["result"])
    progress = Channel(fds.get("progress"))
    try:
        if run is None:
            result = run_test(job, job_path.parent, out, progress)
        else:
            result = run(job, job_path.parent, out, progress, Channel(fds.get("timing"), fds.get("ack")))
    except LoadError as exc:
        result = {"fatal": "load_error", "message": str(exc)}
    out.finish(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
