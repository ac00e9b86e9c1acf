"""Active context selection maths: token estimates, maximal marginal relevance, and budgeted packing.

Caps (the paper gives no values; these are ours, and why):
- the hot tier (target, incumbent, latest feedback) always goes first: without it the agent does not know
  where it stands;
- the warm tier (this task or family, this hardware, this error) gets at most 70% of what is left after the hot
  tier and at most 12 items: beyond that the marginal item repeats what the first ones said;
- the cold tier (other families, other hardware) gets the rest, at most 6 items: it is there for feasibility
  ("this worked elsewhere"), not as the main evidence;
- MMR with lambda 0.7 keeps relevance first but drops an item whose text is >= 0.9 similar to one already taken.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

WARM_SHARE = 0.7
WARM_MAX_ITEMS = 12
COLD_MAX_ITEMS = 6
MMR_LAMBDA = 0.7
NEAR_DUPLICATE = 0.9
CHARS_PER_TOKEN = 4  # the usual estimate for English and code with BPE tokenizers

_TOKEN = re.compile(r"[a-z0-9_]+")


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def truncate_to_tokens(text: str, tokens: int) -> str:
    limit = max(0, tokens * CHARS_PER_TOKEN - 3)
    return text if len(text) <= limit + 3 else text[:limit] + "..."


def word_set(text: str) -> frozenset[str]:
    return frozenset(_TOKEN.findall(text.lower()))


def jaccard_sets(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


@dataclass
class Scored:
    item_id: str
    score: float
    text: str
    tokens: int
    words: frozenset[str] = field(default_factory=frozenset)
    compact: str | None = None  # a shorter rendering (no diff) to use when the full one does not fit


def mmr_order(items: list[Scored], similarity: Callable[[Scored, Scored], float]) -> tuple[list[Scored], list[Scored]]:
    """Greedy MMR; returns (ordered keepers, near-duplicates dropped)."""
    remaining = sorted(items, key=lambda s: -s.score)
    chosen: list[Scored] = []
    duplicates: list[Scored] = []
    top = max((s.score for s in remaining), default=1.0) or 1.0
    while remaining:
        best, best_value, best_sim = None, -math.inf, 0.0
        for cand in remaining:
            sim = max((similarity(cand, c) for c in chosen), default=0.0)
            value = MMR_LAMBDA * cand.score / top - (1 - MMR_LAMBDA) * sim
            if value > best_value:
                best, best_value, best_sim = cand, value, sim
        assert best is not None
        remaining.remove(best)
        (duplicates if best_sim >= NEAR_DUPLICATE else chosen).append(best)
    return chosen, duplicates


def pack(items: list[Scored], budget: int, max_items: int) -> tuple[list[Scored], list[Scored]]:
    """Take items in order while they fit; smaller later items may still fit after a big one is skipped."""
    taken: list[Scored] = []
    skipped: list[Scored] = []
    used = 0
    for item in items:
        if len(taken) < max_items and used + item.tokens > budget and item.compact:
            short = estimate_tokens(item.compact)
            if used + short <= budget:
                item.text, item.tokens, item.compact = item.compact, short, None
        if len(taken) < max_items and used + item.tokens <= budget:
            taken.append(item)
            used += item.tokens
        else:
            skipped.append(item)
    return taken, skipped
