"""The memory's read index: an SQLite file beside the graph (``memory.kuzu.index``) that answers the read path's
filters with a bounded top-k from a B-tree, whatever the memory's size.

Kùzu 0.11 has no secondary indexes: a filter on a property (task, error signature, label) scans its table, ~4 ms
per 10k rows, so the read path kept every attempt summary and lesson in Python instead (a dictionary per filter).
At a million lessons that was 7.5 GB of RAM and a 70 s load after every start, with the first questions answered
by scans meanwhile (35 s). Here each filter is an index whose order is the read path's order (evidence, then
time), so a question reads the k rows it returns; the file is mapped, not loaded, so a server serves its first
question from it at once and holds only SQLite's page cache.

The graph stays the record; this file is derived from it and kept by every write the memory makes. It is trusted
only when it was closed cleanly right after the database (``meta.clean`` and the database file's size and mtime
then, which any later write or replacement changes); otherwise it is emptied and rebuilt from the graph in the
background while the read path falls back to the store's bounded scans. A write made during a rebuild wins over
the rebuild's copy of the same row (the rebuild only inserts what is missing).

Lessons are searched here too, by BM25 over their stems (``lesson_text``, SQLite's FTS5; the stems are written
by terms.py, so a question is split and stemmed as its lessons were), and count their stems (``term``): the
search's cost per word. Kùzu's own full-text index kept this before (schema migration 6 drops it): it was
rebuilt inside every COPY of lessons, ~60% of a million lessons' import, and rebuilding it once at the end needed
more than 1 GB of buffer pool; FTS5 takes a million lessons in ~3 s and answered the bench's questions held to
25k postings in p50 <1 / p95 36 ms.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kope_mcp.hardware import hardware_rank
from kope_mcp.memory.outcome import lesson_evidence
from kope_mcp.memory.records import AttemptRecord, LessonRecord
from kope_mcp.memory.terms import index_terms

SUFFIX = ".index"
SUMMARY_FIELDS: tuple[str, ...] = tuple(f for f in AttemptRecord.model_fields if f != "source")

_TABLES = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS attempt(
    kernel_id TEXT NOT NULL UNIQUE, session_id TEXT, task_id TEXT, family TEXT, signature TEXT, strategy_id TEXT,
    parent_id TEXT, created_at TEXT, score REAL, good INTEGER, summary TEXT);
CREATE TABLE IF NOT EXISTS lesson(
    lesson_id TEXT NOT NULL UNIQUE, attempt_id TEXT, task_id TEXT, family TEXT, hardware_key TEXT, evidence REAL,
    record TEXT);
CREATE TABLE IF NOT EXISTS scope(kind TEXT, name TEXT, hardware_key TEXT, PRIMARY KEY(kind, name, hardware_key))
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS term(stem TEXT PRIMARY KEY, df INTEGER) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS vector(pos INTEGER PRIMARY KEY, item_id TEXT NOT NULL UNIQUE, kind TEXT);
CREATE VIRTUAL TABLE IF NOT EXISTS lesson_text USING fts5(stems, content='', tokenize='unicode61 remove_diacritics 0');
"""
# Files of another format are rebuilt, never trusted (format 1 had no lesson_text).
FORMAT = "2"
# Rows are appended (rowid tables: a lesson's JSON is ~600 bytes) and found through these, each in the order the
# read path reads: the top k of a filter is the first k entries of one index range.
_INDEXES = """
CREATE INDEX IF NOT EXISTS attempt_task ON attempt(task_id, score, created_at, kernel_id);
CREATE INDEX IF NOT EXISTS attempt_family ON attempt(family, score, created_at, kernel_id);
CREATE INDEX IF NOT EXISTS attempt_signature ON attempt(signature, created_at, kernel_id) WHERE signature IS NOT NULL;
CREATE INDEX IF NOT EXISTS attempt_strategy ON attempt(strategy_id, score, created_at, kernel_id)
    WHERE strategy_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS attempt_good ON attempt(score, created_at, kernel_id) WHERE good = 1;
CREATE INDEX IF NOT EXISTS attempt_session ON attempt(session_id, created_at, kernel_id);
CREATE INDEX IF NOT EXISTS attempt_parent ON attempt(parent_id, created_at, kernel_id) WHERE parent_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS lesson_task ON lesson(task_id, hardware_key, evidence, lesson_id) WHERE task_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS lesson_family ON lesson(family, hardware_key, evidence, lesson_id)
    WHERE family IS NOT NULL;
CREATE INDEX IF NOT EXISTS lesson_general ON lesson(hardware_key, evidence, lesson_id)
    WHERE task_id IS NULL AND family IS NULL;
CREATE INDEX IF NOT EXISTS lesson_attempt ON lesson(attempt_id) WHERE attempt_id IS NOT NULL;
"""
_INDEX_NAMES = ("attempt_task", "attempt_family", "attempt_signature", "attempt_strategy", "attempt_good",
                "attempt_session", "attempt_parent", "lesson_task", "lesson_family", "lesson_general",
                "lesson_attempt")
