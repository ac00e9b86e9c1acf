"""The forgeries of issue 24 against a target that is not C: the contract tests' pure-Python fake, which shares
nothing with the C harness but the measurement protocol (kope_mcp/runtime/measurement.py) and the workbench. Each is
caught or gains nothing there too, so a new target that implements the primitives inherits the defence.
(The same classes against C, in the sandbox: test_forgeries.py and test_tricks.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kope_mcp.services.workbench import Workbench
from kope_mcp.targets.registry import load_targets
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import make_settings
from tests.fake_target import NUMPY_BASELINES, FakeNumpyTarget

# Results kept by a (sampled) hash of the inputs, with room for every set a profile could ever draw.
CONTENT_CACHE = """import numpy as np
cache = {}

def kernel(A, B, C, M, N, K):
    key = (A.ravel()[::97].tobytes(), B.ravel()[::97].tobytes(), M, N, K)
    if key in cache:
        np.copyto(C, cache[key])
        return
    np.matmul(A, B, out=C)
    cache[key] = C.copy()
"""
# Tells the timed run by its repetition (tests call each shape a few times, a profile one shape again and again):
# exact on the first four calls at a shape, a rank-one guess after.
EXACT_WHILE_WATCHED = """import numpy as np
seen = {}

def kernel(A, B, C, M, N, K):
    seen[M, N, K] = seen.get((M, N, K), 0) + 1
    if seen[M, N, K] <= 4:
        np.matmul(A, B, out=C)
    else:
        C[...] = A[:, :1] * B[:1, :]
"""
EVERY_8TH = """import numpy as np

def kernel(a, b, out, n):
    d = a[::8].astype(np.float64) - b[::8]
    out[0] = np.dot(d, d) / len(d)
"""
TRICK_PAYS = 1.5


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, registry: TaskRegistry) -> Iterator[Workbench]:
    settings = make_settings(tmp_path_factory.mktemp("protocol-home"))
    workbench = Workbench(settings, registry, targets=load_targets(settings, extra=[FakeNumpyTarget]))
    yield workbench
    workbench.store.close()


def test_a_content_keyed_cache_has_nothing_to_replay_on_a_target_that_is_not_c(bench):
    compiled = bench.compile_kernel("matmul", CONTENT_CACHE, backend="fake", strategy="forgery: content cache")
    assert bench.run_tests(compiled.kernel_id).passed
    profiled = bench.profile_kernel(compiled.kernel_id)
    assert profiled.failure is None, profiled.message
    # Fresh sets, each timed once by the protocol: the cache never hits, whatever its size.
    assert profiled.repeated_calls == 0 and profiled.checked_input_sets >= 8, profiled
    assert (profiled.speedup_vs_baseline or 0) < TRICK_PAYS, profiled
    assert bench.store.attempt(compiled.kernel_id).label != "effective"


def test_every_timed_call_is_judged_so_exact_only_while_watched_is_wrong_on_a_target_that_is_not_c(bench):
    compiled = bench.compile_kernel("matmul", EXACT_WHILE_WATCHED, backend="fake", strategy="forgery: watched")
    assert bench.run_tests(compiled.kernel_id).passed
    profiled = bench.profile_kernel(compiled.kernel_id)
    assert profiled.failure == "wrong_at_profile_size", profiled
    assert bench.store.attempt(compiled.kernel_id).label == "incorrect"


def test_a_reduction_over_a_subsample_fails_the_drawn_case_on_a_target_that_is_not_c(bench):
    assert "mse_loss" in NUMPY_BASELINES
    compiled = bench.compile_kernel("mse_loss", EVERY_8TH, backend="fake", strategy="forgery: every 8th")
    tested = bench.run_tests(compiled.kernel_id)
    assert not tested.passed and tested.failure == "mismatch", tested.message
    assert any(c.name.startswith("drawn_") and not c.passed for c in tested.cases)


def test_the_fakes_own_baselines_pass_the_protocol(bench):
    for task_id in ("matmul", "mse_loss"):
        compiled = bench.compile_kernel(task_id, NUMPY_BASELINES[task_id], backend="fake")
        assert bench.run_tests(compiled.kernel_id).passed
        profiled = bench.profile_kernel(compiled.kernel_id)
        assert profiled.failure is None, profiled.message
        # The contract knows its own baseline's source on any target: under load the fake's baseline measured
        # "effective" against itself once (a noisy profile whose CI still cleared 1.05).
        assert profiled.same_code_as_baseline
        assert bench.store.attempt(compiled.kernel_id).label != "effective"
