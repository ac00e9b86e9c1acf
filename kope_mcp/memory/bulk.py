"""Bulk loading of the experience graph (imports, benchmarks, the embedding backlog): many rows per statement,
edges by COPY. A mixin of KuzuExperienceStore, kept apart because store.py is the graph's everyday API; it runs
its statements through the store's plumbing and never imports kuzu itself."""

from __future__ import annotations

import math
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kope_mcp.memory.records import AttemptRecord, LessonRecord, SessionRecord
from kope_mcp.memory.rows import ATTEMPT_COLUMNS, LESSON_COLUMNS, attempt_props


class BulkLoading:
    _deferred: _Deferred | None = None  # set by defer_writes: an import's staging copy

    if TYPE_CHECKING:
        _lock: threading.RLock
        path: Path

        def _exec(self, query: str, params: dict[str, Any] | None = None) -> None: ...
        def _rows(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...
        def set_embedding(self, item_id: str, kind: str, model: str, vector: list[float]) -> None: ...

    # --- bulk loading (benchmarks, large imports) -----------------------------------------------------------
    def bulk_attempts(self, records: list[AttemptRecord]) -> None:
        """Insert many new attempts with their edges: nodes by a CSV COPY (an UNWIND where a value cannot be said
        in CSV), edges by COPY, each edge only to a node that exists (the caller checks what must)."""
        rows = [attempt_props(r) for r in records]
        with self._lock:
            if not self._copy_nodes("Attempt", rows):
                assignments = _unwind_assignments(rows[0], ATTEMPT_COLUMNS)
                self._exec(f"UNWIND $rows AS r CREATE (:Attempt {{{assignments}}})", {"rows": rows})
            self._link("IN_SESSION", "Attempt", "Session", "session_id", [(r.kernel_id, r.session_id) for r in records])
            self._link("FOR_TASK", "Attempt", "Task", "id", [(r.kernel_id, r.task_id) for r in records])
            self._link("ON_HARDWARE", "Attempt", "Hardware", "key", [(r.kernel_id, r.hardware_key) for r in records])
            self._link("PREV", "Attempt", "Attempt", "kernel_id", [(r.kernel_id, r.parent_id) for r in records])
            self._link("APPLIED", "Attempt", "Strategy", "strategy_id", [(r.kernel_id, r.strategy_id) for r in records])

    def bulk_sessions(self, records: list[SessionRecord]) -> None:
        """Insert many new sessions with their edges to the tasks and hardware that exist (the caller checks)."""
        rows = [{"session_id": r.session_id, "task_id": r.task_id, "hardware_key": r.hardware_key,
                 "agent_name": r.agent.name, "agent_version": r.agent.version, "agent_label": r.agent.label,
                 "created_at": r.created_at, "incumbent_id": r.incumbent_id, "incumbent_speedup": r.incumbent_speedup}
                for r in records]
        with self._lock:
            if not self._copy_nodes("Session", rows):
                self._exec("UNWIND $rows AS r CREATE (:Session {session_id: r.session_id, task_id: r.task_id, "
                           "hardware_key: r.hardware_key, agent_name: r.agent_name, agent_version: r.agent_version, "
                           "agent_label: CAST(r.agent_label AS STRING), created_at: r.created_at, "
                           "incumbent_id: CAST(r.incumbent_id AS STRING), "
                           "incumbent_speedup: CAST(r.incumbent_speedup AS DOUBLE)})", {"rows": rows})
            self._link("FOR_TASK", "Session", "Task", "id", [(r.session_id, r.task_id) for r in records])
            self._link("ON_HARDWARE", "Session", "Hardware", "key", [(r.session_id, r.hardware_key) for r in records])

    def bulk_lessons(self, records: list[tuple[LessonRecord, str]]) -> None:
        """Insert many lessons with their edges to the attempts, strategies and tasks that exist."""
        rows = [{**lesson.model_dump(), "search_text": text} for lesson, text in records]
        with self._lock:
            if not self._copy_nodes("Lesson", rows):
                assignments = _unwind_assignments(rows[0], LESSON_COLUMNS)
                self._exec(f"UNWIND $rows AS r CREATE (:Lesson {{{assignments}}})", {"rows": rows})
            lessons = [lesson for lesson, _ in records]
            self._link("FROM_ATTEMPT", "Lesson", "Attempt", "kernel_id", [(x.lesson_id, x.attempt_id) for x in lessons])
            self._link("ABOUT", "Lesson", "Strategy", "strategy_id", [(x.lesson_id, x.strategy_id) for x in lessons])
            self._link("ABOUT", "Lesson", "Task", "id", [(x.lesson_id, x.task_id) for x in lessons])

    def bulk_links(self, rel: str, src: str, dst: str, pairs: list[tuple[str, str]]) -> None:
        """COPY the edges ``rel`` between existing nodes (the caller checked both ends)."""
        with self._lock:
            self._copy_edges(rel, src, dst, pairs)

    def _link(self, rel: str, src: str, dst: str, key: str, pairs: list[tuple[str, str | None]]) -> None:
        """COPY the edges ``rel`` from new ``src`` nodes to the ``dst`` nodes (by ``key``) that exist; a pair
        naming none, or a node that is not there, gets no edge."""
        named = [(a, b) for a, b in pairs if b]
        there = self.existing_ids(dst, key, [b for _, b in named])
        self._copy_edges(rel, src, dst, [(a, b) for a, b in named if b in there])

    def existing_ids(self, table: str, key: str, ids: list[str]) -> set[str]:
        """Which of ``ids`` are nodes of ``table`` (one query, not one per id)."""
        if not ids:
            return set()
        deferred = self._deferred
        pending = deferred.nodes.get(table) if deferred is not None and _KEYS.get(table) == key else None
        held = {i for i in ids if i in pending.ids} if pending is not None else set()
        rest = [i for i in dict.fromkeys(ids) if i not in held]
        if not rest:
            return held
        query = f"UNWIND $ids AS x MATCH (n:{table} {{{key}: x}}) RETURN n.{key} AS i"
        return held | {r["i"] for r in self._rows(query, {"ids": rest})}

    def bulk_embeddings(self, rows: list[tuple[str, str, str, list[float]]], chunk: int = 10_000) -> None:
        """(id, kind, model, vector) rows through CSV COPYs of 10k rows (parameter lists of floats are slow, and
        one COPY of 110k vectors took minutes where 11 chunks take seconds)."""
        with tempfile.TemporaryDirectory() as tmp:
            for start in range(0, len(rows), chunk):
                path = Path(tmp) / f"embeddings-{start}.csv"
                with path.open("w", encoding="utf-8") as fh:
                    for item_id, kind, model, vector in rows[start:start + chunk]:
                        # One %-format per row (C code) instead of one f-string per float: ~10x less GIL time.
                        numbers = ("%.7g," * len(vector))[:-1] % tuple(vector)
                        fh.write(f'{item_id},{kind},{model},"[{numbers}]"\n')
                self._exec(f"COPY Embedding FROM '{path}' (HEADER=false)")

    def _copy_nodes(self, table: str, rows: list[dict[str, Any]]) -> bool:
        """Write ``rows`` as new nodes of ``table`` by one CSV COPY: ~10x faster than an UNWIND of parameters and
        without its memory (a parameter list of 25k lessons took the importer to 1.2 GB). False, with nothing
        written, when a value cannot be said in the CSV exactly (the null marker itself, a NaN): the caller then
        uses the UNWIND."""
        columns = self._columns(table)
        lines = []
        for row in rows:
            cells = []
            for name in columns:
                value = row.get(name)
                if value is None:
                    cells.append(_NULL)
                elif isinstance(value, bool):
                    cells.append("true" if value else "false")
                elif isinstance(value, int | float):
                    if not math.isfinite(value):
                        return False
                    cells.append(repr(value))
                elif isinstance(value, str):
                    if value == _NULL:
                        return False
                    cells.append('"' + value.replace('"', '""') + '"')
                else:
                    return False
            lines.append(",".join(cells))
        deferred = self._deferred
        if deferred is not None and table in _KEYS:
            pending = self._pending(deferred.nodes, table, table)
            text = "\n".join(lines) + "\n"
            pending.handle.write(text)
            pending.ids.update(row[_KEYS[table]] for row in rows)
            pending.rows += len(rows)
            pending.bytes += len(text)
            if pending.rows >= DEFERRED_ROWS or pending.bytes >= DEFERRED_BYTES:
                self._write_pending_nodes(deferred, table)
            return True
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{table}.csv"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            self._exec(_COPY_NODES.format(table=table, path=path))
        return True

    def _columns(self, table: str) -> list[str]:
        """The table's columns in the order COPY expects them."""
        cache = self.__dict__.setdefault("_column_order", {})
        if table not in cache:
            cache[table] = [r["name"] for r in self._rows(f"CALL table_info('{table}') RETURN name")]
        return list(cache[table])

    def defer_writes(self) -> None:
        """For a copy that is thrown away unless it completes (an import's staging copy): new nodes are gathered
        in files beside the database and written by one COPY per DEFERRED_ROWS rows or DEFERRED_BYTES, edges by one
        COPY per edge table at :meth:`write_deferred` (or the close). Each COPY into a table costs more the fuller
        its last node group is: five edge COPYs per chunk of ~5k attempts were ~100 s of a million attempts'
        import, and a node COPY of 5k attempts took 0.19 s into an empty table, 0.36 s into one of 43k rows."""
        self._deferred = _Deferred()

    def write_deferred(self) -> None:
        """Write the nodes, then the edges, held back since :meth:`defer_writes` (every node an edge names is
        then there)."""
        deferred = self._deferred
        if deferred is None:
            return
        with self._lock:
            for table in list(deferred.nodes):
                self._write_pending_nodes(deferred, table)
            while deferred.edges:
                (rel, src, dst), pending = deferred.edges.popitem()
                pending.handle.close()
                try:
                    self._exec(f"COPY {rel} FROM '{pending.path}' (from='{src}', to='{dst}', HEADER=false)")
                finally:
                    pending.path.unlink(missing_ok=True)

    def discard_deferred(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            return
        for pending in [*deferred.nodes.values(), *deferred.edges.values()]:
            pending.handle.close()
            pending.path.unlink(missing_ok=True)

    def _pending(self, table: dict[Any, _PendingFile], key: Any, name: str) -> _PendingFile:
        if key not in table:
            path = self.path.with_name(f"{self.path.name}.pending-{name}.csv")
            table[key] = _PendingFile(path, path.open("w", encoding="utf-8"))
        return table[key]

    def _write_pending_nodes(self, deferred: _Deferred, table: str) -> None:
        pending = deferred.nodes.pop(table)
        pending.handle.close()
        try:
            if pending.rows:
                self._exec(_COPY_NODES.format(table=table, path=pending.path))
        finally:
            pending.path.unlink(missing_ok=True)

    def _copy_edges(self, rel: str, src: str, dst: str, pairs: list[tuple[str, str]]) -> None:
        if not pairs:
            return
        deferred = self._deferred
        if deferred is not None:
            pending = self._pending(deferred.edges, (rel, src, dst), f"{rel}-{src}-{dst}")
            pending.handle.write("".join(f"{a},{b}\n" for a, b in pairs))
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{rel}.csv"
            path.write_text("".join(f"{a},{b}\n" for a, b in pairs), encoding="utf-8")
            self._exec(f"COPY {rel} FROM '{path}' (from='{src}', to='{dst}', HEADER=false)")

    def add_embeddings(self, rows: list[tuple[str, str, str, list[float]]]) -> None:
        """(id, kind, model, vector) rows: new ones by one COPY (0.4-0.8 ms a row, a MERGE each costs 1.7 ms),
        ids that already have a vector (embedded meanwhile by another path) by MERGE."""
        with self._lock:
            existing = self.existing_ids("Embedding", "id", [r[0] for r in rows])
            fresh = list({r[0]: r for r in rows if r[0] not in existing}.values())
            if len(fresh) >= 8:
                self.bulk_embeddings(fresh)
            else:
                existing |= {r[0] for r in fresh}
            for item_id, kind, model, vector in rows:
                if item_id in existing:
                    self.set_embedding(item_id, kind, model, vector)


@dataclass
class _PendingFile:
    path: Path
    handle: TextIO
    ids: set[str] = field(default_factory=set)
    rows: int = 0
    bytes: int = 0


@dataclass
class _Deferred:
    nodes: dict[str, _PendingFile] = field(default_factory=dict)
    edges: dict[tuple[str, str, str], _PendingFile] = field(default_factory=dict)


# A deferred node COPY once this many rows or bytes are gathered: at 250k attempts of ~2 KB (in one run, load ~1)
# COPYs of 5k rows took the import 69 s, of 16k 46 s, of 32k 46 s with 120 MB more at the peak, of 128k 93 s and
# 1.06 GB (Kùzu holds a COPY's rows in memory).
DEFERRED_ROWS = 65_536
DEFERRED_BYTES = 16 * 1024**2
_KEYS = {"Attempt": "kernel_id", "Session": "session_id", "Lesson": "lesson_id"}
# COPY's null marker. Kùzu 0.11.3 honours no other for numbers (KOPE_NULL, NA, N: "cast failed") and reads a
# quoted "NULL" as null too: a chunk with a value equal to it goes through the UNWIND instead.
_NULL = "NULL"


def _unwind_assignments(row: dict[str, Any], columns: dict[str, str]) -> str:
    # UNWIND infers a struct field's type from the values; a column that is NULL in every row comes out as
    # STRING, so every non-string column is cast explicitly.
    return ", ".join(f"{k}: r.{k}" if columns[k] == "STRING" else f"{k}: CAST(r.{k} AS {columns[k]})" for k in row)
# Quoted fields may hold newlines, which a parallel reader cannot split on; "" is an empty string only when the
# null marker is something else.
_COPY_NODES = "COPY {table} FROM '{path}' (HEADER=false, PARALLEL=false, NULL_STRINGS=['" + _NULL + "'])"