_ORDER = "ORDER BY score DESC, created_at DESC, kernel_id DESC"
_LESSON_ORDER = "ORDER BY evidence DESC, lesson_id DESC"
_BATCH = 20_000


def database_stamp(database: Path) -> str:
    """What changes whenever the database is written or replaced: the file's size and modification time, and the
    size of its write-ahead log (a write a crash left there is in no checkpoint yet; a clean close leaves none,
    and reading writes nothing: a server that only read and was killed leaves the same stamp)."""
    try:
        st = database.stat()
    except FileNotFoundError:
        return "absent"
    try:
        wal = database.with_name(database.name + ".wal").stat().st_size
    except FileNotFoundError:
        wal = 0
    return f"{st.st_size}:{st.st_mtime_ns}:{wal}"


def _attempt_row(data: dict[str, Any]) -> tuple[Any, ...]:
    summary = {f: data.get(f) for f in SUMMARY_FIELDS}
    good = data.get("label") == "effective" and not data.get("suspect") and not data.get("noisy")
    return (data["kernel_id"], data.get("session_id"), data.get("task_id"), data.get("family"),
            data.get("error_signature") or None, data.get("strategy_id") or None, data.get("parent_id") or None,
            data.get("created_at"), data.get("downstream") or 0.0, 1 if good else 0, json.dumps(summary))


def _lesson_row(lesson: LessonRecord) -> tuple[Any, ...]:
    evidence = lesson_evidence(lesson.label, lesson.speedup, lesson.confidence)
    return (lesson.lesson_id, lesson.attempt_id, lesson.task_id, lesson.family, lesson.hardware_key,
            evidence if math.isfinite(evidence) else 0.0, lesson.model_dump_json())


def _scopes(lesson: LessonRecord) -> list[tuple[str, str, str]]:
    hardware = lesson.hardware_key or ""  # a primary key column is never NULL: '' is "for any hardware"
    out = []
    if lesson.task_id:
        out.append(("task", lesson.task_id, hardware))
    if lesson.family:
        out.append(("family", lesson.family, hardware))
    if not lesson.task_id and not lesson.family:
        out.append(("general", "", hardware))
    return out


