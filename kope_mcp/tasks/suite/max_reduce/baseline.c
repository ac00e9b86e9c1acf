#include <stdint.h>

void kernel(const float *x, float *out, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > m) m = x[i];
    }
    out[0] = m;
}
