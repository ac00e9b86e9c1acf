"""Active context selection maths: token estimates, maximal marginal relevance, and budgeted packing.

Pure functions; every cap and weight they take comes from ``services/selection_config.SelectionConfig``, where
the values and the reasons for them are written down.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

import numpy as np

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


def mmr_order(items: list[Scored], similarity: np.ndarray, limit: int, *, relevance_weight: float,
              near_duplicate: float) -> tuple[list[Scored], list[Scored], list[Scored]]:
    """Greedy MMR over a precomputed similarity matrix, stopping after ``limit`` picks (O(limit * n)); an item at
    least ``near_duplicate`` similar to one already picked is set aside.

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
        value = np.where(open_, relevance_weight * relevance - (1 - relevance_weight) * max_sim, -np.inf)
        best = int(np.argmax(value))
        open_[best] = False
        if chosen and max_sim[best] >= near_duplicate:
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


def cover(ordered: list[Scored], strategy_of: Mapping[str, str | None], pitfalls: Set[str], *, pitfall_min: int,
          per_strategy: int) -> tuple[list[Scored], list[Scored]]:
    """Reorder a ranked list for coverage: the best pitfalls (ids in `pitfalls`) of up to ``pitfall_min``
    distinct strategies first, then everything else in rank order, at most ``per_strategy`` items per strategy
    (items without a strategy are not capped). Returns (reordered, left out by the per-strategy cap)."""
    first: list[Scored] = []
    failing: set[str | None] = set()
    for item in ordered:
        key = strategy_of.get(item.item_id)
        if len(first) < pitfall_min and item.item_id in pitfalls and key not in failing:
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
        if key is not None and counts[key] >= per_strategy:
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
