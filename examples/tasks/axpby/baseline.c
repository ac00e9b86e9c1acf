#include <stdint.h>

void kernel(float alpha, float beta, const float *x, const float *y, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        out[i] = alpha * x[i] + beta * y[i];
    }
}
