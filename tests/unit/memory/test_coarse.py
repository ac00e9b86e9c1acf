"""The coarse pass's choice of rows to score exactly: never fewer than the k best, whatever the sample saw."""

from __future__ import annotations

import numpy as np
import pytest

from kope_mcp.memory.coarse import _best


@pytest.mark.parametrize("rows, k", [(1_000_000, 8192), (200_000, 8192), (50_000, 8192), (9_000, 8192), (100, 7)])
def test_the_rows_chosen_hold_every_one_of_the_k_best(rows: int, k: int) -> None:
    rng = np.random.default_rng(rows)
    for scores in (rng.standard_normal(rows).astype(np.float32),
                   np.round(rng.standard_normal(rows), 1).astype(np.float32),  # many ties, as bfloat16 makes
                   np.sort(rng.standard_normal(rows)).astype(np.float32)):  # the best rows all at one end
        chosen = _best(scores, k)
        assert np.all(np.diff(chosen) > 0)
        assert k <= len(chosen) <= max(2 * k, rows if rows < 2 * k else 0)
        kth = np.sort(scores)[-k]
        assert set(np.flatnonzero(scores > kth)) <= set(chosen.tolist())


def test_a_sample_that_sees_few_of_the_best_rows_still_returns_them_all() -> None:
    scores = np.zeros(1_000_000, dtype=np.float32)
    best = np.arange(1, 1_000_000, 97)[:8192]  # off the sample's stride, so the sample sees only zeros above
    scores[best] = 1.0
    chosen = _best(scores, 8192)
    assert set(best.tolist()) <= set(chosen.tolist())
