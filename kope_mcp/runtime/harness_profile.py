"""The child side of profile_kernel: each implementation in its own process, only one of them runnable at a time.

The coordinator (this process, which never loads a kernel) forks one worker per implementation before any kernel
library is loaded. The coordinator and the baseline's and reference's workers are non-dumpable, so the
candidate's process can neither ptrace them nor read or patch their memory. The coordinator resumes one worker
for one sample (SIGCONT), waits for its reply and stops it again (SIGSTOP): a kernel's threads cannot run while
another implementation is timed, so it cannot slow the baseline down or write timing markers in its place. With
the candidate stopped, the coordinator itself re-poisons and reads the candidate's output buffers in the
candidate's memory (``process_vm_writev``/``readv``: it is the candidate's parent), so the check of every timed
call is not the kernel's to forge. The buffers are the worker's own private memory (faulted in by the worker,
transparent huge pages as for any numpy array), not a shared mapping, which is 25-30% slower to stream through
here (4 KiB shmem pages). A process the kernel leaves behind ends the measurement: the run has its own PID
namespace, so /proc lists every process of it, and this coordinator is its pid 1.

Nothing before the clock: the candidate's worker is forked first, before any input set is in this process (the
pool comes by a descriptor, closed before the trusted workers are forked), and each batch's inputs are written
into the stopped candidate right before it is resumed for that batch; the trusted workers copy theirs from their
own memory at the same point. Its filter denies it new processes: a child computing every set, or a
``clone(CLONE_VM)`` helper, would have done work no clock or CPU count sees.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kope_mcp.runtime import sandbox_seccomp
from kope_mcp.runtime import variants as variants_mod
from kope_mcp.runtime.harness import (
    POISON_BITS,
    POISON_BITS_64,
    Channel,
    InputSet,
    LoadError,
    ResultWriter,
    _load_kernel,
    _load_reference,
    _omp_team_size,
    main,
    poison,
)
from kope_mcp.runtime.harness_guard import CpuUsage, Scheduling, TamperedError
from kope_mcp.runtime.measurement import Consistency, Schedule, bitwise_equal, measure

_PR_SET_DUMPABLE = 4
_IOV_MAX = 1024
OUTPUT_BUDGET_BYTES = 48 * 1024**2  # fresh buffers per sample: a kernel writes at least its outputs in ~5 ms
_COMMAND_CAP = 1 << 17  # "S" and up to 10,000 comma-separated set indices
_libc = ctypes.CDLL(None, use_errno=True)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _dumpable(value: bool) -> None:
    _libc.prctl(_PR_SET_DUMPABLE, int(value), 0, 0, 0)


def _transfer(pid: int, pairs: list[tuple[int, int, int]], *, write: bool) -> None:
    """Copy (local address, remote address, bytes) between this process and a stopped child."""
    call = _libc.process_vm_writev if write else _libc.process_vm_readv
    call.restype = ctypes.c_ssize_t
    for start in range(0, len(pairs), _IOV_MAX):
        chunk = pairs[start:start + _IOV_MAX]
        local = (_IoVec * len(chunk))(*[_IoVec(loc, n) for loc, _, n in chunk])
        remote = (_IoVec * len(chunk))(*[_IoVec(rem, n) for _, rem, n in chunk])
        done = call(pid, local, len(chunk), remote, len(chunk), 0)
        if done != sum(n for _, _, n in chunk):
            err = ctypes.get_errno()
            raise MemoryAccessError(f"process_vm_{'writev' if write else 'readv'}: {os.strerror(err) if err else done}")


class MemoryAccessError(Exception):
    pass


class Region:
    """Address space reserved (never touched) by the coordinator for one C implementation's inputs and output
    buffers; the worker faults it in, so the pages are the worker's own."""

    def __init__(self, sets: list[InputSet], buffers: int) -> None:
        layout: list[tuple[tuple[str, int, str], np.dtype[Any], tuple[int, ...]]] = []
        for i, s in enumerate(sets):
            layout += [(("in", i, n), np.dtype(m["dtype"]), tuple(m["shape"])) for n, m in s.input_meta.items()]
        for b in range(buffers):
            layout += [(("out", b, n), np.dtype(m["dtype"]), tuple(m["shape"]))
                       for n, m in sets[0].output_meta.items()]
        self.layout: dict[tuple[str, int, str], tuple[int, np.dtype[Any], tuple[int, ...]]] = {}
        total = 0
        for index, (key, dtype, shape) in enumerate(layout):
            # 64-byte aligned, but never a multiple of 4 KiB apart: arrays at the same offset modulo 4 KiB alias
            # in the store buffer and in every cache set (vector_add was 20% slower with inputs 64 MiB apart).
            total += (index * 320) % 4096
            self.layout[key] = (total, dtype, shape)
            total += -(-int(np.prod(shape)) * dtype.itemsize // 64) * 64
        self.map = mmap.mmap(-1, max(total, 64), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.sets, self.buffers = sets, buffers
        self.poisoned: dict[str, np.ndarray] | None = None

    def view(self, key: tuple[str, int, str]) -> np.ndarray:
        """The array at ``key`` in this process (the worker's side)."""
        offset, dtype, shape = self.layout[key]
        return np.frombuffer(self.map, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)

    def address(self, key: tuple[str, int, str]) -> tuple[int, int]:
        offset, dtype, shape = self.layout[key]
        return self.base + offset, int(np.prod(shape)) * dtype.itemsize

    def huge_pages(self) -> None:
        if hasattr(self.map, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):
                self.map.madvise(mmap.MADV_HUGEPAGE)

    def fill_inputs(self, chosen: list[int] | None = None, variants: list[int] | None = None,
                    noise: dict[str, np.ndarray] | None = None) -> None:
        """Copy the inputs of the sets ``chosen`` (all of them: None) into their places in this process, each as
        the variant ``variants`` gives for it (0: the set itself)."""
        picked = chosen if chosen is not None else list(range(len(self.sets)))
        for i, v in zip(picked, variants or [0] * len(picked), strict=True):
            for n, a in self.sets[i].inputs.items():
                if v and noise is not None and n in noise:
                    variants_mod.vary_into(self.view(("in", i, n)), a, noise[n], v)
                else:
                    np.copyto(self.view(("in", i, n)), a)

    def poison_outputs(self, n: int) -> None:
        """What the coordinator does to the candidate's buffers, done by a trusted worker to its own: copied from one
        poisoned set of outputs, so the cache is left in the same state (a copy's source competes for it too)."""
        if self.poisoned is None:
            self.poisoned = self.sets[0].new_outputs(guarded=False)
            for arr in self.poisoned.values():
                poison(arr)
        for b in range(n):
            for name, source in self.poisoned.items():
                np.copyto(self.view(("out", b, name)), source)

    def call_args(self, set_index: int, b: int) -> list[Any]:
        s = self.sets[set_index]
        values: list[Any] = []
        for a in s.args:
            if a["kind"] == "in":
                values.append(self.address(("in", set_index, a["name"]))[0])
            elif a["kind"] == "out":
                values.append(self.address(("out", b, a["name"]))[0])
            elif a["kind"] == "size":
                values.append(s.sizes[a["name"]])
            else:
                values.append(s.scalars[a["name"]])
        return values


class Worker:
    def __init__(self, name: str, pid: int, commands: int, replies: int) -> None:
        self.name, self.pid, self.commands = name, pid, commands
        self.replies = os.fdopen(replies, "rb", buffering=0)
        self.status: int | None = None  # once it died: its exit status, negative for the signal that ended it

    def ask(self, text: str) -> list[str]:
        os.kill(self.pid, signal.SIGCONT)
        with contextlib.suppress(BrokenPipeError):
            os.write(self.commands, (text + "\n").encode())
        return self.answer()

    def answer(self) -> list[str]:
        """Its reply, then it is stopped: nothing of it runs until the next ask."""
        line = self.replies.readline(4096).decode(errors="replace").split()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGSTOP)
        _, raw = os.waitpid(self.pid, os.WUNTRACED)
        if os.WIFSIGNALED(raw) or os.WIFEXITED(raw):
            self.status = -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)
        if not line or self.status is not None:
            raise WorkerDied(self)
        return line

    def end(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.status = -signal.SIGKILL


def fork_worker(name: str, others: dict[str, Worker], private: tuple[int | None, ...],
                serve: Callable[[int, int], None]) -> Worker:
    """Fork the worker ``name``: in the child, close what only the coordinator may hold (``private``, the other
    workers' pipes) and ``serve(commands, replies)``, which never returns."""
    cmd_r, cmd_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (*private, cmd_w, rep_r, *(w.commands for w in others.values()),
                   *(w.replies.fileno() for w in others.values())):
            if fd is not None:
                os.close(fd)
        serve(cmd_r, rep_w)
        os._exit(0)
    os.close(cmd_r)
    os.close(rep_w)
    return Worker(name, pid, cmd_w, rep_r)


class WorkerDied(Exception):
    def __init__(self, worker: Worker) -> None:
        super().__init__(worker.name)
        self.worker = worker


class ForkedError(Exception):
    pass


def _serve(name: str, job: dict[str, Any], region: Region | None, sets: list[InputSet], timing: Channel,
           noise: dict[str, np.ndarray], commands: int, replies: int) -> None:
    """A worker's life: load its implementation, then time samples on command. Never returns."""
    # Non-dumpable is inherited from the coordinator. The candidate alone makes itself dumpable again, so that its
    # parent, the coordinator, can read and poison its buffers; the other processes that could reach it run only
    # trusted code (the baseline, the reference).
    _dumpable(name == "candidate")
    # Before any library loads (its constructors run under it): this worker signals, traces and re-prioritises
    # only itself, whatever its code does; the coordinator alone reaches the others.
    sandbox_seccomp.confine_to_self(bytes.fromhex(job["worker_filter"]) if job.get("worker_filter") else None)
    kernel: Any = None
    reference: Any = None
    try:
        if region is None:
            reference = _load_reference(job["task_folder"])
            reference(**sets[0].reference_kwargs())  # lazy imports (torch) outside the timed calls
        else:
            region.huge_pages()
            kernel = _load_kernel(job["libraries"][name], job["args"])
    except LoadError as exc:
        os.write(replies, f"L {exc}\n".encode())
        os._exit(0)
    os.write(replies, f"R {_omp_team_size() or 0}\n".encode())
    pid0 = os.getpid()
    source = os.fdopen(commands, "rb", buffering=0)
    while True:
        command = source.readline(_COMMAND_CAP).split()
        if len(command) not in (3, 4) or command[0] != b"S" or command[3:] not in ([], [b"P"]):
            os._exit(0)
        chosen = [int(i) for i in command[1].split(b",")]
        variants = [int(v) for v in command[2].split(b",")]
        n = len(chosen)
        calls: list[tuple[Any, list[Any], dict[str, Any]]]
        if region is not None:
            calls = [(kernel, region.call_args(i, j), {}) for j, i in enumerate(chosen)]
            if command[3:] == [b"P"]:
                region.poison_outputs(n)
            if name != "candidate":
                # As the coordinator writes the candidate's, after its poison: the same cache state for both.
                region.fill_inputs(chosen, variants, noise)
        else:
            calls = [(reference, [], sets[i].reference_kwargs()) for i in chosen]
        timing.begin(name)
        t0 = time.monotonic_ns()
        for fn, args, kwargs in calls:
            fn(*args, **kwargs)
        t1 = time.monotonic_ns()
        timing.mark(f"E {name} {n} {t0} {t1}")
        if os.getpid() != pid0:
            os._exit(0)  # a kernel that forked returns twice: the copy vanishes, the coordinator sees the fork
        os.write(replies, f"D {t0} {t1}\n".encode())


def _other_processes(mine: set[int]) -> list[int]:
    """Processes of the run besides the sandbox's init, the coordinator and its workers (a fresh /proc)."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine and int(p) != 1]


class CandidateBuffers:
    """The coordinator's side of the candidate's output buffers: poison them, read them back."""

    def __init__(self, region: Region, pid: int, *, filled_at_load: bool = True) -> None:
        """``filled_at_load``: the worker copied every set's inputs in at load (a GPU profile's); else they are
        written batch by batch (:meth:`write_inputs`) and only those are checked for writes."""
        self.region, self.pid = region, pid
        self.names = list(region.sets[0].output_meta)
        self.local = [region.sets[0].new_outputs(guarded=False) for _ in range(region.buffers)]
        self.poisoned = region.sets[0].new_outputs(guarded=False)
        for arr in self.poisoned.values():
            poison(arr)
        # Sets whose own inputs (not a variant's) the candidate holds.
        self.written: set[int] = set(range(len(region.sets))) if filled_at_load else set()
        self.staging: dict[str, np.ndarray] = {}

    def poison(self, n: int) -> None:
        _transfer(self.pid, [(self.poisoned[name].ctypes.data, *self.region.address(("out", b, name)))
                             for b in range(n) for name in self.names], write=True)

    def read(self, n: int) -> list[dict[str, np.ndarray]]:
        _transfer(self.pid, [(self.local[b][name].ctypes.data, *self.region.address(("out", b, name)))
                             for b in range(n) for name in self.names], write=False)
        return self.local[:n]

    def write_inputs(self, chosen: list[int], variants: list[int], noise: dict[str, np.ndarray]) -> None:
        """The inputs of the sets of the next batch (each as its variant), written into the stopped candidate right
        before it runs: it never holds an input before the call that is timed on it."""
        plain = [(arr.ctypes.data, *self.region.address(("in", i, name)))
                 for i, v in zip(chosen, variants, strict=True) if not v
                 for name, arr in self.region.sets[i].inputs.items()]
        _transfer(self.pid, plain, write=True)
        for i, v in zip(chosen, variants, strict=True):
            if v:
                for name, arr in self.region.sets[i].inputs.items():
                    staged = arr
                    if name in noise:
                        staged = self.staging.setdefault(name, np.empty_like(arr))
                        variants_mod.vary_into(staged, arr, noise[name], v)
                    _transfer(self.pid, [(staged.ctypes.data, *self.region.address(("in", i, name)))], write=True)
        for i, v in zip(chosen, variants, strict=True):
            (self.written.discard if v else self.written.add)(i)

    def inputs_modified(self) -> list[str]:
        modified = set()
        for i in sorted(self.written):
            for name, pristine in self.region.sets[i].inputs.items():
                seen = np.empty_like(pristine)
                _transfer(self.pid, [(seen.ctypes.data, *self.region.address(("in", i, name)))], write=False)
                if not bitwise_equal(seen, pristine) and not np.array_equal(seen, pristine, equal_nan=True):
                    modified.add(name)
        return sorted(modified)


def run_profile(job: dict[str, Any], folder: Path, out: ResultWriter, progress: Channel,
                timing: Channel) -> dict[str, Any]:
    data_fd = job.get("fds", {}).get("inputs")
    sets = [InputSet(c, job["args"], folder, kernels_see_these=False, data_fd=data_fd, load=False)
            for c in job["cases"]]
    names = [*job["libraries"], *(["reference"] if job.get("task_folder") else [])]
    names.sort(key=lambda name: name != "candidate")  # forked first, before any input is in this process
    buffers = max(1, min(10_000, OUTPUT_BUDGET_BYTES // max(1, sets[0].output_bytes())))
    cpu = job.get("pin_cpu")
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    _dumpable(False)
    workers: dict[str, Worker] = {}
    regions: dict[str, Region] = {}
    candidate_omp: int | None = None
    noise: dict[str, np.ndarray] = {}
    seed = job.get("variant_seed")
    for name in names:
        if name != "candidate" and not sets[0].inputs:
            for s in sets:  # the trusted workers get them by inheritance; the candidate never had the chance
                s.load()
            if data_fd is not None:
                os.close(data_fd)
                data_fd = None
            noise.update(_noise(sets[0], seed))
        region = Region(sets, buffers) if name != "reference" else None
        workers[name] = fork_worker(name, workers, (out.fd, progress.fd, data_fd),
                                    functools.partial(_serve, name, job, region, sets, timing, noise))
        if region is not None:
            regions[name] = region
        try:
            ready = workers[name].answer()
        except WorkerDied:
            _end(workers)
            return {"fatal": "crash" if name == "candidate" else "baseline_failed",
                    "message": f"the {name} process died while loading its library"}
        if ready[0] == "L":
            _end(workers)
            if name != "candidate":
                return {"fatal": "baseline_failed", "message": f"the {name} cannot be loaded: {' '.join(ready[1:])}"}
            return {"fatal": "load_error", "message": " ".join(ready[1:])}
        if name == "candidate":
            candidate_omp = int(ready[1]) or None
    for s in sets if not sets[0].inputs else ():  # a profile of the candidate alone
        s.load()
    noise = noise or _noise(sets[0], seed)
    expected = {os.getpid(), *(w.pid for w in workers.values())}
    isolated = bool(job.get("pid_namespace"))
    candidate = CandidateBuffers(regions["candidate"], workers["candidate"].pid, filled_at_load=False)
    usage = CpuUsage(workers["candidate"].pid, cpu)
    # The naive baseline's own load and warm-up, measured the same way in the same run: what the candidate's
    # untimed CPU is compared with, on this machine at this moment, rather than with a fixed allowance.
    baseline_usage = CpuUsage(workers["baseline"].pid, None) if "baseline" in workers else None
    # The trusted workers' scheduling as the coordinator set it up: a candidate runs as the same identity and could
    # renice, re-pin or demote them (SCHED_IDLE made an unchanged kernel 1.65x -> 4.19x). Checked after every
    # candidate sample (it runs only then); any change ends the measurement.
    guarded = {name: Scheduling.of(w.pid) for name, w in workers.items() if name != "candidate"}
    guarded["coordinator"] = Scheduling.of(os.getpid())
    pids = {**{name: w.pid for name, w in workers.items()}, "coordinator": os.getpid()}

    def check_neighbours() -> None:
        for name, before in guarded.items():
            now = Scheduling.of(pids[name])
            if now != before:
                raise TamperedError(f"the {name}'s scheduling changed while the candidate ran ({before.describe()} "
                                    f"-> {now.describe()})")

    poison_next: set[str] = set()

    class Processes:
        """This target's primitives for the protocol (kope_mcp/runtime/measurement.py): a worker process per
        implementation, resumed for one batch at a time; the candidate's buffers reached from outside it."""

        variants = seed is not None  # every repeated call on a variant of its set (runtime/variants.py)

        def poison(self, name: str, n: int) -> None:
            if name == "candidate":
                candidate.poison(n)  # from outside: its own code could not be trusted to do it
            elif name in regions:
                poison_next.add(name)  # a trusted worker poisons its own buffers (they are not ours to write)

        def run(self, name: str, chosen: list[int], variants: list[int] | None = None) -> float:
            worker = workers[name]
            varied = variants or [0] * len(chosen)
            if isolated and _other_processes(expected):
                raise ForkedError(name)
            progress.mark(f"run {name}")  # who was running, should the whole run be ended (native_runner)
            if name == "candidate":
                candidate.write_inputs(chosen, varied, noise)
                usage.before()
            elif name == "baseline" and baseline_usage is not None:
                baseline_usage.before()
            reply = worker.ask("S " + ",".join(map(str, chosen)) + " " + ",".join(map(str, varied))
                               + (" P" if name in poison_next else ""))
            poison_next.discard(name)
            if reply[0] != "D" or len(reply) != 3:
                raise WorkerDied(worker)
            if name == "candidate":
                usage.after()
                check_neighbours()
            elif name == "baseline" and baseline_usage is not None:
                baseline_usage.after()
            return (int(reply[2]) - int(reply[1])) / 1e9 / len(chosen)

        def read(self, n: int) -> list[dict[str, np.ndarray]]:
            return candidate.read(n)

    def phase(name: str) -> None:
        if name == "measure":
            usage.reset()
            if baseline_usage is not None:
                baseline_usage.reset()
        progress.mark(name)
        if name == "measure":
            timing.mark("M")

    schedule = Schedule(time_cap_s=float(job["time_cap_s"]), sample_target_s=float(job.get("sample_target_s", 0.002)),
                        min_rounds=int(job.get("min_rounds", 7)), max_rounds=int(job.get("max_rounds", 5000)),
                        checked_variants=variants_mod.CHECKED)
    try:
        measured = measure(Processes(), names, len(sets), buffers, schedule,
                           Consistency(job["consistency_atol"], job["consistency_rtol"], _poisoned), phase)
        if isolated and _other_processes(expected):
            raise ForkedError("candidate")
        inputs_modified = candidate.inputs_modified()
        escaped = usage.escaped_mask()
        untimed = usage.untimed()
        baseline_untimed = baseline_usage.untimed() if baseline_usage is not None else None
    except ForkedError:
        _end(workers)
        return {"fatal": "fork", "case": sets[0].name}
    except TamperedError as exc:
        _end(workers)
        return {"fatal": "tampered", "message": f"{exc}: a kernel must not touch other processes"}
    except WorkerDied as died:
        _end(workers)
        # The trusted implementations run only their own code: one that fails is not the candidate's to answer for.
        return {"fatal": "crash" if died.worker.name == "candidate" else "baseline_failed",
                "message": f"the {died.worker.name} process {_describe(died.worker.status)} at the profiling size"}
    except MemoryAccessError as exc:
        _end(workers)
        return {"fatal": "crash", "message": f"the coordinator cannot reach the candidate's buffers ({exc}); "
                                             "a kernel that unmapped or protected them?"}
    _end(workers)
    for outputs in [*measured.anchor_outputs(), *measured.variant_outputs()]:
        for name in sets[0].output_meta:
            out.array(outputs[name])
    return {
        **measured.result(),
        "cpu_seconds": round(usage.cpu_s, 6),
        "window_seconds": round(usage.wall_s, 6),
        "cpu_mask_widened": escaped,
        "untimed_cpu_seconds": round(untimed, 6),
        "warmup_cpu_seconds": round(usage.warmup_cpu_s, 6),
        **({"baseline_untimed_cpu_seconds": round(baseline_untimed, 6),
            "baseline_warmup_cpu_seconds": round(baseline_usage.warmup_cpu_s, 6)}
           if baseline_usage is not None and baseline_untimed is not None else {}),
        "cpus": sorted(os.sched_getaffinity(0)),
        "inputs_modified": inputs_modified,
        "omp_threads": candidate_omp,
    }


def _noise(first: InputSet, seed: int | None) -> dict[str, np.ndarray]:
    """Each float input's noise for this profile's variants (none without a seed: the variants are off)."""
    if seed is None:
        return {}
    return {name: variants_mod.noise(int(seed), name, arr.size).astype(arr.dtype)
            for name, arr in first.inputs.items() if variants_mod.varies(arr)}


def _poisoned(arr: np.ndarray) -> bool:
    """Any element still holding the poison's bits: a call that left part of its output unwritten."""
    if arr.dtype.itemsize == 4:
        return bool(np.any(arr.view(np.uint32) == POISON_BITS))
    if arr.dtype.itemsize == 8:
        return bool(np.any(arr.view(np.uint64) == POISON_BITS_64))
    return False


def _end(workers: dict[str, Worker]) -> None:
    for worker in workers.values():
        worker.end()


def _describe(status: int | None) -> str:
    if status is None:
        return "stopped answering"
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with code {status} instead of returning"


if __name__ == "__main__":
    sys.exit(main(sys.argv, run=run_profile))
