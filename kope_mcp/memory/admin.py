"""Memory you can manage: statistics, one item in full, and export/import in a versioned JSONL format.

Format ``kope-memory`` version 1: one JSON object per line. The first is a header ``{"kind": "header", "format":
"kope-memory", "version": 1, "exported_at": ..., "counts": {...}}``; then one line per node, kinds in this order:
``task``, ``hardware``, ``strategy``, ``session``, ``attempt`` (as the database keeps them: a PREV parent may come
after its child, see ``node_pages``), ``lesson``, ``embedding`` (``id``, ``item_kind``, ``model``, ``vector``).
Fields are those of the records in ``kope_mcp/memory/records.py``. Import merges: a node whose id already exists is
skipped, so importing the same file twice, or into a memory that shares part of it, creates no duplicates; edges are
rebuilt from the ids each record carries. A record must find what it names in the memory or earlier in the file,
except an attempt's parent, which may come anywhere in the file.

Provenance: the header names the exporting home (``home_id``, kept in ``KOPE_HOME/home-id``) and every record line
carries ``sha256``, the hash of the line without it, and ``mac``, an HMAC-SHA256 of the same under the home's key
(``KOPE_HOME/home-key``, 0600, never exported). A record whose hash does not match was edited after the export:
counted in the report (``edited``); an edited lesson or vector is left out, an edited attempt is kept for its
successors' sake but as suspect (never taught). A line is this home's own only when its ``mac`` verifies under
this home's key: a file that names this home but whose line does not prove it (edited and re-hashed, say) is
counted edited too, and everything not proven is an import, whatever its ``home_id`` (an unkeyed hash anyone can
recompute; a copied ``home-id`` anyone can claim). Measurements from another home keep ``origin`` ("home <id>,
exported <time>") and lessons from one are stored unverified: they are evidence from elsewhere, served as such
(never under "What worked here"). An export of this same home (a backup) comes back as its own.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kope_mcp.errors import KopeError
from kope_mcp.memory.experience_memory import ExperienceMemory, now
from kope_mcp.memory.records import AttemptRecord, LessonRecord, SessionRecord
from kope_mcp.memory.schema import EMBEDDING_DIM
from kope_mcp.memory.strategies import strategy_key
from kope_mcp.memory.transfer import MemoryStats

FORMAT = "kope-memory"
VERSION = 1


class InvalidExportError(KopeError):
    code = "invalid_export"


class ImportReport(BaseModel):
    added: dict[str, int]
    skipped_existing: dict[str, int]
    edited: dict[str, int] = {}  # records whose sha256 does not match their line (see the module's docstring)
    unhashed: int = 0  # records from an export written before per-record hashes (taken as they are)
    origin: str = ""  # '' when the export is this home's own


HOME_ID_FILE = "home-id"
HOME_KEY_FILE = "home-key"


@dataclass(frozen=True)
class HomeSeal:
    """A home's name and its key: what its exports are signed with, so that only they come back as its own."""

    home_id: str
    key: bytes

    def mac(self, kind: str, data: dict[str, Any]) -> str:
        return hmac.new(self.key, _line_body(kind, data).encode(), hashlib.sha256).hexdigest()

    def proves(self, kind: str, data: dict[str, Any], mac: object) -> bool:
        return isinstance(mac, str) and hmac.compare_digest(mac, self.mac(kind, data))


def home_identity(home: Path) -> str:
    """This home's id (random, made once, kept 0600 in the home): names it as the origin of what it exports."""
    path = home / HOME_ID_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return path.read_text(encoding="utf-8").strip()[:64]
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(secrets.token_hex(6) + "\n")
    return path.read_text(encoding="utf-8").strip()


def home_seal(home: Path) -> HomeSeal:
    """This home's id and key (each made once, kept 0600 in the home)."""
    path = home / HOME_KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(secrets.token_hex(32) + "\n")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, encoding="utf-8") as fh:
        key = fh.read(256).strip()
    if len(key) < 32:
        raise InvalidExportError(f"the home's key file {HOME_KEY_FILE} is damaged: remove it (its old exports then "
                                 "come back as imports) and a new one is made")
    return HomeSeal(home_identity(home), key.encode())


