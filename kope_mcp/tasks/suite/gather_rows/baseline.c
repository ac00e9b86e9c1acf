#include <stdint.h>

void kernel(const float *table, const int64_t *idx, float *out, int64_t V, int64_t D, int64_t n) {
    for (int64_t d = 0; d < D; d++) {
        for (int64_t i = 0; i < n; i++) {
            out[i * D + d] = table[idx[i] * D + d];
        }
    }
}
