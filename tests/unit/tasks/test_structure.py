"""The structure of the profiling inputs of sum-like reductions: every element counts, by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kope_mcp.services.catalogue import profile_inputs
from kope_mcp.tasks.drawn import draw_case
from kope_mcp.tasks.registry import TaskRegistry
from kope_mcp.tasks.structure import MIN_ELEMENTS, place_outliers, sparsify, support

REGISTRY = TaskRegistry.default()


def test_a_sparse_support_keeps_one_element_in_k_and_zeroes_the_rest():
    rng = np.random.default_rng(3)
    kept = support(1 << 16, 1024, rng)
    assert kept is not None and kept.size == 64 and np.all(np.diff(kept) > 0)
    a, b = rng.uniform(-1, 1, 1 << 16).astype(np.float32), rng.uniform(-1, 1, 1 << 16).astype(np.float32)
    before = a[kept].copy()
    sparsify([a, b], kept)
    assert np.array_equal(np.flatnonzero(a), kept) and np.array_equal(np.flatnonzero(b), kept)
    assert np.array_equal(a[kept], before)


def test_small_arrays_and_dense_cases_get_no_support():
    rng = np.random.default_rng(0)
    assert support(MIN_ELEMENTS - 1, 8, rng) is None
    assert support(1 << 20, 0, rng) is None


def test_outliers_land_on_the_support_with_the_sign_of_a_one_signed_range():
    rng = np.random.default_rng(5)
    arr = np.zeros(1 << 16, dtype=np.float32)
    kept = np.sort(rng.choice(arr.size, 64, replace=False))
    assert place_outliers(arr, 3, 1.0, rng, magnitude=100.0, kept=kept, sign=1.0)
    placed = np.flatnonzero(arr)
    assert placed.size == 3 and np.isin(placed, kept).all()
    assert np.all((arr[placed] >= 50) & (arr[placed] <= 200))


def test_mse_inputs_share_one_support_so_their_difference_is_sparse_too():
    task = REGISTRY.get("mse_loss")
    inputs = task.make_inputs({"n": 1 << 16}, seed=11, sparse=1024, outliers=1)
    a, b = inputs["a"], inputs["b"]
    assert np.count_nonzero(a) == 64 and np.array_equal(np.flatnonzero(a), np.flatnonzero(b))
    assert np.count_nonzero(a - b) <= 64


def test_a_positive_sum_keeps_a_positive_outlier():
    task = REGISTRY.get("sum_reduce")
    x = task.case_inputs(task.spec.profile.model_copy(update={"sizes": {"n": 1 << 20}}), seed=2)["x"]
    assert np.count_nonzero(x) == (1 << 20) // 1024
    assert x.min() >= 0 and x.max() >= 1024


@pytest.mark.parametrize("task_id", ["sum_reduce", "mse_loss", "l2_norm", "smooth_l1_loss"])
def test_the_case_drawn_near_the_profiling_size_carries_its_structure(task_id):
    spec = REGISTRY.get(task_id).spec
    drawn = draw_case(spec, seed=9)
    assert spec.profile.sparse == drawn.sparse == 1024 and drawn.outliers == spec.profile.outliers == 1
    assert "one element of 1024" in profile_inputs(spec.profile) and "outlier" in profile_inputs(spec.profile)


SUMS = {
    "sum_reduce": (lambda i: i["x"].astype(np.float64), lambda s, n: s),
    "mse_loss": (lambda i: (i["a"].astype(np.float64) - i["b"].astype(np.float64)) ** 2, lambda s, n: s / n),
}


@pytest.mark.parametrize("task_id", list(SUMS))
def test_at_the_profiling_size_an_honest_float32_sum_passes_and_a_three_quarter_sample_fails_in_every_draw(task_id):
    task = REGISTRY.get(task_id)
    terms, finish = SUMS[task_id]
    tolerance = task.spec.tolerance_for(task.spec.profile)["float32"]
    for seed in range(3):
        inputs = task.case_inputs(task.spec.profile, seed=seed)
        values = terms(inputs)
        n = values.size
        exact = finish(math.fsum(values[values != 0].tolist()), n)
        allowed = tolerance.atol + tolerance.rtol * abs(exact)
        serial = finish(float(np.cumsum(values.astype(np.float32), dtype=np.float32)[-1]), n)
        assert abs(serial - exact) <= allowed / 4, (seed, serial, exact)
        for head in (3 * n // 4, 7 * n // 8):
            sampled = finish(math.fsum(values[:head][values[:head] != 0].tolist()) * n / head, n)
            assert abs(sampled - exact) > 10 * allowed, (seed, head, sampled, exact)
