"""record_experience and query_experience: the agent's account of a step, and active context selection."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Literal

from kope_mcp.errors import MAX_STRATEGY_CHARS, MAX_TEXT_CHARS, KopeError, UnknownBackendError, check_length
from kope_mcp.experience.candidates import Candidate, Kind, QueryState, gather, pasted_signature
from kope_mcp.experience.config import PRESETS, SelectionConfig
from kope_mcp.experience.render import (
    Chosen,
    HotItem,
    attempt_data,
    has_diff,
    hot_section,
    item_data,
    render_context,
    render_item,
)
from kope_mcp.experience.scoring import score as score_candidate
from kope_mcp.experience.selection import (
    Scored,
    cover,
    mmr_order,
    pack,
    similarity_matrix,
    word_set,
)
from kope_mcp.experience.tokens import count_tokens, token_counter, truncate_to_tokens
from kope_mcp.hardware import detect_hardware
from kope_mcp.memory.experience_memory import ExperienceMemory, new_id, now
from kope_mcp.memory.outcome import UNVERIFIED_CONFIDENCE
from kope_mcp.memory.records import AgentInfo, AttemptRecord, LessonRecord
from kope_mcp.memory.strategies import strategy_key
from kope_mcp.models import ContextItem, MemoryHistory, Phase, QueryResult, RecordResult
from kope_mcp.tasks.registry import TaskRegistry

MAX_QUERY_CHARS = 2000
# A question asked while the read index is rebuilt (after a crash: seconds at 50k lessons) waits for it rather than
# answer from bounded scans: the same memory must give the same answer.
INDEX_WAIT_S = 30.0
SECTION_HEADER_RESERVE = 60  # tokens kept free for the markdown headers when adding diffs


class EmptyLessonError(KopeError):
    code = "empty_lesson"


class ExperienceService:
    def __init__(self, memory: ExperienceMemory, tasks: TaskRegistry,
                 target_hardware: Callable[[str], str | None] | None = None,
                 config: SelectionConfig | None = None) -> None:
        self.memory = memory
        self.config = config or PRESETS["evidence"]
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
        attempt = self.memory.attempt(kernel_id) if kernel_id else None
        about_agent = ""
        if attempt is None and session_id:
            task_id = task_id or self.memory.session(session_id).task_id
        if task_id:
            self.memory.ensure_task(self.tasks.get(task_id))
        canonical = self.memory.canonical_strategy(strategy)
        if attempt is not None:
            task_id = attempt.task_id
            if not attempt.strategy_id:
                self.memory.name_strategy(attempt.kernel_id, canonical, strategy)
            # The outcome is the measurement's, whatever the caller believes.
            measured = attempt.speedup is not None or attempt.tested or not attempt.ok
            confidence = attempt.confidence if attempt.speedup is not None else (0.8 if measured else 0.5)
            label, verified = attempt.label, measured
            if attempt.speedup is not None and not attempt.teaches:
                # A lesson cannot launder a suspect or noisy measurement into a verified outcome.
                label, verified, confidence = "lesson", False, UNVERIFIED_CONFIDENCE
            elif attempt.origin:
                # Measured in another home: the words may be right, but nothing here verified them.
                label, verified, confidence = "lesson", False, min(confidence, UNVERIFIED_CONFIDENCE)
            measurer = self.memory.session(attempt.session_id)
            if session_id != attempt.session_id:
                # Only the session's own id (the server gave it to the client that started the session, and to
                # no one else) vouches for its measurements: a client's self-description (its clientInfo, a
                # label) is anyone's to copy. Other words about this measurement are their writer's claim; the
                # label stays the measurement's, the verification does not travel.
                about_agent = measurer.agent.display or "another agent"
                label, verified, confidence = "lesson", False, min(confidence, UNVERIFIED_CONFIDENCE)
        else:
            label, verified, confidence = "lesson", False, UNVERIFIED_CONFIDENCE
        family = self.tasks.get(task_id).spec.family if task_id else None
        record = LessonRecord(
            lesson_id=new_id("x"), text=lesson.strip(), strategy=canonical.name,
            strategy_id=canonical.strategy_id, opt_layer=opt_layer, rationale=rationale or "",
            task_id=task_id, family=family,
            hardware_key=attempt.hardware_key if attempt else (hardware or None),
            target=attempt.target if attempt else None,
            attempt_id=attempt.kernel_id if attempt else None, verified=verified, label=label,
            step_ratio=attempt.step_ratio if attempt else None, speedup=attempt.speedup if attempt else None,
            confidence=confidence, agent=(agent or AgentInfo()).display, created_at=now(), about_agent=about_agent,
        )
        text = " ".join(p for p in (task_id, family, canonical.name, opt_layer, record.text, rationale) if p)
        self.memory.add_lesson(record, text)
        return RecordResult(
            experience_id=record.lesson_id, attempt_id=record.attempt_id, label=label, verified=verified,
            confidence=confidence, strategy=canonical.name, strategy_id=canonical.strategy_id,
            step_ratio=record.step_ratio, speedup=record.speedup,
            measured=attempt is not None and attempt.speedup is not None and attempt.teaches and not attempt.origin,
            about_agent=about_agent or None,
            next_step=("recorded as your claim about the attempt of " + about_agent + ": its measurement stays "
                       "that session's; pass the attempt's session_id if it is yours. " if about_agent else "")
            + "call query_experience before your next attempt to get the most relevant experience",
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
        if self.memory.index_loading and not self.memory.wait_index(timeout=INDEX_WAIT_S):
            warnings.append("the memory's index is still loading: candidates come from bounded scans this time")
        state = self._state(task_id, session_id, phase, hardware, backend, query=query)
        candidates = gather(self.memory, query, state, self.config)
        hot = self._hot_items(state)
        scored: dict[str, Chosen] = {}
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
            tier_score = score_candidate(cand, state, self.config)
            if tier_score is None:
                dropped["no_measured_value"] = dropped.get("no_measured_value", 0) + 1
                continue
            tier, score = tier_score
            repeats = failures[strategy_of[cand.item_id]] if cand.kind == "pitfall" else 0
            if repeats > 1:
                boost = 1.0 + self.config.repeated_failure_step * (repeats - 1)
                score = round(score * min(self.config.repeated_failure_cap, boost), 4)
                cand.reasons.append(f"{repeats} failures with this strategy")
            if by:
                cand.reasons.append(f"by {by}")
            if wanted and agent_mode == "prefer" and wanted in by.lower():
                score = round(score * self.config.preferred_agent_boost, 4)
                cand.reasons.append("preferred agent")
            text = render_item(cand, state.task_id, hardware=state.hardware_key)
            scored[cand.item_id] = Chosen(Scored(cand.item_id, score, text, count_tokens(text), word_set(text)),
                                          cand, tier)
        hot_tokens = count_tokens(hot_section(hot)) + 1 if hot else 0
        chosen: list[Chosen] = []
        if hot_tokens > token_budget:
            warnings.append(f"the budget ({token_budget} tokens) is below the hot tier ({hot_tokens}); "
                            "returned the hot tier truncated and nothing else")
            hot = _truncate_hot(hot, token_budget)
            dropped["budget"] = dropped.get("budget", 0) + len(scored)
        else:
            remaining = token_budget - hot_tokens
            config = self.config
            for tier, cap, share in (("warm", config.warm_max_items, config.warm_share),
                                     ("cold", config.cold_max_items, 1.0)):
                if tier == "cold" and config.cold_takes_unused_warm:
                    # A home made of imports (or of other hardware) has little warm evidence: the slots the warm
                    # tier left are the cold tier's, so the budget is still filled.
                    cap += max(0, config.warm_max_items - len(chosen))
                ranked = sorted((s for s, _, t in scored.values() if t == tier), key=lambda s: (-s.score, s.item_id))
                # MMR reaches a few times the cap at most: pairwise similarity for the best mmr_pool_per_item * cap
                # only (the whole pool was O(n^2): ~20 ms a query at 50k lessons).
                reach = self.config.mmr_pool_per_item * cap
                pool, beyond = ranked[:reach], ranked[reach:]
                sim = similarity_matrix(pool, [self.memory.vector(s.item_id) for s in pool])
                ordered, duplicates, rest = mmr_order(pool, sim, limit=config.mmr_picks_per_item * cap,
                                                      relevance_weight=config.mmr_lambda,
                                                      near_duplicate=config.near_duplicate)
                rest += beyond
                dropped["near_duplicate"] = dropped.get("near_duplicate", 0) + len(duplicates)
                pitfalls: set[str] = set()
                if tier == "warm":
                    # Pitfalls rank below wins, so they may lie beyond MMR's horizon; coverage still reaches them.
                    pitfalls = {s.item_id for s in pool if scored[s.item_id].candidate.kind == "pitfall"}
                    ordered += [s for s in rest if s.item_id in pitfalls]
                    rest = [s for s in rest if s.item_id not in pitfalls]
                ordered, capped = cover(ordered, strategy_of, pitfalls, pitfall_min=config.pitfall_min_items,
                                        per_strategy=config.strategy_max_items)
                dropped["same_strategy"] = dropped.get("same_strategy", 0) + len(capped)
                budget = int(remaining * share) if tier == "warm" else remaining
                taken, skipped = pack(ordered, budget, cap)
                remaining -= sum(s.tokens for s in taken)
                dropped["budget_or_cap"] = dropped.get("budget_or_cap", 0) + len(skipped) + len(rest)
                chosen += [Chosen(s, scored[s.item_id].candidate, tier) for s in taken]
            self._add_diffs(chosen, state.task_id, remaining - SECTION_HEADER_RESERVE, state.hardware_key)
        context, items, used = render_context(hot, chosen, token_budget)
        semantic = self.memory.semantic_ready
        if not semantic:
            warnings.append(f"semantic search not available ({self.memory.semantic_status}); "
                            "selected by graph filters and BM25 only")
        return QueryResult(
            context=context, items=items, tokens_used=used, token_budget=token_budget,
            token_encoding=token_counter().encoding, phase=state.phase,
            candidates=len(candidates), dropped=sum(dropped.values()),
            dropped_reasons={k: v for k, v in dropped.items() if v}, semantic_search=semantic,
            semantic_status=self.memory.semantic_status, warnings=warnings,
        )

    def history(self) -> MemoryHistory:
        """Every measured or failed attempt and every lesson, oldest first, one line each: the whole memory as
        an agent that keeps its own transcript would paste it (the baseline active selection is measured
        against), with the data behind each line."""
        # Chronological, each lesson right after the attempt it is about: what a transcript of the work would
        # hold, so what a window's truncation keeps is the most recent work (attempts first and lessons after
        # made a bounded reader keep only lessons, whatever their age).
        keyed: list[tuple[tuple[str, int, str], str, Candidate]] = []
        attempt_times: dict[str, str] = {}
        for rec in self.memory.all_attempts():
            attempt_times[rec.kernel_id] = rec.created_at
            kind: Kind = "case" if rec.speedup is not None else "pitfall"
            if rec.speedup is None and rec.ok and rec.correct is not False:
                continue  # compiled, never measured: nothing learned yet
            cand = Candidate(kind=kind, item_id=rec.kernel_id, attempt=rec)
            keyed.append(((rec.created_at, 0, rec.kernel_id), render_item(cand, None), cand))
        for lesson in self.memory.all_lessons():
            cand = Candidate(kind="lesson", item_id=lesson.lesson_id, lesson=lesson)
            when = attempt_times.get(lesson.attempt_id or "", lesson.created_at)
            keyed.append(((when, 1, lesson.created_at + lesson.lesson_id), render_item(cand, None), cand))
        lines = [(line, cand) for _, line, cand in sorted(keyed, key=lambda entry: entry[0])]
        text = "# Every recorded attempt and lesson, oldest first"
        items: list[ContextItem] = []
        for line, cand in lines:
            text += "\n"
            items.append(ContextItem(id=cand.item_id, tier="history", kind=cand.kind, score=0.0,
                                     tokens=count_tokens(line), span=(len(text), len(text) + len(line)),
                                     why="the whole memory, oldest first", **item_data(cand)))
            text += line
        text += "\n"
        return MemoryHistory(context=text, items=items, tokens=count_tokens(text),
                             token_encoding=token_counter().encoding)

    def _add_diffs(self, chosen: list[Chosen], task_id: str | None, spare: int,
                   hardware: str | None = None) -> None:
        """Give the best chosen cases and fixes their before/after diff while the spare budget allows."""
        for scored, cand, _ in sorted(chosen, key=lambda item: -item.scored.score):
            if not has_diff(cand) or spare <= 0:
                continue
            text = render_item(cand, task_id, with_diff=True, hardware=hardware)
            extra = count_tokens(text) - scored.tokens
            if 0 < extra <= spare:
                scored.text, scored.tokens = text, scored.tokens + extra
                spare -= extra

    def _state(self, task_id: str | None, session_id: str | None, phase: Phase | None,
               hardware: str | None, backend: str | None = None, query: str = "") -> QueryState:
        latest = incumbent = None
        if session_id:
            session = self.memory.session(session_id)
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
        pasted = False
        if signature is None and phase in (None, "compile_error"):
            # An error pasted into the question: its fix recorded on any task, in any family, is what transfers.
            signature = pasted_signature(query)
            pasted = signature is not None
            if pasted and latest is None:
                inferred = "compile_error"
        target = backend or (latest.target if latest is not None else None)
        target_key = None
        if backend is not None:
            target_key = self.target_hardware(backend)  # refuses an unknown name, even when `hardware` is given
        elif target:
            with contextlib.suppress(UnknownBackendError):  # recorded on a backend this server does not have
                target_key = self.target_hardware(target)
        hardware = hardware or target_key or detect_hardware().key
        return QueryState(phase=phase or inferred, task_id=task_id, family=family, hardware_key=hardware,
                          target=target, signature=signature, latest=latest, incumbent=incumbent,
                          signature_pasted=pasted)

    def _hot_items(self, state: QueryState) -> list[HotItem]:
        """What the state requires: target, incumbent, latest feedback."""
        hot: list[HotItem] = []
        if state.task_id:
            spec = self.tasks.get(state.task_id).spec
            backend = f", backend {state.target}" if state.target else ""
            hot.append(HotItem("target", state.task_id, f"Target: `{spec.id}` ({spec.family}, level {spec.level}): "
                               f"{spec.summary}. Hardware {state.hardware_key}{backend}. Phase: {state.phase}.",
                               {"task_id": spec.id, "family": spec.family, "hardware": state.hardware_key,
                                "target": state.target}))
        if state.incumbent is not None:
            inc = state.incumbent
            hot.append(HotItem("incumbent", inc.kernel_id, f"Incumbent: {inc.kernel_id}{_elsewhere(inc)}, "
                               f"{inc.speedup:.2f}x vs the naive baseline ({inc.strategy or 'no strategy recorded'};"
                               f" flags {' '.join(inc.flags) or '-'}).", attempt_data(inc)))
        if state.latest is not None:
            hot.append(HotItem("feedback", state.latest.kernel_id, _feedback(state.latest),
                               attempt_data(state.latest)))
        return hot


def _elsewhere(record: AttemptRecord) -> str:
    """Every tier marks what was measured in another home: its numbers are that home's, untested here."""
    return f" (imported from {record.origin}, measured there, untested here)" if record.origin else ""


def _feedback(latest: AttemptRecord) -> str:
    who = latest.kernel_id + _elsewhere(latest)
    if not latest.ok:
        first = latest.diagnostics_digest.splitlines()[0] if latest.diagnostics_digest else "see the log"
        return f"Latest: {who} did not compile: {first}"
    if latest.tested and not latest.correct:
        return f"Latest: {who} failed its tests ({latest.failure}): {latest.failure_message[:300]}"
    if latest.speedup is not None:
        return (f"Latest: {who} correct, {latest.speedup:.2f}x vs naive (step ratio "
                f"{latest.step_ratio:.2f}, {latest.label}).")
    if latest.tested:
        return f"Latest: {who} passed its tests; not profiled yet."
    return f"Latest: {who} compiled; not tested yet (call run_tests)."


def _truncate_hot(hot: list[HotItem], budget: int) -> list[HotItem]:
    out, left = [], budget - 4  # room for the section header
    for item in hot:
        if left <= 0:
            break
        text = truncate_to_tokens(item.text, left)
        out.append(item._replace(text=text))
        left -= count_tokens(text)
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
