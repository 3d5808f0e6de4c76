/*
 * Probes in the instruction set every CPU of the architecture has, compiled without extra
 * flags: NEON (Advanced SIMD) on aarch64, which is what an Apple-silicon CPU's roof is made of,
 * and the compiler's baseline vectors (GCC/Clang vector extensions) elsewhere, such as an
 * x86-64 CPU without AVX2.
 *
 * FMA roof: 24 independent accumulators of 4 f32 lanes (NEON fmla), each updated once per
 * iteration. Apple's performance cores start four 128-bit FMAs per cycle with a latency of
 * four cycles, so 16 chains are the least that keeps them busy; 24 chains plus the two operands
 * fit the 32 vector registers. The loop touches no memory. Elsewhere 12 chains, within the 16
 * registers of baseline x86-64; where the baseline has no fused multiply-add (x86-64 before
 * AVX2) each update is a multiply and an add, the same 2 FLOPs.
 *
 * Read bandwidth: 16-byte loads of consecutive cache lines into 8 independent 64-bit integer
 * sums, so the loop waits on memory only; integer sums are exact in any order.
 */
#include <string.h>

#include "probes/kernels.h"

#if defined(__aarch64__)
#define FMA_CHAINS 24
#include <arm_neon.h>
typedef float32x4_t f32x4;
typedef uint64x2_t u64x2;
#define DUP_F32(x)      vdupq_n_f32(x)
#define ZERO_U64X2      vdupq_n_u64(0)
#define FMA(acc, m, a)  vfmaq_f32((a), (acc), (m))
#define LOAD_U64X2(p)   vld1q_u64((const uint64_t*)(p))
#define ADD_U64X2(x, y) vaddq_u64((x), (y))
#define ISA             "neon"
#define FMA_METHOD      "NEON fmla: 24 independent chains of 4 f32 lanes per thread, no memory access"
#define READ_METHOD     "NEON ld1 loads of consecutive lines into 8 add sums, one slice per thread"
#else
/* 12 chains: baseline x86-64 (SSE2) has 16 vector registers. */
#define FMA_CHAINS      12
typedef float f32x4 __attribute__((vector_size(16)));
typedef uint64_t u64x2 __attribute__((vector_size(16)));
#define DUP_F32(x)      ((f32x4){(x), (x), (x), (x)})
#define ZERO_U64X2      ((u64x2){0, 0})
#define FMA(acc, m, a)  ((acc) * (m) + (a))
static inline u64x2 load_u64x2(const void* p) {
    u64x2 value;
    memcpy(&value, p, sizeof value);
    return value;
}
#define LOAD_U64X2(p)   load_u64x2(p)
#define ADD_U64X2(x, y) ((x) + (y))
#define ISA             "portable"
#define FMA_METHOD                                                                                 \
    "16-byte vector multiply-add: 12 independent chains of 4 f32 lanes per thread, no memory "     \
    "access"
#define READ_METHOD "16-byte vector loads of consecutive lines into 8 sums, one slice per thread"
#endif

static double fma_f32(uint64_t iterations, uint32_t multiplier_bits, uint32_t addend_bits) {
    float multiplier, addend;
    memcpy(&multiplier, &multiplier_bits, sizeof multiplier);
    memcpy(&addend, &addend_bits, sizeof addend);
    const f32x4 m = DUP_F32(multiplier), a = DUP_F32(addend);
    f32x4 acc[FMA_CHAINS];
    for (int c = 0; c < FMA_CHAINS; ++c) acc[c] = DUP_F32(0.0f);
    for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 24
        for (int c = 0; c < FMA_CHAINS; ++c) acc[c] = FMA(acc[c], m, a);
    }
    double sum = 0;
    for (int c = 0; c < FMA_CHAINS; ++c) {
        for (int l = 0; l < 4; ++l) sum += acc[c][l];
    }
    return sum;
}

static uint64_t read_u64(const void* data, size_t bytes) {
    const unsigned char* p = (const unsigned char*)data;
    u64x2 s[8];
    for (int k = 0; k < 8; ++k) s[k] = ZERO_U64X2;
    for (size_t i = 0; i < bytes; i += 128) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) s[k] = ADD_U64X2(s[k], LOAD_U64X2(p + i + 16 * k));
    }
    uint64_t sum = 0;
    for (int k = 0; k < 8; ++k) sum += s[k][0] + s[k][1];
    return sum;
}

const probe_compute* probe_fma_baseline(void) {
    static const probe_compute probe = {ISA, fma_f32, FMA_CHAINS * 4, 2, FMA_METHOD};
    return &probe;
}

const probe_read* probe_read_baseline(void) {
    static const probe_read probe = {ISA, read_u64, READ_METHOD};
    return &probe;
}
