#include <stdint.h>

__global__ void relu_kernel(const float *x, float *y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

extern "C" void kernel(const float *x, float *y, int64_t n) {
    const int threads = 256;
    relu_kernel<<<(unsigned)((n + threads - 1) / threads), threads>>>(x, y, n);
}
