"""Stored embeddings for cosine search: a float32 matrix in a file beside the graph (``memory.kuzu.vectors``),
mapped rather than loaded, searched by brute force (one matrix-vector product: ~62 ms at a million 384-dim rows on
two cores here; an HNSW index in Kùzu costs ~10 ms per inserted row, and below ~100k rows was no faster).

Which row is which item is the read index's ``vector`` table, under the read index's trust: a file a server did
not close cleanly, or one that never held every stored embedding (a memory served with embeddings off), is
emptied, and the stored embeddings are written into it again from the graph by the embedding backlog. Before,
every start read all of them from the graph into Python: minutes and gigabytes at a million items.

``path`` None keeps the matrix in memory (a scratch index).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from kope_mcp.memory.read_index import ReadIndex

SUFFIX = ".vectors"


class VectorIndex:
    def __init__(self, dim: int, index: ReadIndex, path: Path | None = None) -> None:
        self.dim = dim
        self._row_bytes = dim * 4
        self._index = index
        self.path = path
        self._lock = threading.Lock()
        self.loaded = threading.Event()  # holds every stored embedding (trusted at open, or loaded since)
        if not index.vectors_trusted:
            index.clear_vectors()
        self._rows = index.vector_count()
        self._memory = np.zeros((0, dim), dtype=np.float32)
        self._map: np.ndarray | None = None
        if path is not None:
            with path.open("ab") as fh:  # created if missing; rows past the last one indexed are a torn write
                fh.truncate(self._rows * self._row_bytes)
        if index.vectors_trusted:
            self.loaded.set()

    @classmethod
    def beside(cls, dim: int, index: ReadIndex, database: Path) -> VectorIndex:
        return cls(dim, index, database.with_name(database.name + SUFFIX))

    def __len__(self) -> int:
        return self._rows

    def add(self, item_id: str, kind: str, vector: list[float]) -> None:
        self.add_many([(item_id, kind, vector)])

    def add_many(self, rows: list[tuple[str, str, list[float]]]) -> None:
        """Store vectors: an item already here gets its new vector in place, a new one the next row."""
        latest = {item_id: (kind, vector) for item_id, kind, vector in rows}  # the last vector of an id wins
        with self._lock:
            known = self._index.vector_positions(list(latest))
            fresh = [item_id for item_id in latest if item_id not in known]
            for item_id, pos in known.items():
                self._write(pos, np.asarray([latest[item_id][1]], dtype=np.float32))
            if fresh:
                self._write(self._rows, np.asarray([latest[i][1] for i in fresh], dtype=np.float32))
                # The rows first, then the table that names them: a row without a name is cut at the next open.
                self._index.add_vector_items([(self._rows + n, item_id, latest[item_id][0])
                                              for n, item_id in enumerate(fresh)])
                self._rows += len(fresh)

    def _write(self, pos: int, block: np.ndarray) -> None:
        if block.shape[1] != self.dim:
            raise ValueError(f"a vector of {block.shape[1]} numbers where the memory holds {self.dim}")
        if self.path is None:
            end = pos + len(block)
            if end > len(self._memory):
                grown = np.zeros((max(end, 2 * len(self._memory), 64), self.dim), dtype=np.float32)
                grown[: len(self._memory)] = self._memory
                self._memory = grown
            self._memory[pos:end] = block
            return
        with self.path.open("r+b") as fh:
            fh.seek(pos * self._row_bytes)
            fh.write(block.tobytes())
        self._map = None if pos + len(block) > self._mapped_rows() else self._map

    def _mapped_rows(self) -> int:
        return 0 if self._map is None else len(self._map)

    def _matrix(self) -> np.ndarray:
        if self.path is None:
            return self._memory[: self._rows]
        if self._rows == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._map is None or len(self._map) < self._rows:
            self._map = np.memmap(self.path, dtype=np.float32, mode="r", shape=(self._rows, self.dim))
        return self._map[: self._rows]

    def clear(self) -> None:
        """Forget every vector (before they are written again from the graph)."""
        with self._lock:
            self._index.clear_vectors()
            self._rows = 0
            self._map = None
            self._memory = np.zeros((0, self.dim), dtype=np.float32)
            if self.path is not None:
                with self.path.open("r+b") as fh:
                    fh.truncate(0)

    def ids(self) -> set[str]:
        return self._index.vector_ids()

    def vector(self, item_id: str) -> np.ndarray | None:
        with self._lock:
            pos = self._index.vector_positions([item_id]).get(item_id)
            return None if pos is None else np.array(self._matrix()[pos])

    def warm(self) -> None:
        """Read the file once so the first question does not wait for the disk (a background thread calls it)."""
        with self._lock:
            matrix = self._matrix()
        for start in range(0, len(matrix), 65536):
            float(matrix[start:start + 65536, 0].sum())

    def search(self, query: list[float], k: int) -> list[tuple[str, str, float]]:
        """Top-k (id, kind, cosine) for a normalised query vector."""
        with self._lock:
            matrix = self._matrix()
        if not len(matrix):
            return []
        # Outside the lock: rows below the count never move, and a vector replaced meanwhile is either one.
        scores = matrix @ np.asarray(query, dtype=np.float32)
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        items = self._index.vector_items([int(i) for i in top])
        return [(*items[int(i)], float(scores[i])) for i in top if int(i) in items]
