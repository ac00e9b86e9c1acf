"""Attempts acknowledged before they are in the graph.

A compile's attempt is appended here and synced to disk (0.5-0.7 ms here) before compile_kernel answers; the
graph gets it right after, in the background (a Kùzu statement with its edges costs ~2-4 ms), and
before any other statement runs (see ``KuzuExperienceStore``), so every read sees it. A server that dies in
between replays the file when it opens the memory again: an acknowledged attempt is never lost. A line cut short
by a crash mid-append was never acknowledged (the answer waits for the sync) and is skipped.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from kope_mcp.memory.records import AttemptRecord

log = logging.getLogger(__name__)


class AttemptJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd = -1
        self._pending: collections.deque[AttemptRecord] = collections.deque()
        self._unapplied = 0  # in the file and not yet in the graph (taken or still pending)

    @property
    def pending(self) -> bool:
        """Records waiting to be taken (a plain read: a stale answer only delays a barrier by one statement)."""
        return bool(self._pending)

    def append(self, record: AttemptRecord) -> None:
        """Durable when this returns: written and synced."""
        line = (record.model_dump_json() + "\n").encode("utf-8")
        with self._lock:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
            os.fdatasync(self._fd)
            self._pending.append(record)
            self._unapplied += 1

    def take(self) -> list[AttemptRecord]:
        """Everything pending, oldest first; call :meth:`applied` once it is in the graph."""
        with self._lock:
            records = list(self._pending)
            self._pending.clear()
            return records

    def applied(self, count: int) -> None:
        """``count`` taken records are in the graph (or set aside); the file empties once nothing is unapplied."""
        with self._lock:
            self._unapplied -= count
            if self._unapplied == 0 and self._fd >= 0:
                os.ftruncate(self._fd, 0)

    def recorded(self) -> list[AttemptRecord]:
        """What a previous process acknowledged and may not have written (read once, when the memory opens)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        records = []
        for number, line in enumerate(raw.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                records.append(AttemptRecord.model_validate(json.loads(line)))
            except (ValueError, ValidationError):  # json's and pydantic's: a torn last line, never acknowledged
                log.warning("%s:%d: skipped an incomplete journal line (%d bytes)", self.path, number, len(line))
        return records

    def clear(self) -> None:
        """After a replay: everything recorded is in the graph."""
        with self._lock:
            if self._fd >= 0:
                os.ftruncate(self._fd, 0)
            elif self.path.exists():
                os.truncate(self.path, 0)

    def set_aside(self, record: AttemptRecord, why: str) -> Path:
        """Keep a record the graph refused next to the memory (it stays importable); returns the file."""
        aside = self.path.with_name(self.path.name + ".unapplied.jsonl")
        with aside.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"why": why, "attempt": record.model_dump(mode="json")}) + "\n")
        return aside

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class JournalledAttempts:
    """``add_attempt_soon`` and the graph writer: a mixin of KuzuExperienceStore, whose every statement first
    calls :meth:`_apply_journal` when the journal holds something (the read barrier)."""

    if TYPE_CHECKING:
        _lock: threading.RLock
        _journal: AttemptJournal
        _applying: bool
        _closing: bool
        _wake: threading.Event
        _applier: threading.Thread | None

        def add_attempt(self, record: AttemptRecord) -> None: ...
        def has_node(self, table: str, key: str, value: str) -> bool: ...

    def add_attempt_soon(self, record: AttemptRecord) -> None:
        """:meth:`add_attempt`, durable on return (journalled and synced, 0.5-0.7 ms here) and in the graph shortly
        after, always before the next statement of anyone runs. The caller must have created what it links to
        (session, task, hardware, parent, strategy)."""
        self._journal.append(record)
        if self._applier is None:
            with self._lock:
                if self._applier is None:
                    self._applier = threading.Thread(target=self._apply_loop, name="kope-graph-writer",
                                                     daemon=True)
                    self._applier.start()
        self._wake.set()

    def _apply_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                if self._closing:
                    return
                self._apply_journal()

    @contextlib.contextmanager
    def _writing_journal(self) -> Iterator[None]:
        """The caller holds the lock; statements run meanwhile skip the read barrier (they are the journal's)."""
        self._applying = True
        try:
            yield
        finally:
            self._applying = False

    def _apply_journal(self) -> None:
        """Write every pending attempt, oldest first (the caller holds the lock)."""
        with self._writing_journal():
            while records := self._journal.take():
                for record in records:
                    self._add_or_set_aside(record)
                self._journal.applied(len(records))

    def _add_or_set_aside(self, record: AttemptRecord) -> None:
        try:
            self.add_attempt(record)
        except (ValueError, RuntimeError) as exc:  # ours (a link missing) and Kùzu's: never drop it silently
            aside = self._journal.set_aside(record, str(exc))
            log.error("attempt %s could not be written to the graph (%s); kept in %s", record.kernel_id, exc,
                      aside)

    def _replay_journal(self) -> None:
        recorded = self._journal.recorded()
        if not recorded:
            return
        with self._lock, self._writing_journal():
            missing = [r for r in recorded if not self.has_node("Attempt", "kernel_id", r.kernel_id)]
            for record in missing:
                self._add_or_set_aside(record)
            self._journal.clear()
        if missing:
            log.warning("wrote %d acknowledged attempts the last server had not written to the graph", len(missing))
