"""The child side of profile_kernel for the GPU targets: the contract's protocol (measurement.py) on a CUDA device.

As for C (:mod:`kope_mcp.runtime.harness_profile`), the coordinator (this process: it never loads a kernel and
never touches the device) forks one worker per implementation before anything initialises CUDA, and resumes one
worker at a time for one sample (SIGCONT ... SIGSTOP). Each worker gives the device a context of its own, holds
every input set in device memory, and times one call per sample:

- **before the sample** (outside the stamped window): the output buffer poisoned on the device when the protocol
  asks, then the L2 flushed by writing a buffer of at least twice its size, and the device synchronised;
- **the sample**: a CUDA event, the call, a device-wide synchronisation of the worker's context (``cuCtxSynchronize``:
  work the kernel left on another stream counts, and a kernel that never finishes is a timeout), a second event.
  The claim is the events' interval, inside the window the trusted timekeeper stamped (targets/timing.py);
- **after the sample**: any host thread the call left running (counted as the call returns and again after the
  sample) ends the measurement (``tampered``: work must be done when ``kernel()`` returns), and the candidate's
  output is copied into host memory the coordinator reads from outside the process (``process_vm_readv``), where
  every timed call is checked.

The baseline's worker (trusted code) also measures the device's roof once per profile, best of several probes:
the copy bandwidth of a buffer far larger than L2 and torch's float32 matmul (TF32 off). A result past it is
suspect (services/verdicts.py). NVML's clocks and slowdowns are read around the measurement.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from kope_mcp.runtime import sandbox_seccomp
from kope_mcp.runtime.harness import POISON_BITS, POISON_BITS_64, Channel, InputSet, ResultWriter, main
from kope_mcp.runtime.harness_guard import Scheduling, TamperedError
from kope_mcp.runtime.harness_profile import (
    _COMMAND_CAP,
    CandidateBuffers,
    ForkedError,
    MemoryAccessError,
    Region,
    Worker,
    WorkerDied,
    _describe,
    _dumpable,
    _end,
    _other_processes,
    fork_worker,
)
from kope_mcp.runtime.measurement import Consistency, Schedule, measure
from kope_mcp.targets.gpu_harness import CudaFault, DeviceUnavailable, Implementation, start_device
from kope_mcp.targets.nvml import read_clocks

MIN_FLUSH_BYTES = 64 * 1024**2


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


class DevicePool:
    """One implementation's input sets and output buffer in device memory, and the L2 flush."""

    def __init__(self, torch: Any, region: Region) -> None:
        self.torch, self.region = torch, region
        self.inputs = [{n: torch.from_numpy(region.view(("in", i, n))).cuda() for n in s.inputs}
                       for i, s in enumerate(region.sets)]
        self.outputs = [{n: torch.empty(tuple(m["shape"]), dtype=getattr(torch, m["dtype"]), device="cuda")
                         for n, m in region.sets[0].output_meta.items()} for _ in range(region.buffers)]
        l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0)
        self.flush_buffer = torch.empty(max(2 * l2, MIN_FLUSH_BYTES) // 4, dtype=torch.int32, device="cuda")
        self.l2_bytes = l2

    def poison(self, n: int) -> None:
        for b in range(n):
            for t in self.outputs[b].values():
                if t.element_size() == 4:
                    t.view(self.torch.int32).fill_(POISON_BITS)
                elif t.element_size() == 8:
                    t.view(self.torch.int64).fill_(POISON_BITS_64)
                else:
                    t.zero_()

    def flush(self) -> None:
        self.flush_buffer.zero_()

    def tensors(self, set_index: int, b: int) -> dict[str, Any]:
        return {**self.inputs[set_index], **self.outputs[b]}

    def copy_out(self, n: int) -> None:
        """The first ``n`` outputs into the host region, where the coordinator reads them."""
        for b in range(n):
            for name, t in self.outputs[b].items():
                self.region.view(("out", b, name))[...] = t.cpu().numpy()

    def copy_inputs_back(self) -> None:
        for i, tensors in enumerate(self.inputs):
            for name, t in tensors.items():
                self.region.view(("in", i, name))[...] = t.cpu().numpy()


def measure_roof(torch: Any, pool: DevicePool) -> dict[str, float]:
    """The device's copy bandwidth (GB/s, read + write) and float32 matmul rate (GFLOP/s), best of a few probes."""
    best_bw = best_flops = 0.0
    size = max(8 * pool.l2_bytes, 512 * 1024**2) // 4
    src = torch.empty(size, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    n = 8192
    a = torch.rand(n, n, device="cuda")
    b = torch.rand(n, n, device="cuda")
    allow = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            best_bw = max(best_bw, 2 * src.numel() * 4 / (start.elapsed_time(end) / 1e3) / 1e9)
        for _ in range(4):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b)
            end.record()
            end.synchronize()
            best_flops = max(best_flops, 2 * n**3 / (start.elapsed_time(end) / 1e3) / 1e9)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow
        del src, dst, a, b
        torch.cuda.empty_cache()
    return {"bandwidth_gbps": round(best_bw, 1), "fp32_gflops": round(best_flops, 1), "l2_bytes": pool.l2_bytes}


def _reply(fd: int, text: str) -> None:
    os.write(fd, (" ".join(text.split()) + "\n").encode(errors="replace")[:4000])


def _serve(name: str, job: dict[str, Any], region: Region, timing: Channel, commands: int, replies: int) -> None:
    """A worker's life: bring up the device, load its implementation, then time samples on command. Never
    returns."""
    _dumpable(name == "candidate")
    sandbox_seccomp.confine_to_self(bytes.fromhex(job["worker_filter"]) if job.get("worker_filter") else None)
    # After a failure reply the worker waits to be ended (_idle): one that exited at once could be seen dead by the
    # coordinator before its reply was read, and a device the server could not bring up would read as a crash.
    try:
        torch, driver = start_device()
        region.fill_inputs()
        pool = DevicePool(torch, region)
        roof = measure_roof(torch, pool) if name == "baseline" else None
    except Exception as exc:  # before any kernel code: the device (or the server's pool on it) is at fault
        _reply(replies, f"U {exc if isinstance(exc, DeviceUnavailable) else f'{type(exc).__name__}: {exc}'}")
        _idle()
    before_load = _threads()
    sets = region.sets
    try:
        if job["kind"] == "triton":
            import triton  # noqa: F401  (before the user's module, as its own `import triton` expects)
        impl = Implementation(job["kind"], job["libraries"][name], job["args"])
        for _ in range(2):  # Triton compiles at its first call (ptxas runs then): never in a timed one
            impl.call(pool.tensors(0, 0), sets[0].sizes, sets[0].scalars)
            driver.synchronize()
    except CudaFault as exc:
        _reply(replies, f"C {exc}")
        _idle()
    except Exception as exc:  # the implementation's own failure to load or run once
        _reply(replies, f"L {type(exc).__name__}: {str(exc)[:600]}{impl_where(job, name, exc)}")
        _idle()
    left = 0  # threads the calls of the current sample left running as they returned

    def sample(chosen: list[int], poisoned: bool) -> tuple[int, int]:
        """One sample as the module's docstring says; (t0, the claimed end) by the monotonic clock."""
        nonlocal left
        if poisoned:
            pool.poison(len(chosen))
        pool.flush()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in chosen]
        timing.begin(name)
        t0 = time.monotonic_ns()
        for j, (i, (start, end)) in enumerate(zip(chosen, events, strict=True)):
            if j:
                pool.flush()
            before = _threads()
            start.record()
            impl.call(pool.tensors(i, j), sets[i].sizes, sets[i].scalars)
            # A thread the call started and that still runs as it returns (a lazy launch, a helper): counted now.
            left = max(left, _threads() - before)
            driver.synchronize()
            end.record()
            end.synchronize()
        t1 = time.monotonic_ns()
        claimed = min(t1, t0 + int(sum(start.elapsed_time(end) for start, end in events) * 1e6))
        timing.mark(f"E {name} {len(chosen)} {t0} {claimed}")
        # Every worker copies its outputs out, the candidate's for the coordinator to check, the others' to leave
        # the device and the host as the candidate's copy leaves them (A/A on vector_add read the candidate ~3%
        # slower when only its worker copied).
        pool.copy_out(len(chosen))
        return t0, claimed

    try:
        # Every path of a sample once before the threads are counted: what torch or the driver start lazily on
        # their first copy, fill or event is theirs, not the kernel's (warm-up batches precede the timing
        # stream's "M" and are not measured).
        sample([0], True)
        pool.copy_inputs_back()
    except Exception as exc:  # the kernel's own fault on a third call
        _reply(replies, f"C {exc if isinstance(exc, CudaFault) else f'{type(exc).__name__}: {str(exc)[:600]}'}")
        _idle()
    ready = _threads()
    roof_text = f" {roof['bandwidth_gbps']} {roof['fp32_gflops']} {roof['l2_bytes']}" if roof else ""
    _reply(replies, f"R {ready - before_load}{roof_text}")
    pid0 = os.getpid()
    source = os.fdopen(commands, "rb", buffering=0)
    while True:
        command = source.readline(_COMMAND_CAP).split()
        if command == [b"I"]:
            pool.copy_inputs_back()
            _reply(replies, "D 0 0")
            continue
        if len(command) not in (2, 3) or command[0] != b"S" or command[2:] not in ([], [b"P"]):
            os._exit(0)
        left = 0
        try:
            t0, claimed = sample([int(i) for i in command[1].split(b",")], command[2:] == [b"P"])
        except Exception as exc:  # the kernel's own error on a timed call
            _reply(replies, f"C {exc if isinstance(exc, CudaFault) else f'{type(exc).__name__}: {str(exc)[:600]}'}")
            _idle()
        if os.getpid() != pid0:
            os._exit(0)  # a kernel that forked returns twice: the copy vanishes, the coordinator sees the fork
        now = _threads()
        if left > 0 or now > ready:
            _reply(replies, f"T {ready} {max(now, ready + left)}")
            _idle()
        _reply(replies, f"D {t0} {claimed}")


