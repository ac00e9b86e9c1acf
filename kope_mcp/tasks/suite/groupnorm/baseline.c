#include <math.h>
#include <stdint.h>

void kernel(const float *x, const float *gamma, const float *beta, float *y,
            int64_t N, int64_t G, int64_t CG, int64_t HW) {
    int64_t C = G * CG;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * C + g * CG) * HW;
            float *yg = y + (n * C + g * CG) * HW;
            int64_t count = CG * HW;
            float sum = 0.0f;
            for (int64_t i = 0; i < count; i++) sum += xg[i];
            float mu = sum / (float)count;
            float sq = 0.0f;
            for (int64_t i = 0; i < count; i++) sq += (xg[i] - mu) * (xg[i] - mu);
            float inv = 1.0f / sqrtf(sq / (float)count + 1e-5f);
            for (int64_t c = 0; c < CG; c++) {
                int64_t ch = g * CG + c;
                for (int64_t s = 0; s < HW; s++) {
                    yg[c * HW + s] = (xg[c * HW + s] - mu) * inv * gamma[ch] + beta[ch];
                }
            }
        }
    }
}