def export_line(kind: str, data: dict[str, Any], seal: HomeSeal | None = None) -> str:
    """One line of an export: the record with its ``sha256``, and with ``seal`` its ``mac``. For tools that derive
    an export from another (the bench's sampled memories): they re-hash what they changed, and only the home
    whose key ``seal`` holds can make it its own again."""
    if kind != "header":
        data = {k: v for k, v in data.items() if k not in ("sha256", "mac")}
        data = {**data, "sha256": _line_hash(kind, data), **({"mac": seal.mac(kind, data)} if seal else {})}
    return json.dumps({"kind": kind, **data}, separators=(",", ":"))


def _line_body(kind: str, data: dict[str, Any]) -> str:
    return json.dumps({"kind": kind, **{k: v for k, v in data.items() if k not in ("sha256", "mac")}},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _line_hash(kind: str, data: dict[str, Any]) -> str:
    return hashlib.sha256(_line_body(kind, data).encode()).hexdigest()


def memory_stats(memory: ExperienceMemory) -> MemoryStats:
    return memory.stats()


def show_item(memory: ExperienceMemory, item_id: str) -> dict[str, Any]:
    return memory.describe(item_id)


def export_memory(memory: ExperienceMemory, path: Path, seal: HomeSeal | None = None) -> dict[str, int]:
    """Every record of ``memory`` into ``path``, signed with ``seal`` (the exporting home's)."""
    counts = memory.counts()
    with path.open("w", encoding="utf-8") as fh:
        def write(kind: str, data: dict[str, Any]) -> None:
            fh.write(export_line(kind, data, seal) + "\n")

        write("header", {"format": FORMAT, "version": VERSION, "exported_at": now(), "counts": counts,
                         "home_id": seal.home_id if seal else "", "sealed": seal is not None})
        for kind, record in memory.records():
            write(kind, record)
    return counts


def import_memory(memory: ExperienceMemory, path: Path, seal: HomeSeal | None = None) -> ImportReport:
    """Merge an export into ``memory``; ``seal`` is this home's (the lines its key proves come back as its own)."""
    importer = _Importer(memory, path, seal)
    try:
        with path.open(encoding="utf-8") as fh:
            header = json.loads(fh.readline() or "{}")
            if header.get("format") != FORMAT or header.get("version") != VERSION:
                raise InvalidExportError(f"{path} is not a {FORMAT} version {VERSION} file "
                                         f"(header: {header!r:.200})")
            source = str(header.get("home_id") or "")
            # A file that names this home and says it is signed: a line its key does not prove was changed.
            importer.claims_own = seal is not None and bool(source) and source == seal.home_id and \
                header.get("sealed") is True
            importer.foreign = (f"home {source[:64]}" if source and not importer.claims_own else
                                "a copy of this home's export it cannot prove" if source else "an unnamed home") + \
                f", exported {str(header.get('exported_at', '?'))[:19]}"
            for number, line in enumerate(fh, start=2):
                importer.line = number
                if line.strip():
                    importer.take(json.loads(line), len(line))
            importer.flush()
            importer.wait()
            importer.link_forward()
    except (KeyError, ValueError) as exc:
        raise InvalidExportError(f"{path}:{importer.line}: {type(exc).__name__}: {exc}") from None
    finally:
        importer.close()
        memory.forget_cached()  # the import wrote to the store directly
    if importer.added:
        memory.queue_backlog()  # a server importing embeds what it imported; `kope memory import` has no model
    return ImportReport(added=importer.added, skipped_existing=importer.skipped, edited=importer.edited,
                        unhashed=importer.unhashed, origin=importer.foreign if importer.unproven else "")


class _Importer:
    """Rows in file order; consecutive lessons, attempts or embeddings are written together, a chunk at a time (row
    by row, 50k lessons took 19 minutes and an attempt ~4 ms)."""

    def __init__(self, memory: ExperienceMemory, path: Path, seal: HomeSeal | None = None) -> None:
        self.memory, self.path, self.seal = memory, path, seal
        self.claims_own = False  # the header names this home
        self.foreign = ""  # the origin of what this home's key does not prove
        self.unproven = 0  # records of attempts and lessons taken as imports
        self.added: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.rows: list[dict[str, Any]] = []  # the chunk being read: rows of one kind (CHUNK_ROWS, CHUNK_BYTES)
        self.bytes = 0
        self.kind = ""
        self.line = 0
        self.edited: dict[str, int] = {}
        self.unhashed = 0
        # (attempt, parent, line) where the parent comes later in the file: linked once every attempt is written.
        # Kùzu's COPY does not keep a file's order in the database, so the export of a home that once imported
        # lists some children before their parents (45 of 250k attempts in one such export).
        self.forward: list[tuple[str, str, int]] = []
        # Canonical strategy key -> this memory's strategy id; an imported strategy id -> the one it merged into.
        self.strategy_keys: dict[str, str] | None = None
        self.alias: dict[str, str] = {}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kope-import-writer")
        self._pending: tuple[Future[int], int, str] | None = None

    def take(self, row: dict[str, Any], size: int = 0) -> None:
        """One record of the file; ``size``: its line's length (a chunk ends at CHUNK_BYTES of lines)."""
        kind = row.pop("kind")
        claimed = row.pop("sha256", None)
        mac = row.pop("mac", None)
        own = self.seal is not None and self.seal.proves(kind, row, mac)
        if claimed is None:
            self.unhashed += 1
        elif claimed != _line_hash(kind, row) or (self.claims_own and not own):
            # Changed after the export: evidence of nothing. Lessons and vectors are left out; an attempt is kept
            # (its successors link to it) but as a suspect measurement, which nothing ever teaches from; the
            # structure (task, hardware, strategy, session) carries no verdict.
            self.edited[kind] = self.edited.get(kind, 0) + 1
            if kind in ("lesson", "embedding"):
                return
            if kind == "attempt":
                row |= {"suspect": True, "suspect_reason": "changed after its export (sha256 mismatch): not "
                        "evidence of anything"}
        if self._merged_strategy(kind, row):
            return
        if not own and kind in ("attempt", "lesson"):
            self.unproven += 1
            row["origin"] = row.get("origin") or self.foreign  # a re-export keeps the first home's name
            if kind == "lesson":
                row["verified"] = False  # verified described a measurement made there
        if kind in CHUNK_ROWS:
            if kind != self.kind:
                self.flush()
            self.kind = kind
            row["_line"] = self.line
            self.rows.append(row)
            self.bytes += size
            if len(self.rows) >= CHUNK_ROWS[kind] or self.bytes >= CHUNK_BYTES:
                self.flush()
            return
        self.flush()
        self.wait()  # later rows (an attempt's lessons, say) may need what is in flight
        self._count(kind, 1 if _import_row(self.memory, kind, row) else 0, 1)

    def _merged_strategy(self, kind: str, row: dict[str, Any]) -> bool:
        """A strategy that this memory already has under another id (the same canonical key of its name) is not
        added again: what names it is pointed at this memory's own, and its vector is not needed. True when the
        row is done with."""
        if self.strategy_keys is None:
            self.strategy_keys = {record.key: record.strategy_id for record in self.memory.strategies()}
        if kind == "strategy" and isinstance(row.get("strategy_id"), str):
            key = strategy_key(str(row.get("name") or ""))
            known = self.strategy_keys.setdefault(key, row["strategy_id"])
            if known != row["strategy_id"]:
                self.alias[row["strategy_id"]] = known
                self._count("strategy", 0, 1)
                return True
        elif kind in ("attempt", "lesson") and row.get("strategy_id") in self.alias:
            row["strategy_id"] = self.alias[row["strategy_id"]]
        elif kind == "embedding" and row.get("id") in self.alias:
            self._count("embedding", 0, 1)
            return True
        return False

    def flush(self) -> None:
        """Hand the chunk read so far to the writer thread, which writes it while the next one is read and checked
        (Kùzu's COPY runs without the GIL); one chunk in flight, so a chunk finds every earlier one written."""
        if self.rows:
            self.wait()
            chunk, self.rows, self.bytes = self.rows, [], 0
            write = {"session": _import_sessions, "attempt": self._attempts, "lesson": _import_lessons,
                     "embedding": _import_embeddings}[self.kind]
            self._pending = (self._writer.submit(write, self.memory, self.path, chunk), len(chunk), self.kind)

    def _attempts(self, memory: ExperienceMemory, path: Path, rows: list[dict[str, Any]]) -> int:
        return _import_attempts(memory, path, rows, self.forward)

    def link_forward(self) -> None:
        """The parents named before they came: every one must now be in the memory (else the line that named it
        is refused), and gets the PREV edge its child could not have when it was written."""
        if not self.forward:
            return
        there = self.memory.known_ids("Attempt", "kernel_id", [parent for _, parent, _ in self.forward])
        for child, parent, line in self.forward:
            if parent not in there:
                raise InvalidExportError(f"{self.path}:{line}: attempt {child!r} names parent_id {parent!r}, which "
                                         "is neither in the memory nor anywhere in the file")
        self.memory.link_parents([(child, parent) for child, parent, _ in self.forward])
        self.forward = []

    def wait(self) -> None:
        """Until the chunk in flight is written (its errors are raised here)."""
        if self._pending is not None:
            future, seen, kind = self._pending
            self._pending = None
            self._count(kind, future.result(), seen)

    def close(self) -> None:
        """Let the writer finish whatever it has (also when the import failed) before the memory is touched."""
        if self._pending is not None:
            self._pending[0].exception()
            self._pending = None
        self._writer.shutdown(wait=True)

    def _count(self, kind: str, new: int, seen: int) -> None:
        self.added[kind] = self.added.get(kind, 0) + new
        self.skipped[kind] = self.skipped.get(kind, 0) + seen - new
        if not self.added[kind]:
            del self.added[kind]
        if not self.skipped[kind]:
            del self.skipped[kind]


# Rows per write, a COPY of nodes and one per edge table (lessons by 2,000: 1M lessons took ~5 min). Attempts carry
# their sources (kilobytes each) and embeddings 384 numbers: fewer per chunk bounds the importer's memory.
CHUNK_ROWS = {"session": 20_000, "attempt": 20_000, "lesson": 20_000, "embedding": 5_000}
# and at most this many bytes of lines: an attempt's source can be hundreds of kilobytes, and a chunk of 20k
# attempts of ~2 KB each took the importer past 1.3 GB (two chunks are in memory: one written, one read).
CHUNK_BYTES = 8 * 1024**2


def _import_lessons(memory: ExperienceMemory, path: Path, rows: list[dict[str, Any]]) -> int:
    """Write a chunk of lessons at once (row by row, 50k lessons took 19 minutes); returns how many were new.
    Edges go only to nodes that exist, as the row-by-row MATCH ... CREATE did."""
    records: list[tuple[LessonRecord, str]] = []
    for row in rows:
        if not isinstance(row.get("lesson_id"), str):
            raise InvalidExportError(f"{path}:{row['_line']}: a lesson needs a string lesson_id")
    seen = memory.known_ids("Lesson", "lesson_id", [row["lesson_id"] for row in rows])
    for row in rows:
        line = row.pop("_line")
        if row["lesson_id"] in seen:
            continue
        seen.add(row["lesson_id"])
        text = row.pop("search_text", "") or row.get("text", "")
        try:
            records.append((LessonRecord.model_validate(row), text))
        except ValueError as exc:
            raise InvalidExportError(f"{path}:{line}: {type(exc).__name__}: {exc}") from None
    if records:
        memory.add_lessons(records)
    return len(records)


def _import_row(memory: ExperienceMemory, kind: str, row: dict[str, Any]) -> bool:
    return memory.add_record(kind, row)


# What a chunk's records must find, in the memory or (for `own`) among themselves, as a record written alone must:
# (kind, its id field, its table, its model, [(table, key, field naming a node of it)], own table).
_CHUNKED: dict[str, tuple[str, str, type[Any], tuple[tuple[str, str, str], ...], str]] = {
    "session": ("session_id", "Session", SessionRecord,
                (("Task", "id", "task_id"), ("Hardware", "key", "hardware_key")), ""),
    "attempt": ("kernel_id", "Attempt", AttemptRecord,
                (("Session", "session_id", "session_id"), ("Task", "id", "task_id"),
                 ("Hardware", "key", "hardware_key"), ("Attempt", "kernel_id", "parent_id"),
                 ("Strategy", "strategy_id", "strategy_id")), "Attempt"),
}


def _new_records(memory: ExperienceMemory, path: Path, kind: str, rows: list[dict[str, Any]],
                 forward: list[tuple[str, str, int]] | None = None) -> list[Any]:
    """The chunk's records that are not in the memory yet, validated, each finding the nodes it names; one
    naming a node of its own table that is not there yet (a parent later in the file) goes to ``forward`` as
    (its id, the id it names, its line) when given, for the caller to check and link at the end."""
    id_field, table, model, named, own = _CHUNKED[kind]
    for row in rows:
        if not isinstance(row.get(id_field), str):
            raise InvalidExportError(f"{path}:{row['_line']}: a {kind} needs a string {id_field}")
    seen = memory.known_ids(table, id_field, [row[id_field] for row in rows])
    records: list[Any] = []
    lines: dict[str, int] = {}
    for row in rows:
        line = row.pop("_line")
        if row[id_field] in seen:
            continue
        seen.add(row[id_field])
        try:
            records.append(model.model_validate(row))
        except ValueError as exc:
            raise InvalidExportError(f"{path}:{line}: {type(exc).__name__}: {exc}") from None
        lines[row[id_field]] = line
    for other, key, field in named:
        values = [value for r in records if (value := getattr(r, field))]
        there = memory.known_ids(other, key, values) | (set(lines) if other == own else set())
        for record in records:
            value = getattr(record, field)
            if value and value not in there:
                ident = getattr(record, id_field)
                if other == own and forward is not None:
                    forward.append((ident, value, lines[ident]))
                    continue
                raise InvalidExportError(f"{path}:{lines[ident]}: {kind} {ident!r} names {field} {value!r}, which "
                                         "is neither in the memory nor earlier in the file")
    return records


def _import_sessions(memory: ExperienceMemory, path: Path, rows: list[dict[str, Any]]) -> int:
    """Write a chunk of sessions at once; returns how many were new."""
    records = _new_records(memory, path, "session", rows)
    if records:
        memory.add_sessions(records)
    return len(records)


def _import_attempts(memory: ExperienceMemory, path: Path, rows: list[dict[str, Any]],
                     forward: list[tuple[str, str, int]]) -> int:
    """Write a chunk of attempts at once; returns how many were new. A parent later in the file goes to
    ``forward`` (see :meth:`_Importer.link_forward`)."""
    records = _new_records(memory, path, "attempt", rows, forward)
    if records:
        memory.add_attempts(records)
    return len(records)


def _import_embeddings(memory: ExperienceMemory, path: Path, rows: list[dict[str, Any]]) -> int:
    """Write a chunk of embeddings at once (items that have none yet); returns how many were new."""
    out: dict[str, tuple[str, str, str, list[float]]] = {}
    for row in rows:
        vector = row.get("vector")
        if not (isinstance(row.get("id"), str) and isinstance(row.get("item_kind"), str)
                and isinstance(vector, list) and len(vector) == EMBEDDING_DIM
                and all(isinstance(x, int | float) and math.isfinite(x) for x in vector)):
            raise InvalidExportError(f"{path}:{row['_line']}: an embedding needs a string id and item_kind and "
                                     f"{EMBEDDING_DIM} finite numbers")
        out[row["id"]] = (row["id"], row["item_kind"], str(row.get("model") or ""), [float(x) for x in vector])
    known = memory.known_ids("Embedding", "id", list(out))
    fresh = [row for item_id, row in out.items() if item_id not in known]
    if fresh:
        memory.add_embeddings(fresh)
    return len(fresh)
