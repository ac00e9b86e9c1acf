"""Variants of an input set (kope_mcp/runtime/variants.py): what the harness writes is what the server rebuilds."""

from __future__ import annotations

import itertools

import numpy as np

from kope_mcp.runtime import variants


def test_the_server_rebuilds_a_variant_bit_for_bit_from_the_set_the_variant_and_the_seed():
    rng = np.random.default_rng(3)
    inputs = {"x": rng.uniform(-1, 1, 1001).astype(np.float32), "idx": np.arange(7, dtype=np.int64)}
    u = variants.noise(42, "x", 1001)
    dest = np.empty_like(inputs["x"])
    variants.vary_into(dest, inputs["x"], u, 123456789012345)  # as a harness worker does, in place
    rebuilt = variants.varied(inputs, 123456789012345, 42)
    assert rebuilt["x"].tobytes() == dest.tobytes()
    assert rebuilt["idx"] is inputs["idx"]  # integers are indices or labels: never changed


def test_every_element_changes_keeps_its_sign_and_never_grows():
    x = np.linspace(-5, 5, 4096, dtype=np.float32)
    out = variants.varied({"x": x}, 987654321987, 7)["x"]
    nonzero = x != 0
    ratio = out[nonzero] / x[nonzero]
    assert (ratio >= 0.5 - 1e-6).all() and (ratio < 1.0).all()
    assert (out[~nonzero] == 0).all()
    assert np.count_nonzero(out == x) <= 2


def test_different_variants_move_a_sum_by_more_than_a_reductions_tolerance():
    x = np.random.default_rng(5).uniform(0, 1, 1 << 20).astype(np.float32)
    drawn = np.random.default_rng(6).integers(1, 1 << 62, 40)  # as the protocol draws them
    sums = [float(variants.varied({"x": x}, int(v), 11)["x"].sum(dtype=np.float64)) for v in drawn]
    # The offset s moves the sum by up to +-17%, far past a reduction's profile tolerance (5e-4).
    assert max(sums) / min(sums) > 1.2
    ordered = sorted(sums)
    assert sum(b / a - 1 < 5e-4 for a, b in itertools.pairwise(ordered)) <= 2
