/*
 * Armv8.6 BF16 probe (compiled with +bf16; run only where probes.c found FEAT_BF16: Linux's
 * HWCAP2_BF16, macOS's hw.optional.arm.FEAT_BF16; Apple M2 and later, Neoverse V1/N2 and later).
 *
 * bf16 dot-product roof: 24 independent accumulators of 4 f32 lanes, each updated by one bfdot
 * per iteration, which adds the two products of a pair of bf16 pairs to each f32 lane: 4 FLOPs
 * per lane, twice an fmla's 2. As for the FMA probe, 24 chains cover four pipes of four-cycle
 * latency and fit the 32 vector registers with the two operands; the loop touches no memory.
 * (bfmmla, the 2x4 by 4x2 matrix form, may reach more on some cores; bfdot is the instruction
 * a dot-product kernel feeds.)
 */
#include <arm_neon.h>

#include "probes/kernels.h"

#define DOT_CHAINS 24

static double dot_bf16(uint64_t iterations, uint32_t a_pair, uint32_t b_pair) {
    const bfloat16x8_t a = vreinterpretq_bf16_u32(vdupq_n_u32(a_pair));
    const bfloat16x8_t b = vreinterpretq_bf16_u32(vdupq_n_u32(b_pair));
    float32x4_t acc[DOT_CHAINS];
    for (int c = 0; c < DOT_CHAINS; ++c) acc[c] = vdupq_n_f32(0.0f);
    for (uint64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 24
        for (int c = 0; c < DOT_CHAINS; ++c) acc[c] = vbfdotq_f32(acc[c], a, b);
    }
    double sum = 0;
    for (int c = 0; c < DOT_CHAINS; ++c) sum += vaddvq_f32(acc[c]);
    return sum;
}

const probe_compute* probe_dot_neon_bf16(void) {
    static const probe_compute probe = {
        "neon_bf16", dot_bf16, DOT_CHAINS * 4, 4,
        "bfdot: 24 independent chains of 4 f32 lanes (2 bf16 products each) per thread, no "
        "memory access"};
    return &probe;
}
