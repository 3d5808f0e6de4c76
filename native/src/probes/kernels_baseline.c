/*
 * Probes in the instruction set every CPU of the architecture has, compiled without extra
 * flags: NEON (Advanced SIMD) on aarch64, which is what an Apple-silicon CPU's roof is made of,
 * and the compiler's baseline vectors (GCC/Clang vector extensions) elsewhere, such as an
 * x86-64 CPU without AVX2.
 *
 * FMA roof (chains.inl): on aarch64, 24 chains of fmla on 4 f32 lanes. Apple's performance
 * cores start four 128-bit FMAs per cycle with a latency of four cycles, so 16 chains are the
 * least that keeps them busy; 24 chains plus the two operands fit the 32 vector registers.
 * Elsewhere 12 chains, within the 16 registers of baseline x86-64; where the baseline has no
 * fused multiply-add (x86-64 before AVX2) each update is a multiply and an add, the same 2 FLOPs.
 *
 * Read bandwidth: 16-byte loads into 64-bit sums (read.inl).
 */
#include "probes/kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#define FMA_CHAINS        24
#define ACCUMULATOR       float32x4_t
#define STEP(acc, x, y)   vfmaq_f32((y), (acc), (x))
#define STORE(lanes, acc) vst1q_f32((lanes), (acc))
#define BROADCAST(value)  vdupq_n_f32(value)
#define WORDS_VECTOR      uint64x2_t
#define ZERO_WORDS()      vdupq_n_u64(0)
#define LOAD(p)           vld1q_u64((const uint64_t*)(p))
#define ADD(a, b)         vaddq_u64((a), (b))
#define STORE_WORDS(w, v) vst1q_u64((w), (v))
#define ISA               "neon"
#define FMA_METHOD        "NEON fmla: 24 independent chains of 4 f32 lanes per thread, no memory access"
#define READ_METHOD       "NEON ld1 loads of consecutive lines into 8 add sums, one slice per thread"
#else
#include <string.h>
typedef float f32x4 __attribute__((vector_size(16)));
typedef uint64_t u64x2 __attribute__((vector_size(16)));
#define FMA_CHAINS        12
#define ACCUMULATOR       f32x4
#define STEP(acc, x, y)   ((acc) * (x) + (y))
#define STORE(lanes, acc) memcpy((lanes), &(acc), sizeof(acc))
#define BROADCAST(value)  ((f32x4){(value), (value), (value), (value)})
#define WORDS_VECTOR      u64x2
#define ZERO_WORDS()      ((u64x2){0, 0})
#define LOAD(p)           (*(const u64x2*)(p))
#define ADD(a, b)         ((a) + (b))
#define STORE_WORDS(w, v) memcpy((w), &(v), sizeof(v))
#define ISA               "portable"
#define FMA_METHOD                                                                                 \
    "16-byte vector multiply-add: 12 independent chains of 4 f32 lanes per thread, no memory "     \
    "access"
#define READ_METHOD "16-byte vector loads of consecutive lines into 8 sums, one slice per thread"
#endif

#define LANES       4
#define WORDS       2
#define FMA_GETTER  probe_fma_baseline
#define READ_GETTER probe_read_baseline
#include "probes/fma_read.inl"
