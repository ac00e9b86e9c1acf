import numpy as np

from kope_mcp.harness import POISON_BITS
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
