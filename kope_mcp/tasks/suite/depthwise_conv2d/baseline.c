#include <stdint.h>

void kernel(const float *x, const float *w, float *y, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW) {
    int64_t OH = H - KH + 1, OW = W - KW + 1;
    for (int64_t c = 0; c < C; c++) {
        for (int64_t i = 0; i < OH; i++) {
            for (int64_t j = 0; j < OW; j++) {
                float s = 0.0f;
                for (int64_t p = 0; p < KH; p++) {
                    for (int64_t q = 0; q < KW; q++) {
                        s += x[(c * H + i + p) * W + j + q] * w[(c * KH + p) * KW + q];
                    }
                }
                y[(c * OH + i) * OW + j] = s;
            }
        }
    }
}
