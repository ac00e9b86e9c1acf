"""One compiler invocation in the sandbox that produces a shared library: shared by the native targets (c, cuda).

The source and a header declaring the expected prototype are written into the run's folder, the compiler runs in
its own sandbox (prepared ahead of time: ``sandbox_warm``), and the library it leaves is read back with
``O_NOFOLLOW`` by the run's uid (never followed by path); the log has the sandbox's paths removed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kope_mcp.runtime.sandbox import (
    SANDBOX_RUN,
    SandboxLimits,
    SandboxResult,
    Scratch,
    UntrustedFileError,
    capabilities,
    read_back,
    run_sandboxed,
    scrubbed_env,
)
from kope_mcp.runtime.sandbox_warm import POOL


@dataclass
class ToolchainRun:
    log: str
    library: bytes | None
    result: SandboxResult
    seconds: float
    refused: str | None = None  # why the output was refused, when it was


def build_library(scratch_root: Path, *, files: dict[str, str], argv: list[str], artifact: str, max_bytes: int,
                  limits: SandboxLimits, binds: Sequence[Path] = (), path: str | None = None) -> ToolchainRun:
    extra = {"PATH": path} if path else None
    if not capabilities().isolated:
        with Scratch(scratch_root) as scratch:
            env = scrubbed_env(extra, tmpdir=scratch.inside(scratch.run))
            return _build(scratch, files, argv, artifact, max_bytes,
                          lambda: run_sandboxed(argv, scratch=scratch, limits=limits, env=env, binds=binds))
    # A sandbox prepared ahead of time: its namespaces and mounts are not on the compile's critical path.
    with POOL.sandbox(scratch_root, limits=limits, env=scrubbed_env(extra, tmpdir=SANDBOX_RUN),
                      binds=tuple(binds)) as prepared:
        return _build(prepared.scratch, files, argv, artifact, max_bytes, lambda: prepared.execute(argv))


def _build(scratch: Scratch, files: dict[str, str], argv: list[str], artifact: str, max_bytes: int,
           run: Callable[[], SandboxResult]) -> ToolchainRun:
    work = scratch.run
    for name, text in files.items():
        (work / name).write_text(text, encoding="utf-8")
        (work / name).chmod(0o644)
    scratch.hand_over()
    dir_fd = scratch.open_run_dir()
    try:
        start = time.monotonic()
        result = run()
        seconds = time.monotonic() - start
        log = (result.stderr_tail + result.stdout_tail).strip()
        if result.timed_out:
            log += f"\ncompiler {result.describe()}"
        library = refused = None
        if result.returncode == 0:
            try:
                library = read_back(dir_fd, artifact, owner=result.uid, max_bytes=max_bytes)
            except UntrustedFileError as exc:
                refused = f"the build's output was refused: {exc}"
                log += f"\nerror: {refused}"
    finally:
        os.close(dir_fd)
    log = log.replace(SANDBOX_RUN + "/", "").replace(str(work) + "/", "").replace(str(work), ".")
    return ToolchainRun(log=log, library=library, result=result, seconds=round(seconds, 3), refused=refused)
