"""The ``c`` backend: C kernels built by gcc (or clang) into a shared object, run on the CPU.

The build is content-addressed (source, flags, prototype, compiler version) under ``KOPE_HOME/builds`` (0700),
and the compiler itself runs in the sandbox, because ``#include "/etc/shadow"`` in untrusted source would
otherwise leak files into diagnostics. The library the sandbox leaves is read back with ``O_NOFOLLOW`` and
checked, its sha256 is recorded, and it is verified against that hash before every later use.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kope_mcp.backends.diagnostics import Diagnostic, parse_diagnostics
from kope_mcp.backends.flags import validate_flags
from kope_mcp.sandbox import (
    SANDBOX_RUN,
    SandboxLimits,
    Scratch,
    UntrustedFileError,
    read_back,
    run_sandboxed,
    scrubbed_env,
)
from kope_mcp.tasks.loader import Task

SOURCE_NAME = "kernel.c"
PROTOTYPE_HEADER = "kope_prototype.h"
ARTIFACT_NAME = "kernel.so"
BASE_FLAGS = ("-std=gnu17", "-O2", "-Wall")
_LOG_LIMIT = 6000
MAX_ARTIFACT_BYTES = 64 * 1024**2


class TamperedBuildError(Exception):
    """A cached build no longer matches the hash recorded when it was built."""


@dataclass
class BuildResult:
    build_hash: str
    ok: bool
    diagnostics: list[Diagnostic]
    log: str
    seconds: float
    cached: bool
    artifact: Path | None
    uses_openmp: bool
    flags: list[str] = field(default_factory=list)
    sha256: str | None = None


@functools.cache
def compiler_version(compiler: str) -> str | None:
    """``gcc -dumpfullversion`` (None when the compiler does not run)."""
    try:
        out = subprocess.run([compiler, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def prototype_header(task: Task) -> str:
    # Declaring the expected prototype before the user's source makes gcc report "conflicting types for
    # 'kernel'" when the definition does not match, without shifting the user's line numbers.
    return (
        "#include <stdint.h>\n#include <stddef.h>\n"
        f"{task.spec.prototype};\n"
    )


def trim_log(text: str, build_dir: Path) -> str:
    text = text.replace(str(build_dir) + "/", "").replace(str(build_dir), ".")
    if len(text) > _LOG_LIMIT:
        text = text[: _LOG_LIMIT // 2] + "\n[... log cut ...]\n" + text[-_LOG_LIMIT // 2 :]
    return text


class CpuCBackend:
    name = "c"
    language = "C17 (gnu17)"

    def __init__(self, builds_dir: Path, scratch_root: Path, compiler: str = "gcc", timeout_s: float = 60.0) -> None:
        self.builds_dir = builds_dir
        self.scratch_root = scratch_root
        self.compiler = compiler
        self.timeout_s = timeout_s

    def build_hash(self, task: Task, source: str, flags: list[str]) -> str:
        key = json.dumps(
            {"backend": self.name, "cc": self.compiler, "cc_version": compiler_version(self.compiler),
             "prototype": task.spec.prototype, "flags": flags, "base": BASE_FLAGS, "source": source},
            sort_keys=True,
        )
        return hashlib.sha256(key.encode()).hexdigest()[:24]

    def compile(self, task: Task, source: str, flags: list[str] | None = None) -> BuildResult:
        flags = validate_flags(list(flags or []))
        digest = self.build_hash(task, source, flags)
        final_dir = self.builds_dir / digest
        cached = self._load_cached(final_dir)
        if cached is not None:
            return cached
        return self._build(task, source, flags, digest, final_dir)

    def artifact(self, build_hash: str) -> Path:
        """The library of an earlier successful build, verified against its recorded sha256."""
        final_dir = self.builds_dir / build_hash
        path = final_dir / ARTIFACT_NAME
        if not path.is_file():
            raise FileNotFoundError(f"build {build_hash} is missing from {self.builds_dir}; compile the kernel again")
        meta = json.loads((final_dir / "build.json").read_text())
        _verify(path, meta.get("sha256"))
        return path

    def compile_baseline(self, task: Task) -> BuildResult:
        if task.baseline_source is None:
            raise ValueError(f"task {task.id} has no C baseline")
        return self.compile(task, task.baseline_source, [])

    def _load_cached(self, final_dir: Path) -> BuildResult | None:
        meta = final_dir / "build.json"
        if not meta.is_file():
            return None
        data = json.loads(meta.read_text())
        artifact = final_dir / ARTIFACT_NAME
        if data["ok"]:
            try:
                _verify(artifact, data.get("sha256"))
            except (TamperedBuildError, FileNotFoundError):
                # Rebuild rather than load what was not built here: the cache entry is set aside.
                os.rename(final_dir, self.builds_dir / f".tampered-{final_dir.name}-{uuid.uuid4().hex[:8]}")
                return None
        return BuildResult(
            build_hash=data["build_hash"],
            ok=data["ok"],
            diagnostics=[Diagnostic(**d) for d in data["diagnostics"]],
            log=data["log"],
            seconds=data["seconds"],
            cached=True,
            artifact=artifact if data["ok"] and artifact.is_file() else None,
            uses_openmp=data["uses_openmp"],
            flags=data.get("flags", []),
            sha256=data.get("sha256"),
        )

    def _build(self, task: Task, source: str, flags: list[str], digest: str, final_dir: Path) -> BuildResult:
        with Scratch(self.scratch_root) as scratch:
            work = scratch.run
            (work / SOURCE_NAME).write_text(source, encoding="utf-8")
            (work / PROTOTYPE_HEADER).write_text(prototype_header(task), encoding="utf-8")
            for name in (SOURCE_NAME, PROTOTYPE_HEADER):
                (work / name).chmod(0o644)
            argv = [
                self.compiler, *BASE_FLAGS, "-fPIC", "-shared", "-fdiagnostics-color=never",
                # A call to an undeclared function, or a symbol nothing defines, must fail here with a line
                # number, not later as a library that cannot load.
                "-Werror=implicit-function-declaration", "-Wl,--no-undefined",
                "-include", PROTOTYPE_HEADER, *flags, SOURCE_NAME, "-o", ARTIFACT_NAME, "-lm",
            ]
            dir_fd = scratch.open_run_dir()
            try:
                start = time.monotonic()
                result = run_sandboxed(
                    argv,
                    scratch=scratch,
                    limits=SandboxLimits(wall_seconds=self.timeout_s, cpu_seconds=int(self.timeout_s) + 5,
                                         address_space_bytes=4 * 1024**3, max_file_bytes=256 * 1024**2),
                    env=scrubbed_env(tmpdir=scratch.inside(work)),
                    binds=_toolchain_binds(self.compiler),
                )
                seconds = time.monotonic() - start
                log = (result.stderr_tail + result.stdout_tail).strip()
                if result.timed_out:
                    log += f"\ncompiler {result.describe()}"
                diagnostics = parse_diagnostics(log, SOURCE_NAME)
                library: bytes | None = None
                if result.returncode == 0:
                    try:
                        library = read_back(dir_fd, ARTIFACT_NAME, owner=result.uid, max_bytes=MAX_ARTIFACT_BYTES)
                    except UntrustedFileError as exc:
                        log += f"\nerror: the build's output was refused: {exc}"
                        diagnostics.append(Diagnostic(0, 0, "error", f"the build's output was refused: {exc}"))
            finally:
                os.close(dir_fd)
            ok = library is not None
            build = BuildResult(
                build_hash=digest, ok=ok, diagnostics=diagnostics, log="", seconds=round(seconds, 3),
                cached=False, artifact=None, uses_openmp="-fopenmp" in flags, flags=flags,
                sha256=hashlib.sha256(library).hexdigest() if library is not None else None,
            )
            staging = self._stage(build, library, source)
            if ok and not _defines_kernel(staging / ARTIFACT_NAME):
                build.ok, build.sha256 = False, None
                build.diagnostics.append(Diagnostic(0, 0, "error", "the source does not define a function named "
                                                    f"`kernel` (expected: {task.spec.prototype})"))
                log += "\nerror: no exported symbol `kernel` in the built library"
                (staging / ARTIFACT_NAME).unlink()
            if not build.ok and not any(d.severity == "error" for d in build.diagnostics):
                build.diagnostics.append(Diagnostic(0, 0, "error", f"compiler {result.describe()}"))
            build.log = trim_log(log.replace(SANDBOX_RUN + "/", ""), work)
            self._commit(build, staging, final_dir)
            build.artifact = (final_dir / ARTIFACT_NAME) if build.ok else None
            return build

    def _stage(self, build: BuildResult, library: bytes | None, source: str) -> Path:
        self.builds_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = self.builds_dir / f".tmp-{uuid.uuid4().hex}"
        staging.mkdir(mode=0o700)
        if library is not None:
            fd = os.open(staging / ARTIFACT_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
            with os.fdopen(fd, "wb") as fh:
                fh.write(library)
        (staging / SOURCE_NAME).write_text(source, encoding="utf-8")
        return staging

    def _commit(self, build: BuildResult, staging: Path, final_dir: Path) -> None:
        meta = asdict(build)
        meta["artifact"] = None
        (staging / "build.json").write_text(json.dumps(meta, default=str, indent=1))
        try:
            os.rename(staging, final_dir)
        except OSError:
            # Another thread finished the same build first; its result is identical.
            shutil.rmtree(staging, ignore_errors=True)


def _verify(path: Path, expected: str | None) -> None:
    if expected is None:
        raise TamperedBuildError(f"{path.parent.name}: no recorded hash (built by an older kope-mcp)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected:
        raise TamperedBuildError(f"build {path.parent.name}: the library changed since it was built "
                                 f"(sha256 {digest[:12]}..., recorded {expected[:12]}...)")


@functools.cache
def _toolchain_binds(compiler: str) -> tuple[Path, ...]:
    """A compiler outside /usr (``KOPE_CC=/opt/gcc-14/bin/gcc``) is bound read-only with its whole prefix."""
    found = shutil.which(compiler)
    if found is None:
        return ()
    real = Path(os.path.realpath(found))
    if str(real).startswith("/usr/"):
        return ()
    return (real.parent.parent,)


def _defines_kernel(library: Path) -> bool:
    try:
        out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return True  # without nm we cannot tell; the harness reports a missing symbol at run time
    return any(line.split()[-1:] == ["kernel"] and " T " in f" {line} " for line in out.stdout.splitlines())
