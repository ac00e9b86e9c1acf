#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *out, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        s += x[i] * x[i];
    }
    out[0] = sqrtf(s);
}
