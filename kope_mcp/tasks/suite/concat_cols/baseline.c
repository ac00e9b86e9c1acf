#include <stdint.h>

void kernel(const float *a, const float *b, float *out, int64_t rows, int64_t ca, int64_t cb) {
    int64_t cols = ca + cb;
    for (int64_t j = 0; j < cols; j++) {
        for (int64_t r = 0; r < rows; r++) {
            out[r * cols + j] = j < ca ? a[r * ca + j] : b[r * cb + j - ca];
        }
    }
}
