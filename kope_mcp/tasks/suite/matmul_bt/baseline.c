#include <stdint.h>

void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                s += A[i * K + k] * B[j * K + k];
            }
            C[i * N + j] = s;
        }
    }
}
