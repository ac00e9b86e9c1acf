"""Experience carries its backend: a Triton session is served Triton experience before C experience of the same
family (and the other way round), and every item says which backend it came from."""

from __future__ import annotations

import pytest

from kope_mcp.experience.service import ExperienceService
from kope_mcp.targets.triton import triton_version

pytestmark = [pytest.mark.slow, pytest.mark.skipif(triton_version() is None, reason="triton is not installed")]

SAXPY_TRITON_NO_MASK = '''
import triton
import triton.language as tl


@triton.jit
def saxpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, alpha * tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


def kernel(alpha, x, y, out, n):
    saxpy_kernel[(triton.cdiv(n, 256),)](x, y, out, alpha, n, BLOCK=256)
'''
SAXPY_C_WRONG = """
#include <stdint.h>
void kernel(float alpha, const float *x, const float *y, float *out, int64_t n) {
    for (int64_t i = 0; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) out[i + k] = alpha * x[i + k] + y[i + k];
}
"""


@pytest.fixture(scope="module")
def served(workbench):
    ids = {}
    for backend, source, strategy in (("triton", SAXPY_TRITON_NO_MASK, "drop the tail mask for wide blocks"),
                                      ("c", SAXPY_C_WRONG, "unroll by 4 without a remainder loop")):
        compiled = workbench.compile_kernel("saxpy", source, backend=backend, strategy=strategy)
        assert compiled.ok, compiled.log
        report = workbench.run_tests(compiled.kernel_id)
        assert not report.passed
        ids[backend] = compiled.kernel_id
    return ids, ExperienceService(workbench.memory, workbench.tasks, workbench.target_hardware_key)


@pytest.mark.parametrize("backend, other", [("triton", "c"), ("c", "triton")])
def test_the_sessions_backend_ranks_its_own_experience_first(served, backend, other):
    ids, service = served
    answer = service.query_experience("what goes wrong with tails", task_id="vector_add", phase="optimize",
                                      backend=backend, token_budget=4000)
    items = {i.id: i for i in answer.items}
    assert ids[backend] in items and ids[other] in items
    assert items[ids[backend]].score > items[ids[other]].score
    assert items[ids[backend]].target == backend and items[ids[other]].target == other
    assert f"other backend ({other})" in items[ids[other]].why
    assert f"backend {backend}" in answer.context


def test_a_session_on_triton_infers_its_backend(served, workbench):
    ids, service = served
    session_id = workbench.store.attempt(ids["triton"]).session_id
    answer = service.query_experience("tails", session_id=session_id, token_budget=4000)
    assert "backend triton" in answer.context
    assert workbench.targets["triton"].hardware().key in answer.context
