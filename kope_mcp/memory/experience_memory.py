"""ExperienceMemory: records every attempt's outcome in the graph as it happens, and keeps the derived
numbers (step ratio, label, confidence, downstream score, session incumbent, embeddings) current."""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np

from kope_mcp.hardware import HardwareProfile, detect_hardware
from kope_mcp.memory.diffs import short_diff
from kope_mcp.memory.embedder import EMBEDDINGS_OFF, MODEL_NAME, BackgroundEmbedder
from kope_mcp.memory.embedding_backlog import EmbeddingBacklog
from kope_mcp.memory.outcome import downstream, label_for, measurement_confidence, ratio_interval, step_ratio
from kope_mcp.memory.read_index import SUFFIX as INDEX_SUFFIX
from kope_mcp.memory.read_index import ReadIndex, database_stamp
from kope_mcp.memory.recent import RecentCache
from kope_mcp.memory.records import AgentInfo, AttemptRecord, LessonRecord, SessionRecord, StrategyRecord
from kope_mcp.memory.recovery import check_opens
from kope_mcp.memory.rows import got_further
from kope_mcp.memory.schema import EMBEDDING_DIM
from kope_mcp.memory.signature import compile_signature, failure_signature
from kope_mcp.memory.store import KuzuExperienceStore
from kope_mcp.memory.strategies import SAME_STRATEGY_COSINE, SAME_STRATEGY_JACCARD, jaccard, strategy_key
from kope_mcp.memory.terms import affordable_words, stems
from kope_mcp.memory.transfer import MemoryTransfer
from kope_mcp.memory.vectors import SUFFIX as VECTORS_SUFFIX
from kope_mcp.memory.vectors import VectorIndex
from kope_mcp.models import ProfileReport, TestReport
from kope_mcp.tasks.loader import Task

log = logging.getLogger(__name__)
_NOT_WORD = re.compile(r"[^\w]+")

