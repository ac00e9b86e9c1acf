#include <stdint.h>

__global__ void add_kernel(const float *a, const float *b, float *out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

extern "C" void kernel(const float *a, const float *b, float *out, int64_t n) {
    const int threads = 256;
    add_kernel<<<(unsigned)((n + threads - 1) / threads), threads>>>(a, b, out, n);
}
