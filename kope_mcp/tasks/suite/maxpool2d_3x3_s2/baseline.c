#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t C, int64_t H, int64_t W) {
    int64_t OH = (H - 1) / 2 + 1, OW = (W - 1) / 2 + 1;
    for (int64_t c = 0; c < C; c++) {
        for (int64_t i = 0; i < OH; i++) {
            for (int64_t j = 0; j < OW; j++) {
                float m = -INFINITY;
                for (int64_t h = 2 * i - 1; h <= 2 * i + 1; h++) {
                    for (int64_t w = 2 * j - 1; w <= 2 * j + 1; w++) {
                        if (h >= 0 && h < H && w >= 0 && w < W && x[(c * H + h) * W + w] > m) {
                            m = x[(c * H + h) * W + w];
                        }
                    }
                }
                y[(c * OH + i) * OW + j] = m;
            }
        }
    }
}
