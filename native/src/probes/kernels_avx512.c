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

#define FMA_CHAINS        16
#define ACCUMULATOR       __m512
#define LANES             16
#define BROADCAST(value)  _mm512_set1_ps(value)
#define STEP(acc, x, y)   _mm512_fmadd_ps((acc), (x), (y))
#define STORE(lanes, acc) _mm512_storeu_ps((lanes), (acc))
#define WORDS_VECTOR      __m512i
#define WORDS             8
#define ZERO_WORDS()      _mm512_setzero_si512()
#define LOAD(p)           _mm512_load_si512((const void*)(p))
#define ADD(a, b)         _mm512_add_epi64((a), (b))
#define STORE_WORDS(w, v) _mm512_storeu_si512((void*)(w), (v))
#define ISA               "avx512"
#define FMA_METHOD                                                                                 \
    "vfmadd*ps zmm: 16 independent chains of 16 f32 lanes per thread, no memory access"
#define READ_METHOD                                                                                \
    "vmovdqa64 zmm loads of consecutive lines into 8 vpaddq sums, one slice per thread"
#define FMA_GETTER  probe_fma_avx512
#define READ_GETTER probe_read_avx512
#include "probes/fma_read.inl"