# Files beside the database, derived from it (the read index, the vector file): they travel with it.
SIDECARS = (INDEX_SUFFIX, VECTORS_SUFFIX)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class ExperienceMemory(MemoryTransfer):
    """The memory's one front door: services record, read and search experience through this class, never
    through its store, vectors or embedder."""

    @classmethod
    def open(cls, path: Path, embeddings: bool = True, why_off: str = EMBEDDINGS_OFF,
             cache_bytes: int = 0) -> ExperienceMemory:
        """The memory at ``path`` (a Kùzu database), embedding in the background when ``embeddings`` (else
        ``why_off`` is what its status says); ``cache_bytes`` caps the database's page cache (0: Kùzu's default,
        most of the machine's memory, taken as pages are read). Raises MemoryDamagedError, with what to do, when
        the database's log cannot be replayed (tried first in a child process: a damaged log can crash the
        opener)."""
        stamp = database_stamp(path)  # before anything opens it: an open may replay and checkpoint
        check_opens(path)
        return cls(KuzuExperienceStore(path, cache_bytes=cache_bytes), BackgroundEmbedder(embeddings, why_off=why_off),
                   stamp=stamp)

    def __init__(self, store: KuzuExperienceStore, embedder: BackgroundEmbedder, stamp: str | None = None,
                 index: ReadIndex | None = None) -> None:
        """``stamp``: the database file's :func:`database_stamp` before the store opened it (taken now if None),
        which says whether the read index beside it can be trusted; ``index``: another read index than the file
        beside the database (a private one, say)."""
        self.store = store
        self.embedder = embedder
        beside = index is None
        self.index = ReadIndex.beside(store.path) if index is None else index
        self.index.attach(database_stamp(store.path) if stamp is None else stamp,
                          database_empty=store.is_empty())
        self.vectors = (VectorIndex.beside(EMBEDDING_DIM, self.index, store.path) if beside
                        else VectorIndex(EMBEDDING_DIM, self.index))
        self.embeddings = EmbeddingBacklog(store, embedder, self.vectors)
        self._loader: threading.Thread | None = None
        self._known_tasks: set[str] = set()
        self._known_hardware: set[str] = set()
        # Recording is read-modify-write (step ratio from the parent, downstream scores up the chain, the
        # incumbent): one writer at a time, whichever thread the MCP call runs in.
        self.write_lock = threading.RLock()
        self._strategy_lock = threading.Lock()
        self._strategies: list[StrategyRecord] | None = None  # cached: strategies are only ever added
        # Records that never change once written, read on every compile: sessions (the incumbent is kept
        # current here) and the sources of recent attempts (the next attempt's parent, for its diff).
        self._sessions: RecentCache[str, SessionRecord] = RecentCache(4096)
        self._sources: RecentCache[str, str] = RecentCache(256, max_size=32 * 1024**2, size=len)

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Rebuild a stale read index (or read a trusted one once, for the page cache), load the vectors and the
        embedding model, all in the background; nothing here blocks."""
        self.embedder.start()
        if self._loader is None and not self.index.complete:
            self._loader = threading.Thread(target=self.load_index, name="kope-index-loader", daemon=True)
            self._loader.start()
        elif self.index.complete:
            threading.Thread(target=self.index.warm, name="kope-index-warm", daemon=True).start()
        self.embeddings.start()

    def load_index(self) -> None:
        """Fill the read index from the graph (it was stale: not closed cleanly after the database's last write)."""
        log.info("rebuilding the memory's read index from the graph")
        self.index.rebuild(self.store.attempt_summaries(), self.store.lesson_pages())

    @property
    def index_loading(self) -> bool:
        """The read index is being rebuilt (started, not finished)."""
        return self._loader is not None and not self.index.complete

    def wait_index(self, timeout: float = 120.0) -> bool:
        if self._loader is not None:
            self._loader.join(timeout)
        return self.index.complete

    def stop(self) -> None:
        self.embeddings.stop()
        if self._loader is not None:
            self._loader.join(timeout=30)
            self._loader = None

    def close(self) -> None:
        """Checkpoint and release the database (after :meth:`stop`), once any write in progress has finished; the
        read index is marked as matching it."""
        with self.write_lock:
            self.store.close()
            self.index.close(database_stamp(self.store.path), vectors_complete=self.vectors.loaded.is_set())

    # --- embeddings (the backlog lives in embedding_backlog.py) ------------------------------------------
    @property
    def semantic_ready(self) -> bool:
        return self.embeddings.semantic_ready

    @property
    def semantic_status(self) -> str:
        return self.embeddings.semantic_status

    def queue_backlog(self) -> int:
        return self.embeddings.queue_backlog()

    @property
    def backlog(self) -> int:
        """Items waiting for their embedding."""
        return self.embeddings.backlog

    def drain(self, timeout: float = 60.0) -> None:
        self.embeddings.drain(timeout)

    def enqueue_embedding(self, kind: str, item_id: str, text: str) -> None:
        self.embeddings.enqueue(kind, item_id, text)

    # --- tasks, hardware, sessions -------------------------------------------------------------------------
    def ensure_task(self, task: Task) -> None:
        if task.id not in self._known_tasks:
            self.store.upsert_task(task.id, task.spec.family, task.spec.level, task.spec.summary)
            self._known_tasks.add(task.id)

    def ensure_hardware(self, hw: HardwareProfile | None = None) -> HardwareProfile:
        hw = hw or detect_hardware()
        if hw.key not in self._known_hardware:
            self.store.upsert_hardware(hw.key, hw.arch, hw.cpu_model, hw.cores, hw.isa,
                                       [c.model_dump() for c in hw.caches])
            self._known_hardware.add(hw.key)
        return hw

    def create_session(self, task: Task, agent: AgentInfo | None,
                       hardware: HardwareProfile | None = None) -> SessionRecord:
        self.ensure_task(task)
        hw = self.ensure_hardware(hardware)
        # The session's id is its holder's capability: given only to the client that started it, it is what makes
        # that client's lessons verified and lets it add attempts to the session, so it cannot be guessed.
        record = SessionRecord(session_id=f"s-{secrets.token_hex(16)}", task_id=task.id, hardware_key=hw.key,
                               agent=agent or AgentInfo(), created_at=now())
        self.store.add_session(record)
        self._sessions.put(record.session_id, record)
        return record

    def session(self, session_id: str) -> SessionRecord:
        """The session (UnknownSessionError if none). Cached: its task, hardware and agent never change, and its
        incumbent changes only through this memory, which updates the cached copy."""
        cached = self._sessions.get(session_id)
        if cached is None:
            cached = self.store.session(session_id)
            self._sessions.put(session_id, cached)
        return cached

    def forget_cached(self) -> None:
        """Drop cached records (after an import wrote to the store directly)."""
        self._sessions.clear()
        self._sources.clear()

    # --- strategies ----------------------------------------------------------------------------------------
    def canonical_strategy(self, name: str) -> StrategyRecord:
        """The existing Strategy node with a near-identical name, or a new one."""
        key = strategy_key(name)
        with self._strategy_lock:
            if self._strategies is None:
                self._strategies = self.store.strategies()
            known = self._strategies
            for strategy in known:
                if strategy.key == key or jaccard(strategy.key, key) >= SAME_STRATEGY_JACCARD:
                    return strategy
            vectors = self.embedder.embed([name]) if known else None
            if vectors:
                similarity, best = max(((self._cosine(vectors[0], s.strategy_id), s) for s in known),
                                       key=lambda pair: pair[0])
                if similarity >= SAME_STRATEGY_COSINE:
                    return best
            record = StrategyRecord(strategy_id=new_id("st"), name=name.strip()[:200], key=key)
            self.store.add_strategy(record)
            known.append(record)
            if vectors:
                self.store.set_embedding(record.strategy_id, "strategy", MODEL_NAME, vectors[0])
                self.vectors.add(record.strategy_id, "strategy", vectors[0])
            else:
                self.enqueue_embedding("strategy", record.strategy_id, record.name)
            return record

    def forget_cached_strategies(self) -> None:
        with self._strategy_lock:
            self._strategies = None

    def _cosine(self, vector: list[float], item_id: str) -> float:
        other = self.vectors.vector(item_id)
        return float(sum(a * b for a, b in zip(vector, other, strict=True))) if other is not None else 0.0

    # --- automatic recording -------------------------------------------------------------------------------
    def record_compile(self, record: AttemptRecord, first_error: str | None,
                       parent_source: str | None = None) -> AttemptRecord:
        """``parent_source``: the parent's source when the caller has it (saves reading it again)."""
        with self.write_lock:
            return self._record_compile(record, first_error, parent_source)

    def _record_compile(self, record: AttemptRecord, first_error: str | None,
                        parent_source: str | None) -> AttemptRecord:
        if record.strategy:
            record.strategy_id = self.canonical_strategy(record.strategy).strategy_id
        record.error_signature = compile_signature(first_error)
        if record.parent_id:
            # Diffs are computed once here, so the read path never fetches sources.
            if parent_source is None:
                parent_source = self._sources.get(record.parent_id)
            if parent_source is None:
                parent_source = self.store.sources([record.parent_id]).get(record.parent_id)
            record.diff_from_parent = short_diff(parent_source, record.source)
        record.label = label_for(record.ok, None, None)
        # Journalled and synced now, in the graph right after: the answer does not wait for the statement.
        self.store.add_attempt_soon(record)
        self.index.upsert_attempt(record)
        if record.source:
            self._sources.put(record.kernel_id, record.source)  # the next attempt's parent, most likely
        # A new attempt has no measured gain and no successors: d = 0, and no ancestor's score changes.
        self.enqueue_embedding("attempt", record.kernel_id, _embedding_text(record))
        return record

    def record_test(self, kernel_id: str, report: TestReport) -> None:
        with self.write_lock:
            self._record_test(kernel_id, report)

    def _record_test(self, kernel_id: str, report: TestReport) -> None:
        attempt = self.store.attempt(kernel_id)
        unwritten = sum(c.unwritten for c in report.cases)
        signature = failure_signature(report.failure, report.message, unwritten) or attempt.error_signature
        ratio = attempt.step_ratio if report.passed else None
        interval = None if ratio is None else ratio_interval(
            (attempt.speedup_ci_low, attempt.speedup_ci_high), self._predecessor_speedup(attempt), ratio)
        label = label_for(attempt.ok, report.passed, ratio, interval)
        self._update(kernel_id, tested=True, correct=report.passed, failure=report.failure,
                                  failure_message=report.message[:2000], error_signature=signature, label=label)
        self._refresh_downstream(kernel_id)

    def record_profile(self, kernel_id: str, report: ProfileReport) -> None:
        with self.write_lock:
            self._record_profile(kernel_id, report)

    def _record_profile(self, kernel_id: str, report: ProfileReport) -> None:
        if report.failure is not None:
            self._record_profile_failure(kernel_id, report)
            return
        assert report.speedup_vs_baseline is not None and report.speedup_vs_baseline_ci95 is not None
        assert report.kernel is not None
        attempt = self.store.attempt(kernel_id)
        predecessor = self._predecessor_speedup(attempt)
        ratio = step_ratio(report.speedup_vs_baseline, predecessor)
        interval = ratio_interval(report.speedup_vs_baseline_ci95, predecessor, ratio)
        confidence = measurement_confidence(report.speedup_vs_baseline, report.speedup_vs_baseline_ci95, report.noisy)
        label = label_for(True, True, ratio, interval)
        if report.same_code_as_baseline:
            label = "ineffective"  # the baseline's own machine code: a difference measured is placement or noise
        # A win whose whole interval clears the gain threshold is a win however much the rounds varied: on a
        # machine with one busy job per core every honest profile was noisy, and nothing was ever taught. It is
        # taught with its (wide) CI and says it was measured under load; a noisy result of any other label is not.
        noisy = report.noisy and not (label == "effective" and not report.suspect)
        warnings = list(report.warnings)
        if report.noisy and not noisy:
            low, high = report.speedup_vs_baseline_ci95
            warnings.append(f"measured under load ({'; '.join(report.noise_reasons)}): taught because its whole "
                            f"95% CI [{low:.2f}, {high:.2f}]x clears the gain threshold")
        self._update(
            kernel_id, median_s=report.kernel.median_s, speedup=report.speedup_vs_baseline,
            speedup_ci_low=report.speedup_vs_baseline_ci95[0], speedup_ci_high=report.speedup_vs_baseline_ci95[1],
            speedup_vs_reference=report.speedup_vs_reference,
            step_ratio=ratio, label=label, confidence=confidence,
            profile_warnings=warnings, suspect=report.suspect, suspect_reason="; ".join(report.suspect_reasons),
            noisy=noisy, noise_reason="; ".join(report.noise_reasons) if noisy else "",
        )
        session = self.session(attempt.session_id)
        # Only a correct candidate that is measurably faster replaces the incumbent, never on a noisy measurement;
        # the incumbent measured again carries its latest figure (a busy machine made the first one high).
        remeasured = kernel_id == session.incumbent_id and not report.suspect
        if remeasured or (not report.suspect and not noisy and (
                session.incumbent_speedup is None or report.speedup_vs_baseline_ci95[0] > session.incumbent_speedup)):
            self.store.set_incumbent(session.session_id, kernel_id, report.speedup_vs_baseline)
            self._sessions.put(session.session_id, session.model_copy(
                update={"incumbent_id": kernel_id, "incumbent_speedup": report.speedup_vs_baseline}))
        for child in self.store.successors(kernel_id):
            if child.speedup is not None and child.origin == attempt.origin:
                child_ratio = step_ratio(child.speedup, report.speedup_vs_baseline)
                child_interval = ratio_interval((child.speedup_ci_low, child.speedup_ci_high),
                                                report.speedup_vs_baseline, child_ratio)
                self._update(child.kernel_id, step_ratio=child_ratio,
                             label=label_for(True, True, child_ratio, child_interval))
                self._refresh_downstream(child.kernel_id)
        self._refresh_downstream(kernel_id)
        self.enqueue_embedding("attempt", kernel_id, _embedding_text(self.store.attempt(kernel_id)))

    def _record_profile_failure(self, kernel_id: str, report: ProfileReport) -> None:
        if report.failure == "timing_unverified":
            # Nothing was measured that can be trusted: the attempt stays correct and unmeasured.
            self._update(kernel_id, profile_warnings=[report.message[:500]])
            return
        # Wrong or crashing at the size that is timed: the attempt is incorrect, whatever the small cases said.
        self._update(kernel_id, correct=False, failure=report.failure, failure_message=report.message[:2000],
                     error_signature=failure_signature(report.failure, report.message, 0),
                     label=label_for(True, False, None))
        self._refresh_downstream(kernel_id)

    def _update(self, kernel_id: str, **fields: object) -> None:
        self.store.update_attempt(kernel_id, **fields)
        self.index.update_attempt(kernel_id, **fields)

    def add_lesson(self, lesson: LessonRecord, search_text: str) -> None:
        """Store a lesson (linked to its attempt, strategy, task), index it and queue its embedding."""
        self.store.add_lesson(lesson, search_text)
        self.index.add_lesson(lesson, search_text)
        self.enqueue_embedding("lesson", lesson.lesson_id, search_text)

    def name_strategy(self, kernel_id: str, strategy: StrategyRecord, name: str) -> None:
        """Give an attempt recorded without a strategy the one its lesson names."""
        self._update(kernel_id, strategy=name.strip()[:200], strategy_id=strategy.strategy_id)
        self.store.link_strategy("Attempt", kernel_id, strategy.strategy_id)

    # --- single records and whole-memory listings ----------------------------------------------------------
    def attempt(self, kernel_id: str) -> AttemptRecord:
        """One attempt with its source (raises UnknownKernelError)."""
        return self.store.attempt(kernel_id)

    def attempts_in_session(self, session_id: str) -> list[AttemptRecord]:
        """A session's attempts without their sources, oldest first."""
        return self.store.attempts_in_session(session_id)

    def all_attempts(self) -> list[AttemptRecord]:
        """Every attempt with its source, oldest first."""
        return self.store.all_attempts()

    def noisy_attempts(self, limit: int) -> list[AttemptRecord]:
        """This home's own attempts whose last measurement was too noisy to teach, fastest first."""
        return self.store.noisy_attempts(limit)

    def all_lessons(self) -> list[LessonRecord]:
        return self.store.all_lessons()

    # --- search: BM25 over lessons and strategy names, cosine over embeddings ------------------------------
    def full_text(self, query: str, limit: int, postings_budget: int | None = None) -> list[tuple[str, str, float]]:
        """(kind, id, BM25 score) of strategies and lessons matching the words of ``query``; lessons are searched
        without the question's most common words once their postings pass ``postings_budget`` (terms.py). Lessons
        are searched in the read index, and by a scan of the graph while it is rebuilt after a crash."""
        hits = self.store.full_text(query, limit)
        if not self.index.complete:
            found = self.store.lessons_containing(_NOT_WORD.split(query), limit)
            return sorted(hits + [("lesson", lesson_id, n) for lesson_id, n in found], key=lambda h: -h[2])[:limit]
        lesson_query = query
        if postings_budget is not None:
            lesson_query, dropped = affordable_words(query, self.index.document_frequency(stems(query)),
                                                     postings_budget)
            if dropped:
                log.debug("full-text search without %s (over %d postings)", dropped, postings_budget)
        return hits + [("lesson", lesson_id, score) for lesson_id, score in self.index.full_text(lesson_query, limit)]

    def embed_question(self, text: str) -> list[float] | None:
        """The question's embedding, at once on this thread; None while semantic search is not ready."""
        if not self.semantic_ready:
            return None
        vectors = self.embedder.embed([text])
        return list(vectors[0]) if vectors else None

    def nearest(self, vector: list[float], limit: int) -> list[tuple[str, str, float]]:
        """(id, kind, cosine) of the embedded items closest to ``vector``."""
        return self.vectors.search(vector, limit)

    def vector(self, item_id: str) -> np.ndarray | None:
        return self.vectors.vector(item_id)

    # --- the read path: the read index when complete, the store's scans while it is rebuilt -------------------
    def attempts_for_task(self, task_id: str, limit: int) -> list[AttemptRecord]:
        if self.index.complete:
            return self.index.get(self.index.top_for_task(task_id, limit))
        return self.store.attempts_for_task(task_id, limit)

    def attempts_for_family(self, family: str, exclude_task: str | None, limit: int) -> list[AttemptRecord]:
        if self.index.complete:
            return self.index.get(self.index.top_for_family(family, exclude_task, limit))
        return self.store.attempts_for_family(family, exclude_task, limit)

    def attempts_for_strategy(self, strategy_id: str, limit: int) -> list[AttemptRecord]:
        if self.index.complete:
            return self.index.get(self.index.top_for_strategy(strategy_id, limit))
        return self.store.attempts_for_strategy(strategy_id, limit)

    def attempts_with_signature(self, signature: str, limit: int) -> list[AttemptRecord]:
        if self.index.complete:
            return self.index.get(self.index.with_signature(signature, limit))
        return self.store.attempts_with_signature(signature, limit)

    def best_attempts(self, limit: int) -> list[AttemptRecord]:
        if self.index.complete:
            return self.index.get(self.index.best(limit))
        return self.store.best_attempts(limit)

    def attempts_by_id(self, kernel_ids: list[str]) -> list[AttemptRecord]:
        return self.index.get(kernel_ids) if self.index.complete else self.store.attempts_by_id(kernel_ids)

    def lessons_by_id(self, lesson_ids: list[str]) -> list[LessonRecord]:
        return self.index.lessons(lesson_ids) if self.index.complete else self.store.lessons_by_id(lesson_ids)

    def lessons_about(self, kernel_ids: list[str]) -> list[LessonRecord]:
        """The lessons recorded on these attempts (an agent's account of how an error was fixed, say)."""
        if self.index.complete:
            return self.index.lessons_about(kernel_ids)
        return self.store.lessons_for_attempts(kernel_ids)

    def latest_in_session(self, session_id: str) -> AttemptRecord | None:
        if self.index.complete:
            latest = self.index.latest_in_session(session_id)
            return self.index.get([latest])[0] if latest else None
        return self.store.latest_in_session(session_id)

    def scoped_lessons(self, task_id: str | None, family: str | None, hardware: str | None, limit: int,
                       by: Literal["evidence", "recency"] = "evidence") -> list[LessonRecord]:
        if by == "recency":
            return self.store.lessons_in_scope(task_id, family, limit)
        if self.index.complete:
            return self.index.lessons_in_scope(task_id, family, hardware, limit)
        # Until the index has loaded: the same choice, over what a bounded scan of the store returns.
        scratch = ReadIndex(None)
        scratch.add_lessons([(lesson, "") for lesson in self.store.lessons_in_scope(task_id, family, 20 * limit)])
        return scratch.lessons_in_scope(task_id, family, hardware, limit)

    def fixes_of(self, failing: list[AttemptRecord]) -> dict[str, AttemptRecord]:
        """Error -> fix pairs: a PREV successor that got further, else the session's very next attempt (agents
        often fix an error without naming the failing kernel as the parent)."""
        if not self.index.complete:
            fixes = self.store.prev_fixes([f.kernel_id for f in failing])
            rest = [f.kernel_id for f in failing if f.kernel_id not in fixes]
            return {**self.store.session_next_fixes(rest), **fixes} if rest else fixes
        pairs = [(f.kernel_id, c) for f in failing for c in self.index.children(f.kernel_id)]
        children = {a.kernel_id: a for a in self.index.get(c for _, c in pairs)}
        fixes = {}
        by_id = {f.kernel_id: f for f in failing}
        for parent_id, child_id in pairs:
            child = children.get(child_id)
            if parent_id not in fixes and child is not None and got_further(by_id[parent_id].ok, child):
                fixes[parent_id] = child
        for parent in failing:
            if parent.kernel_id in fixes:
                continue
            nxt = self.index.next_in_session(parent.kernel_id)
            child = self.index.get([nxt])[0] if nxt else None
            if child is not None and got_further(parent.ok, child):
                fixes[parent.kernel_id] = child
        return fixes

    def _predecessor_speedup(self, attempt: AttemptRecord) -> float | None:
        """The speedup of the nearest measured ancestor; None means the naive baseline (speedup 1)."""
        parent_id = attempt.parent_id
        seen = 0
        while parent_id and seen < 1000:
            parent = self.store.attempt(parent_id)
            if parent.origin != attempt.origin:
                # Measured in another home (or this one's attempt under an import): another machine's baseline,
                # no base for a step here. The step is from this home's own baseline.
                return None
            # A suspect measurement (the baseline's own code among them) is no base to measure a step from.
            if parent.correct and parent.speedup is not None and not parent.suspect:
                return parent.speedup
            parent_id, seen = parent.parent_id, seen + 1
        return None

    def _refresh_downstream(self, kernel_id: str) -> None:
        """Recompute d(v) for this attempt and its ancestors (each depends on its successors), stopping as soon
        as a value does not change."""
        for node_id, _parent, ratio, correct, old in self.store.lineage(kernel_id):
            own = ratio if correct and ratio is not None else 0.0
            score = downstream(own, self.store.successor_scores(node_id))
            if abs(score - old) < 1e-12:
                return
            self._update(node_id, downstream=score)


def _embedding_text(record: AttemptRecord) -> str:
    outcome = record.label + (f" {record.speedup:.2f}x" if record.speedup else "")
    detail = record.error_signature or ""
    return f"{record.family} {record.task_id}: {record.strategy or 'no strategy given'}. {outcome}. {detail}"
