/*
 * AVX2 probes (compiled with -mavx2 -mfma; run only where probes.c found AVX2, FMA and an OS
 * that saves the ymm registers): the roofs of x86-64 CPUs without AVX-512.
 *
 * FMA roof: 12 chains of vfmadd on 8 f32 lanes (chains.inl). With an FMA latency of 4-5 cycles
 * and two 256-bit FMA units per core, 8-10 chains must be in flight; 12 chains plus the two
 * operands fit the 16 ymm registers.
 *
 * Read bandwidth: 32-byte aligned vmovdqa loads into vpaddq sums (read.inl).
 */
#include <immintrin.h>

#include "probes/kernels.h"

#define FMA_CHAINS        12
#define ACCUMULATOR       __m256
#define LANES             8
#define BROADCAST(value)  _mm256_set1_ps(value)
#define STEP(acc, x, y)   _mm256_fmadd_ps((acc), (x), (y))
#define STORE(lanes, acc) _mm256_storeu_ps((lanes), (acc))
#define WORDS_VECTOR      __m256i
#define WORDS             4
#define ZERO_WORDS()      _mm256_setzero_si256()
#define LOAD(p)           _mm256_load_si256((const __m256i*)(p))
#define ADD(a, b)         _mm256_add_epi64((a), (b))
#define STORE_WORDS(w, v) _mm256_storeu_si256((__m256i*)(w), (v))
#define ISA               "avx2"
#define FMA_METHOD                                                                                 \
    "vfmadd*ps ymm: 12 independent chains of 8 f32 lanes per thread, no memory access"
#define READ_METHOD                                                                                \
    "vmovdqa ymm loads of consecutive lines into 8 vpaddq sums, one slice per thread"
#define FMA_GETTER  probe_fma_avx2
#define READ_GETTER probe_read_avx2
#include "probes/fma_read.inl"
