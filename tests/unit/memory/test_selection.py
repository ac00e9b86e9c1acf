import numpy as np
import pytest

from kope_mcp.memory.selection import Scored, estimate_tokens, mmr_order, pack, similarity_matrix, word_set


def item(item_id: str, score: float, text: str) -> Scored:
    return Scored(item_id, score, text, estimate_tokens(text), word_set(text))


def test_pack_never_exceeds_the_budget_and_lets_smaller_items_fill_gaps():
    items = [item("a", 3, "x" * 400), item("b", 2, "y" * 40), item("c", 1, "z" * 40)]
    taken, skipped = pack(items, budget=30, max_items=10)
    assert [s.item_id for s in taken] == ["b", "c"] and [s.item_id for s in skipped] == ["a"]
    assert sum(s.tokens for s in taken) <= 30


def test_mmr_drops_near_duplicates_and_keeps_diverse_items():
    items = [item("a", 1.0, "openmp over rows softmax"), item("b", 0.99, "openmp over rows softmax"),
             item("c", 0.5, "blocking for l1 cache matmul")]
    sim = similarity_matrix(items, [None, None, None])
    chosen, duplicates, rest = mmr_order(items, sim, limit=10)
    assert [s.item_id for s in chosen] == ["a", "c"] and [s.item_id for s in duplicates] == ["b"] and not rest


def test_mmr_stops_at_the_limit_and_returns_the_rest():
    items = [item(str(i), 1.0 - i / 100, f"topic{i} words{i}") for i in range(20)]
    chosen, _, rest = mmr_order(items, similarity_matrix(items, [None] * 20), limit=5)
    assert [s.item_id for s in chosen] == ["0", "1", "2", "3", "4"] and len(rest) == 15


def test_similarity_uses_cosine_when_vectors_exist():
    items = [item("a", 1.0, "x"), item("b", 0.5, "y")]
    v = np.array([1.0, 0.0])
    sim = similarity_matrix(items, [v, v])
    assert sim[0, 1] == pytest.approx(1.0)