class ReadIndex:
    def __init__(self, path: Path | None) -> None:
        """``path`` None: a private index in memory (a scratch copy; nothing persists)."""
        self.path = path
        self._lock = threading.RLock()
        self._conn = self._connect()
        self._complete = threading.Event()
        self.vectors_trusted = False
        self._clean_on_disk = False  # marked clean by the last close, and not written since
        self._closed = False
        self._indexes_deferred = False

    def _connect(self) -> sqlite3.Connection:
        path = self.path
        conn = sqlite3.connect(":memory:" if path is None else str(path), check_same_thread=False,
                               isolation_level=None)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn.execute("PRAGMA journal_mode=WAL")
            # A crash between a commit and its fsync can lose the index's last writes, never the graph's: the
            # index is then stale (meta.clean is 0 while a memory is open) and rebuilt from the graph.
            conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA cache_size=-32768")  # 32 MiB of pages; the OS caches the rest of the file
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.executescript(_TABLES + _INDEXES)
        return conn

    @classmethod
    def beside(cls, database: Path) -> ReadIndex:
        return cls(database.with_name(database.name + SUFFIX))

    # --- trust -------------------------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """Holds every attempt and lesson of the graph (and gets every write), so reads may use it."""
        return self._complete.is_set()

    def attach(self, stamp: str, database_empty: bool) -> bool:
        """Take the index into use for a database whose :func:`database_stamp` was ``stamp`` before it opened.
        True when the index can be trusted (closed cleanly after that database's last write, or the database is
        empty); otherwise it is emptied, and incomplete until :meth:`rebuild`. Either way it is marked in use, so
        an end without :meth:`close` makes it stale."""
        with self._lock:
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
            trusted = meta.get("clean") == "1" and meta.get("stamp") == stamp and meta.get("format") == FORMAT
            # The vectors are complete only if a server with semantic search kept them (vectors.py).
            self.vectors_trusted = (trusted and meta.get("vectors") == "1") or database_empty
            # A trusted index stays marked clean until its first write (which marks it in use in the same
            # transaction): a server that only reads and is killed costs the next one no rebuild (at a million
            # lessons its first questions took 31-35 s and found nothing relevant for ~2 minutes).
            self._clean_on_disk = trusted
            if not trusted:
                self._clear()
                self._set_meta(clean="0", format=FORMAT)
            elif not self.vectors_trusted:
                self.clear_vectors()
            if trusted or database_empty:
                self._complete.set()
            return self.complete

    def invalidate(self) -> None:
        """The graph lost writes the index got (a rolled-back import): incomplete from now on, and rebuilt from
        the graph at the next start."""
        with self._lock:
            self._complete.clear()
            self._set_meta(clean="0", format=FORMAT)
            self._clean_on_disk = False

    def warm(self) -> None:
        """Read the file once through the OS (a background thread at start), so that the first questions after a
        cold start find its B-tree pages in the page cache rather than fill it one question at a time: at a
        million lessons (871 MB, read in ~1 s here), side by side with the page cache emptied, p50 / p95 68 / 100
        and 58 / 82 ms without the read, 56 / 77 and 53 / 81 with it; the price, a first question ~0.6 s later
        and, in about half the starts, one of the first ten waiting ~0.4 s behind the read."""
        if self.path is None:
            return
        buffer = bytearray(1 << 20)
        for path in (self.path, self.path.with_name(self.path.name + "-wal")):
            try:
                with path.open("rb", buffering=0) as fh:
                    while fh.readinto(buffer):
                        pass
            except OSError:
                continue  # no write-ahead log, or the file replaced meanwhile: nothing to warm

    def bulk(self) -> None:
        """For a copy that is thrown away unless it completes (an import's staging copy): no rollback journal and
        no syncs (the caller syncs the file once it is closed), and, while it is empty, its indexes are built once
        at the close (a sort instead of a million random inserts into each)."""
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=OFF")
            self._conn.execute("PRAGMA synchronous=OFF")
            empty = not any(self._conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() for t in ("attempt", "lesson"))
            if empty:
                for name in _INDEX_NAMES:
                    self._conn.execute(f"DROP INDEX IF EXISTS {name}")
                self._indexes_deferred = True

    def close(self, stamp: str, vectors_complete: bool = False) -> None:
        """Mark the index clean for the database whose stamp (after its close) is ``stamp``, when it is complete,
        and its vectors as complete when ``vectors_complete``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._indexes_deferred:
                self._conn.executescript(_INDEXES)
            if self.complete:
                self._set_meta(clean="1", stamp=stamp, vectors="1" if vectors_complete else "0")
            if self.path is not None:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._in_use()
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _in_use(self) -> None:
        """Before the first write: an end without :meth:`close` must make the index stale from here on."""
        if self._clean_on_disk:
            self._set_meta(clean="0", format=FORMAT)
            self._clean_on_disk = False

    def _set_meta(self, **values: str) -> None:
        self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(values.items()))

    def _clear(self) -> None:
        if self.path is not None:
            # A new file rather than DELETEs: emptying a million-lesson index row by row took 5 s at a start.
            self._conn.close()
            for leftover in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                leftover.unlink(missing_ok=True)
            self._conn = self._connect()
            return
        with self._transaction() as conn:
            for table in ("attempt", "lesson", "scope", "term", "vector"):
                conn.execute(f"DELETE FROM {table}")
            conn.execute("DROP TABLE lesson_text")  # a contentless FTS5 table forgets only what it is told
        self._conn.executescript(_TABLES)

    def rebuild(self, attempts: Iterable[dict[str, Any]], lessons: Iterable[list[tuple[LessonRecord, str]]]) -> None:
        """Fill an incomplete index from the graph: attempt summaries, then pages of (lesson, search text); rows a
        write has put here meanwhile are kept as they are. Nobody reads it until it is complete, so its indexes are
        built once at the end (a sort instead of random inserts)."""
        with self._lock:
            for name in _INDEX_NAMES:
                self._conn.execute(f"DROP INDEX IF EXISTS {name}")
        batch: list[dict[str, Any]] = []
        for row in attempts:
            batch.append(row)
            if len(batch) >= _BATCH:
                self.add_attempts(batch, replace=False)
                batch = []
        self.add_attempts(batch, replace=False)
        for page in lessons:
            self.add_lessons(page)
        with self._lock:
            self._conn.executescript(_INDEXES)
        self._complete.set()

    # --- vectors: which row of the vector file is which item ----------------------------------------------
    def clear_vectors(self) -> None:
        with self._lock:
            if not self.vectors_trusted:
                # Rows no close vouched for (meta.vectors is 0): dropping them leaves every other table as the
                # clean close left it, so the index stays clean (a server without embeddings does this each start).
                self._conn.execute("DELETE FROM vector")
                return
            with self._transaction() as conn:
                conn.execute("DELETE FROM vector")

    def vector_count(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT max(pos) FROM vector").fetchone()
            return 0 if row[0] is None else int(row[0]) + 1

    def vector_positions(self, item_ids: list[str]) -> dict[str, int]:
        with self._lock:
            return dict(self._rows_by_id("vector", "item_id", "pos", item_ids))

    def vector_items(self, positions: list[int]) -> dict[int, tuple[str, str]]:
        with self._lock:
            return {r[0]: (r[1], r[2]) for start in range(0, len(positions), 500) for r in self._conn.execute(
                "SELECT pos, item_id, kind FROM vector WHERE pos IN "
                f"({', '.join('?' * len(positions[start:start + 500]))})", positions[start:start + 500])}

    def add_vector_items(self, rows: list[tuple[int, str, str]]) -> None:
        with self._transaction() as conn:
            conn.executemany("INSERT INTO vector VALUES (?, ?, ?)", rows)

    def vector_ids(self) -> set[str]:
        with self._lock:
            return {r[0] for r in self._conn.execute("SELECT item_id FROM vector")}

    # --- writes --------------------------------------------------------------------------------------------
    def upsert_attempt(self, record: AttemptRecord) -> None:
        self.add_attempts([record.__dict__], replace=True)

    def add_attempts(self, rows: list[dict[str, Any]], replace: bool = True) -> None:
        if not rows:
            return
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        values = [_attempt_row(r) for r in rows]
        with self._transaction() as conn:
            conn.executemany(f"{verb} INTO attempt VALUES ({', '.join('?' * 11)})", values)

    def update_attempt(self, kernel_id: str, **fields: Any) -> None:
        with self._lock:
            row = self._conn.execute("SELECT summary FROM attempt WHERE kernel_id = ?", (kernel_id,)).fetchone()
            if row is None:
                return
            data = json.loads(row[0])
            data.update({k: v for k, v in fields.items() if k in data})
            self.add_attempts([data], replace=True)

    def add_lesson(self, lesson: LessonRecord, search_text: str) -> None:
        self.add_lessons([(lesson, search_text)])

    def add_lessons(self, lessons: list[tuple[LessonRecord, str]]) -> None:
        """New lessons (an id already here is the same lesson: lessons are never edited) and their stems."""
        if not lessons:
            return
        with self._lock:
            known = self._known("lesson", "lesson_id", [lesson.lesson_id for lesson, _ in lessons])
            fresh = {lesson.lesson_id: (lesson, text) for lesson, text in lessons if lesson.lesson_id not in known}
            if not fresh:
                return
            df: dict[str, int] = {}
            texts: list[str] = []
            for _, text in fresh.values():
                terms = index_terms(text)
                texts.append(" ".join(terms))
                for s in set(terms):
                    df[s] = df.get(s, 0) + 1
            with self._transaction() as conn:
                # Explicit rowids: the lesson's row and its text share one, which the search joins on.
                first = conn.execute("SELECT coalesce(max(rowid), 0) + 1 FROM lesson").fetchone()[0]
                conn.executemany("INSERT INTO lesson(rowid, lesson_id, attempt_id, task_id, family, hardware_key, "
                                 "evidence, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                 [(first + n, *_lesson_row(lesson)) for n, (lesson, _) in enumerate(fresh.values())])
                conn.executemany("INSERT INTO lesson_text(rowid, stems) VALUES (?, ?)",
                                 [(first + n, text) for n, text in enumerate(texts)])
                conn.executemany("INSERT OR IGNORE INTO scope VALUES (?, ?, ?)",
                                 list({s for lesson, _ in fresh.values() for s in _scopes(lesson)}))
                conn.executemany("INSERT INTO term VALUES (?, ?) ON CONFLICT(stem) DO UPDATE SET df = df + excluded.df",
                                 list(df.items()))

    def _known(self, table: str, key: str, ids: list[str]) -> set[str]:
        out: set[str] = set()
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            out |= {r[0] for r in self._conn.execute(
                f"SELECT {key} FROM {table} WHERE {key} IN ({', '.join('?' * len(chunk))})", chunk)}
        return out

    # --- reads ---------------------------------------------------------------------------------------------
    def _ids(self, sql: str, params: tuple[Any, ...]) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute(sql, params)]

    def top_for_task(self, task_id: str, n: int) -> list[str]:
        return self._ids(f"SELECT kernel_id FROM attempt WHERE task_id = ? {_ORDER} LIMIT ?", (task_id, n))

    def top_for_family(self, family: str, exclude_task: str | None, n: int) -> list[str]:
        return self._ids(f"SELECT kernel_id FROM attempt WHERE family = ? AND task_id IS NOT ? {_ORDER} LIMIT ?",
                         (family, exclude_task, n))

    def with_signature(self, signature: str, n: int) -> list[str]:
        return self._ids("SELECT kernel_id FROM attempt WHERE signature = ? "
                         "ORDER BY created_at DESC, kernel_id DESC LIMIT ?", (signature, n))

    def top_for_strategy(self, strategy_id: str, n: int) -> list[str]:
        return self._ids(f"SELECT kernel_id FROM attempt WHERE strategy_id = ? {_ORDER} LIMIT ?", (strategy_id, n))

    def best(self, n: int) -> list[str]:
        return self._ids(f"SELECT kernel_id FROM attempt WHERE good = 1 {_ORDER} LIMIT ?", (n,))

    def children(self, kernel_id: str) -> list[str]:
        """PREV successors, oldest first."""
        return self._ids("SELECT kernel_id FROM attempt WHERE parent_id = ? ORDER BY created_at, kernel_id",
                         (kernel_id,))

    def next_in_session(self, kernel_id: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT session_id, created_at FROM attempt WHERE kernel_id = ?",
                                     (kernel_id,)).fetchone()
            if row is None:
                return None
            found = self._conn.execute(
                "SELECT kernel_id FROM attempt WHERE session_id = ? AND (created_at > ? OR "
                "(created_at = ? AND kernel_id > ?)) ORDER BY created_at, kernel_id LIMIT 1",
                (row[0], row[1], row[1], kernel_id)).fetchone()
            return found[0] if found else None

    def latest_in_session(self, session_id: str) -> str | None:
        ids = self._ids("SELECT kernel_id FROM attempt WHERE session_id = ? "
                        "ORDER BY created_at DESC, kernel_id DESC LIMIT 1", (session_id,))
        return ids[0] if ids else None

    def get(self, kernel_ids: Iterable[str]) -> list[AttemptRecord]:
        """Summaries (no source) of the ids that exist, in the order given."""
        ids = list(kernel_ids)
        with self._lock:
            found = dict(self._rows_by_id("attempt", "kernel_id", "summary", ids))
        # Built without validation: the rows were validated when they were written.
        return [AttemptRecord.model_construct(**json.loads(found[i]), source="") for i in ids if i in found]

    def lessons(self, lesson_ids: Iterable[str]) -> list[LessonRecord]:
        ids = list(lesson_ids)
        with self._lock:
            found = dict(self._rows_by_id("lesson", "lesson_id", "record", ids))
        return [LessonRecord.model_validate_json(found[i]) for i in ids if i in found]

    def _rows_by_id(self, table: str, key: str, column: str, ids: list[str]) -> Iterator[tuple[Any, Any]]:
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            yield from self._conn.execute(
                f"SELECT {key}, {column} FROM {table} WHERE {key} IN ({', '.join('?' * len(chunk))})", chunk)

    def lessons_about(self, kernel_ids: Iterable[str]) -> list[LessonRecord]:
        ids = list(kernel_ids)
        with self._lock:
            rows = [r for start in range(0, len(ids), 500) for r in self._conn.execute(
                "SELECT record FROM lesson WHERE attempt_id IN "
                f"({', '.join('?' * len(ids[start:start + 500]))}) ORDER BY attempt_id, lesson_id",
                ids[start:start + 500])]
        return [LessonRecord.model_validate_json(r[0]) for r in rows]

    def scoped_groups(self, kind: str, name: str) -> list[str | None]:
        """The hardware keys that lessons of this scope (task, family, or general with name '') report for."""
        with self._lock:
            return [r[0] or None for r in self._conn.execute(
                "SELECT hardware_key FROM scope WHERE kind = ? AND name = ?", (kind, name))]

    def top_lessons(self, kind: str, name: str, hardware_key: str | None, n: int) -> list[tuple[float, str]]:
        """(evidence, lesson id) of the best ``n`` lessons of one scope and hardware key, best first."""
        where = {"task": "task_id = ?", "family": "family = ?", "general": "task_id IS NULL AND family IS NULL"}[kind]
        params: tuple[Any, ...] = (name, hardware_key, n) if kind != "general" else (hardware_key, n)
        with self._lock:
            return [(r[0], r[1]) for r in self._conn.execute(
                f"SELECT evidence, lesson_id FROM lesson WHERE {where} AND hardware_key IS ? {_LESSON_ORDER} LIMIT ?",
                params)]

    def full_text(self, question: str, limit: int) -> list[tuple[str, float]]:
        """(lesson id, BM25 score) of the ``limit`` lessons that best match the words of ``question``, best first
        (equal scores in id order). FTS5's bm25 (k1 1.2, b 0.75, as Kùzu's) is negated: higher is better."""
        terms = sorted(set(index_terms(question)))
        if not terms:
            return []
        match = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
        fetch = 2 * limit
        with self._lock:
            # FTS5's own top-k (ORDER BY rank) before the join: joining and sorting every match first cost twice
            # as much at a million lessons (p95 68 -> 36 ms at 25k postings).
            rows = self._conn.execute(
                "SELECT lesson.lesson_id, t.score FROM (SELECT rowid, rank AS score FROM lesson_text WHERE "
                "lesson_text MATCH ? ORDER BY rank LIMIT ?) AS t JOIN lesson ON lesson.rowid = t.rowid",
                (match, fetch)).fetchall()
        found = sorted((score, lesson_id) for lesson_id, score in rows)
        if len(found) == fetch:
            # The LIMIT may have cut the last score's group anywhere (in insertion order): drop that group so the
            # same memory gives the same hits whatever order it was written in.
            found = [h for h in found if h[0] < found[-1][0]]
        return [(lesson_id, -score) for score, lesson_id in found[:limit]]

    def document_frequency(self, wanted: Iterable[str]) -> dict[str, int]:
        """Lessons per stem (a stem no lesson has is left out)."""
        stems_wanted = list(set(wanted))
        if not stems_wanted:
            return {}
        with self._lock:
            return dict(self._conn.execute(
                f"SELECT stem, df FROM term WHERE stem IN ({', '.join('?' * len(stems_wanted))})", stems_wanted))

    def lessons_in_scope(self, task_id: str | None, family: str | None, hardware: str | None,
                         n: int) -> list[LessonRecord]:
        """Up to ``n`` lessons about this task, its family and none in particular (half, half and a quarter of
        ``n``), each group by what they report for this hardware: the strongest measured evidence on the same
        machine first, then the same architecture, then the rest; never by age (``hardware_rank``)."""
        picked: dict[str, None] = {}
        for kind, name, share in (("task", task_id or "", n // 2), ("family", family or "", n // 2),
                                  ("general", "", max(1, n // 4))):
            if kind != "general" and not name:
                continue
            keys = self.scoped_groups(kind, name)
            taken = 0
            for rank in sorted({hardware_rank(key, hardware) for key in keys}, reverse=True):
                entries = [e for key in keys if hardware_rank(key, hardware) == rank
                           for e in self.top_lessons(kind, name, key, share - taken)]
                best = sorted(entries, reverse=True)[:share - taken]
                picked.update((lesson_id, None) for _, lesson_id in best)
                taken += len(best)
                if taken >= share:
                    break
        return self.lessons(picked)
