#include <math.h>
#include <stdint.h>

void kernel(const float *logits, const int64_t *target, float *out, int64_t N, int64_t C) {
    float total = 0.0f;
    for (int64_t i = 0; i < N; i++) {
        const float *z = logits + i * C;
        float m = z[0];
        for (int64_t c = 1; c < C; c++) {
            if (z[c] > m) m = z[c];
        }
        float s = 0.0f;
        for (int64_t c = 0; c < C; c++) {
            s += expf(z[c] - m);
        }
        total += m + logf(s) - z[target[i]];
    }
    out[0] = total / (float)N;
}
