#include <math.h>
#include <stdint.h>

void kernel(const float *x, const float *gamma, const float *beta, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float mean = 0.0f;
        for (int64_t j = 0; j < cols; j++) mean += xr[j];
        mean /= (float)cols;
        float var = 0.0f;
        for (int64_t j = 0; j < cols; j++) {
            float d = xr[j] - mean;
            var += d * d;
        }
        var /= (float)cols;
        float inv = 1.0f / sqrtf(var + 1e-5f);
        for (int64_t j = 0; j < cols; j++) {
            yr[j] = (xr[j] - mean) * inv * gamma[j] + beta[j];
        }
    }
}
