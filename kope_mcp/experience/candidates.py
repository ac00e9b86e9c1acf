"""Candidates for query_experience: the experiences worth scoring for a question in a state (the first stage of
the selection pipeline; see selection_config.py)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kope_mcp.diagnostics import parse_diagnostics
from kope_mcp.experience.config import Kind, SelectionConfig
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.records import AttemptRecord, LessonRecord
from kope_mcp.memory.signature import compile_signature
from kope_mcp.models import Phase

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _question_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kope-question")
        return _pool


def _semantic(memory: ExperienceMemory, text: str) -> dict[str, float]:
    """Cosine of the attempts and lessons nearest the question; empty while semantic search is not ready. The
    embedding is computed next to any backlog batch (the backlog's workers start no new one meanwhile)."""
    vector = memory.embed_question(text)
    if not vector:
        return {}
    return {item_id: score for item_id, kind, score in memory.nearest(vector, 50) if kind in ("attempt", "lesson")}


@dataclass
class Candidate:
    kind: Kind
    item_id: str
    attempt: AttemptRecord | None = None
    lesson: LessonRecord | None = None
    fix: AttemptRecord | None = None
    bm25: float = 0.0
    cosine: float = 0.0
    reasons: list[str] = field(default_factory=list)
    about_same_error: bool = False  # a lesson written on an attempt that failed with the question's error


@dataclass
class QueryState:
    phase: Phase
    task_id: str | None
    family: str | None
    hardware_key: str
    target: str | None
    signature: str | None
    latest: AttemptRecord | None
    incumbent: AttemptRecord | None
    signature_pasted: bool = False  # read from the question's own text, not from the session's latest attempt


def pasted_signature(text: str) -> str | None:
    """The normalised signature of the first compiler error quoted in ``text`` (gcc/clang or nvcc form), the same
    one a failed compile records: another line, column or identifier gives the same signature."""
    if "error" not in text:
        return None
    first = next((d.message for d in parse_diagnostics(text, "kernel.c") if d.severity == "error"), None)
    return compile_signature(first)


def gather(memory: ExperienceMemory, query: str, state: QueryState, config: SelectionConfig) -> dict[str, Candidate]:
    """Every experience worth scoring for this question and state: the task's, family's and error's measured
    attempts and scoped lessons by evidence (never by age), BM25 and embedding matches, and fixes of failures."""
    found: dict[str, Candidate] = {}
    attempts: dict[str, AttemptRecord] = {}
    reasons: dict[str, list[str]] = {}

    def add_attempts(records: list[AttemptRecord], reason: str) -> None:
        for rec in records:
            attempts[rec.kernel_id] = rec
            reasons.setdefault(rec.kernel_id, []).append(reason)

    # Not the task id: every lesson naming the task would match it, and the task's lessons are candidates
    # by scope already; BM25 is for the words of the question.
    # A signature read from the question itself repeats its words: BM25's cost grows with them, its ranking not.
    signature = state.signature if state.signature and not state.signature_pasted else None
    text_query = " ".join(p for p in (query, state.task_id if config.text_query_has_task else None, signature) if p)
    limit = config.candidates_per_source
    # The question's embedding and its nearest items on another thread while the index is read here: both
    # release the GIL (torch, SQLite), so on two cores the ~25 ms of the one overlap the ~10 ms of the other.
    semantic = _question_pool().submit(_semantic, memory, text_query) if text_query.strip() else None
    if state.task_id:
        add_attempts(memory.attempts_for_task(state.task_id, limit), "same task")
    if state.family:
        add_attempts(memory.attempts_for_family(state.family, state.task_id, limit), "same family")
    if state.signature:
        add_attempts(memory.attempts_with_signature(state.signature, limit), "same error signature")
    add_attempts(memory.best_attempts(limit // 2), "effective elsewhere")
    lessons: dict[str, LessonRecord] = {}
    for lesson in memory.scoped_lessons(state.task_id, state.family, state.hardware_key, limit, by=config.lessons_by):
        lessons[lesson.lesson_id] = lesson
        reasons.setdefault(lesson.lesson_id, []).append("scope match")
    hits = memory.full_text(text_query, config.full_text_hits, config.full_text_postings) if text_query.strip() else []
    hits.sort(key=lambda h: (-h[2], h[1]))  # equal scores in id order, not in the order rows were inserted
    top_bm25 = max((score for _, _, score in hits), default=1.0) or 1.0
    bm25 = {item_id: score / top_bm25 for kind, item_id, score in hits if kind == "lesson"}
    # A strategy that matches the query lends its score to the attempts that applied it.
    for _, strategy_id, score in sorted((h for h in hits if h[0] == "strategy"), key=lambda h: -h[2])[:5]:
        for rec in memory.attempts_for_strategy(strategy_id, config.strategy_match_attempts):
            attempts.setdefault(rec.kernel_id, rec)
            reasons.setdefault(rec.kernel_id, []).append("strategy matches the query")
            bm25[rec.kernel_id] = max(bm25.get(rec.kernel_id, 0.0), score / top_bm25)
    cosine = semantic.result() if semantic is not None else {}
    extra = [i for i in dict.fromkeys([*bm25, *cosine]) if i not in attempts and i not in lessons]
    if extra:
        add_attempts(memory.attempts_by_id([i for i in extra if i.startswith("k-")]), "text match")
        lesson_ids = [i for i in extra if i.startswith("x-")]
        for lesson in memory.lessons_by_id(lesson_ids):
            lessons[lesson.lesson_id] = lesson
            reasons.setdefault(lesson.lesson_id, []).append("text match")
    # Fixes matter for failures like the current one: same error signature first, then the same task.
    failing = sorted((a for a in attempts.values() if not a.ok or a.correct is False),
                     key=lambda a: (a.error_signature != state.signature, a.task_id != state.task_id))
    fixes = memory.fixes_of(failing[:config.max_fix_lookups]) if failing else {}
    same_error = [a.kernel_id for a in failing if state.signature and a.error_signature == state.signature]
    about_same_error: set[str] = set()
    for lesson in memory.lessons_about(same_error[:config.max_fix_lookups]):
        lessons.setdefault(lesson.lesson_id, lesson)
        about_same_error.add(lesson.lesson_id)
        reasons.setdefault(lesson.lesson_id, []).append("written about the same error")
    latest_id = state.latest.kernel_id if state.latest is not None else None
    for kid, rec in attempts.items():
        if kid == latest_id:
            continue  # already in the hot tier as the latest feedback
        if kid in fixes:
            kind: Kind = "fix"
        elif not rec.ok or rec.correct is False:
            kind = "pitfall"
        elif not rec.teaches:
            continue  # a suspect or noisy measurement is never offered as what worked nor as what to avoid
        elif rec.label in ("negative", "ineffective"):
            kind = "pitfall"  # measurably slower: the whole CI lies below 1/1.05 (outcome.label_for)
        elif rec.label in ("effective", "partial"):
            kind = "case"
        else:
            continue  # compiled but never measured: nothing to learn from yet
        found[kid] = Candidate(kind=kind, item_id=kid, attempt=rec, fix=fixes.get(kid),
                               bm25=bm25.get(kid, 0.0), cosine=cosine.get(kid, 0.0),
                               reasons=reasons.get(kid, []))
    for lid, lesson in lessons.items():
        found[lid] = Candidate(kind="lesson", item_id=lid, lesson=lesson, bm25=bm25.get(lid, 0.0),
                               cosine=cosine.get(lid, 0.0), reasons=reasons.get(lid, []),
                               about_same_error=lid in about_same_error)
    return found
