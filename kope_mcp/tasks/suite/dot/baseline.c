#include <stdint.h>

void kernel(const float *x, const float *y, float *out, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        acc += x[i] * y[i];
    }
    out[0] = acc;
}
