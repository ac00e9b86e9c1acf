"""record_experience and query_experience: the agent's account of a step, and active context selection."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kope_mcp.errors import MAX_STRATEGY_CHARS, MAX_TEXT_CHARS, KopeError, UnknownBackendError, check_length
from kope_mcp.hardware import detect_hardware
from kope_mcp.memory.outcome import LABEL_PRIOR, UNVERIFIED_CONFIDENCE, gain_factor
from kope_mcp.memory.records import AgentInfo, AttemptRecord, LessonRecord
from kope_mcp.memory.retrieval_index import hardware_rank
from kope_mcp.memory.selection import (
    COLD_MAX_ITEMS,
    WARM_MAX_ITEMS,
    WARM_SHARE,
    Scored,
    cover,
    estimate_tokens,
    mmr_order,
    pack,
    similarity_matrix,
    truncate_to_tokens,
    word_set,
)
from kope_mcp.memory.strategies import strategy_key
from kope_mcp.models import Phase, QueryResult, RecordResult
from kope_mcp.services.context_render import has_diff, hot_section, render_context, render_item
from kope_mcp.services.memory import ExperienceMemory, new_id, now
from kope_mcp.tasks.registry import TaskRegistry

MAX_QUERY_CHARS = 2000
MAX_LESSON_CHARS = 4000
CANDIDATES_PER_SOURCE = 60  # per graph filter; the best by downstream score come first
MAX_FIX_LOOKUPS = 40
MMR_POOL_PER_ITEM = 4  # MMR considers the best 4 x the tier's item cap
FULL_TEXT_HITS = 100  # per BM25 index (strategies, lessons): ~3 ms at 20k documents
FIX_QUALITY = 0.8  # a recorded fix for the error at hand, as an attempt's fix weighs
# Evidence from other hardware, by hardware_rank: the same architecture still carries the algorithm and most of
# the code; another kind of device (a GPU result for a CPU question) mostly does not.
HARDWARE_WEIGHT = {3: 1.0, 2: 0.6, 1: 0.45, 0: 0.2}
FIX_TEXT_MATCH = 0.3  # a lesson about a failure answers an error when its words match this well (BM25, cosine)
STRATEGY_MATCH_ATTEMPTS = 10  # attempts taken per strategy whose name matches the query
SECTION_HEADER_RESERVE = 60  # tokens kept free for the markdown headers when adding diffs
PREFERRED_AGENT_BOOST = 1.5  # enough to reorder near-equals, not to outrank much stronger evidence
Kind = Literal["case", "fix", "pitfall", "lesson"]


class EmptyLessonError(KopeError):
    code = "empty_lesson"


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


class ExperienceService:
    def __init__(self, memory: ExperienceMemory, tasks: TaskRegistry,
                 target_hardware: Callable[[str], str | None] | None = None) -> None:
        self.memory = memory
        self.store = memory.store
        self.tasks = tasks
        # backend name -> the hardware key its results are recorded under (a GPU target's is its GPU's).
        self.target_hardware = target_hardware or (lambda name: None)

    # --- record --------------------------------------------------------------------------------------------
    def record_experience(
        self, strategy: str, lesson: str, kernel_id: str | None = None, session_id: str | None = None,
        task_id: str | None = None, opt_layer: str | None = None, rationale: str | None = None,
        hardware: str | None = None, agent: AgentInfo | None = None,
    ) -> RecordResult:
        if not lesson.strip() or not strategy.strip():
            raise EmptyLessonError("both `strategy` and `lesson` need text: what you tried, and what you learned")
        check_length("strategy", strategy.strip(), MAX_STRATEGY_CHARS)
        check_length("lesson", lesson.strip(), MAX_TEXT_CHARS)
        check_length("rationale", rationale, MAX_TEXT_CHARS)
        check_length("opt_layer", opt_layer, MAX_STRATEGY_CHARS)
        check_length("hardware", hardware, MAX_STRATEGY_CHARS)
        with self.memory.write_lock:
            return self._record(strategy, lesson, kernel_id, session_id, task_id, opt_layer, rationale, hardware,
                                agent)

    def _record(
        self, strategy: str, lesson: str, kernel_id: str | None, session_id: str | None, task_id: str | None,
        opt_layer: str | None, rationale: str | None, hardware: str | None, agent: AgentInfo | None,
    ) -> RecordResult:
        attempt = self.store.attempt(kernel_id) if kernel_id else None
        if attempt is None and session_id:
            task_id = task_id or self.store.session(session_id).task_id
        if task_id:
            self.memory.ensure_task(self.tasks.get(task_id))
        canonical = self.memory.canonical_strategy(strategy)
        if attempt is not None:
            task_id = attempt.task_id
            if not attempt.strategy_id:
                self.store.update_attempt(attempt.kernel_id, strategy=strategy.strip()[:200],
                                          strategy_id=canonical.strategy_id)
                self.store.link_strategy("Attempt", attempt.kernel_id, canonical.strategy_id)
            # The outcome is the measurement's, whatever the caller believes.
            measured = attempt.speedup is not None or attempt.tested or not attempt.ok
            confidence = attempt.confidence if attempt.speedup is not None else (0.8 if measured else 0.5)
            label, verified = attempt.label, measured
            if attempt.suspect:
                # A lesson cannot launder a suspect measurement into a verified win.
                label, verified, confidence = "lesson", False, UNVERIFIED_CONFIDENCE
        else:
            label, verified, confidence = "lesson", False, UNVERIFIED_CONFIDENCE
        family = self.tasks.get(task_id).spec.family if task_id else None
        record = LessonRecord(
            lesson_id=new_id("x"), text=lesson.strip()[:MAX_LESSON_CHARS], strategy=canonical.name,
            strategy_id=canonical.strategy_id, opt_layer=opt_layer, rationale=(rationale or "")[:MAX_LESSON_CHARS],
            task_id=task_id, family=family,
            hardware_key=attempt.hardware_key if attempt else (hardware or None),
            target=attempt.target if attempt else None,
            attempt_id=attempt.kernel_id if attempt else None, verified=verified, label=label,
            step_ratio=attempt.step_ratio if attempt else None, speedup=attempt.speedup if attempt else None,
            confidence=confidence, agent=(agent or AgentInfo()).display, created_at=now(),
        )
        text = " ".join(p for p in (task_id, family, canonical.name, opt_layer, record.text, rationale) if p)
        self.store.add_lesson(record, text)
        self.memory.index_lesson(record)
        self.memory.enqueue_embedding("lesson", record.lesson_id, text)
        return RecordResult(
            experience_id=record.lesson_id, attempt_id=record.attempt_id, label=label, verified=verified,
            confidence=confidence, strategy=canonical.name, strategy_id=canonical.strategy_id,
            step_ratio=record.step_ratio, speedup=record.speedup,
            next_step="call query_experience before your next attempt to get the most relevant experience",
        )

    # --- query ---------------------------------------------------------------------------------------------
    def query_experience(
        self, query: str, task_id: str | None = None, session_id: str | None = None, phase: Phase | None = None,
        hardware: str | None = None, token_budget: int = 2000, agent: str | None = None,
        agent_mode: Literal["prefer", "only"] = "prefer", backend: str | None = None,
    ) -> QueryResult:
        warnings: list[str] = []
        if len(query) > MAX_QUERY_CHARS:
            query = query[:MAX_QUERY_CHARS]
            warnings.append(f"the query was cut to its first {MAX_QUERY_CHARS} characters")
        state = self._state(task_id, session_id, phase, hardware, backend)
        candidates = self._gather(query, state)
        hot = self._hot_items(state)
        scored: dict[str, tuple[Scored, Candidate, str]] = {}
        dropped: dict[str, int] = {}
        wanted = agent.strip().lower() if agent and agent.strip() else None
        strategy_of = {c.item_id: _strategy_of(c) for c in candidates.values()}
        # A strategy that failed on several kernels is a pattern, not an accident.
        failures = Counter(strategy_of[c.item_id] for c in candidates.values() if c.kind == "pitfall")
        for cand in candidates.values():
            by = _agent_of(cand)
            if wanted and agent_mode == "only" and wanted not in by.lower():
                dropped["other_agent"] = dropped.get("other_agent", 0) + 1
                continue
            tier_score = self._score(cand, state)
            if tier_score is None:
                dropped["no_measured_value"] = dropped.get("no_measured_value", 0) + 1
                continue
            tier, score = tier_score
            repeats = failures[strategy_of[cand.item_id]] if cand.kind == "pitfall" else 0
            if repeats > 1:
                score = round(score * min(2.0, 1.0 + 0.25 * (repeats - 1)), 4)
                cand.reasons.append(f"{repeats} failures with this strategy")
            if by:
                cand.reasons.append(f"by {by}")
            if wanted and agent_mode == "prefer" and wanted in by.lower():
                score = round(score * PREFERRED_AGENT_BOOST, 4)
                cand.reasons.append("preferred agent")
            text = render_item(cand, state.task_id)
            scored[cand.item_id] = (Scored(cand.item_id, score, text, estimate_tokens(text), word_set(text)),
                                    cand, tier)
        hot_tokens = estimate_tokens(hot_section(hot)) + 1 if hot else 0
        chosen: list[tuple[Scored, Candidate, str]] = []
        if hot_tokens > token_budget:
            warnings.append(f"the budget ({token_budget} tokens) is below the hot tier ({hot_tokens}); "
                            "returned the hot tier truncated and nothing else")
            hot = _truncate_hot(hot, token_budget)
            dropped["budget"] = dropped.get("budget", 0) + len(scored)
        else:
            remaining = token_budget - hot_tokens
            for tier, cap, share in (("warm", WARM_MAX_ITEMS, WARM_SHARE), ("cold", COLD_MAX_ITEMS, 1.0)):
                ranked = sorted((s for s, _, t in scored.values() if t == tier), key=lambda s: (-s.score, s.item_id))
                # MMR reaches a few times the cap at most: pairwise similarity for the best MMR_POOL_PER_ITEM * cap
                # only (the whole pool was O(n^2): ~20 ms a query at 50k lessons).
                pool, beyond = ranked[:MMR_POOL_PER_ITEM * cap], ranked[MMR_POOL_PER_ITEM * cap:]
                sim = similarity_matrix(pool, [self.memory.vectors.vector(s.item_id) for s in pool])
                # Look at a few times the cap so packing can still skip items that do not fit.
                ordered, duplicates, rest = mmr_order(pool, sim, limit=3 * cap)
                rest += beyond
                dropped["near_duplicate"] = dropped.get("near_duplicate", 0) + len(duplicates)
                pitfalls: set[str] = set()
                if tier == "warm":
                    # Pitfalls rank below wins, so they may lie beyond MMR's horizon; coverage still reaches them.
                    pitfalls = {s.item_id for s in pool if scored[s.item_id][1].kind == "pitfall"}
                    ordered += [s for s in rest if s.item_id in pitfalls]
                    rest = [s for s in rest if s.item_id not in pitfalls]
                ordered, capped = cover(ordered, strategy_of, pitfalls)
                dropped["same_strategy"] = dropped.get("same_strategy", 0) + len(capped)
                budget = int(remaining * share) if tier == "warm" else remaining
                taken, skipped = pack(ordered, budget, cap)
                remaining -= sum(s.tokens for s in taken)
                dropped["budget_or_cap"] = dropped.get("budget_or_cap", 0) + len(skipped) + len(rest)
                chosen += [(s, scored[s.item_id][1], tier) for s in taken]
            self._add_diffs(chosen, state.task_id, remaining - SECTION_HEADER_RESERVE)
        context, items, used = render_context(hot, chosen, token_budget)
        semantic = self.memory.semantic_ready
        if not semantic:
            warnings.append(f"semantic search not available ({self.memory.semantic_status}); "
                            "selected by graph filters and BM25 only")
        return QueryResult(
            context=context, items=items, tokens_used=used, token_budget=token_budget, phase=state.phase,
            candidates=len(candidates), dropped=sum(dropped.values()),
            dropped_reasons={k: v for k, v in dropped.items() if v}, semantic_search=semantic,
            semantic_status=self.memory.semantic_status, warnings=warnings,
        )

    def history(self) -> str:
        """Every measured or failed attempt and every lesson, oldest first, one line each: the whole memory as
        an agent that keeps its own transcript would paste it (the baseline active selection is measured
        against)."""
        lines = ["# Every recorded attempt and lesson, oldest first"]
        for rec in sorted(self.store.all_attempts(), key=lambda r: r.created_at):
            kind: Kind = "case" if rec.speedup is not None else "pitfall"
            if rec.speedup is None and rec.ok and rec.correct is not False:
                continue  # compiled, never measured: nothing learned yet
            lines.append(render_item(Candidate(kind=kind, item_id=rec.kernel_id, attempt=rec), None))
        for lesson in sorted(self.store.all_lessons(), key=lambda x: x.created_at):
            lines.append(render_item(Candidate(kind="lesson", item_id=lesson.lesson_id, lesson=lesson), None))
        return "\n".join(lines) + "\n"

    def _add_diffs(self, chosen: list[tuple[Scored, Candidate, str]], task_id: str | None, spare: int) -> None:
        """Give the best chosen cases and fixes their before/after diff while the spare budget allows."""
        for scored, cand, _ in sorted(chosen, key=lambda item: -item[0].score):
            if not has_diff(cand) or spare <= 0:
                continue
            text = render_item(cand, task_id, with_diff=True)
            extra = estimate_tokens(text) - scored.tokens
            if 0 < extra <= spare:
                scored.text, scored.tokens = text, scored.tokens + extra
                spare -= extra

    def _state(self, task_id: str | None, session_id: str | None, phase: Phase | None,
               hardware: str | None, backend: str | None = None) -> QueryState:
        latest = incumbent = None
        if session_id:
            session = self.store.session(session_id)
            task_id = task_id or session.task_id
            latest = self.memory.latest_in_session(session_id)
            found = self.memory.attempts_by_id([session.incumbent_id]) if session.incumbent_id else []
            incumbent = found[0] if found else None
        family = self.tasks.get(task_id).spec.family if task_id else None
        inferred: Phase = "start"
        if latest is not None:
            inferred = ("compile_error" if not latest.ok else
                        "incorrect" if latest.tested and not latest.correct else "optimize")
        signature = latest.error_signature if latest is not None and inferred != "optimize" else None
        target = backend or (latest.target if latest is not None else None)
        target_key = None
        if backend is not None:
            target_key = self.target_hardware(backend)  # refuses an unknown name, even when `hardware` is given
        elif target:
            with contextlib.suppress(UnknownBackendError):  # recorded on a backend this server does not have
                target_key = self.target_hardware(target)
        hardware = hardware or target_key or detect_hardware().key
        return QueryState(phase=phase or inferred, task_id=task_id, family=family, hardware_key=hardware,
                          target=target, signature=signature, latest=latest, incumbent=incumbent)

    def _gather(self, query: str, state: QueryState) -> dict[str, Candidate]:
        found: dict[str, Candidate] = {}
        attempts: dict[str, AttemptRecord] = {}
        reasons: dict[str, list[str]] = {}

        def add_attempts(records: list[AttemptRecord], reason: str) -> None:
            for rec in records:
                attempts[rec.kernel_id] = rec
                reasons.setdefault(rec.kernel_id, []).append(reason)

        limit = CANDIDATES_PER_SOURCE
        if state.task_id:
            add_attempts(self.memory.attempts_for_task(state.task_id, limit), "same task")
        if state.family:
            add_attempts(self.memory.attempts_for_family(state.family, state.task_id, limit), "same family")
        if state.signature:
            add_attempts(self.memory.attempts_with_signature(state.signature, limit), "same error signature")
        add_attempts(self.memory.best_attempts(limit // 2), "effective elsewhere")
        lessons: dict[str, LessonRecord] = {}
        for lesson in self.memory.scoped_lessons(state.task_id, state.family, state.hardware_key, limit):
            lessons[lesson.lesson_id] = lesson
            reasons.setdefault(lesson.lesson_id, []).append("scope match")
        # Not the task id: every lesson naming the task would match it, and the task's lessons are candidates
        # by scope already; BM25 is for the words of the question.
        text_query = " ".join(p for p in (query, state.signature) if p)
        hits = self.store.full_text(text_query, FULL_TEXT_HITS) if text_query.strip() else []
        hits.sort(key=lambda h: (-h[2], h[1]))  # equal scores in id order, not in the order rows were inserted
        top_bm25 = max((score for _, _, score in hits), default=1.0) or 1.0
        bm25 = {item_id: score / top_bm25 for kind, item_id, score in hits if kind == "lesson"}
        # A strategy that matches the query lends its score to the attempts that applied it.
        for _, strategy_id, score in sorted((h for h in hits if h[0] == "strategy"), key=lambda h: -h[2])[:5]:
            for rec in self.memory.attempts_for_strategy(strategy_id, STRATEGY_MATCH_ATTEMPTS):
                attempts.setdefault(rec.kernel_id, rec)
                reasons.setdefault(rec.kernel_id, []).append("strategy matches the query")
                bm25[rec.kernel_id] = max(bm25.get(rec.kernel_id, 0.0), score / top_bm25)
        cosine: dict[str, float] = {}
        vectors = self.memory.embedder.embed([text_query]) if text_query.strip() and self.memory.semantic_ready \
            else None
        if vectors:
            cosine = {item_id: score for item_id, kind, score in self.memory.vectors.search(vectors[0], 50)
                      if kind in ("attempt", "lesson")}
        extra = [i for i in dict.fromkeys([*bm25, *cosine]) if i not in attempts and i not in lessons]
        if extra:
            add_attempts(self.memory.attempts_by_id([i for i in extra if i.startswith("k-")]), "text match")
            lesson_ids = [i for i in extra if i.startswith("x-")]
            for lesson in self.memory.lessons_by_id(lesson_ids):
                lessons[lesson.lesson_id] = lesson
                reasons.setdefault(lesson.lesson_id, []).append("text match")
        # Fixes matter for failures like the current one: same error signature first, then the same task.
        failing = sorted((a for a in attempts.values() if not a.ok or a.correct is False),
                         key=lambda a: (a.error_signature != state.signature, a.task_id != state.task_id))
        fixes = self.memory.fixes_of(failing[:MAX_FIX_LOOKUPS]) if failing else {}
        latest_id = state.latest.kernel_id if state.latest is not None else None
        for kid, rec in attempts.items():
            if kid == latest_id:
                continue  # already in the hot tier as the latest feedback
            if kid in fixes:
                kind: Kind = "fix"
            elif not rec.ok or rec.correct is False or rec.label in ("negative", "ineffective"):
                kind = "pitfall"
            elif rec.label in ("effective", "partial") and not rec.suspect:
                kind = "case"  # a suspect measurement is never offered as what worked
            else:
                continue  # compiled but never measured: nothing to learn from yet
            found[kid] = Candidate(kind=kind, item_id=kid, attempt=rec, fix=fixes.get(kid),
                                   bm25=bm25.get(kid, 0.0), cosine=cosine.get(kid, 0.0),
                                   reasons=reasons.get(kid, []))
        for lid, lesson in lessons.items():
            found[lid] = Candidate(kind="lesson", item_id=lid, lesson=lesson, bm25=bm25.get(lid, 0.0),
                                   cosine=cosine.get(lid, 0.0), reasons=reasons.get(lid, []))
        return found

    def _score(self, cand: Candidate, state: QueryState) -> tuple[str, float] | None:
        rec, lesson = cand.attempt, cand.lesson
        task_id = rec.task_id if rec else (lesson.task_id if lesson else None)
        family = rec.family if rec else (lesson.family if lesson else None)
        hw = rec.hardware_key if rec else (lesson.hardware_key if lesson else None)
        target = rec.target if rec else (lesson.target if lesson else None)
        # Another backend's experience on the same family still carries the algorithm, not the code.
        other_target = bool(state.target and target and target != state.target)
        same_task = bool(task_id and task_id == state.task_id)
        same_family = bool(family and family == state.family)
        hw_rank = hardware_rank(hw, state.hardware_key)
        same_hw = hw_rank == 3
        same_sig = bool(rec and state.signature and rec.error_signature == state.signature)
        relevance = 0.1 + 0.4 * cand.bm25 + 0.5 * max(0.0, cand.cosine)
        relevance += 0.6 if same_task else 0.3 if same_family else 0.0
        relevance += 1.0 if same_sig else 0.0
        if cand.kind == "case" and rec is not None:
            quality = LABEL_PRIOR[rec.label] * (0.5 + min(rec.downstream, 3.0) / 3.0) * max(rec.confidence, 0.1)
        elif cand.kind == "fix":
            quality = 0.8
        elif cand.kind == "pitfall" and rec is not None:
            # A kernel that broke is the pitfall worth a line; "slower" is measured, "no gain" says least.
            broken = not rec.ok or rec.correct is False
            quality = 0.6 if broken else (0.45 if rec.label == "negative" else 0.3) * rec.confidence
        elif lesson is not None and fixes_the_error(lesson, cand, state):
            quality = FIX_QUALITY
        elif lesson is not None:
            measured = lesson.verified or lesson.speedup is not None
            quality = (LABEL_PRIOR.get(lesson.label, 0.5) if measured else LABEL_PRIOR["lesson"]) * \
                max(lesson.confidence, 0.1)
            if lesson.label in ("effective", "partial") and lesson.speedup is not None:
                quality *= 2 * gain_factor(lesson.speedup)  # a 6x win says more than a 1.02x tweak
        else:
            return None
        fix_like = cand.kind == "fix" or (lesson is not None and quality == FIX_QUALITY)
        multiplier = _PHASE_WEIGHTS[state.phase]["fix" if fix_like else cand.kind]
        if (same_sig or fix_like) and cand.kind in ("fix", "pitfall", "lesson"):
            multiplier *= 2.0
        multiplier *= HARDWARE_WEIGHT[hw_rank]
        if other_target:
            multiplier *= 0.5
        score = round(relevance * quality * multiplier, 4)
        local = (same_task or same_family or same_sig or fix_like or (cand.kind == "lesson" and task_id is None))
        tier = "warm" if local and same_hw and not other_target else "cold"
        why = list(dict.fromkeys(cand.reasons))
        flags = (("same hardware", same_hw and hw is not None), ("other hardware", 0 < hw_rank < 3),
                 ("another kind of hardware", hw_rank == 0), ("fixes this error", fix_like),
                 (f"other backend ({target})", other_target),
                 (f"BM25 {cand.bm25:.2f}", cand.bm25 > 0), (f"cosine {cand.cosine:.2f}", cand.cosine > 0),
                 )
        why += [w for w, on in flags if on]
        if rec is not None and cand.kind == "case":
            why.append(f"label {rec.label}, downstream {rec.downstream:.2f}, confidence {rec.confidence:.2f}")
        cand.reasons = why
        return tier, score

    def _hot_items(self, state: QueryState) -> list[tuple[str, str, str]]:
        """(kind, id, text) of what the state requires: target, incumbent, latest feedback."""
        hot: list[tuple[str, str, str]] = []
        if state.task_id:
            spec = self.tasks.get(state.task_id).spec
            backend = f", backend {state.target}" if state.target else ""
            hot.append(("target", state.task_id, f"Target: `{spec.id}` ({spec.family}, level {spec.level}): "
                        f"{spec.summary}. Hardware {state.hardware_key}{backend}. Phase: {state.phase}."))
        if state.incumbent is not None:
            inc = state.incumbent
            hot.append(("incumbent", inc.kernel_id, f"Incumbent: {inc.kernel_id}, {inc.speedup:.2f}x vs the naive "
                        f"baseline ({inc.strategy or 'no strategy recorded'}; flags {' '.join(inc.flags) or '-'})."))
        if state.latest is not None:
            hot.append(("feedback", state.latest.kernel_id, _feedback(state.latest)))
        return hot


_PHASE_WEIGHTS: dict[str, dict[str, float]] = {
    "start": {"case": 1.5, "fix": 0.5, "pitfall": 1.0, "lesson": 1.0},
    "compile_error": {"case": 0.5, "fix": 3.0, "pitfall": 1.0, "lesson": 0.8},
    "incorrect": {"case": 0.6, "fix": 2.5, "pitfall": 1.5, "lesson": 1.0},
    "optimize": {"case": 1.5, "fix": 0.4, "pitfall": 1.2, "lesson": 1.0},
}


def fixes_the_error(lesson: LessonRecord, cand: Candidate, state: QueryState) -> bool:
    """A lesson recorded about a failure, asked about a failure, whose words match the question: the account of
    how that error was mended, whatever task or family it came from."""
    return (state.phase in ("compile_error", "incorrect") and lesson.label in ("compile_error", "incorrect")
            and max(cand.bm25, cand.cosine) >= FIX_TEXT_MATCH)


def _feedback(latest: AttemptRecord) -> str:
    if not latest.ok:
        first = latest.diagnostics_digest.splitlines()[0] if latest.diagnostics_digest else "see the log"
        return f"Latest: {latest.kernel_id} did not compile: {first}"
    if latest.tested and not latest.correct:
        return f"Latest: {latest.kernel_id} failed its tests ({latest.failure}): {latest.failure_message[:300]}"
    if latest.speedup is not None:
        return (f"Latest: {latest.kernel_id} correct, {latest.speedup:.2f}x vs naive (step ratio "
                f"{latest.step_ratio:.2f}, {latest.label}).")
    if latest.tested:
        return f"Latest: {latest.kernel_id} passed its tests; not profiled yet."
    return f"Latest: {latest.kernel_id} compiled; not tested yet (call run_tests)."


def _truncate_hot(hot: list[tuple[str, str, str]], budget: int) -> list[tuple[str, str, str]]:
    out, left = [], budget - 4  # room for the section header
    for kind, item_id, text in hot:
        if left <= 0:
            break
        text = truncate_to_tokens(text, left)
        out.append((kind, item_id, text))
        left -= estimate_tokens(text)
    return out


def _agent_of(cand: Candidate) -> str:
    """Who produced an item: the client name, version and label recorded with it ('' when unknown)."""
    if cand.attempt is not None:
        return cand.attempt.agent
    return cand.lesson.agent if cand.lesson is not None else ""


def _strategy_of(cand: Candidate) -> str | None:
    """The canonical strategy an item is about (synonyms merged), for the per-strategy cap."""
    name = cand.attempt.strategy if cand.attempt is not None else cand.lesson.strategy if cand.lesson else None
    return strategy_key(name) if name else None
