/*
 * AVX-512 probes (compiled with -mavx512f; run only where probes.c found AVX-512F and an OS that
 * saves the zmm registers).
 *
 * FMA roof: 16 chains of vfmadd on 16 f32 lanes (chains.inl). An FMA's result is ready after
 * about 4 cycles and a core starts one or two 512-bit FMAs per cycle, so at least 8 chains must
 * be in flight to keep the units busy; 16 chains plus the two operands fit the 32 zmm
 * registers. Its rate is the core's peak float32 FMA throughput at 512 bits.
 *
 * Read bandwidth: 64-byte aligned vmovdqa64 loads into vpaddq sums (read.inl).
 */
#include <immintrin.h>

#include "probes/kernels.h"

#define FMA_CHAINS 16

#define ACCUMULATOR       __m512
#define LANES             16
#define OPERAND           __m512
#define CHAINS            FMA_CHAINS
#define ZERO()            _mm512_setzero_ps()
#define STEP(acc, x, y)   _mm512_fmadd_ps((acc), (x), (y))
#define STORE(lanes, acc) _mm512_storeu_ps((lanes), (acc))
#define CHAINS_KERNEL     fma_chains
#include "probes/chains.inl"

#define WORDS_VECTOR      __m512i
#define WORDS             8
#define ZERO_WORDS()      _mm512_setzero_si512()
#define LOAD(p)           _mm512_load_si512((const void*)(p))
#define ADD(a, b)         _mm512_add_epi64((a), (b))
#define STORE_WORDS(w, v) _mm512_storeu_si512((void*)(w), (v))
#define READ_KERNEL       read_u64
#include "probes/read.inl"

static double fma_f32(uint64_t iterations, uint32_t multiplier, uint32_t addend) {
    return fma_chains(iterations, _mm512_set1_ps(probe_f32(multiplier)),
                      _mm512_set1_ps(probe_f32(addend)));
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
