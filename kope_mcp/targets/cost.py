"""Deterministic cost: instructions and cache misses of one kernel call, counted by valgrind's callgrind.

Wall-clock time on a shared machine drifts; instruction counts for the same binary and inputs do not. A small
generated C driver reads the inputs, calls ``kernel`` once, and callgrind counts only inside ``kernel``
(``--toggle-collect``), with its cache simulator for L1 and last-level misses.
"""

from __future__ import annotations

import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kope_mcp.sandbox import SandboxLimits, Scratch, UntrustedFileError, read_back, run_sandboxed, scrubbed_env
from kope_mcp.tasks.loader import Task
from kope_mcp.tasks.spec import C_TYPES

_DRIVER = "kope_driver.c"
# valgrind reserves address space for its own heap and the shadow of the client's: far more than the kernel.
VALGRIND_ADDRESS_SPACE = 16 * 1024**3
_CALLGRIND_OUT_CAP = 16 * 1024**2


@dataclass(frozen=True)
class CallgrindCounts:
    instructions: int
    data_reads: int | None
    data_writes: int | None
    l1_data_misses: int | None
    last_level_misses: int | None


def valgrind_available() -> bool:
    return shutil.which("valgrind") is not None


def driver_source(task: Task, sizes: dict[str, int]) -> str:
    """C that loads ``in_<name>.bin`` files, allocates outputs, and calls ``kernel`` once."""
    lines = ["#include <stdint.h>", "#include <stdio.h>", "#include <stdlib.h>", "",
             f"{task.spec.prototype};", "",
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
    lines += [f"    kernel({', '.join(call_args)});", "    return 0;", "}", ""]
    return "\n".join(lines)


def parse_callgrind(text: str) -> CallgrindCounts:
    events: list[str] = []
    totals: list[int] = []
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("totals:", "summary:")):
            totals = [int(v) for v in line.split()[1:]]
    counts = dict(zip(events, totals, strict=False))

    def total(*names: str) -> int | None:
        present = [counts[n] for n in names if n in counts]
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
    with Scratch(scratch_root) as scratch:
        work = scratch.run
        shutil.copyfile(library, work / "kernel.so")
        for name, arr in inputs.items():
            np.ascontiguousarray(arr).tofile(work / f"in_{name}.bin")
        (work / _DRIVER).write_text(driver_source(task, sizes))
        for path in work.iterdir():
            path.chmod(0o755)
        limits = SandboxLimits(wall_seconds=timeout_s, cpu_seconds=int(timeout_s) + 5,
                               address_space_bytes=VALGRIND_ADDRESS_SPACE)
        build = run_sandboxed([compiler, "-O1", _DRIVER, "./kernel.so", "-Wl,-rpath,$ORIGIN", "-o", "driver"],
                              scratch=scratch, limits=limits, env=scrubbed_env(tmpdir=scratch.inside(work)))
        if build.returncode != 0:
            return f"the measurement driver did not build: {build.stderr_tail[-500:]}"
        dir_fd = scratch.open_run_dir()
        try:
            run = run_sandboxed(
                ["valgrind", "--tool=callgrind", "--toggle-collect=kernel", "--cache-sim=yes",
                 "--callgrind-out-file=callgrind.out", "./driver"],
                scratch=scratch, limits=limits, env=scrubbed_env(tmpdir=scratch.inside(work)),
            )
            if run.signal_number == signal.SIGILL:
                return ("valgrind cannot execute an instruction in this kernel (this valgrind does not support "
                        "AVX-512): build without it (e.g. -march=native -mno-avx512f) for deterministic counts")
            if run.returncode != 0:
                return f"valgrind {run.describe()}: {run.stderr_tail[-300:]}"
            try:
                text = read_back(dir_fd, "callgrind.out", owner=run.uid, max_bytes=_CALLGRIND_OUT_CAP)
            except UntrustedFileError as exc:
                return f"valgrind's output was refused: {exc}"
        finally:
            os.close(dir_fd)
        return parse_callgrind(text.decode("utf-8", errors="replace"))
