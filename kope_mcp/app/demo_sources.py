"""The kernels `kope demo` submits: the task's naive baseline, a broken optimisation, then its fix; for the c
backend and, on a GPU (`kope demo --backend triton|cuda`), for Triton and CUDA."""

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

# Measured on an H200 at matmul 2048^3 (tools/device_check.py): 600 us against the naive Triton baseline's 2,716
# (4.52x, CI 4.42-4.61). input_precision="ieee": float32 is the contract, tl.dot's default TF32 fails it.
TRITON_TILED_MATMUL = '''
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :],
                    mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def kernel(A, B, C, M, N, K):
    grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
    matmul_kernel[grid](A, B, C, M, N, K, BM=64, BN=64, BK=32)
'''

CUDA_TILED_MATMUL = r'''
#include <stdint.h>
#define TILE 32

__global__ void matmul_tiled(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int64_t row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += TILE) {
        As[threadIdx.y][threadIdx.x] = (row < M && k0 + threadIdx.x < K) ? A[row * K + k0 + threadIdx.x] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (col < N && k0 + threadIdx.y < K) ? B[(k0 + threadIdx.y) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

extern "C" void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    dim3 threads(TILE, TILE), blocks((unsigned)((N + TILE - 1) / TILE), (unsigned)((M + TILE - 1) / TILE));
    matmul_tiled<<<blocks, threads>>>(A, B, C, M, N, K);
}
'''

TRITON_BROKEN_TILED_MATMUL = TRITON_TILED_MATMUL.replace("    rk = tl.arange(0, BK)\n", "")
# Measured there: 1,932 us against the naive CUDA baseline's 3,528 (1.82x, CI 1.81-1.83).
CUDA_BROKEN_TILED_MATMUL = CUDA_TILED_MATMUL.replace("    __shared__ float Bs[TILE][TILE];\n", "")
GPU_STRATEGIES = {
    "triton": "64x64 output tiles, K in steps of 32 through tl.dot (ieee float32), operands reused from registers",
    "cuda": "32x32 shared-memory tiles of A and B: each element loaded once per tile instead of once per product",
}
