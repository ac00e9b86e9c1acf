#include <stdint.h>

void kernel(const float *x, float *out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            s += x[r * cols + c];
        }
        out[r] = s / (float)cols;
    }
}
