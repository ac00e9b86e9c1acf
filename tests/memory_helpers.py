"""Kernels with clearly different outcomes, for memory tests (the timings differ by several times)."""

import time

SUM_NAIVE = """#include <stdint.h>
void kernel(const float *x, float *out, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += x[i];
    out[0] = acc;
}
"""

SUM_ACCUMULATORS = """#include <stdint.h>
void kernel(const float *x, float *out, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += x[i + k];
    float total = 0.0f;
    for (int k = 0; k < 16; k++) total += acc[k];
    for (; i < n; i++) total += x[i];
    out[0] = total;
}
"""

SUM_NO_TAIL = """#include <stdint.h>
void kernel(const float *x, float *out, int64_t n) {
    float acc[16] = {0};
    for (int64_t i = 0; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += x[i + k];
    float total = 0.0f;
    for (int k = 0; k < 16; k++) total += acc[k];
    out[0] = total;
}
"""

SUM_BROKEN = SUM_ACCUMULATORS.replace("float total = 0.0f;", "total = 0.0f;")

ACCUMULATOR_STRATEGY = "16 independent accumulators to hide the add latency"


def profile_until_clean(workbench, kernel_id: str, tries: int = 6):
    """Profile until the memory teaches the verdict (no failure, not suspect; not noisy, or noisy with its whole CI
    clearing the gain threshold, which the memory teaches under load) and return it, or fail saying why. A busy
    machine can make a profile noisy with a CI that clears nothing (at load 2.3 here, three in a row were; CI once
    saw three noisy profiles of a 3x win): profile again, as the product tells an agent to, after a pause that lets
    a burst of other work pass."""
    for attempt in range(tries):
        measured = workbench.profile_kernel(kernel_id)
        if measured.failure is None and workbench.store.attempt(kernel_id).teaches:
            return measured
        time.sleep(0.5 * (attempt + 1))
    raise AssertionError((measured.failure, measured.message, measured.suspect_reasons, measured.noise_reasons,
                          measured.warnings))


def run_sum_session(workbench, task_id: str = "sum_reduce", agent=None):
    """naive -> broken -> fixed fast -> no-tail (wrong): returns the kernel ids."""
    naive = workbench.compile_kernel(task_id, SUM_NAIVE, strategy="naive serial sum", agent=agent)
    workbench.run_tests(naive.kernel_id)
    workbench.profile_kernel(naive.kernel_id)
    broken = workbench.compile_kernel(task_id, SUM_BROKEN, session_id=naive.session_id, strategy=ACCUMULATOR_STRATEGY,
                                      flags=["-O3"])
    fast = workbench.compile_kernel(task_id, SUM_ACCUMULATORS, session_id=naive.session_id, parent_id=naive.kernel_id,
                                    strategy=ACCUMULATOR_STRATEGY, flags=["-O3"])
    workbench.run_tests(fast.kernel_id)
    # Every test built on this session needs the fast kernel to be a trusted win.
    profile_until_clean(workbench, fast.kernel_id)
    wrong = workbench.compile_kernel(task_id, SUM_NO_TAIL, session_id=naive.session_id, parent_id=fast.kernel_id,
                                     strategy="drop the tail loop", flags=["-O3"])
    workbench.run_tests(wrong.kernel_id)
    return {"session": naive.session_id, "naive": naive.kernel_id, "broken": broken.kernel_id,
            "fast": fast.kernel_id, "wrong": wrong.kernel_id}
