#include <stdint.h>

void kernel(const float *x, float *y, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        acc += x[i];
        y[i] = acc;
    }
}
