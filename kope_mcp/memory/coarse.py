"""A coarse pass for cosine search over many stored vectors: every row projected on the 64 principal directions of
the stored vectors, kept in memory; a question's candidates are the rows whose projections score best, and only
those are scored exactly (vectors.py).

A brute-force pass over a million 384-dim bfloat16 rows reads 768 MB per question (45-110 ms on two cores here);
the projections are 128 MB (a scan ~14 ms, the top 8,192 ~7 ms, gathering those rows ~2 ms). The embeddings of
one memory share few directions: 64 of them hold ~96% of the variance of the suite's lessons, and on 16k of their
embeddings the exact top 50 was found among the coarse top 0.4% with recall 0.97, among the top 0.8% with 0.99.

The directions are computed once, from an even sample of the rows there are when the pass is built (in the
background, the first time a memory is large enough); later rows are projected on the same directions as they
come. Below ``MIN_ROWS`` a brute-force pass costs less than this one's bookkeeping.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

DIMS = 64
MIN_ROWS = 100_000  # below this, brute force: ~5 ms on two cores
CANDIDATES = 8_192  # rows scored exactly per question
SAMPLE_ROWS = 20_000  # for the principal directions
_BLOCK = 65_536


class CoarsePass:
    """Projections of rows ``[0, rows)`` of a bfloat16 matrix; ``extend`` projects rows added since."""

    def __init__(self, torch: Any, matrix: np.ndarray) -> None:
        self._torch = torch
        rows = torch.from_numpy(np.ascontiguousarray(matrix[:: max(1, len(matrix) // SAMPLE_ROWS)]).view(np.int16))
        sample = rows.view(torch.bfloat16).float()
        centred = sample - sample.mean(0)
        _, vectors = torch.linalg.eigh(centred.T @ centred)  # ascending eigenvalues: the last columns lead
        self._basis = vectors.flip(1)[:, :DIMS].contiguous().to(torch.bfloat16)
        self._projected = torch.zeros((0, DIMS), dtype=torch.bfloat16)
        self._lock = threading.Lock()  # guards the matrix of projections
        self._extending = threading.Lock()  # one extension at a time: each projects the rows past the last one
        self.extend(matrix)

    @property
    def rows(self) -> int:
        return len(self._projected)

    def extend(self, matrix: np.ndarray) -> None:
        """Project the rows of ``matrix`` past those already projected (rows never move)."""
        torch = self._torch
        with self._extending:
            blocks = [self._project(matrix[a:a + _BLOCK]) for a in range(self.rows, len(matrix), _BLOCK)]
            if blocks:
                with self._lock:
                    self._projected = torch.cat([self._projected, *blocks])

    def replace(self, pos: int, row: np.ndarray) -> None:
        """A row rewritten in place (an item embedded again)."""
        if pos < self.rows:
            with self._lock:
                self._projected[pos] = self._project(row[None, :])[0]

    def candidates(self, query: np.ndarray, k: int) -> np.ndarray:
        """Positions of the ``k`` rows whose projections score best against ``query`` (float32, normalised),
        ascending."""
        torch = self._torch
        with self._lock:
            projected = self._projected
        q = (torch.from_numpy(query).to(torch.bfloat16) @ self._basis)
        scores = (projected @ q).float()
        if k >= len(scores):
            return np.arange(len(scores))
        top = torch.topk(scores, k, sorted=False).indices.numpy()
        top.sort()
        return top

    def _project(self, rows: np.ndarray) -> Any:
        torch = self._torch
        return torch.from_numpy(np.ascontiguousarray(rows).view(np.int16)).view(torch.bfloat16) @ self._basis
