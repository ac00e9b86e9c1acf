"""Judge a kernel's outputs against the reference: tolerance, NaN poison, unchanged inputs."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kope_mcp.models import CaseResult, FailureKind
from kope_mcp.runtime.harness import POISON_BITS
from kope_mcp.tasks.spec import Tolerance


def _poisoned(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.float32:
        return arr.view(np.uint32) == POISON_BITS
    return np.zeros(arr.shape, dtype=bool)


# Outputs are compared this many elements at a time: the float64 copies and masks of a 16M-element output took
# ~0.7 GB at once (a profile's judging peaked 0.6 GB above its measurement); a chunk's take 8 MiB each.
CHUNK = 1 << 20

Comparison = tuple[int, int, int, float | None, float | None, int | None, float | None, float | None]


def compare_output(name: str, got: np.ndarray, expected: np.ndarray, tol: Tolerance,
                   chunk: int = CHUNK) -> Comparison:
    """mismatches, unwritten, non-finite, max abs, max rel, first bad index, expected and got there."""
    flat_got, exp = got.reshape(-1), expected.reshape(-1)
    if flat_got.size != exp.size:
        raise ValueError(f"{name}: {flat_got.size} elements against {exp.size} expected")
    mismatches = unwritten = nonfinite = 0
    max_abs: float | None = None
    max_rel: float | None = None
    first: int | None = None
    exp_at: float | None = None
    got_at: float | None = None
    for start in range(0, max(exp.size, 1), chunk):
        bad, blank, odd, part_abs, part_rel, part_first, part_exp, part_got = _compare_chunk(
            flat_got[start:start + chunk], exp[start:start + chunk], tol)
        mismatches, unwritten, nonfinite = mismatches + bad, unwritten + blank, nonfinite + odd
        max_abs, max_rel = _max(max_abs, part_abs), _max(max_rel, part_rel)
        if first is None and part_first is not None:
            first, exp_at, got_at = start + part_first, part_exp, part_got
    return mismatches, unwritten, nonfinite, max_abs, max_rel, first, exp_at, got_at


def _compare_chunk(flat_got: np.ndarray, exp: np.ndarray, tol: Tolerance) -> Comparison:
    got64 = flat_got.astype(np.float64)
    if exp.dtype == np.float64 and np.isfinite(got64).all() and np.isfinite(exp).all():
        return _compare_finite(got64, exp, tol)
    return _compare_general(flat_got, got64, exp, tol)


def _compare_general(flat_got: np.ndarray, got64: np.ndarray, exp: np.ndarray, tol: Tolerance
                     ) -> tuple[int, int, int, float | None, float | None, int | None, float | None, float | None]:
    unwritten = _poisoned(flat_got)
    finite = np.isfinite(got64)
    exp_finite = np.isfinite(exp)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got64 - exp)
    within = np.zeros(exp.shape, dtype=bool)
    both = finite & exp_finite
    within[both] = err[both] <= tol.atol + tol.rtol * np.abs(exp[both])
    # A non-finite expected value is matched only by the same non-finite value.
    same_special = ~exp_finite & ((np.isnan(exp) & np.isnan(got64)) | (got64 == exp))
    within |= same_special
    bad = ~within
    nonfinite = int(np.count_nonzero(~finite & exp_finite & ~unwritten))
    max_abs = float(err[both].max()) if both.any() else None
    rel_mask = both & (np.abs(exp) > 0)
    max_rel = float((err[rel_mask] / np.abs(exp[rel_mask])).max()) if rel_mask.any() else None
    first = int(np.argmax(bad)) if bad.any() else None
    exp_at = float(exp[first]) if first is not None and np.isfinite(exp[first]) else None
    got_at = float(got64[first]) if first is not None and np.isfinite(got64[first]) else None
    return int(bad.sum()), int(unwritten.sum()), nonfinite, max_abs, max_rel, first, exp_at, got_at


def _compare_finite(got64: np.ndarray, exp: np.ndarray, tol: Tolerance
                    ) -> tuple[int, int, int, float | None, float | None, int | None, float | None, float | None]:
    """compare_output when every value is finite (the usual case, and nothing was left poisoned: poison is a
    NaN): the same figures without the masks and masked copies, which cost ~3x on 16M-element outputs."""
    if not exp.size:
        return 0, 0, 0, None, None, None, None, None
    abs_exp = np.abs(exp)
    err = np.abs(got64 - exp)
    bad = err > tol.atol + tol.rtol * abs_exp
    rel = np.divide(err, abs_exp, out=np.zeros_like(err), where=abs_exp > 0)
    mismatches = int(np.count_nonzero(bad))
    first = int(np.argmax(bad)) if mismatches else None
    return (mismatches, 0, 0, float(err.max()), float(rel.max()) if (abs_exp > 0).any() else None, first,
            float(exp[first]) if first is not None else None, float(got64[first]) if first is not None else None)


def judge_case(
    name: str,
    sizes: dict[str, int],
    outputs: dict[str, np.ndarray],
    expected: list[np.ndarray],
    output_names: list[str],
    tolerances: Mapping[str, Tolerance],
    inputs_modified: list[str],
    out_of_bounds: list[str] | None = None,
) -> tuple[CaseResult, FailureKind | None]:
    result = CaseResult(name=name, sizes=sizes, passed=True, inputs_modified=inputs_modified,
                        out_of_bounds=list(out_of_bounds or []))
    failure: FailureKind | None = ("out_of_bounds_write" if out_of_bounds else
                                   "input_modified" if inputs_modified else None)
    nonfinite_total = 0
    for out_name, exp in zip(output_names, expected, strict=True):
        got = outputs[out_name]
        if got.size != exp.size:
            result.passed = False
            return result, "wrong_shape"
        mism, unwritten, nonfinite, max_abs, max_rel, first, exp_at, got_at = compare_output(
            out_name, got, exp, tolerances[str(got.dtype)]
        )
        nonfinite_total += nonfinite
        result.mismatches += mism
        result.unwritten += unwritten
        result.max_abs_error = _max(result.max_abs_error, max_abs)
        result.max_rel_error = _max(result.max_rel_error, max_rel)
        if first is not None and result.first_bad_index is None:
            result.first_bad_index, result.first_bad_output = first, out_name
            result.expected, result.got = exp_at, got_at
    if result.mismatches or inputs_modified or out_of_bounds:
        result.passed = False
        if failure is None:
            failure = "nan" if nonfinite_total and nonfinite_total >= result.mismatches - result.unwritten \
                else "mismatch"
    return result, failure


def merge_seeds(runs: list[CaseResult]) -> CaseResult:
    """One line per case: the worst of its seeds (the first failing seed supplies the bad index)."""
    merged = runs[0].model_copy(deep=True)
    for other in runs[1:]:
        merged.max_abs_error = _max(merged.max_abs_error, other.max_abs_error)
        merged.max_rel_error = _max(merged.max_rel_error, other.max_rel_error)
        merged.mismatches = max(merged.mismatches, other.mismatches)
        merged.unwritten = max(merged.unwritten, other.unwritten)
        merged.inputs_modified = sorted(set(merged.inputs_modified) | set(other.inputs_modified))
        merged.out_of_bounds = list(dict.fromkeys([*merged.out_of_bounds, *other.out_of_bounds]))
        if merged.passed and not other.passed:
            merged.first_bad_index, merged.first_bad_output = other.first_bad_index, other.first_bad_output
            merged.expected, merged.got = other.expected, other.got
        merged.passed = merged.passed and other.passed
    return merged


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)
