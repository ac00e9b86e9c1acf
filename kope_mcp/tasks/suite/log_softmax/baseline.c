#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float m = xr[0];
        for (int64_t j = 1; j < cols; j++) {
            if (xr[j] > m) m = xr[j];
        }
        float s = 0.0f;
        for (int64_t j = 0; j < cols; j++) {
            s += expf(xr[j] - m);
        }
        float lse = m + logf(s);
        for (int64_t j = 0; j < cols; j++) {
            y[r * cols + j] = xr[j] - lse;
        }
    }
}
