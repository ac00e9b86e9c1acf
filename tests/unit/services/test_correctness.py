import numpy as np
import pytest

from kope_mcp.runtime.harness import POISON_BITS
from kope_mcp.services.correctness import judge_case, merge_seeds
from kope_mcp.tasks.spec import Tolerance

TOL = {"float32": Tolerance(atol=1e-5, rtol=1e-5)}


def judge(got, expected, modified=()):
    return judge_case("c", {"n": got.size}, {"y": got}, [expected], ["y"], TOL, list(modified))


def test_values_within_atol_plus_rtol_pass():
    exp = np.array([1.0, 100.0, 0.0])
    result, failure = judge(np.array([1.0 + 1e-6, 100.0 + 1e-3, 5e-6], dtype=np.float32), exp)
    assert result.passed and failure is None


def test_poisoned_elements_count_as_unwritten_mismatches():
    got = np.zeros(4, dtype=np.float32)
    got.view(np.uint32)[2:] = POISON_BITS
    result, failure = judge(got, np.zeros(4))
    assert failure == "mismatch" and result.unwritten == 2 and result.first_bad_index == 2 and result.got is None


def test_kernel_made_nan_is_nan_not_mismatch():
    result, failure = judge(np.array([0.0, np.nan], dtype=np.float32), np.zeros(2))
    assert failure == "nan" and result.mismatches == 1


def test_expected_infinity_is_matched_only_by_the_same_infinity():
    exp = np.array([np.inf, 1.0])
    assert judge(np.array([np.inf, 1.0], dtype=np.float32), exp)[0].passed
    assert not judge(np.array([1e30, 1.0], dtype=np.float32), exp)[0].passed


def test_modified_inputs_fail_even_with_right_outputs():
    result, failure = judge(np.zeros(2, dtype=np.float32), np.zeros(2), modified=["x"])
    assert failure == "input_modified" and not result.passed


def test_merging_seeds_keeps_the_worst():
    good, _ = judge(np.zeros(3, dtype=np.float32), np.zeros(3))
    bad, _ = judge(np.array([0, 0, 1], dtype=np.float32), np.zeros(3))
    merged = merge_seeds([good, bad])
    assert not merged.passed and merged.first_bad_index == 2 and merged.max_abs_error == 1.0


def test_the_finite_fast_path_gives_the_same_figures_as_the_general_comparison():
    from kope_mcp.services.correctness import _compare_finite, _compare_general

    rng = np.random.default_rng(3)
    exp = rng.standard_normal(10_000)
    exp[[4, 50]] = 0.0
    got = (exp * (1 + rng.standard_normal(exp.size) * 1e-7)).astype(np.float32)
    got[[7, 50, 9_999]] = [5.0, 1e-3, -2.0]
    tol = Tolerance(atol=1e-5, rtol=1e-5)
    got64 = got.astype(np.float64)
    assert _compare_finite(got64, exp, tol) == _compare_general(got, got64, exp, tol)
    assert _compare_finite(got64, exp, tol)[0] == 3
    same = exp.astype(np.float32)
    assert _compare_finite(same.astype(np.float64), exp, tol) == _compare_general(same, same.astype(np.float64),
                                                                                  exp, tol)


def test_the_consistency_check_compares_bit_for_bit_first_and_still_catches_a_changed_result():
    from kope_mcp.runtime.measurement import Consistency

    first = np.arange(1000, dtype=np.float32)
    checks = Consistency(atol=1e-5, rtol=1e-5)
    checks.check(0, {"y": first}, 0)
    checks.check(0, {"y": first.copy()}, 1)
    assert checks.bad_calls == 0
    changed = first.copy()
    changed[10] = np.nan
    checks.check(0, {"y": changed}, 2)
    assert checks.bad_calls == 1 and "y[10]" in (checks.first_problem or "")
    close = first + 1e-9
    checks.check(0, {"y": close}, 3)
    assert checks.bad_calls == 1  # within tolerance but not bitwise: isclose decides


@pytest.mark.parametrize("seed", range(6))
def test_comparing_in_chunks_gives_exactly_what_one_pass_gives(seed):
    from kope_mcp.services.correctness import compare_output

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    expected = rng.standard_normal(n)
    got = expected.astype(np.float32)
    for _ in range(int(rng.integers(0, 6))):  # wrong values, NaN, inf and poison, anywhere (chunk edges included)
        i = int(rng.integers(0, n))
        got[i] = rng.choice([np.float32(7.0), np.float32(np.nan), np.float32(np.inf), np.float32(0.0)])
    if seed % 2 and n > 3:
        got.view(np.uint32)[n // 2] = POISON_BITS
        expected[n // 3] = np.nan
    tol = Tolerance(atol=1e-5, rtol=1e-5)
    whole = compare_output("y", got, expected, tol, chunk=n + 1)
    for chunk in (1, 7, 64, 1000):
        assert compare_output("y", got, expected, tol, chunk=chunk) == whole, chunk
