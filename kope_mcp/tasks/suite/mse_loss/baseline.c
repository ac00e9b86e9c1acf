#include <stdint.h>

void kernel(const float *a, const float *b, float *out, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float d = a[i] - b[i];
        s += d * d;
    }
    out[0] = s / (float)n;
}