def _idle() -> NoReturn:
    """After a fatal reply: wait to be ended (exiting at once could make the coordinator see a dead worker before it
    read the reply). Never returns."""
    while True:
        signal.pause()


def impl_where(job: dict[str, Any], name: str, exc: BaseException) -> str:
    if job["kind"] != "triton":
        return ""
    from kope_mcp.targets.gpu_harness import user_lines

    found = user_lines(exc, job["libraries"][name])
    return f" at {found}" if found else ""


class GpuFault(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class ThreadLeft(Exception):
    pass


def run_profile(job: dict[str, Any], folder: Path, out: ResultWriter, progress: Channel,
                timing: Channel) -> dict[str, Any]:
    sets = [InputSet(c, job["args"], folder, kernels_see_these=False, data_fd=job.get("fds", {}).get("inputs"))
            for c in job["cases"]]
    names = list(job["libraries"])
    _dumpable(False)
    workers: dict[str, Worker] = {}
    regions: dict[str, Region] = {}
    ready: dict[str, list[str]] = {}
    for name in names:
        regions[name] = region = Region(sets, 1)
        workers[name] = fork_worker(name, workers, (out.fd, progress.fd),
                                    functools.partial(_serve, name, job, region, timing))
        try:
            ready[name] = workers[name].answer()
        except WorkerDied:
            _end(workers)
            return {"fatal": "crash" if name == "candidate" else "baseline_failed",
                    "message": f"the {name} process died while loading its kernel"}
        kind, rest = ready[name][0], " ".join(ready[name][1:])
        if kind != "R":
            _end(workers)
            if kind == "U":
                return {"fatal": "device_unavailable", "message": rest}
            if kind == "C" and name == "candidate":
                return {"fatal": "crash", "case": sets[0].name,
                        "message": f"the kernel's first call at the profiling size: {rest}"}
            return {"fatal": "load_error" if name == "candidate" else "baseline_failed",
                    "message": rest if name == "candidate" else f"the {name} failed to load: {rest}"}
    extra_threads = {name: int(r[1]) for name, r in ready.items()}
    if extra_threads["candidate"] > max(v for k, v in extra_threads.items() if k != "candidate"):
        _end(workers)
        return {"fatal": "tampered", "message": (
            f"loading the kernel and its first calls left {extra_threads['candidate']} host thread(s) running "
            f"(the baseline: {extra_threads.get('baseline', 0)}): work must be done when kernel() returns")}
    roof_line = ready.get("baseline", [])
    roof = ({"bandwidth_gbps": float(roof_line[2]), "fp32_gflops": float(roof_line[3]), "l2_bytes": int(roof_line[4])}
            if len(roof_line) == 5 else None)
    expected = {os.getpid(), *(w.pid for w in workers.values())}
    isolated = bool(job.get("pid_namespace"))
    candidate = CandidateBuffers(regions["candidate"], workers["candidate"].pid)
    guarded = {name: Scheduling.of(w.pid) for name, w in workers.items() if name != "candidate"}
    guarded["coordinator"] = Scheduling.of(os.getpid())
    pids = {**{name: w.pid for name, w in workers.items()}, "coordinator": os.getpid()}
    minor = int(job.get("gpu_minor", 0))

    class Devices:
        """This target's primitives for the protocol: a worker per implementation on the device, resumed for one
        sample at a time; the candidate's outputs read from outside its process."""

        def poison(self, name: str, n: int) -> None:
            poison_next.add(name)

        def run(self, name: str, chosen: list[int], variants: list[int] | None = None) -> float:
            worker = workers[name]
            if isolated and _other_processes(expected):
                raise ForkedError(name)
            reply = worker.ask("S " + ",".join(map(str, chosen)) + (" P" if name in poison_next else ""))
            poison_next.discard(name)
            if reply[0] == "C":
                raise GpuFault(name, " ".join(reply[1:]))
            if reply[0] == "T":
                raise ThreadLeft(f"the {name}'s call left host threads running ({reply[1]} before, {reply[2]} "
                                 "after): work must be done when kernel() returns")
            if reply[0] != "D" or len(reply) != 3:
                raise WorkerDied(worker)
            if name == "candidate":
                for other, before in guarded.items():
                    if (now := Scheduling.of(pids[other])) != before:
                        raise TamperedError(f"the {other}'s scheduling changed while the candidate ran "
                                            f"({before.describe()} -> {now.describe()})")
            return (int(reply[2]) - int(reply[1])) / 1e9 / len(chosen)

        def read(self, n: int) -> list[dict[str, Any]]:
            return candidate.read(n)

    poison_next: set[str] = set()

    def phase(name: str) -> None:
        progress.mark(name)
        if name == "measure":
            timing.mark("M")

    # One call per sample (sample_target_s 0): at a size that fills the device a call takes about a millisecond
    # or more, and one call per sample gives every call its own fresh set, its own flushed L2, its own check.
    schedule = Schedule(time_cap_s=float(job["time_cap_s"]), sample_target_s=0.0,
                        min_rounds=int(job.get("min_rounds", 7)), max_rounds=int(job.get("max_rounds", 5000)))
    clocks_before = read_clocks(minor)
    try:
        measured = measure(Devices(), names, len(sets), 1, schedule,
                           Consistency(job["consistency_atol"], job["consistency_rtol"]), phase)
        if isolated and _other_processes(expected):
            raise ForkedError("candidate")
        workers["candidate"].ask("I")
        inputs_modified = candidate.inputs_modified()
    except ForkedError:
        _end(workers)
        return {"fatal": "fork", "case": sets[0].name}
    except (TamperedError, ThreadLeft) as exc:
        _end(workers)
        return {"fatal": "tampered", "message": f"{exc}: a kernel must not touch other processes or leave work "
                                                "running"}
    except GpuFault as exc:
        _end(workers)
        if exc.name != "candidate":
            return {"fatal": "baseline_failed", "message": f"the {exc.name} failed at the profiling size: {exc}"}
        return {"fatal": "crash", "case": sets[0].name, "message": f"at the profiling size: {exc}"}
    except WorkerDied as died:
        _end(workers)
        return {"fatal": "crash" if died.worker.name == "candidate" else "baseline_failed",
                "message": f"the {died.worker.name} process {_describe(died.worker.status)} at the profiling size"}
    except MemoryAccessError as exc:
        _end(workers)
        return {"fatal": "crash", "message": f"the coordinator cannot reach the candidate's buffers ({exc})"}
    clocks_after = read_clocks(minor)
    _end(workers)
    for outputs in measured.anchor_outputs():
        for name in sets[0].output_meta:
            out.array(outputs[name])
    return {
        **measured.result(),
        "filled_bytes": sum(a.nbytes for s in sets for a in s.inputs.values()),
        "inputs_modified": inputs_modified,
        "gpu_roof": roof,
        "gpu_clocks": {"before": clocks_before, "after": clocks_after},
    }


if __name__ == "__main__":
    with contextlib.suppress(AttributeError):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv, run=run_profile))
