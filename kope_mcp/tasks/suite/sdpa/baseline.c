#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void kernel(const float *q, const float *k, const float *v, float *out,
            int64_t BH, int64_t Lq, int64_t Lk, int64_t D) {
    float *p = malloc((size_t)Lk * sizeof(float));
    float scale = 1.0f / sqrtf((float)D);
    for (int64_t b = 0; b < BH; b++) {
        for (int64_t i = 0; i < Lq; i++) {
            const float *qi = q + (b * Lq + i) * D;
            float m = -INFINITY;
            for (int64_t j = 0; j < Lk; j++) {
                float s = 0.0f;
                for (int64_t d = 0; d < D; d++) s += qi[d] * k[(b * Lk + j) * D + d];
                p[j] = s * scale;
                if (p[j] > m) m = p[j];
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < Lk; j++) {
                p[j] = expf(p[j] - m);
                sum += p[j];
            }
            for (int64_t d = 0; d < D; d++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < Lk; j++) acc += p[j] * v[(b * Lk + j) * D + d];
                out[(b * Lq + i) * D + d] = acc / sum;
            }
        }
    }
    free(p);
}
