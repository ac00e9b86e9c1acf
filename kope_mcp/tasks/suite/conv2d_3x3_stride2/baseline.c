#include <stdint.h>

void kernel(const float *x, const float *w, float *y, int64_t C, int64_t F, int64_t H, int64_t W) {
    int64_t OH = (H - 1) / 2 + 1, OW = (W - 1) / 2 + 1;
    for (int64_t f = 0; f < F; f++) {
        for (int64_t i = 0; i < OH; i++) {
            for (int64_t j = 0; j < OW; j++) {
                float s = 0.0f;
                for (int64_t c = 0; c < C; c++) {
                    for (int64_t p = 0; p < 3; p++) {
                        int64_t h = 2 * i + p - 1;
                        if (h < 0 || h >= H) continue;
                        for (int64_t q = 0; q < 3; q++) {
                            int64_t v = 2 * j + q - 1;
                            if (v < 0 || v >= W) continue;
                            s += x[(c * H + h) * W + v] * w[((f * C + c) * 3 + p) * 3 + q];
                        }
                    }
                }
                y[(f * OH + i) * OW + j] = s;
            }
        }
    }
}
