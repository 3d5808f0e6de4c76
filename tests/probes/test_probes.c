/* The roof probes (native/src/probes): each kernel computes its documented closed form, the
 * probes run on several threads and refuse bad arguments. Built into the sanitizer and thread
 * sanitizer runs with the rest of ctest; it asserts no rate beyond its being positive. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "probes/mfa_probes.h"
#include "test_util.h"

static void check_kernels(void) {
    int lanes = 0;
    /* Every lane: 0 -> fma(lane, 1, 2^-20), 1000 times: exactly 1000 * 2^-20. */
    const double fma = mfa_probe_fma_f32_sum(1000, 1.0f, 0x1p-20f, &lanes);
    CHECK(lanes >= 4 && fma == lanes * 1000 * 0x1p-20, "fma sum %g over %d lanes", fma, lanes);
    /* Pairs (1, 0.5) . (0.25, 1) = 0.75 per lane and iteration. */
    const double dot =
        mfa_probe_dot_bf16_sum(1000, 0x3F80u | 0x3F00u << 16, 0x3E80u | 0x3F80u << 16, &lanes);
    CHECK(dot == lanes * 1000 * 0.75, "dot sum %g over %d lanes", dot, lanes);

    enum { WORDS = 4 * MFA_PROBE_READ_BLOCK / 8 };
    uint64_t* words = aligned_alloc(64, WORDS * sizeof *words);
    uint64_t expected = 0, sum = 0;
    for (int i = 0; i < WORDS; ++i)
        expected += words[i] = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
    CHECK(mfa_probe_read_sum(words, WORDS * sizeof *words, &sum) == MFA_PROBE_OK && sum == expected,
          "read sum %llu, expected %llu", (unsigned long long)sum, (unsigned long long)expected);
    CHECK(mfa_probe_read_sum(words, 8, &sum) == MFA_PROBE_FAILED, "a partial block is refused");
    CHECK(mfa_probe_read_sum((char*)words + 8, MFA_PROBE_READ_BLOCK, &sum) == MFA_PROBE_FAILED,
          "unaligned data is refused");
    free(words);
}

static void check_probes(void) {
    mfa_probe_result result;
    CHECK(mfa_probe_fma_f32(2, 2, 0.01, &result) == MFA_PROBE_OK && result.rate > 0 &&
              result.median_rate > 0 && result.threads == 2 && result.trials == 2,
          "fma: %s", result.method);
    const int dot = mfa_probe_dot_bf16(2, 2, 0.01, &result);
    CHECK(dot == MFA_PROBE_OK ? result.rate > 0 : dot == MFA_PROBE_UNSUPPORTED && result.rate == 0,
          "dot: %d %s", dot, result.method);
    CHECK(mfa_probe_read(2, 2, 0.01, 8u << 20, &result) == MFA_PROBE_OK && result.rate > 0,
          "read: %s", result.method);

    CHECK(mfa_probe_fma_f32(0, 2, 0.01, &result) == MFA_PROBE_FAILED &&
              strstr(result.method, "threads") && result.rate == 0,
          "threads 0: %s", result.method);
    CHECK(mfa_probe_fma_f32(1, 0, 0.01, &result) == MFA_PROBE_FAILED, "trials 0");
    CHECK(mfa_probe_fma_f32(1, 1, 11.0, &result) == MFA_PROBE_FAILED, "11 seconds");
    CHECK(mfa_probe_read(4, 1, 0.01, 100, &result) == MFA_PROBE_FAILED &&
              strstr(result.method, "bytes"),
          "100 bytes on 4 threads: %s", result.method);
}

int main(void) {
    check_kernels();
    check_probes();
    return test_finish("test_probes");
}
