#include <stdint.h>

void kernel(const float *A, const float *x, float *y, int64_t M, int64_t N) {
    for (int64_t i = 0; i < M; i++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < N; j++) {
            acc += A[i * N + j] * x[j];
        }
        y[i] = acc;
    }
}
