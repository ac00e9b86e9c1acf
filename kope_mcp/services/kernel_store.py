"""Kernel records and sessions, kept in an append-only journal under KOPE_HOME.

Every compile, test and profile outcome is appended (flushed and fsynced) before the tool call returns, so an
acknowledged result survives a crash or ``kill -9`` of the server; the journal is replayed at start-up.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from kope_mcp.errors import UnknownKernelError, UnknownSessionError


class KernelRecord(BaseModel):
    kernel_id: str
    session_id: str
    task_id: str
    backend: str
    build_hash: str
    flags: list[str]
    ok: bool
    uses_openmp: bool
    parent_id: str | None = None
    strategy: str | None = None
    created_at: str
    test: dict[str, Any] | None = Field(None, description="passed, failure, message of the latest run_tests.")
    profile: dict[str, Any] | None = Field(None, description="Summary of the latest profile_kernel.")


class SessionRecord(BaseModel):
    session_id: str
    task_id: str
    created_at: str
    kernel_ids: list[str] = Field(default_factory=list)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class KernelStore:
    def __init__(self, home: Path) -> None:
        self._path = home / "journal.jsonl"
        self._lock = threading.Lock()
        self._kernels: dict[str, KernelRecord] = {}
        self._sessions: dict[str, SessionRecord] = {}
        home.mkdir(parents=True, exist_ok=True)
        self._replay()

    def _replay(self) -> None:
        if not self._path.is_file():
            return
        with self._path.open("rb+") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() and (fh.seek(-1, os.SEEK_END), fh.read(1))[1] != b"\n":
                # Close a line torn by a crash so the next event is not glued onto it.
                fh.write(b"\n")
        with self._path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line from a crash mid-write was never acknowledged
                self._apply(event)

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "session":
            record = SessionRecord.model_validate(event["record"])
            self._sessions[record.session_id] = record
        elif kind == "kernel":
            kernel = KernelRecord.model_validate(event["record"])
            self._kernels[kernel.kernel_id] = kernel
            session = self._sessions.get(kernel.session_id)
            if session is not None and kernel.kernel_id not in session.kernel_ids:
                session.kernel_ids.append(kernel.kernel_id)
        elif kind in ("test", "profile") and event.get("kernel_id") in self._kernels:
            setattr(self._kernels[event["kernel_id"]], kind, event["summary"])

    def _append(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self._apply(event)

    def create_session(self, task_id: str) -> SessionRecord:
        record = SessionRecord(session_id=new_id("s"), task_id=task_id, created_at=now())
        with self._lock:
            self._append({"event": "session", "record": record.model_dump()})
        return record

    def session(self, session_id: str) -> SessionRecord:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSessionError(session_id) from None

    def add_kernel(self, record: KernelRecord) -> None:
        with self._lock:
            self._append({"event": "kernel", "record": record.model_dump()})

    def set_outcome(self, kernel_id: str, kind: str, summary: dict[str, Any]) -> None:
        with self._lock:
            self._append({"event": kind, "kernel_id": kernel_id, "summary": summary, "at": now()})

    def kernel(self, kernel_id: str) -> KernelRecord:
        try:
            return self._kernels[kernel_id]
        except KeyError:
            raise UnknownKernelError(kernel_id) from None

    def latest_in_session(self, session_id: str) -> KernelRecord | None:
        session = self._sessions.get(session_id)
        if session is None or not session.kernel_ids:
            return None
        return self._kernels[session.kernel_ids[-1]]
