#include <math.h>
#include <stdint.h>

void kernel(const float *x, const float *gamma, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        float ss = 0.0f;
        for (int64_t j = 0; j < cols; j++) {
            ss += x[r * cols + j] * x[r * cols + j];
        }
        float scale = 1.0f / sqrtf(ss / (float)cols + 1e-6f);
        for (int64_t j = 0; j < cols; j++) {
            y[r * cols + j] = x[r * cols + j] * scale * gamma[j];
        }
    }
}
