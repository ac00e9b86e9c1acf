#include <stdint.h>

void kernel(const float *x, const float *w, float *y, int64_t C, int64_t F, int64_t L, int64_t K) {
    int64_t OL = L - K + 1;
    for (int64_t f = 0; f < F; f++) {
        for (int64_t t = 0; t < OL; t++) {
            float s = 0.0f;
            for (int64_t c = 0; c < C; c++) {
                for (int64_t k = 0; k < K; k++) {
                    s += x[c * L + t + k] * w[(f * C + c) * K + k];
                }
            }
            y[f * OL + t] = s;
        }
    }
}
