"""The vector file beside the graph: searched in place, kept across a clean close, emptied when not trusted."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kope_mcp.memory.read_index import ReadIndex, database_stamp
from kope_mcp.memory.vectors import VectorIndex


def unit(*values: float) -> list[float]:
    v = np.asarray(values, dtype=np.float32)
    return (v / np.linalg.norm(v)).tolist()


def open_index(database: Path, empty: bool = False) -> tuple[ReadIndex, VectorIndex]:
    index = ReadIndex.beside(database)
    index.attach(database_stamp(database), database_empty=empty)
    return index, VectorIndex.beside(3, index, database)


def test_search_ranks_by_cosine_and_a_second_vector_for_an_item_replaces_its_first(tmp_path: Path):
    database = tmp_path / "memory.kuzu"
    database.write_bytes(b"graph")
    _, vectors = open_index(database, empty=True)
    vectors.add_many([("x-1", "lesson", unit(1, 0, 0)), ("x-2", "lesson", unit(0, 1, 0)),
                      ("k-1", "attempt", unit(1, 1, 0))])
    assert [hit[0] for hit in vectors.search(unit(1, 0.1, 0), 3)] == ["x-1", "k-1", "x-2"]
    vectors.add("x-2", "lesson", unit(1, 0, 0.01))  # re-embedded: the same row, a new vector
    hits = vectors.search(unit(1, 0, 0), 2)
    assert {hit[0] for hit in hits} == {"x-1", "x-2"} and hits[0][2] > 0.99 and len(vectors) == 3
    # Kept in bfloat16: 3 significant digits.
    assert np.allclose(vectors.vector("x-2"), unit(1, 0, 0.01), atol=4e-3) and vectors.vector("x-9") is None
    assert vectors.ids() == {"x-1", "x-2", "k-1"}


def test_vectors_survive_a_clean_close_only_when_they_were_complete(tmp_path: Path):
    database = tmp_path / "memory.kuzu"
    database.write_bytes(b"graph")
    index, vectors = open_index(database, empty=True)
    assert vectors.loaded.is_set()  # an empty database has no vector to miss
    vectors.add("x-1", "lesson", unit(1, 0, 0))
    index.close(database_stamp(database), vectors_complete=True)
    index, vectors = open_index(database)
    assert vectors.loaded.is_set() and [h[0] for h in vectors.search(unit(1, 0, 0), 1)] == ["x-1"]
    index.close(database_stamp(database), vectors_complete=False)  # e.g. served with embeddings off
    index, vectors = open_index(database)
    assert index.complete and not vectors.loaded.is_set() and len(vectors) == 0
    assert (tmp_path / "memory.kuzu.vectors").stat().st_size == 0


def test_a_row_written_without_its_name_is_cut_at_the_next_open(tmp_path: Path):
    database = tmp_path / "memory.kuzu"
    database.write_bytes(b"graph")
    index, vectors = open_index(database, empty=True)
    vectors.add("x-1", "lesson", unit(1, 0, 0))
    index.close(database_stamp(database), vectors_complete=True)
    with (tmp_path / "memory.kuzu.vectors").open("ab") as fh:
        fh.write(b"\x00\x3f\x80")  # a torn append: half a row of three bfloat16 numbers
    _, vectors = open_index(database)
    assert (tmp_path / "memory.kuzu.vectors").stat().st_size == 6 and len(vectors) == 1
    vectors.add("x-2", "lesson", unit(0, 1, 0))
    assert [h[0] for h in vectors.search(unit(0, 1, 0), 1)] == ["x-2"]


def test_a_private_index_keeps_its_vectors_in_memory():
    index = ReadIndex(None)
    index.attach("", database_empty=True)
    vectors = VectorIndex(3, index)
    vectors.add_many([(f"x-{i}", "lesson", unit(1, i, 0)) for i in range(100)])
    assert len(vectors) == 100 and vectors.search(unit(1, 0, 0), 1)[0][0] == "x-0"


def test_a_large_memory_is_searched_through_its_coarse_pass_with_the_answers_of_brute_force(monkeypatch):
    from kope_mcp.memory import coarse

    monkeypatch.setattr(coarse, "MIN_ROWS", 10**9)  # brute force first: no pass is built behind the answers
    monkeypatch.setattr(coarse, "CANDIDATES", 250)  # 5% of the rows (at a million, 8,192 are 0.8%)
    monkeypatch.setattr(coarse, "DIMS", 16)
    rng = np.random.default_rng(3)
    # Like a memory's embeddings: few directions matter (40 topics in 96 dimensions), each text near its topic
    topics = rng.normal(size=(40, 96)) * np.linspace(2, 0.1, 96)
    rows = topics[rng.integers(0, 40, 5000)] + rng.normal(scale=0.3, size=(5000, 96))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    index = ReadIndex(None)
    index.attach("", database_empty=True)
    vectors = VectorIndex(96, index)
    vectors.add_many([(f"x-{n}", "lesson", row.tolist()) for n, row in enumerate(rows)])
    questions = [row + rng.normal(scale=0.2, size=96) for row in rows[rng.integers(0, 5000, 30)]]
    questions = [(q / np.linalg.norm(q)).tolist() for q in questions]
    brute = [[hit[0] for hit in vectors.search(q, 20)] for q in questions]
    monkeypatch.setattr(coarse, "MIN_ROWS", 3000)
    vectors.warm()  # builds the pass: 5,000 rows are past MIN_ROWS
    assert vectors._coarse is not None and vectors._coarse.rows == 5000
    found = [[hit[0] for hit in vectors.search(q, 20)] for q in questions]
    overlap = [len(set(a) & set(b)) / 20 for a, b in zip(brute, found, strict=True)]
    assert np.mean(overlap) >= 0.95 and sum(a[0] == b[0] for a, b in zip(brute, found, strict=True)) >= 28
    # rows added since the pass was built are scored exactly until it grows; a replaced row is found in its place
    vectors.add("x-new", "lesson", questions[0])
    vectors.add("x-7", "lesson", questions[1])
    assert vectors.search(questions[0], 1)[0][0] == "x-new" and vectors.search(questions[1], 1)[0][0] == "x-7"
    assert vectors._coarse.rows == 5000
    vectors.clear()
    assert vectors._coarse is None and vectors.search(questions[0], 3) == []
