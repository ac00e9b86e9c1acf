"""Deterministic cost: instructions and cache misses of one kernel call, counted by valgrind's callgrind.

Wall-clock time on a shared machine drifts; instruction counts for the same binary and inputs do not. A small
generated C driver reads the inputs, calls ``kernel`` once, and callgrind counts only inside ``kernel``
(``--toggle-collect``), with its cache simulator for L1 and last-level misses.

The kernel runs in valgrind's own process, so nothing valgrind writes to a file is believed: the counts are the
summary valgrind prints at exit on a pipe the server holds (append-only: a kernel can add text, never remove
valgrind's), and exactly one summary must be there. The driver loads a filter before it opens the kernel: no exec
(the way to end the process with no summary of valgrind's and a forged one of its own) and no further filter.
A kernel that carries valgrind's client-request sequence (which toggles or zeroes callgrind's counters) gets no
counts. What stays possible for code sharing the address space (generating that sequence at run time, writing
into valgrind's memory) is why these counts are advice for the agent: they never enter a verdict or the memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kope_mcp.runtime.sandbox import SandboxLimits, Scratch, run_sandboxed, scrubbed_env
from kope_mcp.runtime.sandbox_seccomp import counting_program
from kope_mcp.tasks.loader import Task
from kope_mcp.tasks.spec import C_TYPES

_DRIVER = "kope_driver.c"
# valgrind reserves address space for its own heap and the shadow of the client's: far more than the kernel.
VALGRIND_ADDRESS_SPACE = 16 * 1024**3
_LOG_CAP = 1024**2  # the pipe's size: a kernel that fills it blocks valgrind's summary, and the run times out
_F_SETPIPE_SZ = 1031
# `rol $3,%rdi; rol $13,%rdi; rol $61,%rdi; rol $51,%rdi` (amd64): what precedes every valgrind client request.
_CLIENT_REQUEST = bytes.fromhex("48c1c70348c1c70d48c1c73d48c1c733")


@dataclass(frozen=True)
class CallgrindCounts:
    instructions: int
    data_reads: int | None
    data_writes: int | None
    l1_data_misses: int | None
    last_level_misses: int | None


def valgrind_available() -> bool:
    return shutil.which("valgrind") is not None


def driver_source(task: Task, sizes: dict[str, int], program: bytes) -> str:
    """C that loads ``in_<name>.bin`` files, allocates outputs, loads ``program`` (a seccomp filter), then opens
    ``kernel.so`` and calls ``kernel`` once: nothing of the kernel's (its constructors included) runs unfiltered."""
    words = (struct.unpack_from("=HBBI", program, offset) for offset in range(0, len(program), 8))
    filters = ", ".join(f"{{{code}, {jt}, {jf}, {k}u}}" for code, jt, jf, k in words)
    lines = ["#include <dlfcn.h>", "#include <linux/filter.h>", "#include <linux/seccomp.h>",
             "#include <stdint.h>", "#include <stdio.h>", "#include <stdlib.h>", "#include <sys/prctl.h>", "",
             f"{task.spec.prototype};", "",
             f"static struct sock_filter filters[] = {{{filters}}};", "",
             "static void *load(const char *path, size_t bytes) {",
             "    void *p = malloc(bytes ? bytes : 1); FILE *f = fopen(path, \"rb\");",
             "    if (!p || !f || fread(p, 1, bytes, f) != bytes) {",
             "        fprintf(stderr, \"cannot read %s\\n\", path); exit(2);", "    }",
             "    fclose(f); return p;", "}", "", "int main(void) {"]
    call_args = []
    for arg in task.spec.args:
        ctype = C_TYPES[arg.dtype]
        if arg.kind in ("in", "out"):
            count = int(np.prod(task.spec.shape_of(arg, sizes)))
            nbytes = count * np.dtype(arg.dtype).itemsize
            if arg.kind == "in":
                lines.append(f'    {ctype} *{arg.name} = load("in_{arg.name}.bin", {nbytes}u);')
            else:
                lines.append(f"    {ctype} *{arg.name} = calloc({count}u, sizeof({ctype}));")
        elif arg.kind == "size":
            lines.append(f"    int64_t {arg.name} = {sizes[arg.name]};")
        else:
            lines.append(f"    {ctype} {arg.name} = ({ctype}){arg.value!r};")
        call_args.append(arg.name)
    lines += [
        "    struct sock_fprog program = {sizeof(filters) / sizeof(filters[0]), filters};",
        "    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||",
        "        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {",
        '        perror("kope: loading the filter"); return 3;', "    }",
        '    void *library = dlopen("./kernel.so", RTLD_NOW | RTLD_LOCAL);',
        '    if (!library) { fprintf(stderr, "kope: %s\\n", dlerror()); return 4; }',
        '    __typeof__(kernel) *call = (__typeof__(kernel) *)dlsym(library, "kernel");',
        '    if (!call) { fprintf(stderr, "kope: no kernel symbol\\n"); return 4; }',
        f"    call({', '.join(call_args)});", "    return 0;", "}", ""]
    return "\n".join(lines)


