"""Brute-force cosine search over normalised vectors held in numpy (as fast as HNSW below ~100k items here)."""

from __future__ import annotations

import threading

import numpy as np


class VectorIndex:
    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._ids: list[str] = []
        self._kinds: list[str] = []
        self._pos: dict[str, int] = {}
        self._matrix = np.zeros((0, dim), dtype=np.float32)
        self._pending: list[np.ndarray] = []
        self._lock = threading.Lock()

    def add(self, item_id: str, kind: str, vector: list[float]) -> None:
        vec = np.asarray(vector, dtype=np.float32)
        with self._lock:
            if item_id in self._pos:
                self._flush()
                self._matrix[self._pos[item_id]] = vec
                return
            self._pos[item_id] = len(self._ids)
            self._ids.append(item_id)
            self._kinds.append(kind)
            self._pending.append(vec)

    def _flush(self) -> None:
        if self._pending:
            self._matrix = np.vstack([self._matrix, np.stack(self._pending)])
            self._pending = []

    def ids(self) -> set[str]:
        with self._lock:
            return set(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def vector(self, item_id: str) -> np.ndarray | None:
        with self._lock:
            self._flush()
            pos = self._pos.get(item_id)
            return None if pos is None else self._matrix[pos]

    def search(self, query: list[float], k: int) -> list[tuple[str, str, float]]:
        """Top-k (id, kind, cosine) for a normalised query vector."""
        with self._lock:
            self._flush()
            if not self._ids:
                return []
            scores = self._matrix @ np.asarray(query, dtype=np.float32)
            k = min(k, len(scores))
            top = np.argpartition(-scores, k - 1)[:k]
            top = top[np.argsort(-scores[top])]
            return [(self._ids[i], self._kinds[i], float(scores[i])) for i in top]
