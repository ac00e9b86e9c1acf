"""Every weight, cap and threshold of query_experience's active selection in one object, with named presets.

The pipeline is candidates -> scores -> selection -> rendering (experience/candidates.py, experience/scoring.py,
experience/service.py with experience/selection.py's maths, experience/render.py); each stage reads its knobs
from a ``SelectionConfig`` and has none of its own, so a benchmark compares configurations without editing code:
``KOPE_SELECTION=recency`` (a preset name) or ``KOPE_SELECTION=/path/to/config.json`` (any fields; the rest from
the default).

Caps (the paper gives no values; these are ours, and why):
- the hot tier (target, incumbent, latest feedback) always goes first: without it the agent does not know
  where it stands;
- the warm tier (this task or family, this hardware, this error) gets at most ``warm_share`` (70%) of what is left
  after the hot tier and at most ``warm_max_items`` (12): beyond that the marginal item repeats what the first
  ones said;
- the cold tier (other families, other hardware, other homes) gets the rest, at most ``cold_max_items`` (6) plus
  the warm tier's unused slots (``cold_takes_unused_warm``): it is there for feasibility ("this worked
  elsewhere"), not as the main evidence, but where there is no warm evidence (a home made of imports answered
  with 6 items, 529 tokens of 4,000) it is all there is;
- MMR with ``mmr_lambda`` 0.7 keeps relevance first but drops an item whose text is >= ``near_duplicate`` (0.9)
  similar to one already taken;
- coverage: the warm tier keeps room for the best pitfalls of up to ``pitfall_min_items`` (3) distinct strategies
  (a failure costs one line and saves a whole attempt, yet ranked by outcome alone wins crowd it out: measured in
  `kope bench`, a start context without pitfalls let the agent repeat failures nearly as often as with no memory),
  and any one strategy gets at most ``strategy_max_items`` (2) per tier (the third "fast math worked on X" says
  nothing new, and the slot goes to a strategy the agent has not heard about).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kope_mcp.errors import KopeError

Kind = Literal["case", "fix", "pitfall", "lesson"]


class InvalidSelectionError(KopeError):
    code = "invalid_selection"


_PHASE_WEIGHTS: dict[str, dict[str, float]] = {
    "start": {"case": 1.5, "fix": 0.5, "pitfall": 1.0, "lesson": 1.0},
    "compile_error": {"case": 0.5, "fix": 3.0, "pitfall": 1.0, "lesson": 0.8},
    "incorrect": {"case": 0.6, "fix": 2.5, "pitfall": 1.5, "lesson": 1.0},
    "optimize": {"case": 1.5, "fix": 0.4, "pitfall": 1.2, "lesson": 1.0},
}


class SelectionConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "evidence"
    # --- candidates ---
    candidates_per_source: int = Field(60, description="Per graph filter (task, family, signature, scope).")
    full_text_hits: int = Field(100, description="Per BM25 index (strategies, lessons).")
    full_text_postings: int | None = Field(
        10_000, description="The lesson search leaves out the question's most common words once the lessons "
        "holding its words pass this many (the search's cost grows with them; memory/terms.py). At 1M lessons "
        "(SQLite FTS5) query p50/p95 26/76 ms at 25k, 22/51 at 10k, hit 100% and recall 0.98 each; at 10k and 50k "
        "lessons the same hits and recall at 10k as at 25k (99%, 0.95).")
    lessons_by: Literal["evidence", "recency"] = Field(
        "evidence", description="How scoped lessons become candidates: the strongest measured evidence for this "
        "hardware first, or the newest (the behaviour before issue 16).")
    text_query_has_task: bool = Field(False, description="Add the task id to the BM25 query (every lesson naming "
                                      "the task then matches).")
    max_fix_lookups: int = Field(40, description="Failed attempts whose fixes (and lessons) are looked up.")
    strategy_match_attempts: int = Field(10, description="Attempts taken per strategy whose name matches the "
                                         "query.")
    # --- scores: relevance ---
    base_relevance: float = 0.1
    bm25_weight: float = 0.4
    cosine_weight: float = 0.5
    same_task_bonus: float = 0.6
    same_family_bonus: float = 0.3
    same_signature_bonus: float = 1.0
    # --- scores: quality and multipliers ---
    label_prior: dict[str, float] = Field(
        default_factory=lambda: {"effective": 1.0, "partial": 0.7, "unmeasured": 0.45, "ineffective": 0.4,
                                 "negative": 0.35, "incorrect": 0.3, "compile_error": 0.3, "lesson": 0.5},
        description="Quality by measured label: wins first, measured losses (pitfalls) after; 'lesson' for words "
                    "nobody measured.")
    downstream_cap: float = Field(3.0, description="A case's quality grows with the later wins built on it, up to "
                                  "this much downstream credit (x downstream_floor with none, one more at the "
                                  "cap).")
    downstream_floor: float = Field(0.5, description="A case's quality factor with no downstream credit.")
    min_confidence: float = Field(0.1, description="The floor of a measurement's confidence in a quality.")
    pitfall_quality: dict[str, float] = Field(
        default_factory=lambda: {"broken": 0.6, "negative": 0.45, "ineffective": 0.3},
        description="A kernel that broke is the pitfall worth a line; 'slower' (negative) is measured, 'no gain' "
                    "(ineffective) says least (the last two times the confidence).")
    error_match_multiplier: float = Field(2.0, description="A fix, pitfall or lesson for the error at hand.")
    repeated_failure_step: float = Field(0.25, description="A pitfall whose strategy failed on N kernels: "
                                         "x(1 + step (N - 1)), up to repeated_failure_cap; a pattern, not an "
                                         "accident.")
    repeated_failure_cap: float = 2.0
    lesson_gain: bool = Field(True, description="A lesson with a measured speedup weighs by it (6x > 1.02x).")
    lesson_gain_scale: float = Field(2.0, description="With lesson_gain: quality x scale x gain_factor(speedup) "
                                     "(x1 at 1x, x2 at 2x, x4 from 8x on).")
    fix_quality: float = Field(0.8, description="A recorded fix for the error at hand.")
    fix_text_match: float = Field(0.3, description="A failure lesson answers an error when its BM25 or cosine "
                                  "match reaches this.")
    hardware_weight: dict[int, float] = Field(
        default_factory=lambda: {3: 1.0, 2: 0.6, 1: 0.45, 0: 0.2},
        description="By hardware_rank: 3 same machine, 2 same architecture, 1 same kind of device, 0 another kind "
                    "(a GPU result for a CPU question).")
    other_target_weight: float = 0.5
    imported_weight: float = Field(0.6, description="A measurement (or lesson) imported from another home: "
                                   "evidence from elsewhere, always in the cold tier, weighed down by this.")
    preferred_agent_boost: float = 1.5
    phase_weights: dict[str, dict[str, float]] = Field(
        default_factory=lambda: {phase: dict(weights) for phase, weights in _PHASE_WEIGHTS.items()},
        description="Per phase, the weight of each kind of item (case, fix, pitfall, lesson).")
    # --- selection (see the module's docstring for why these values) ---
    warm_share: float = 0.7
    warm_max_items: int = 12
    cold_max_items: int = 6
    cold_takes_unused_warm: bool = Field(True, description="The cold tier's cap grows by the warm tier's unused "
                                         "slots: a home made of imports still fills its budget.")
    pitfall_min_items: int = 3
    strategy_max_items: int = 2
    mmr_lambda: float = 0.7
    near_duplicate: float = 0.9
    mmr_pool_per_item: int = Field(4, description="MMR considers the best N x the tier's item cap.")
    mmr_picks_per_item: int = Field(3, description="MMR picks up to N x the tier's cap, so that packing can still "
                                    "skip items that do not fit.")


PRESETS: dict[str, SelectionConfig] = {
    "evidence": SelectionConfig(),
    # Before issue 16: scoped lessons by recency, lessons by label only, any other hardware x0.6, the task id in
    # the BM25 query. Kept to measure against.
    "recency": SelectionConfig(name="recency", lessons_by="recency", lesson_gain=False, text_query_has_task=True,
                               hardware_weight={3: 1.0, 2: 0.6, 1: 0.6, 0: 0.6}),
    # Words only: no scope or signature bonus (what BM25 and embeddings find on their own).
    "text": SelectionConfig(name="text", same_task_bonus=0.0, same_family_bonus=0.0, same_signature_bonus=0.0),
}


def load_selection(spec: str | None) -> SelectionConfig:
    """A preset name, or a JSON file of SelectionConfig fields; None or empty: the default."""
    if not spec:
        return PRESETS["evidence"]
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InvalidSelectionError(f"KOPE_SELECTION={spec!r} is neither a preset ({', '.join(PRESETS)}) nor a "
                                    "JSON file")
    try:
        return SelectionConfig.model_validate({"name": path.stem, **json.loads(path.read_text())})
    except (ValueError, ValidationError) as exc:
        raise InvalidSelectionError(f"{path}: not a selection config: {exc}") from None
