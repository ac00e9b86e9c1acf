#include <math.h>
#include <stdint.h>

void kernel(float lo, float hi, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = v < lo ? lo : (v > hi ? hi : v);
    }
}
