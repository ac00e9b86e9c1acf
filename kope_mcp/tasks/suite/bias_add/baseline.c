#include <stdint.h>

void kernel(const float *x, const float *bias, float *y, int64_t rows, int64_t cols) {
    for (int64_t c = 0; c < cols; c++) {
        for (int64_t r = 0; r < rows; r++) {
            y[r * cols + c] = x[r * cols + c] + bias[c];
        }
    }
}