_HEADER = re.compile(r"==(\d+)== Callgrind, a call-graph generating cache profiler\n")


def parse_summary(log: str) -> CallgrindCounts | str:
    """The counts in valgrind's exit summary, or why the log does not hold exactly one summary of valgrind's.

    Valgrind writes its header before the driver starts, so its pid is known before any kernel code could write;
    its summary is two lines with that pid. Any other "Events"/"Collected" text (a kernel writing a summary of its
    own into the log's descriptor, whose number stays open in the process) makes the log ambiguous: no counts."""
    header = _HEADER.match(log)
    if header is None:
        return "valgrind's log does not start with its header"
    pid = header.group(1)
    if log.count("Collected") != 1 or log.count("Events") != 1:
        return (f"valgrind's log holds {log.count('Collected')} summaries: something besides valgrind wrote to "
                "it (counts refused)")
    events = re.search(rf"^=={pid}== Events +: ([A-Za-z0-9 ]+)$", log, re.MULTILINE)
    collected = re.search(rf"^=={pid}== Collected : ([0-9 ]+)$", log, re.MULTILINE)
    if events is None or collected is None:
        return "valgrind's summary is not in the form valgrind writes it (counts refused)"
    names, values = events.group(1).split(), [int(v) for v in collected.group(1).split()]
    if len(values) > len(names):
        return "valgrind's summary has more counts than events (counts refused)"
    # Valgrind leaves out trailing zeros.
    counts = dict(zip(names, values + [0] * (len(names) - len(values)), strict=True))

    def total(*wanted: str) -> int | None:
        present = [counts[n] for n in wanted if n in counts]
        return sum(present) if present else None

    return CallgrindCounts(
        instructions=counts.get("Ir", 0),
        data_reads=total("Dr"),
        data_writes=total("Dw"),
        l1_data_misses=total("D1mr", "D1mw"),
        last_level_misses=total("DLmr", "DLmw"),
    )


def count_kernel(task: Task, library: Path, inputs: dict[str, np.ndarray], sizes: dict[str, int],
                 compiler: str, timeout_s: float, scratch_root: Path) -> CallgrindCounts | str:
    """Counts for one call, or a message saying why they could not be taken."""
    program = counting_program()
    if program is None:
        return "libseccomp is not available: the counting run cannot refuse exec, so it is not done"
    image = library.read_bytes()
    if _CLIENT_REQUEST in image:
        return "the kernel contains a valgrind client request (it could toggle or zero callgrind's counters)"
    with Scratch(scratch_root) as scratch:
        work = scratch.run
        (work / "kernel.so").write_bytes(image)
        for name, arr in inputs.items():
            np.ascontiguousarray(arr).tofile(work / f"in_{name}.bin")
        (work / _DRIVER).write_text(driver_source(task, sizes, program))
        for path in work.iterdir():
            path.chmod(0o755)
        limits = SandboxLimits(wall_seconds=timeout_s, cpu_seconds=int(timeout_s) + 5,
                               address_space_bytes=VALGRIND_ADDRESS_SPACE)
        env = scrubbed_env(tmpdir=scratch.inside(work))
        build = run_sandboxed([compiler, "-O1", _DRIVER, "-ldl", "-o", "driver"], scratch=scratch, limits=limits,
                              env=env)
        if build.returncode != 0:
            return f"the measurement driver did not build: {build.stderr_tail[-500:]}"
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            with contextlib.suppress(OSError):  # over this user's pipe quota: the default 64 KiB holds a summary too
                fcntl.fcntl(write_end, _F_SETPIPE_SZ, _LOG_CAP)
            run = run_sandboxed(
                ["valgrind", "--tool=callgrind", "--toggle-collect=kernel", "--cache-sim=yes",
                 "--callgrind-out-file=/dev/null", f"--log-fd={write_end}", "./driver"],
                scratch=scratch, limits=limits, env=env, pass_fds=(write_end,),
            )
            os.close(write_end)
            write_end = -1
            log = _drain(read_end)
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
    if run.signal_number == signal.SIGILL:
        return ("valgrind cannot execute an instruction in this kernel (this valgrind does not support "
                "AVX-512): build without it (e.g. -march=native -mno-avx512f) for deterministic counts")
    if run.returncode != 0:
        return f"valgrind {run.describe()}: {(run.stderr_tail + log)[-300:]}"
    return parse_summary(log)


def _drain(fd: int) -> str:
    """Everything in the pipe (its writers are gone: the sandbox killed whatever the run left)."""
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    while sum(map(len, chunks)) <= _LOG_CAP:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")
