#include <stdint.h>

void kernel(const float *A, const float *B, float *C, int64_t batch, int64_t M, int64_t N, int64_t K) {
    for (int64_t b = 0; b < batch; b++) {
        const float *Ab = A + b * M * K;
        const float *Bb = B + b * K * N;
        float *Cb = C + b * M * N;
        for (int64_t i = 0; i < M; i++) {
            for (int64_t j = 0; j < N; j++) {
                float s = 0.0f;
                for (int64_t k = 0; k < K; k++) {
                    s += Ab[i * K + k] * Bb[k * N + j];
                }
                Cb[i * N + j] = s;
            }
        }
    }
}
