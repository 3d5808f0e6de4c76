/*
 * AVX2 probes (compiled with -mavx2 -mfma; run only where probes.c found AVX2, FMA and an OS
 * that saves the ymm registers): the roofs of x86-64 CPUs without AVX-512.
 *
 * FMA roof: 12 independent accumulators of 8 f32 lanes, each updated by one vfmadd per
 * iteration. With an FMA latency of 4-5 cycles and two 256-bit FMA units per core, 8-10 chains
 * must be in flight; 12 chains plus the two operands fit the 16 ymm registers, so the loop has
 * no loads, no stores and no dependency between chains.
 *
 * Read bandwidth: aligned 32-byte vmovdqa loads of consecutive cache lines into 8 independent
 * 64-bit integer sums (vpaddq): the loop waits on memory only, and its integer sum is exact in
 * any order (the self-check compares it with numpy's).
 */
#include <immintrin.h>
#include <string.h>

#include "probes/kernels.h"

#define FMA_CHAINS 12

static double fma_f32(uint64_t iterations, uint32_t multiplier_bits, uint32_t addend_bits) {
    float multiplier, addend;
    memcpy(&multiplier, &multiplier_bits, sizeof multiplier);
    memcpy(&addend, &addend_bits, sizeof addend);
    const __m256 m = _mm256_set1_ps(multiplier), a = _mm256_set1_ps(addend);
    __m256 acc[FMA_CHAINS];
    for (int c = 0; c < FMA_CHAINS; ++c) acc[c] = _mm256_setzero_ps();
    for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
        for (int c = 0; c < FMA_CHAINS; ++c) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
    }
    double sum = 0;
    float lanes[8];
    for (int c = 0; c < FMA_CHAINS; ++c) {
        _mm256_storeu_ps(lanes, acc[c]);
        for (int l = 0; l < 8; ++l) sum += lanes[l];
    }
    return sum;
}

static uint64_t read_u64(const void* data, size_t bytes) {
    const __m256i* p = (const __m256i*)data;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0,
            s7 = s0;
    for (size_t i = 0; i < bytes / 32; i += 8) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256(p + i + 0));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256(p + i + 1));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256(p + i + 2));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256(p + i + 3));
        s4 = _mm256_add_epi64(s4, _mm256_load_si256(p + i + 4));
        s5 = _mm256_add_epi64(s5, _mm256_load_si256(p + i + 5));
        s6 = _mm256_add_epi64(s6, _mm256_load_si256(p + i + 6));
        s7 = _mm256_add_epi64(s7, _mm256_load_si256(p + i + 7));
    }
    const __m256i total =
        _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)),
                         _mm256_add_epi64(_mm256_add_epi64(s4, s5), _mm256_add_epi64(s6, s7)));
    uint64_t words[4];
    _mm256_storeu_si256((__m256i*)words, total);
    return words[0] + words[1] + words[2] + words[3];
}

const probe_compute* probe_fma_avx2(void) {
    static const probe_compute probe = {
        "avx2", fma_f32, FMA_CHAINS * 8, 2,
        "vfmadd*ps ymm: 12 independent chains of 8 f32 lanes per thread, no memory access"};
    return &probe;
}

const probe_read* probe_read_avx2(void) {
    static const probe_read probe = {
        "avx2", read_u64,
        "vmovdqa ymm loads of consecutive lines into 8 vpaddq sums, one slice per thread"};
    return &probe;
}
