"""Active context selection maths: token estimates, maximal marginal relevance, and budgeted packing.

Caps (the paper gives no values; these are ours, and why):
- the hot tier (target, incumbent, latest feedback) always goes first: without it the agent does not know
  where it stands;
- the warm tier (this task or family, this hardware, this error) gets at most 70% of what is left after the hot
  tier and at most 12 items: beyond that the marginal item repeats what the first ones said;
- the cold tier (other families, other hardware) gets the rest, at most 6 items: it is there for feasibility
  ("this worked elsewhere"), not as the main evidence;
- MMR with lambda 0.7 keeps relevance first but drops an item whose text is >= 0.9 similar to one already taken;
- coverage: the warm tier keeps room for the best pitfalls of up to 3 distinct strategies (a failure costs one
  line and saves a whole attempt, yet ranked by outcome alone wins crowd it out: measured in `kope bench`, a
  start context without pitfalls let the agent repeat failures nearly as often as with no memory), and any one
  strategy gets at most 2 items per tier (the third "fast math worked on X" says nothing new, and the slot goes
  to a strategy the agent has not heard about).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

import numpy as np

WARM_SHARE = 0.7
WARM_MAX_ITEMS = 12
COLD_MAX_ITEMS = 6
PITFALL_MIN_ITEMS = 3
STRATEGY_MAX_ITEMS = 2
MMR_LAMBDA = 0.7
NEAR_DUPLICATE = 0.9

_TOKEN = re.compile(r"[a-z0-9_]+")


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


def mmr_order(items: list[Scored], similarity: np.ndarray, limit: int
              ) -> tuple[list[Scored], list[Scored], list[Scored]]:
    """Greedy MMR over a precomputed similarity matrix, stopping after ``limit`` picks (O(limit * n)).

    Returns (picked in order, near-duplicates of a picked item, the rest never reached).
    """
    n = len(items)
    if n == 0:
        return [], [], []
    scores = np.array([s.score for s in items], dtype=np.float64)
    relevance = scores / (scores.max() or 1.0)
    max_sim = np.zeros(n)
    open_ = np.ones(n, dtype=bool)
    chosen: list[Scored] = []
    duplicates: list[Scored] = []
    while open_.any() and len(chosen) < limit:
        value = np.where(open_, MMR_LAMBDA * relevance - (1 - MMR_LAMBDA) * max_sim, -np.inf)
        best = int(np.argmax(value))
        open_[best] = False
        if chosen and max_sim[best] >= NEAR_DUPLICATE:
            duplicates.append(items[best])
            continue
        chosen.append(items[best])
        max_sim = np.maximum(max_sim, similarity[best])
    rest = [items[i] for i in np.flatnonzero(open_)]
    return chosen, duplicates, rest


def similarity_matrix(items: list[Scored], vectors: list[np.ndarray | None]) -> np.ndarray:
    """Cosine where both items have embeddings, Jaccard of their words otherwise."""
    n = len(items)
    sim = np.zeros((n, n))
    have = [i for i, v in enumerate(vectors) if v is not None]
    if have:
        matrix = np.stack([vectors[i] for i in have]).astype(np.float64)  # type: ignore[misc]
        sim[np.ix_(have, have)] = matrix @ matrix.T
    missing = [i for i, v in enumerate(vectors) if v is None]
    for i in missing:
        for j in range(n):
            sim[i, j] = sim[j, i] = jaccard_sets(items[i].words, items[j].words)
    np.fill_diagonal(sim, 1.0)
    return sim


def cover(ordered: list[Scored], strategy_of: Mapping[str, str | None], pitfalls: Set[str]
          ) -> tuple[list[Scored], list[Scored]]:
    """Reorder a ranked list for coverage: the best pitfalls (ids in `pitfalls`) of up to PITFALL_MIN_ITEMS
    distinct strategies first, then everything else in rank order, at most STRATEGY_MAX_ITEMS items per strategy
    (items without a strategy are not capped). Returns (reordered, left out by the per-strategy cap)."""
    first: list[Scored] = []
    failing: set[str | None] = set()
    for item in ordered:
        key = strategy_of.get(item.item_id)
        if len(first) < PITFALL_MIN_ITEMS and item.item_id in pitfalls and key not in failing:
            first.append(item)
            failing.add(key)
    taken = {item.item_id for item in first}
    counts = Counter(strategy_of.get(item.item_id) for item in first)
    kept: list[Scored] = []
    capped: list[Scored] = []
    for item in ordered:
        if item.item_id in taken:
            continue
        key = strategy_of.get(item.item_id)
        if key is not None and counts[key] >= STRATEGY_MAX_ITEMS:
            capped.append(item)
            continue
        counts[key] += 1
        kept.append(item)
    return first + kept, capped


def pack(items: list[Scored], budget: int, max_items: int) -> tuple[list[Scored], list[Scored]]:
    """Take items in order while they fit; smaller later items may still fit after a big one is skipped."""
    taken: list[Scored] = []
    skipped: list[Scored] = []
    used = 0
    for item in items:
        if len(taken) < max_items and used + item.tokens <= budget:
            taken.append(item)
            used += item.tokens
        else:
            skipped.append(item)
    return taken, skipped
