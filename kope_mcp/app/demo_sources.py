"""The kernels `kope demo` submits: the task's naive baseline, a broken optimisation, then its fix."""

from __future__ import annotations

DEMO_TASK = "matmul"

# The i-k-j loop order streams rows of B and C, so the inner loop is contiguous and vectorises.
# The broken version forgets to declare the row pointer it uses (a typical slip when rewriting loops).
_FAST_TEMPLATE = """\
#include <stdint.h>
#include <string.h>

void kernel(const float *restrict A, const float *restrict B, float *restrict C,
            int64_t M, int64_t N, int64_t K) {
    memset(C, 0, (size_t)M * (size_t)N * sizeof(float));
    for (int64_t i = 0; i < M; i++) {
        float *restrict crow = C + i * N;
        for (int64_t k = 0; k < K; k++) {
            const float a = A[i * K + k];
%s
            for (int64_t j = 0; j < N; j++) {
                crow[j] += a * brow[j];
            }
        }
    }
}
"""
BROKEN_FAST_KERNEL = _FAST_TEMPLATE % "            /* row k of B */"
FAST_KERNEL = _FAST_TEMPLATE % "            const float *restrict brow = B + k * N;"
FAST_FLAGS = ["-O3", "-march=native"]
FAST_STRATEGY = "loop interchange i-k-j (contiguous inner loop) + restrict + -O3 -march=native vectorisation"
