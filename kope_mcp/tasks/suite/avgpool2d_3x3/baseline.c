#include <stdint.h>

void kernel(const float *x, float *y, int64_t C, int64_t H, int64_t W) {
    for (int64_t c = 0; c < C; c++) {
        for (int64_t i = 0; i < H; i++) {
            for (int64_t j = 0; j < W; j++) {
                float s = 0.0f;
                for (int64_t p = -1; p <= 1; p++) {
                    for (int64_t q = -1; q <= 1; q++) {
                        int64_t h = i + p, w = j + q;
                        if (h >= 0 && h < H && w >= 0 && w < W) s += x[(c * H + h) * W + w];
                    }
                }
                y[(c * H + i) * W + j] = s / 9.0f;
            }
        }
    }
}
