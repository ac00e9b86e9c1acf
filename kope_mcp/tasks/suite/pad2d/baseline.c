#include <stdint.h>

void kernel(const float *x, float *out, int64_t C, int64_t H, int64_t W, int64_t pad) {
    int64_t OH = H + 2 * pad, OW = W + 2 * pad;
    for (int64_t c = 0; c < C; c++) {
        for (int64_t w = 0; w < OW; w++) {
            for (int64_t h = 0; h < OH; h++) {
                int64_t ih = h - pad, iw = w - pad;
                out[(c * OH + h) * OW + w] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[(c * H + ih) * W + iw] : 0.0f;
            }
        }
    }
}
