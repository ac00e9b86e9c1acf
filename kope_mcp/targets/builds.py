"""Content-addressed builds under ``KOPE_HOME/builds`` (0700), shared by every target.

A build folder holds the target's artifact (a shared library, a Python module), the source, and ``build.json``
with the sha256 of the artifact, taken from the bytes read back from the sandbox. The artifact is verified
against that hash before every later use, so a library changed on disk after it was built is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kope_mcp.diagnostics import Diagnostic

_LOG_LIMIT = 6000


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
    flags: list[str] = field(default_factory=list)
    sha256: str | None = None
    # What the target needs to know later about this build (OpenMP for C; the GPU arch and the static resource
    # report for a GPU target). JSON-serialisable.
    traits: dict[str, Any] = field(default_factory=dict)


def build_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def trim_log(text: str, build_dir: Path | str | None = None) -> str:
    if build_dir is not None:
        text = text.replace(str(build_dir) + "/", "").replace(str(build_dir), ".")
    if len(text) > _LOG_LIMIT:
        text = text[: _LOG_LIMIT // 2] + "\n[... log cut ...]\n" + text[-_LOG_LIMIT // 2 :]
    return text


class BuildCache:
    def __init__(self, builds_dir: Path, artifact_name: str, source_name: str) -> None:
        self.builds_dir = builds_dir
        self.artifact_name = artifact_name
        self.source_name = source_name

    def load(self, digest: str) -> BuildResult | None:
        """A finished build, or None (never built, or set aside because its artifact changed on disk)."""
        final_dir = self.builds_dir / digest
        meta = final_dir / "build.json"
        if not meta.is_file():
            return None
        data = json.loads(meta.read_text())
        artifact = final_dir / self.artifact_name
        if data["ok"]:
            try:
                verify(artifact, data.get("sha256"))
            except (TamperedBuildError, FileNotFoundError):
                # Rebuild rather than load what was not built here: the cache entry is set aside.
                os.rename(final_dir, self.builds_dir / f".tampered-{final_dir.name}-{uuid.uuid4().hex[:8]}")
                return None
        return BuildResult(
            build_hash=data["build_hash"], ok=data["ok"], diagnostics=[Diagnostic(**d) for d in data["diagnostics"]],
            log=data["log"], seconds=data["seconds"], cached=True,
            artifact=artifact if data["ok"] and artifact.is_file() else None, flags=data.get("flags", []),
            sha256=data.get("sha256"),
            traits=data.get("traits") or {"uses_openmp": bool(data.get("uses_openmp"))},
        )

    def artifact(self, digest: str) -> Path:
        """The artifact of an earlier successful build, verified against its recorded sha256."""
        final_dir = self.builds_dir / digest
        path = final_dir / self.artifact_name
        if not path.is_file():
            raise FileNotFoundError(f"build {digest} is missing from {self.builds_dir}; compile the kernel again")
        meta = json.loads((final_dir / "build.json").read_text())
        verify(path, meta.get("sha256"))
        return path

    def traits(self, digest: str) -> dict[str, Any]:
        data = json.loads((self.builds_dir / digest / "build.json").read_text())
        return dict(data.get("traits") or {"uses_openmp": bool(data.get("uses_openmp"))})

    def commit(self, build: BuildResult, artifact: bytes | None, source: str) -> None:
        """Write the build atomically (a staging folder renamed into place); fills in ``build.artifact``."""
        self.builds_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = self.builds_dir / f".tmp-{uuid.uuid4().hex}"
        staging.mkdir(mode=0o700)
        build.ok = build.ok and artifact is not None
        if build.ok and artifact is not None:
            fd = os.open(staging / self.artifact_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
            with os.fdopen(fd, "wb") as fh:
                fh.write(artifact)
            build.sha256 = hashlib.sha256(artifact).hexdigest()
        else:
            build.sha256 = None
        (staging / self.source_name).write_text(source, encoding="utf-8")
        meta = asdict(build)
        meta["artifact"] = None
        (staging / "build.json").write_text(json.dumps(meta, default=str, indent=1))
        final_dir = self.builds_dir / build.build_hash
        try:
            os.rename(staging, final_dir)
        except OSError:
            # Another thread finished the same build first; its result is identical.
            shutil.rmtree(staging, ignore_errors=True)
        build.artifact = (final_dir / self.artifact_name) if build.ok else None


def verify(path: Path, expected: str | None) -> None:
    if expected is None:
        raise TamperedBuildError(f"{path.parent.name}: no recorded hash (built by an older kope-mcp)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected:
        raise TamperedBuildError(f"build {path.parent.name}: the artifact changed since it was built "
                                 f"(sha256 {digest[:12]}..., recorded {expected[:12]}...)")
