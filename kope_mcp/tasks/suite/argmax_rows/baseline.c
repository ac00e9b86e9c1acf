#include <stdint.h>

void kernel(const float *x, int64_t *out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        int64_t best = 0;
        for (int64_t c = 1; c < cols; c++) {
            if (xr[c] > xr[best]) best = c;
        }
        out[r] = best;
    }
}
