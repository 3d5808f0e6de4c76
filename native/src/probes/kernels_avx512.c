/*
 * AVX-512 probes (compiled with -mavx512f; run only where probes.c found AVX-512F and an OS that
 * saves the zmm registers).
 *
 * FMA roof: 16 independent accumulators of 16 f32 lanes, each updated by one vfmadd per
 * iteration. An FMA's result is ready after about 4 cycles and a core starts one or two 512-bit
 * FMAs per cycle, so at least 8 chains must be in flight to keep the units busy; 16 chains (plus
 * the two operands) fit the 32 zmm registers, so the loop has no loads, no stores and no
 * dependency between chains. Its rate is the core's peak float32 FMA throughput at 512 bits.
 *
 * Read bandwidth: 64-byte aligned vmovdqa64 loads of consecutive cache lines into 8 independent
 * 64-bit integer sums (vpaddq), so neither the additions nor a dependency limit the loop: it
 * waits on memory only. Integer sums, unlike float ones, are exact in any order, which lets the
 * self-check compare the result with numpy's.
 */
#include <immintrin.h>
#include <string.h>

#include "probes/kernels.h"

#define FMA_CHAINS 16

static double fma_f32(uint64_t iterations, uint32_t multiplier_bits, uint32_t addend_bits) {
    float multiplier, addend;
    memcpy(&multiplier, &multiplier_bits, sizeof multiplier);
    memcpy(&addend, &addend_bits, sizeof addend);
    const __m512 m = _mm512_set1_ps(multiplier), a = _mm512_set1_ps(addend);
    __m512 acc[FMA_CHAINS];
    for (int c = 0; c < FMA_CHAINS; ++c) acc[c] = _mm512_setzero_ps();
    for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
        for (int c = 0; c < FMA_CHAINS; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
    }
    double sum = 0;
    float lanes[16];
    for (int c = 0; c < FMA_CHAINS; ++c) {
        _mm512_storeu_ps(lanes, acc[c]);
        for (int l = 0; l < 16; ++l) sum += lanes[l];
    }
    return sum;
}

static uint64_t read_u64(const void* data, size_t bytes) {
    const __m512i* p = (const __m512i*)data;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0,
            s7 = s0;
    for (size_t i = 0; i < bytes / 64; i += 8) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i + 0));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 1));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 2));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 3));
        s4 = _mm512_add_epi64(s4, _mm512_load_si512(p + i + 4));
        s5 = _mm512_add_epi64(s5, _mm512_load_si512(p + i + 5));
        s6 = _mm512_add_epi64(s6, _mm512_load_si512(p + i + 6));
        s7 = _mm512_add_epi64(s7, _mm512_load_si512(p + i + 7));
    }
    __m512i total =
        _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)),
                         _mm512_add_epi64(_mm512_add_epi64(s4, s5), _mm512_add_epi64(s6, s7)));
    uint64_t words[8];
    _mm512_storeu_si512(words, total);
    uint64_t sum = 0;
    for (int w = 0; w < 8; ++w) sum += words[w];
    return sum;
}

const probe_compute* probe_fma_avx512(void) {
    static const probe_compute probe = {
        "avx512", fma_f32, FMA_CHAINS * 16, 2,
        "vfmadd*ps zmm: 16 independent chains of 16 f32 lanes per thread, no memory access"};
    return &probe;
}

const probe_read* probe_read_avx512(void) {
    static const probe_read probe = {
        "avx512", read_u64,
        "vmovdqa64 zmm loads of consecutive lines into 8 vpaddq sums, one slice per thread"};
    return &probe;
}
