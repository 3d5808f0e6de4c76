/*
 * Armv8.6 BF16 probe (compiled with +bf16; run only where probes.c found FEAT_BF16: Linux's
 * HWCAP2_BF16, macOS's hw.optional.arm.FEAT_BF16; Apple M2 and later, Neoverse V1/N2 and later).
 *
 * bf16 dot-product roof: 24 chains of bfdot on 4 f32 lanes (chains.inl). Each instruction adds
 * the two products of a pair of bf16 pairs to each f32 lane: 4 FLOPs per lane, twice an fmla's
 * 2. As for the FMA probe, 24 chains cover four pipes of four-cycle latency and fit the 32
 * vector registers with the two operands. (bfmmla, the 2x4 by 4x2 matrix form, may reach more
 * on some cores; bfdot is the instruction a dot-product kernel feeds.)
 */
#include <arm_neon.h>

#include "probes/kernels.h"

#define ACCUMULATOR          float32x4_t
#define LANES                4
#define OPERAND              bfloat16x8_t
#define CHAINS               24
#define ZERO()               vdupq_n_f32(0.0f)
#define STEP(acc, x, y)      vbfdotq_f32((acc), (x), (y))
#define STORE(lanes, acc)    vst1q_f32((lanes), (acc))
#define BROADCAST_PAIR(pair) vreinterpretq_bf16_u32(vdupq_n_u32(pair))
#define ISA                  "neon_bf16"
#define DOT_METHOD                                                                                 \
    "bfdot: 24 independent chains of 4 f32 lanes (2 bf16 products each) per thread, no memory "    \
    "access"
#define DOT_GETTER probe_dot_neon_bf16
#include "probes/dot.inl"
