#include <stdint.h>

void kernel(const float *x, float *out, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        acc += x[i];
    }
    out[0] = acc;
}
