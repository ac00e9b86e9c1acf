"""KuzuExperienceStore: the only module that imports kuzu; with its bulk-loading mixin (bulk.py), the only place
with Cypher.

One ``Database`` per path per process (two silently lose rows), one connection behind one lock (Kùzu allows a
single writer and fails a second at once instead of waiting), no explicit multi-statement transactions (a
failed one poisoned its connection), indexes created once by a numbered migration (lessons are searched by the
read index since migration 6: read_index.py).
Embeddings live in their own table without a vector index (an indexed column cannot be SET) and are searched
by numpy brute force, which is as fast as HNSW at these sizes.
A compile's attempt is journalled and acknowledged before its statement runs (``add_attempt_soon``, journal.py);
every statement first writes what the journal holds, so reads never miss an acknowledged attempt.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kuzu

from kope_mcp.errors import UnknownExperienceError, UnknownKernelError, UnknownSessionError
from kope_mcp.memory.bulk import BulkLoading
from kope_mcp.memory.journal import AttemptJournal, JournalledAttempts
from kope_mcp.memory.records import AttemptRecord, LessonRecord, SessionRecord, StrategyRecord
from kope_mcp.memory.rows import (
    ATTEMPT_COLUMNS,
    JSON_FIELDS,
    attempt_from_row,
    attempt_props,
    got_further,
    lesson_from_row,
    session_from_row,
)
from kope_mcp.memory.schema import MIGRATIONS

_GOT_FURTHER = "c.ok = true AND (p.ok = false OR c.correct = true)"
_SUMMARY_RETURN = ", ".join(f"a.{c} AS {c}" for c in ATTEMPT_COLUMNS if c not in ("source", "search_text"))


log = logging.getLogger(__name__)

_PREPARED_CACHE = 256


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


_NOT_WORD = re.compile(r"[^\w]+")
MAX_DB_BYTES = 1 << 40  # 1 TiB


class KuzuExperienceStore(BulkLoading, JournalledAttempts):
    def __init__(self, path: Path, cache_bytes: int = 0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Kùzu reserves max_db_size of address space per open database (8 TiB by default): a process with ~16 open
        # (a test run) ran out of the 128 TiB a process has. A memory of a million attempts is ~1 GB on disk.
        self._db = kuzu.Database(str(path), max_db_size=MAX_DB_BYTES, buffer_pool_size=cache_bytes)
        self._conn = kuzu.Connection(self._db)
        self._lock = threading.RLock()
        # Planning a parameterised query costs about as much as running it: each distinct text is planned once.
        self._prepared: OrderedDict[str, kuzu.PreparedStatement] = OrderedDict()
        # Attempts acknowledged before they are in the graph: written by a background thread, and before any
        # other statement (reads included) runs, so nobody reads around them.
        self._journal = AttemptJournal(path.with_name(path.name + ".pending"))
        self._applying = False
        self._wake = threading.Event()
        self._closing = False
        self._applier: threading.Thread | None = None
        self._migrate()
        self._replay_journal()

    # --- plumbing ------------------------------------------------------------------------------------------
    def _rows(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            if self._journal.pending and not self._applying:
                self._apply_journal()
            result = self._run(query, params)
            names = result.get_column_names()
            return [dict(zip(names, row, strict=True)) for row in result.get_all()]

    def _exec(self, query: str, params: dict[str, Any] | None = None) -> None:
        with self._lock:
            if self._journal.pending and not self._applying:
                self._apply_journal()
            self._run(query, params)

    def _run(self, query: str, params: dict[str, Any] | None) -> kuzu.QueryResult:
        if not params:
            result = self._conn.execute(query)
        else:
            prepared = self._prepared.pop(query, None)
            try:
                if prepared is None:
                    prepared = kuzu.PreparedStatement(self._conn, query)
                result = self._conn.execute(prepared, params)
            except RuntimeError:
                # Never trust a plan that failed (a schema change, a parameter of another type): plan afresh; a
                # real error raises again from there. A failed statement changed nothing, so running it is safe.
                prepared = None
                result = self._conn.execute(query, params)
            if prepared is not None:
                self._prepared[query] = prepared
                if len(self._prepared) > _PREPARED_CACHE:
                    self._prepared.popitem(last=False)
        assert not isinstance(result, list)
        return result

    def _migrate(self) -> None:
        with self._lock:
            tables = {row["name"] for row in self._rows("CALL show_tables() RETURN name")}
            if "KopeMigration" not in tables:
                self._exec("CREATE NODE TABLE KopeMigration(version INT64, name STRING, applied_at STRING, "
                           "PRIMARY KEY (version))")
            done = {row["v"] for row in self._rows("MATCH (m:KopeMigration) RETURN m.version AS v")}
            for version, name, statements in MIGRATIONS:
                if version in done:
                    continue
                for statement in statements:
                    self._exec(statement)
                self._exec("CREATE (:KopeMigration {version: $v, name: $n, applied_at: $t})",
                           {"v": version, "n": name, "t": _now()})
                # Into the database file at once: kuzu 0.11.3 fails to replay a lesson written after the lesson
                # index's drop (migration 6) from the write-ahead log ("Cannot find table catalog entry"), so a
                # home killed before its next checkpoint never opened again.
                self._exec("CHECKPOINT")

    def _require(self, table: str, key: str, value: str, why: str) -> None:
        # A MATCH that finds nothing makes the CREATE after it a silent no-op: never let a write vanish.
        if not self.has_node(table, key, value):
            raise ValueError(f"{table} {value!r} was not created: {why}")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Every write of the block in one Kùzu transaction on this store's one connection: all of it is in the
        database after the block, or none of it (an exception rolls back; a kill before the commit leaves the
        log's uncommitted records, which recovery drops). For a store nobody else writes to meanwhile (an admin
        command on a held home): the block's own threads write through the lock as usual."""
        self._exec("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self._exec("ROLLBACK")
            raise
        self._exec("COMMIT")

    def schema_version(self) -> int:
        return max((row["v"] for row in self._rows("MATCH (m:KopeMigration) RETURN m.version AS v")), default=0)

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return  # closing twice (an admin command's finally after an early close) is harmless
        self._closed = True
        with self._lock:
            self.write_deferred()
            self._apply_journal()
            self._closing = True
            self._wake.set()
        if self._applier is not None:
            self._applier.join(timeout=30)
        with self._lock:
            self._journal.close()
            self._conn.close()
            self._db.close()

    # --- tasks and hardware --------------------------------------------------------------------------------
    def upsert_task(self, task_id: str, family: str, level: int, summary: str) -> None:
        self._exec("MERGE (t:Task {id: $id}) SET t.family = $f, t.level = $l, t.summary = $s",
                   {"id": task_id, "f": family, "l": level, "s": summary})

    def upsert_hardware(self, key: str, arch: str, cpu_model: str, cores: int, isa: list[str],
                        caches: list[dict[str, Any]]) -> None:
        self._exec("MERGE (h:Hardware {key: $k}) SET h.arch = $a, h.cpu_model = $m, h.cores = $c, h.isa = $i, "
                   "h.caches = $ca", {"k": key, "a": arch, "m": cpu_model, "c": cores, "i": json.dumps(isa),
                                      "ca": json.dumps(caches)})

    def hardware_keys(self) -> list[str]:
        return [r["k"] for r in self._rows("MATCH (h:Hardware) RETURN h.key AS k ORDER BY k")]

    # --- sessions ------------------------------------------------------------------------------------------
    def add_session(self, record: SessionRecord) -> None:
        # One statement: the session and its edges commit together.
        self._exec(
            "MATCH (t:Task {id: $t}), (h:Hardware {key: $h}) "
            "CREATE (s:Session {session_id: $id, task_id: $t, hardware_key: $h, agent_name: $an, "
            "agent_version: $av, agent_label: $al, created_at: $c, incumbent_id: $ii, incumbent_speedup: $is})"
            "-[:FOR_TASK]->(t), (s)-[:ON_HARDWARE]->(h)",
            {"id": record.session_id, "t": record.task_id, "h": record.hardware_key, "an": record.agent.name,
             "av": record.agent.version, "al": record.agent.label, "c": record.created_at,
             "ii": record.incumbent_id, "is": record.incumbent_speedup},
        )
        self._require("Session", "session_id", record.session_id, f"task {record.task_id!r} and hardware "
                      f"{record.hardware_key!r} must exist first")

    def session(self, session_id: str) -> SessionRecord:
        rows = self._rows("MATCH (s:Session {session_id: $id}) RETURN s", {"id": session_id})
        if not rows:
            raise UnknownSessionError(session_id)
        return session_from_row(rows[0]["s"])

    def set_incumbent(self, session_id: str, kernel_id: str, speedup: float) -> None:
        self._exec("MATCH (s:Session {session_id: $id}) SET s.incumbent_id = $k, s.incumbent_speedup = $v",
                   {"id": session_id, "k": kernel_id, "v": speedup})

    def sessions(self, task_id: str | None = None) -> list[SessionRecord]:
        where = "WHERE s.task_id = $t " if task_id else ""
        return [session_from_row(r["s"]) for r in self._rows(f"MATCH (s:Session) {where}RETURN s ORDER BY s.created_at",
                                                     {"t": task_id} if task_id else {})]

    # --- attempts ------------------------------------------------------------------------------------------
    def add_attempt(self, record: AttemptRecord) -> None:
        props = attempt_props(record)
        assignments = ", ".join(f"{k}: ${k}" for k in props)
        match = ["(s:Session {session_id: $__s})", "(t:Task {id: $__t})", "(h:Hardware {key: $__h})"]
        create = [f"(a:Attempt {{{assignments}}})-[:IN_SESSION]->(s)", "(a)-[:FOR_TASK]->(t)",
                  "(a)-[:ON_HARDWARE]->(h)"]
        params = {**props, "__s": record.session_id, "__t": record.task_id, "__h": record.hardware_key}
        if record.parent_id:
            match.append("(p:Attempt {kernel_id: $__p})")
            create.append("(a)-[:PREV]->(p)")
            params["__p"] = record.parent_id
        if record.strategy_id:
            match.append("(g:Strategy {strategy_id: $__g})")
            create.append("(a)-[:APPLIED]->(g)")
            params["__g"] = record.strategy_id
        # One statement, one commit: the node and all its edges, or nothing. A MATCH that finds nothing makes
        # the CREATE a silent no-op, so the created id is returned and checked: a write never vanishes.
        rows = self._rows(f"MATCH {', '.join(match)} CREATE {', '.join(create)} RETURN a.kernel_id AS k", params)
        if not rows:
            raise ValueError(f"Attempt {record.kernel_id!r} was not created: session {record.session_id!r}, task "
                             f"{record.task_id!r}, hardware {record.hardware_key!r}, parent "
                             f"{record.parent_id!r} and strategy {record.strategy_id!r} must exist first")

    def update_attempt(self, kernel_id: str, **fields: Any) -> None:
        values = {k: (json.dumps(v) if k in JSON_FIELDS else v) for k, v in fields.items()}
        unknown = set(values) - set(ATTEMPT_COLUMNS)
        if unknown:
            raise ValueError(f"not attempt columns: {sorted(unknown)}")
        assignments = ", ".join(f"a.{k} = ${k}" for k in values)
        self._exec(f"MATCH (a:Attempt {{kernel_id: $__id}}) SET {assignments}", {"__id": kernel_id, **values})

    def attempt(self, kernel_id: str) -> AttemptRecord:
        rows = self._rows("MATCH (a:Attempt {kernel_id: $k}) RETURN a", {"k": kernel_id})
        if not rows:
            raise UnknownKernelError(kernel_id)
        return attempt_from_row(rows[0]["a"])

    def all_attempts(self) -> list[AttemptRecord]:
        """Every attempt with its source, oldest first (export)."""
        return [attempt_from_row(r["a"]) for r in self._rows("MATCH (a:Attempt) RETURN a ORDER BY a.created_at")]

    def attempts_in_session(self, session_id: str) -> list[AttemptRecord]:
        return self._summaries("MATCH (a:Attempt)-[:IN_SESSION]->(s:Session {session_id: $s})", "",
                               {"s": session_id}, "a.created_at", 100_000)

    # Candidate queries for retrieval: walk edges from an indexed node (a Task, a Session) instead of scanning,
    # and leave out the source text (fetched with `sources` for the few items that get shown).
    def _summaries(self, match: str, where: str, params: dict[str, Any], order: str, limit: int) -> list[AttemptRecord]:
        clause = f" WHERE {where}" if where else ""
        rows = self._rows(f"{match}{clause} RETURN {_SUMMARY_RETURN} ORDER BY {order} LIMIT {int(limit)}", params)
        return [attempt_from_row(row) for row in rows]

    def noisy_attempts(self, limit: int) -> list[AttemptRecord]:
        """This home's correct, not suspect attempts whose last measurement was too noisy to teach, fastest first
        (services/remeasure.py measures them again when the machine is quiet)."""
        return self._summaries("MATCH (a:Attempt)", "a.noisy AND a.ok AND a.correct AND NOT a.suspect AND "
                               "a.origin = ''", {}, "a.speedup DESC", limit)

    def attempts_for_task(self, task_id: str, limit: int) -> list[AttemptRecord]:
        return self._summaries("MATCH (a:Attempt)-[:FOR_TASK]->(t:Task {id: $t})", "", {"t": task_id},
                               "a.downstream DESC", limit)

    def attempts_for_family(self, family: str, exclude_task: str | None, limit: int) -> list[AttemptRecord]:
        return self._summaries("MATCH (a:Attempt)-[:FOR_TASK]->(t:Task)", "t.family = $f AND t.id <> $x",
                               {"f": family, "x": exclude_task or ""}, "a.downstream DESC", limit)

    def attempts_for_strategy(self, strategy_id: str, limit: int) -> list[AttemptRecord]:
        return self._summaries("MATCH (a:Attempt)-[:APPLIED]->(s:Strategy {strategy_id: $s})", "",
                               {"s": strategy_id}, "a.downstream DESC", limit)

    def attempts_with_signature(self, signature: str, limit: int) -> list[AttemptRecord]:
        return self._summaries("MATCH (a:Attempt)", "a.error_signature = $s", {"s": signature},
                               "a.created_at DESC", limit)

    def best_attempts(self, limit: int) -> list[AttemptRecord]:
        """The best effective attempts anywhere (a full scan; the read index serves this)."""
        return self._summaries("MATCH (a:Attempt)", "a.label = 'effective' AND NOT a.suspect AND NOT a.noisy", {},
                               "a.downstream DESC", limit)

    def attempts_by_id(self, kernel_ids: list[str]) -> list[AttemptRecord]:
        # UNWIND + a primary-key match is an index lookup per id; `IN $ids` would scan the table.
        if not kernel_ids:
            return []
        return self._summaries("UNWIND $ids AS i MATCH (a:Attempt {kernel_id: i})", "", {"ids": kernel_ids},
                               "a.created_at", len(kernel_ids))

    def sources(self, kernel_ids: list[str]) -> dict[str, str]:
        if not kernel_ids:
            return {}
        return {r["k"]: r["s"] for r in self._rows(
            "UNWIND $ids AS i MATCH (a:Attempt {kernel_id: i}) RETURN a.kernel_id AS k, a.source AS s",
            {"ids": kernel_ids})}

    def latest_in_session(self, session_id: str) -> AttemptRecord | None:
        rows = self._rows("MATCH (a:Attempt)-[:IN_SESSION]->(s:Session {session_id: $s}) RETURN a "
                          "ORDER BY a.created_at DESC LIMIT 1", {"s": session_id})
        return attempt_from_row(rows[0]["a"]) if rows else None

    def successor_scores(self, kernel_id: str) -> list[float]:
        return [float(r["d"] or 0.0) for r in self._rows(
            "MATCH (c:Attempt)-[:PREV]->(p:Attempt {kernel_id: $k}) RETURN c.downstream AS d", {"k": kernel_id})]

    def lineage(self, kernel_id: str) -> list[tuple[str, str | None, float | None, bool | None, float]]:
        """(id, parent, step ratio, correct, downstream) of this attempt and its ancestors, nearest first."""
        out: list[tuple[str, str | None, float | None, bool | None, float]] = []
        current: str | None = kernel_id
        while current and len(out) < 1000:
            rows = self._rows("MATCH (a:Attempt {kernel_id: $k}) RETURN a.parent_id AS p, a.step_ratio AS r, "
                              "a.correct AS c, a.downstream AS d", {"k": current})
            if not rows:
                break
            row = rows[0]
            out.append((current, row["p"], row["r"], row["c"], float(row["d"] or 0.0)))
            current = row["p"]
        return out

    def successors(self, kernel_id: str) -> list[AttemptRecord]:
        return [attempt_from_row(r["c"]) for r in self._rows(
            "MATCH (c:Attempt)-[:PREV]->(p:Attempt {kernel_id: $k}) RETURN c ORDER BY c.created_at", {"k": kernel_id})]

    def prev_fixes(self, kernel_ids: list[str]) -> dict[str, AttemptRecord]:
        """For each failing attempt, its first PREV successor that got further (compiled, or passed tests)."""
        fixes: dict[str, AttemptRecord] = {}
        for row in self._rows("UNWIND $ids AS i MATCH (c:Attempt)-[:PREV]->(p:Attempt {kernel_id: i}) "
                              f"WHERE {_GOT_FURTHER} RETURN p.kernel_id AS parent, "
                              f"{_SUMMARY_RETURN.replace('a.', 'c.')} ORDER BY c.created_at", {"ids": kernel_ids}):
            fixes.setdefault(row.pop("parent"), attempt_from_row(row))
        return fixes

    def session_next_fixes(self, kernel_ids: list[str]) -> dict[str, AttemptRecord]:
        """For each failing attempt, the very next attempt of its session when that one got further."""
        failing = self._rows("UNWIND $ids AS i MATCH (p:Attempt {kernel_id: i}) RETURN p.kernel_id AS id, "
                             "p.session_id AS s, p.created_at AS t, p.ok AS ok", {"ids": kernel_ids})
        by_session: dict[str, list[AttemptRecord]] = {}
        for row in self._rows("UNWIND $s AS sid MATCH (a:Attempt)-[:IN_SESSION]->(s:Session {session_id: sid}) "
                              f"RETURN {_SUMMARY_RETURN} ORDER BY a.created_at",
                              {"s": sorted({f["s"] for f in failing})}):
            child = attempt_from_row(row)
            by_session.setdefault(child.session_id, []).append(child)
        fixes: dict[str, AttemptRecord] = {}
        for parent in failing:
            nxt = next((c for c in by_session.get(parent["s"], []) if c.created_at > parent["t"]), None)
            if nxt is not None and got_further(parent["ok"], nxt):
                fixes[parent["id"]] = nxt
        return fixes

    def attempt_summaries(self) -> Iterator[dict[str, Any]]:
        """Every attempt without its source, as plain dicts (fast: no record validation), for the read index; read
        a page of internal offsets at a time (a million attempts at once would all be in Python together)."""
        last = self._rows("MATCH (a:Attempt) RETURN max(offset(ID(a))) AS m")[0]["m"]
        for start in range(0, -1 if last is None else int(last) + 1, 20_000):
            for row in self._rows(f"MATCH (a:Attempt) WHERE offset(ID(a)) >= $lo AND offset(ID(a)) < $hi "
                                  f"RETURN {_SUMMARY_RETURN}", {"lo": start, "hi": start + 20_000}):
                for name in JSON_FIELDS:
                    row[name] = json.loads(row.get(name) or "[]")
                yield row

    def lesson_pages(self) -> Iterator[list[tuple[LessonRecord, str]]]:
        """Every lesson with its search text, a page at a time in the order written."""
        for page in self.node_pages("Lesson"):
            yield [(lesson_from_row(node), node.get("search_text") or "") for node in page]

    def is_empty(self) -> bool:
        """No attempt, lesson, strategy or embedding yet."""
        return not any(self._rows(f"MATCH (n:{table}) RETURN n.{key} AS i LIMIT 1")
                       for table, key in (("Attempt", "kernel_id"), ("Lesson", "lesson_id"),
                                          ("Strategy", "strategy_id"), ("Embedding", "id")))

    def all_lessons(self) -> list[LessonRecord]:
        return [lesson_from_row(r["l"]) for r in self._rows("MATCH (l:Lesson) RETURN l ORDER BY l.created_at")]

    # --- strategies and lessons ----------------------------------------------------------------------------
    def strategies(self) -> list[StrategyRecord]:
        return [StrategyRecord(strategy_id=r["i"], name=r["n"], key=r["k"]) for r in self._rows(
            "MATCH (s:Strategy) RETURN s.strategy_id AS i, s.name AS n, s.key AS k ORDER BY s.created_at")]

    def add_strategy(self, record: StrategyRecord) -> None:
        self._exec("CREATE (:Strategy {strategy_id: $i, name: $n, key: $k, created_at: $c})",
                   {"i": record.strategy_id, "n": record.name, "k": record.key, "c": _now()})

    def link_strategy(self, table: str, node_id: str, strategy_id: str) -> None:
        key, rel = ("kernel_id", "APPLIED") if table == "Attempt" else ("lesson_id", "ABOUT")
        self._exec(f"MATCH (n:{table} {{{key}: $n}}), (s:Strategy {{strategy_id: $s}}) MERGE (n)-[:{rel}]->(s)",
                   {"n": node_id, "s": strategy_id})

    def add_lesson(self, record: LessonRecord, search_text: str) -> None:
        props = {**record.model_dump(), "search_text": search_text}
        assignments = ", ".join(f"{k}: ${k}" for k in props)
        with self._lock:
            self._exec(f"CREATE (:Lesson {{{assignments}}})", props)
            if record.attempt_id:
                self._exec("MATCH (l:Lesson {lesson_id: $l}), (a:Attempt {kernel_id: $a}) "
                           "CREATE (l)-[:FROM_ATTEMPT]->(a)", {"l": record.lesson_id, "a": record.attempt_id})
            if record.strategy_id:
                self.link_strategy("Lesson", record.lesson_id, record.strategy_id)
            if record.task_id:
                self._exec("MATCH (l:Lesson {lesson_id: $l}), (t:Task {id: $t}) CREATE (l)-[:ABOUT]->(t)",
                           {"l": record.lesson_id, "t": record.task_id})

    def lesson(self, lesson_id: str) -> LessonRecord:
        rows = self._rows("MATCH (l:Lesson {lesson_id: $l}) RETURN l", {"l": lesson_id})
        if not rows:
            raise UnknownExperienceError(lesson_id)
        return lesson_from_row(rows[0]["l"])

    def lessons_by_id(self, lesson_ids: list[str]) -> list[LessonRecord]:
        if not lesson_ids:
            return []
        return [lesson_from_row(r["l"]) for r in self._rows("UNWIND $ids AS i MATCH (l:Lesson {lesson_id: i}) RETURN l",
                                                    {"ids": lesson_ids})]

    def lessons_in_scope(self, task_id: str | None, family: str | None, limit: int) -> list[LessonRecord]:
        """General lessons plus those about this task or family, newest first (a scan; see read_index.py)."""
        return [lesson_from_row(r["l"]) for r in self._rows(
            "MATCH (l:Lesson) WHERE (l.task_id IS NULL AND l.family IS NULL) OR l.task_id = $t OR l.family = $f "
            f"RETURN l ORDER BY l.created_at DESC LIMIT {int(limit)}", {"t": task_id or "", "f": family or ""})]

    def lessons_for_attempts(self, kernel_ids: list[str]) -> list[LessonRecord]:
        if not kernel_ids:
            return []
        return [lesson_from_row(r["l"]) for r in self._rows(
            "UNWIND $ids AS i MATCH (l:Lesson)-[:FROM_ATTEMPT]->(a:Attempt {kernel_id: i}) RETURN l",
            {"ids": kernel_ids})]

    def lessons_for_attempt(self, kernel_id: str) -> list[LessonRecord]:
        return [lesson_from_row(r["l"]) for r in self._rows(
            "MATCH (l:Lesson)-[:FROM_ATTEMPT]->(a:Attempt {kernel_id: $k}) RETURN l ORDER BY l.created_at",
            {"k": kernel_id})]

    # --- text and vector search ----------------------------------------------------------------------------
    def full_text(self, query: str, limit: int) -> list[tuple[str, str, float]]:
        """BM25 over strategy names: (kind, id, score), best first (lessons: the read index's full_text)."""
        # Words only: the index's query parser reads `*` as a term every document matches (a pasted prototype's
        # `float *` made one query ~330 ms at 50k lessons instead of ~15).
        text = _NOT_WORD.sub(" ", query).strip()
        if not text:
            return []
        fetch = 2 * int(limit)
        rows = self._rows(f"CALL QUERY_FTS_INDEX('Strategy', 'strategy_fts', $q, top := {fetch}) "
                          f"RETURN node.strategy_id AS id, score ORDER BY score DESC LIMIT {fetch}", {"q": text})
        found = sorted(((float(r["score"]), r["id"]) for r in rows), key=lambda h: (-h[0], h[1]))
        if len(found) == fetch:
            # The LIMIT may have cut the lowest score's group anywhere (in insertion order): drop that group so
            # the same memory gives the same hits whatever order it was written in.
            found = [h for h in found if h[0] > found[-1][0]]
        return [("strategy", item_id, score) for score, item_id in found[:limit]]

    def lessons_containing(self, words: list[str], limit: int) -> list[tuple[str, float]]:
        """(lesson id, how many of ``words`` its search text holds) for lessons holding any, most first: a table
        scan, for the read path while the read index is rebuilt (slower than its BM25, never empty)."""
        words = [w for w in dict.fromkeys(w.lower() for w in words) if len(w) > 2][:8]
        if not words:
            return []
        held = " + ".join(f"CASE WHEN lower(l.search_text) CONTAINS $w{i} THEN 1 ELSE 0 END" for i in range(len(words)))
        rows = self._rows(f"MATCH (l:Lesson) WITH l, {held} AS n WHERE n > 0 RETURN l.lesson_id AS id, n "
                          f"ORDER BY n DESC, id LIMIT {int(limit)}", {f"w{i}": w for i, w in enumerate(words)})
        return [(r["id"], float(r["n"])) for r in rows]

    def set_embedding(self, item_id: str, kind: str, model: str, vector: list[float]) -> None:
        self._exec("MERGE (e:Embedding {id: $i}) SET e.kind = $k, e.model = $m, e.vector = $v",
                   {"i": item_id, "k": kind, "m": model, "v": vector})

    def embedding_pages(self) -> Iterator[list[tuple[str, str, list[float]]]]:
        """Every stored (id, kind, vector), a page at a time (all at once, a million were ~12 GB of Python)."""
        for page in self.node_pages("Embedding", page=5_000):
            yield [(node["id"], node["kind"], node["vector"]) for node in page]

    _EMBEDDABLE = (("Attempt", "kernel_id", "search_text", "attempt"), ("Lesson", "lesson_id", "search_text", "lesson"),
                   ("Strategy", "strategy_id", "name", "strategy"))

    def unembedded(self, embedded: set[str]) -> list[tuple[str, str, str]]:
        """(kind, id, text) of items without an embedding (e.g. recorded before the model had loaded).

        Read a page of internal offsets at a time (the lock is let go between pages: questions are answered
        meanwhile; one read of a million ids held it for seconds) and the difference taken in Python (a NOT EXISTS
        subquery per row was quadratic: minutes at 100k items)."""
        out: list[tuple[str, str, str]] = []
        for table, key, text, kind in self._EMBEDDABLE:
            last = self._rows(f"MATCH (n:{table}) RETURN max(offset(ID(n))) AS m")[0]["m"]
            for start in range(0, -1 if last is None else int(last) + 1, 50_000):
                out += [(kind, r["i"], r["t"] or "") for r in self._rows(
                    f"MATCH (n:{table}) WHERE offset(ID(n)) >= $a AND offset(ID(n)) < $b "
                    f"RETURN n.{key} AS i, n.{text} AS t", {"a": start, "b": start + 50_000})
                    if r["i"] not in embedded]
        return out

    def embeddable_count(self) -> int:
        """Attempts, lessons and strategies: the items that get an embedding."""
        return sum(int(self._rows(f"MATCH (n:{table}) RETURN count(n) AS c")[0]["c"])
                   for table, _, _, _ in self._EMBEDDABLE)

    # --- statistics and export -----------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        out = {}
        for table in ("Task", "Hardware", "Session", "Attempt", "Strategy", "Lesson", "Embedding"):
            out[table] = int(self._rows(f"MATCH (n:{table}) RETURN count(n) AS c")[0]["c"])
        for rel in ("PREV", "APPLIED", "FROM_ATTEMPT"):
            out[rel] = int(self._rows(f"MATCH ()-[r:{rel}]->() RETURN count(r) AS c")[0]["c"])
        return out

    def label_counts(self) -> dict[str, int]:
        return {r["l"]: int(r["c"]) for r in self._rows("MATCH (a:Attempt) RETURN a.label AS l, count(a) AS c")}

    def raw_nodes(self, table: str) -> list[dict[str, Any]]:
        return [node for page in self.node_pages(table) for node in page]

    def node_pages(self, table: str, page: int = 20_000) -> Iterator[list[dict[str, Any]]]:
        """Every node of ``table`` by internal offset, ``page`` at a time (an export of a million lessons held them
        all in Python at once: 4.6 GB). Offsets keep the order of nodes written one at a time, not of a COPY's rows
        (Kùzu places them as its readers finish: 200k rows came back in 93 to 3,202 runs of consecutive rows), so a
        child attempt can come before its parent. A range of offsets is a cheap filter (~20 ms a page at 1M); nodes
        are never deleted, so the offsets of what exists now only grow."""
        last = self._rows(f"MATCH (n:{table}) RETURN max(offset(ID(n))) AS m")[0]["m"]
        for start in range(0, -1 if last is None else int(last) + 1, page):
            rows = self._rows(f"MATCH (n:{table}) WHERE offset(ID(n)) >= $a AND offset(ID(n)) < $b "
                              "RETURN n ORDER BY offset(ID(n))", {"a": start, "b": start + page})
            yield [{k: v for k, v in r["n"].items() if not k.startswith("_")} for r in rows]

    def has_node(self, table: str, key: str, value: str) -> bool:
        return bool(self._rows(f"MATCH (n:{table}) WHERE n.{key} = $v RETURN count(n) AS c", {"v": value})[0]["c"])
