#include <stdint.h>
#include <math.h>

// One thread per row: three passes (max, sum of exp, write).
__global__ void softmax_kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; c++) m = fmaxf(m, xr[c]);
    float s = 0.0f;
    for (int64_t c = 0; c < cols; c++) s += expf(xr[c] - m);
    for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) / s;
}

extern "C" void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    const int threads = 128;
    softmax_kernel<<<(unsigned)((rows + threads - 1) / threads), threads>>>(x, y, rows, cols);
}
