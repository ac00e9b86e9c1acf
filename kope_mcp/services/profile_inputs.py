"""The input sets a profile times: drawn fresh for every profile from a secret seed, as many as memory and the
reference's time allow, each with its reference outputs.

Why so many, and why fresh: a kernel that keeps results keyed by the content of its inputs replays them whenever
an input set comes round again (with the two fixed sets of old it measured 196-321x on matmul, and 3-6x when
throttled to recompute a third of the rows). The harness times each set at most once while the pool lasts (see
measurement.SetStream), so such a cache has nothing to replay; where the sets are too large to draw more than
a few (16M-element reductions), every repeated call is checked against the first result on its set. The seed is
drawn per profile and never published, so no expected output can be learnt from one profile (a failure message
shows an expected value) and used in the next.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kope_mcp.runtime.variants import varied
from kope_mcp.services.references import PoolRule, ReferenceRunner
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase
from kope_mcp.tasks.loader import Task

#: Inputs and outputs of all sets together, in each implementation's memory.
POOL_BYTES = 64 * 1024**2
MIN_SETS, MAX_SETS = 2, 64
#: The reference's CPU time for all sets (it runs in the server before the measurement; CPU time, so load does not
#: shrink the pool).
REFERENCE_BUDGET_S = 1.5
#: On a GPU the sets fill the device (tens to hundreds of MiB each) and live in device memory while timed; the
#: float64 reference still runs on the host, so its budget is what bounds the pool (matmul 2048^3: ~0.1-0.3 s a set).
GPU_POOL_BYTES = 1024**3
GPU_REFERENCE_BUDGET_S = 4.0


@dataclass(frozen=True)
class ProfileInputs:
    sets: list[PreparedCase]
    expected: list[list[np.ndarray]]
    reference_seconds: float


def set_bytes(task: Task, inputs: dict[str, np.ndarray], sizes: dict[str, int]) -> int:
    outputs = sum(int(np.prod(task.spec.shape_of(a, sizes))) * np.dtype(a.dtype).itemsize for a in task.outputs())
    return sum(a.nbytes for a in inputs.values()) + outputs


def pool_rule(device_class: str) -> PoolRule:
    """How many sets a profile on this device class may draw: by memory, and by the reference's time."""
    if device_class == "gpu":
        return PoolRule(MIN_SETS, MAX_SETS, GPU_POOL_BYTES, GPU_REFERENCE_BUDGET_S)
    return PoolRule(MIN_SETS, MAX_SETS, POOL_BYTES, REFERENCE_BUDGET_S)


def pool_size(one_set_bytes: int, reference_s: float, device_class: str = "cpu") -> int:
    rule = pool_rule(device_class)
    by_memory = rule.pool_bytes // max(1, one_set_bytes)
    by_time = int(rule.time_budget_s / max(reference_s, 1e-6))
    return max(rule.min, min(rule.max, by_memory, by_time))


def draw_profile_inputs(task: Task, references: ReferenceRunner, device_class: str = "cpu") -> ProfileInputs:
    """The pool for one profile at the profiling size of ``device_class`` ("cpu" or "gpu")."""
    profile = task.spec.profile_for(device_class)
    seed = secrets.randbits(63)
    start = time.perf_counter()
    if not task.trusted:  # the task's own code: the sandbox draws the pool by the same rule
        made = references.pool(task, profile, seed, pool_rule(device_class))
        return ProfileInputs([PreparedCase(f"{profile.name}#{i}", profile.sizes, data.inputs)
                              for i, data in enumerate(made)], [data.expected for data in made],
                             time.perf_counter() - start)
    sets: list[PreparedCase] = []
    expected: list[list[np.ndarray]] = []
    count = MIN_SETS
    while len(sets) < count:
        inputs = task.case_inputs(profile, seed + len(sets))
        # CPU time, not wall time: on a busy machine the wall clock shrank the pool to 2 sets for 47 of 53 tasks
        # (load ~10), and a cache keyed by content then replays from the second round.
        t0 = time.thread_time()
        expected.append(task.run_reference(inputs, profile.sizes))
        if not sets:
            count = pool_size(set_bytes(task, inputs, profile.sizes), time.thread_time() - t0, device_class)
        sets.append(PreparedCase(f"{profile.name}#{len(sets)}", profile.sizes, inputs))
    return ProfileInputs(sets, expected, time.perf_counter() - start)


def variant_references(task: Task, outcome: HarnessOutcome,
                       sets: list[PreparedCase]) -> Iterator[tuple[PreparedCase, list[np.ndarray]]]:
    """The variant calls a profile kept (runtime/variants.py), each with its inputs rebuilt from the set, the
    variant and the profile's seed, and the float64 reference on them: what the candidate's outputs of those calls
    are judged against. Only a trusted task's (the server runs its reference here); none otherwise. Made one at a
    time as the judge asks (each is a set's size again, with a float64 reference: vector_add's ~0.25 GB)."""
    if outcome.variant_seed is None or not outcome.variants or not task.trusted:
        return
    for index, variant in outcome.variants:
        case = sets[index]
        inputs = varied(case.inputs, variant, outcome.variant_seed)
        yield (PreparedCase(f"{case.name}~{variant:x}", case.sizes, inputs), task.run_reference(inputs, case.sizes))
