#include <stdint.h>

void kernel(const float *x, float *out, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < cols; j++) {
            out[j * rows + i] = x[i * cols + j];
        }
    }
}
