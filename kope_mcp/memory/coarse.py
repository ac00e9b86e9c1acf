"""A coarse pass for cosine search over many stored vectors: every row projected on the 64 principal directions of
the stored vectors, kept in memory; a question's candidates are the rows whose projections score best, and only
those are scored exactly (vectors.py).

A brute-force pass over a million 384-dim bfloat16 rows reads 768 MB per question (45-110 ms on two cores here);
the projections are 128 MB (a scan ~8-10 ms, a threshold for the best 8,192 ~1 ms, gathering and scoring those
rows ~2-3 ms). The embeddings of one memory share few directions: 64 of them hold ~96% of the variance of the
suite's lessons, and on 16k of their embeddings the exact top 50 was found among the coarse top 0.4% with recall
0.97, among the top 0.8% with 0.99; at a million lessons, the best 50 scores of the benchmark's 76 questions were
all found with recall 0.997 (0.92 at worst).

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
        """Positions of at least the ``k`` rows whose projections score best against ``query`` (float32,
        normalised), ascending."""
        torch = self._torch
        with self._lock:
            projected = self._projected
        if k >= len(projected):
            return np.arange(len(projected))
        q = torch.from_numpy(query).to(torch.bfloat16) @ self._basis
        # As a batch of one matrix product: torch's bfloat16 matrix-vector kernel took 2.5x as long at 64 columns
        # (20 ms against 8 ms a million rows on one thread here; the same products to the last bit). One thread:
        # the scan is bound by memory, and two measured no faster (15.5 ms against 14.5 with the selection).
        scores = np.asarray((projected.unsqueeze(0) @ q[:, None]).reshape(-1).float().numpy())
        return _best(scores, k)

    def _project(self, rows: np.ndarray) -> Any:
        torch = self._torch
        return torch.from_numpy(np.ascontiguousarray(rows).view(np.int16)).view(torch.bfloat16) @ self._basis


def _best(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions (ascending) of the ``k`` best scores and of any that tie the k-th's neighbourhood: everything
    above a threshold read from an even sample of the scores (one comparison per row, ~0.3 ms at a million, where
    a top-k took ~9 ms), then cut to the ``k`` best when the sample's threshold let too many through."""
    step = max(1, min(16, len(scores) // (8 * k)))
    sample = scores[::step]
    rank = min(len(sample) - 1, (5 * k) // (4 * step))  # a quarter more than k, for the sample's error
    threshold = np.partition(sample, len(sample) - 1 - rank)[len(sample) - 1 - rank]
    chosen = np.flatnonzero(scores >= threshold)
    if len(chosen) < k:  # the sample misjudged: take the k best exactly
        chosen = np.argpartition(scores, len(scores) - k)[len(scores) - k:]
    elif len(chosen) > 2 * k:
        chosen = chosen[np.argpartition(scores[chosen], len(chosen) - k)[len(chosen) - k:]]
    chosen.sort()
    return chosen
