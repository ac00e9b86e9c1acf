"""Stored embeddings for cosine search: a bfloat16 matrix in a file beside the graph (``memory.kuzu.vectors``),
mapped rather than loaded, searched by brute force, split across the cores (at a million 384-dim rows on two
cores here: 45-60 ms in bfloat16 with torch, 80-90 ms for numpy's float32 product, which also needs twice the
memory; an HNSW index in Kùzu costs ~10 ms per inserted row, and below ~100k rows was no faster). bfloat16 keeps
3 significant digits, as much as the vectors carry: they are computed in bfloat16 where the CPU has it (cosine
>= 0.9999 against float32 ones, embedder.py), and a question's candidates are ranked again by BM25 and the graph.

Which row is which item is the read index's ``vector`` table, under the read index's trust: a file a server did
not close cleanly, or one that never held every stored embedding (a memory served with embeddings off), is
emptied, and the stored embeddings are written into it again from the graph by the embedding backlog. Before,
every start read all of them from the graph into Python: minutes and gigabytes at a million items.

``path`` None keeps the matrix in memory (a scratch index). From 100k rows a question is answered through a coarse
pass (coarse.py): the rows whose projections on 64 principal directions score best, then those exactly.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from kope_mcp.memory import coarse
from kope_mcp.memory.read_index import ReadIndex

SUFFIX = ".vectors"
_SEARCH_THREADS = os.cpu_count() or 1
_search_pool: ThreadPoolExecutor | None = None
_EXTEND_EVERY = 4096  # rows added since the coarse pass last grew that are scored exactly until it grows again


def to_bfloat16(vectors: np.ndarray) -> np.ndarray:
    """float32 rows as bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = np.ascontiguousarray(vectors, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bfloat16(rows: np.ndarray) -> np.ndarray:
    return (rows.astype(np.uint32) << 16).view(np.float32)


class VectorIndex:
    def __init__(self, dim: int, index: ReadIndex, path: Path | None = None) -> None:
        self.dim = dim
        self._row_bytes = dim * 2
        self._index = index
        self.path = path
        self._lock = threading.Lock()
        self.loaded = threading.Event()  # holds every stored embedding (trusted at open, or loaded since)
        if not index.vectors_trusted:
            index.clear_vectors()
        self._rows = index.vector_count()
        self._memory = np.zeros((0, dim), dtype=np.uint16)
        self._map: np.ndarray | None = None
        self._coarse: coarse.CoarsePass | None = None
        self._coarse_build = threading.Lock()  # held while a pass is built: one build at a time, warm() waits on it
        self._cleared = 0  # clears so far: a pass built from rows cleared meanwhile is not kept
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
        block = to_bfloat16(block)
        if self._coarse is not None:
            for n, row in enumerate(block):
                self._coarse.replace(pos + n, row)
        if self.path is None:
            end = pos + len(block)
            if end > len(self._memory):
                grown = np.zeros((max(end, 2 * len(self._memory), 64), self.dim), dtype=np.uint16)
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
            return np.zeros((0, self.dim), dtype=np.uint16)
        if self._map is None or len(self._map) < self._rows:
            # Copy-on-write: writable for torch's sake, never written (rows are written through the file).
            self._map = np.memmap(self.path, dtype=np.uint16, mode="c", shape=(self._rows, self.dim))
        return self._map[: self._rows]

    def clear(self) -> None:
        """Forget every vector (before they are written again from the graph)."""
        with self._lock:
            self._index.clear_vectors()
            self._rows = 0
            self._map = None
            self._coarse = None
            self._cleared += 1
            self._memory = np.zeros((0, self.dim), dtype=np.uint16)
            if self.path is not None:
                with self.path.open("r+b") as fh:
                    fh.truncate(0)

    def ids(self) -> set[str]:
        return self._index.vector_ids()

    def vector(self, item_id: str) -> np.ndarray | None:
        with self._lock:
            pos = self._index.vector_positions([item_id]).get(item_id)
            return None if pos is None else from_bfloat16(np.array(self._matrix()[pos]))

    def warm(self) -> None:
        """Read the file once so the first question does not wait for the disk (a background thread calls it)."""
        with self._lock:
            matrix = self._matrix()
        # Building the coarse pass reads every row: at a million rows it was ready 3.8 s after a start (torch's
        # import included) instead of 6.1 (a read of the file, then the pass); questions meanwhile go by brute force.
        self._build_coarse()
        if self._coarse is None:
            for start in range(0, len(matrix), 65536):
                float(matrix[start:start + 65536, 0].sum())

    def _build_coarse(self, wait: bool = True) -> None:
        """The coarse pass over the rows there are, once there are enough (on the caller's thread). With wait, a
        build already under way on another thread is waited for, so that warm() returns with the pass there."""
        if not self._coarse_build.acquire(blocking=wait):
            return
        try:
            with self._lock:
                if self._coarse is not None or self._rows < coarse.MIN_ROWS:
                    return
                matrix, cleared = self._matrix(), self._cleared
            try:
                import torch
            except ImportError:
                return  # brute force in numpy (_scores)
            built = coarse.CoarsePass(torch, matrix)
            with self._lock:
                if self._cleared == cleared:
                    self._coarse = built
        finally:
            self._coarse_build.release()

    def search(self, query: list[float], k: int) -> list[tuple[str, str, float]]:
        """Top-k (id, kind, cosine) for a normalised query vector."""
        with self._lock:
            matrix = self._matrix()
            passed = self._coarse
        if not len(matrix):
            return []
        q = np.asarray(query, dtype=np.float32)
        # Outside the lock: rows below the count never move, and a vector replaced meanwhile is either one.
        if passed is None:
            if len(matrix) >= coarse.MIN_ROWS and not self._coarse_build.locked():
                threading.Thread(target=self._build_coarse, args=(False,), name="kope-vector-coarse",
                                 daemon=True).start()
            scores = _scores(matrix, q)
            positions = np.arange(len(scores))
        else:
            if len(matrix) - passed.rows >= _EXTEND_EVERY:
                passed.extend(matrix)
            # The coarse pass's candidates, and rows it has not projected yet, scored exactly; a question that
            # raced another's extension of the pass may see candidates past its own rows.
            candidates = passed.candidates(q, coarse.CANDIDATES)
            positions = np.concatenate([candidates[candidates < len(matrix)],
                                        np.arange(min(passed.rows, len(matrix)), len(matrix))])
            scores = _scores(matrix[positions], q)
        k = min(k, len(scores))
        top = _near_top(scores, k)
        # The product is rounded to bfloat16 (steps of 0.004 near 1, forty times the error of the vectors
        # themselves): rows within two steps of the k-th are scored again in float32, so ties rank by cosine.
        scores[top] = from_bfloat16(matrix[positions[top]]) @ q
        top = top[np.argsort(-scores[top], kind="stable")[:k]]
        items = self._index.vector_items([int(positions[i]) for i in top])
        return [(*items[int(positions[i])], float(scores[i])) for i in top if int(positions[i]) in items]


def _near_top(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k best scores and of every score within two bfloat16 steps of the k-th (at most 64k)."""
    kth = float(np.partition(scores, len(scores) - k)[len(scores) - k])
    near = np.flatnonzero(scores >= kth - 2 * 2.0 ** (np.floor(np.log2(max(abs(kth), 1e-30))) - 7))
    if len(near) > 65536:
        near = near[np.argpartition(-scores[near], 65535)[:65536]]
    return near


def _scores(matrix: np.ndarray, query: np.ndarray) -> np.ndarray:
    """matrix (bfloat16 bits) @ query, one slice per core (torch computes a slice on one thread, without the
    GIL); numpy in float32 slices where torch is missing."""
    global _search_pool
    bounds = np.linspace(0, len(matrix), _SEARCH_THREADS + 1, dtype=int)
    slices = [matrix[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    try:
        import torch
    except ImportError:
        return np.concatenate([from_bfloat16(part) @ query for part in slices])
    q = torch.from_numpy(query).to(torch.bfloat16)

    def product(part: np.ndarray) -> Any:
        return (torch.from_numpy(part.view(np.int16)).view(torch.bfloat16) @ q).float().numpy()

    if len(slices) == 1:
        return np.asarray(product(slices[0]))
    if _search_pool is None:
        _search_pool = ThreadPoolExecutor(_SEARCH_THREADS, thread_name_prefix="kope-vector-search")
    return np.concatenate(list(_search_pool.map(product, slices)))
