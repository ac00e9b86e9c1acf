#include <stdint.h>

// One thread per element of C, reading a row of A and a column of B straight from global memory.
__global__ void matmul_kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    int64_t i = blockIdx.y * (int64_t)blockDim.y + threadIdx.y;
    int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= M || j >= N) return;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
    C[i * N + j] = acc;
}

extern "C" void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    dim3 threads(16, 16);
    dim3 blocks((unsigned)((N + 15) / 16), (unsigned)((M + 15) / 16));
    matmul_kernel<<<blocks, threads>>>(A, B, C, M, N, K);
}
