import numpy as np
import pytest

from kope_mcp.experience.config import SelectionConfig
from kope_mcp.experience.selection import Scored, cover, mmr_order, pack, similarity_matrix, word_set
from kope_mcp.experience.tokens import count_tokens

DEFAULT = SelectionConfig()
MMR = {"relevance_weight": DEFAULT.mmr_lambda, "near_duplicate": DEFAULT.near_duplicate}
COVER = {"pitfall_min": DEFAULT.pitfall_min_items, "per_strategy": DEFAULT.strategy_max_items}


def item(item_id: str, score: float, text: str) -> Scored:
    return Scored(item_id, score, text, count_tokens(text), word_set(text))


def test_pack_never_exceeds_the_budget_and_lets_smaller_items_fill_gaps():
    items = [item("a", 3, "x" * 400), item("b", 2, "y" * 40), item("c", 1, "z" * 40)]
    taken, skipped = pack(items, budget=30, max_items=10)
    assert [s.item_id for s in taken] == ["b", "c"] and [s.item_id for s in skipped] == ["a"]
    assert sum(s.tokens for s in taken) <= 30


def test_mmr_drops_near_duplicates_and_keeps_diverse_items():
    items = [item("a", 1.0, "openmp over rows softmax"), item("b", 0.99, "openmp over rows softmax"),
             item("c", 0.5, "blocking for l1 cache matmul")]
    sim = similarity_matrix(items, [None, None, None])
    chosen, duplicates, rest = mmr_order(items, sim, limit=10, **MMR)
    assert [s.item_id for s in chosen] == ["a", "c"] and [s.item_id for s in duplicates] == ["b"] and not rest


def test_mmr_stops_at_the_limit_and_returns_the_rest():
    items = [item(str(i), 1.0 - i / 100, f"topic{i} words{i}") for i in range(20)]
    chosen, _, rest = mmr_order(items, similarity_matrix(items, [None] * 20), limit=5, **MMR)
    assert [s.item_id for s in chosen] == ["0", "1", "2", "3", "4"] and len(rest) == 15


def test_similarity_uses_cosine_when_vectors_exist():
    items = [item("a", 1.0, "x"), item("b", 0.5, "y")]
    v = np.array([1.0, 0.0])
    sim = similarity_matrix(items, [v, v])
    assert sim[0, 1] == pytest.approx(1.0)


def test_cover_puts_the_best_pitfalls_of_distinct_strategies_first_and_caps_each_strategy():
    wins = [item(f"w{i}", 1.0 - i / 100, f"win {i}") for i in range(6)]
    falls = [item("p1", 0.2, "tail"), item("p2", 0.15, "tail again"), item("p3", 0.1, "omp"), item("p4", 0.05, "avx"),
             item("p5", 0.01, "blocking")]
    strategy = {"w0": "fast", "w1": "fast", "w2": "fast", "w3": "omp", "w4": None, "w5": None,
                "p1": "tail", "p2": "tail", "p3": "omp", "p4": "avx", "p5": "block"}
    ordered, capped = cover(wins + falls, strategy, {"p1", "p2", "p3", "p4", "p5"}, **COVER)
    assert [s.item_id for s in ordered[:3]] == ["p1", "p3", "p4"]  # one per failing strategy, best first
    assert [s.item_id for s in capped] == ["w2"]  # a third "fast" item
    # "omp" already has its pitfall: one win of it still fits under the cap; unnamed items are never capped.
    assert [s.item_id for s in ordered[3:]] == ["w0", "w1", "w3", "w4", "w5", "p2", "p5"]


def test_cover_without_pitfalls_keeps_the_rank_order():
    items = [item(f"w{i}", 1.0 - i / 10, f"win {i}") for i in range(3)]
    ordered, capped = cover(items, {}, set(), **COVER)
    assert ordered == items and capped == []
