"""Scores for query_experience's candidates (the second stage of the selection pipeline): relevance to the
question and the state, times what was measured, times the phase's and the hardware's weight."""

from __future__ import annotations

from kope_mcp.experience.candidates import Candidate, QueryState
from kope_mcp.experience.config import SelectionConfig
from kope_mcp.hardware import hardware_rank
from kope_mcp.memory.outcome import gain_factor
from kope_mcp.memory.records import LessonRecord


def score(cand: Candidate, state: QueryState, config: SelectionConfig) -> tuple[str, float] | None:
    """(tier, score) of a candidate: relevance (words, scope, error) x quality (measured outcome) x the phase's
    weight and the hardware's; None for what has nothing measured to teach."""
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
    relevance = config.base_relevance + config.bm25_weight * cand.bm25 + config.cosine_weight * max(0.0, cand.cosine)
    relevance += config.same_task_bonus if same_task else config.same_family_bonus if same_family else 0.0
    relevance += config.same_signature_bonus if same_sig else 0.0
    if cand.kind == "case" and rec is not None:
        credit = min(rec.downstream, config.downstream_cap) / config.downstream_cap
        quality = config.label_prior[rec.label] * (config.downstream_floor + credit) * \
            max(rec.confidence, config.min_confidence)
    elif cand.kind == "fix":
        quality = config.fix_quality
    elif cand.kind == "pitfall" and rec is not None:
        broken = not rec.ok or rec.correct is False
        weights = config.pitfall_quality
        quality = weights["broken"] if broken else \
            weights["negative" if rec.label == "negative" else "ineffective"] * rec.confidence
    elif lesson is not None and fixes_the_error(lesson, cand, state, config):
        quality = config.fix_quality
    elif lesson is not None:
        measured = lesson.verified or lesson.speedup is not None
        prior = config.label_prior
        quality = (prior.get(lesson.label, prior["lesson"]) if measured else prior["lesson"]) * \
            max(lesson.confidence, config.min_confidence)
        if config.lesson_gain and lesson.label in ("effective", "partial") and lesson.speedup is not None:
            quality *= config.lesson_gain_scale * gain_factor(lesson.speedup)  # 6x says more than 1.02x
    else:
        return None
    fix_like = cand.kind == "fix" or (lesson is not None and quality == config.fix_quality)
    multiplier = config.phase_weights[state.phase]["fix" if fix_like else cand.kind]
    if (same_sig or fix_like) and cand.kind in ("fix", "pitfall", "lesson"):
        multiplier *= config.error_match_multiplier
    multiplier *= config.hardware_weight[hw_rank]
    if other_target:
        multiplier *= config.other_target_weight
    # Measured in another home (or written there): evidence from elsewhere, never "what worked here".
    imported = bool((rec is not None and rec.origin) or (lesson is not None and lesson.origin))
    if imported:
        multiplier *= config.imported_weight
    score = round(relevance * quality * multiplier, 4)
    local = (same_task or same_family or same_sig or fix_like or (cand.kind == "lesson" and task_id is None))
    tier = "warm" if local and same_hw and not other_target and not imported else "cold"
    why = list(dict.fromkeys(cand.reasons))
    flags = (("same hardware", same_hw and hw is not None), ("other hardware", 0 < hw_rank < 3),
             ("another kind of hardware", hw_rank == 0), ("fixes this error", fix_like),
             (f"other backend ({target})", other_target), ("imported from another home", imported),
             (f"BM25 {cand.bm25:.2f}", cand.bm25 > 0), (f"cosine {cand.cosine:.2f}", cand.cosine > 0),
             )
    why += [w for w, on in flags if on]
    if rec is not None and cand.kind == "case":
        why.append(f"label {rec.label}, downstream {rec.downstream:.2f}, confidence {rec.confidence:.2f}")
    cand.reasons = why
    return tier, score


def fixes_the_error(lesson: LessonRecord, cand: Candidate, state: QueryState, config: SelectionConfig) -> bool:
    """A lesson recorded about a failure, asked about a failure, whose words match the question or whose attempt
    failed with the same error signature: the account of how that error was mended, whatever task or family it
    came from."""
    return (state.phase in ("compile_error", "incorrect") and lesson.label in ("compile_error", "incorrect")
            and (max(cand.bm25, cand.cosine) >= config.fix_text_match
                 or cand.about_same_error))
