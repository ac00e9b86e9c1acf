#include <stdint.h>

void kernel(const float *x, const float *W, const float *b, float *y, int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                s += x[i * K + k] * W[j * K + k];
            }
            s += b[j];
            y[i * N + j] = s > 0.0f ? s : 0.0f;
        }
    }
}
