#include <math.h>
#include <stdint.h>

void kernel(const float *a, const float *b, float *out, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (d < 1.0f) {
            s += 0.5f * d * d;
        } else {
            s += d - 0.5f;
        }
    }
    out[0] = s / (float)n;
}
