/*
 * AVX512_BF16 probe (compiled with -mavx512f -mavx512bf16; run only where probes.c found the
 * AVX512_BF16 bit of cpuid leaf 7 sub-leaf 1 and an OS that saves the zmm registers: AMD Zen 4
 * and later, Intel Cooper Lake, Sapphire Rapids and later).
 *
 * bf16 dot-product roof: 16 chains of vdpbf16ps on 16 f32 lanes (chains.inl). Each instruction
 * multiplies 16 pairs of bf16 pairs and adds both products to each f32 lane: 4 FLOPs per lane
 * (2 multiplies, 2 additions), twice an FMA's 2. As for the FMA probe, 16 chains cover the
 * instruction's latency on every such CPU and fit the 32 zmm registers with the two operands.
 * This is the instruction a bf16 kernel with float32 accumulation feeds (Q K^T, P V), so it is
 * the roof of bf16 attention.
 */
#include <immintrin.h>

#include "probes/kernels.h"

/* Every bf16 pair of the vector set to `pair`, through vcvtne2ps2bf16 of the pair's values
 * widened to f32 (exact): clang 16 crashes on a bit cast from integer vectors to __m512bh. */
static __m512bh broadcast_pair(uint32_t pair) {
    const uint64_t low = (uint64_t)(pair & 0xffffu) << 16, high = (uint64_t)(pair >> 16) << 16;
    const __m512 widened = _mm512_castsi512_ps(_mm512_set1_epi64((long long)(high << 32 | low)));
    return _mm512_cvtne2ps_pbh(widened, widened);
}

#define ACCUMULATOR          __m512
#define LANES                16
#define OPERAND              __m512bh
#define CHAINS               16
#define ZERO()               _mm512_setzero_ps()
#define STEP(acc, x, y)      _mm512_dpbf16_ps((acc), (x), (y))
#define STORE(lanes, acc)    _mm512_storeu_ps((lanes), (acc))
#define BROADCAST_PAIR(pair) broadcast_pair(pair)
#define ISA                  "avx512_bf16"
#define DOT_METHOD                                                                                 \
    "vdpbf16ps zmm: 16 independent chains of 16 f32 lanes (2 bf16 products each) per thread, "     \
    "no memory access"
#define DOT_GETTER probe_dot_avx512bf16
#include "probes/dot.inl"
