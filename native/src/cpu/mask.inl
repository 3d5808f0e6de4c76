/*
 * The visibility window on a tile of scores: each row's visible columns as one range, clipped to
 * the tile's real width, so padding columns (past it) count as masked and the softmax needs no
 * edge cases. The passes that apply it (scale_mask_max, probabilities_*) touch every element
 * once and select only in vectors that straddle a range's edge.
 */
#ifndef MFA_CPU_MASK_INL
#define MFA_CPU_MASK_INL

#include "cpu/plan.h"
#include "cpu/simd.inl"

#include <stdint.h>

namespace {

struct visible_range {
    int64_t begin, end; /* 0 <= begin <= end <= width */
};

static inline visible_range clip_range(int64_t begin, int64_t end, int64_t width) {
    if (end > width) end = width;
    if (begin < 0) begin = 0;
    if (begin > end) begin = end;
    visible_range range = {begin, end};
    return range;
}

/* Row i of a tile whose columns are keys j0 .. j0 + width - 1. */
static inline visible_range keys_of_query(const mfa_cpu_plan* plan, int64_t i, int64_t j0,
                                          int64_t width) {
    return clip_range(mfa_cpu_key_begin(plan, i) - j0, mfa_cpu_key_end(plan, i) - j0, width);
}

/* Row j of a tile whose columns are queries i0 .. i0 + width - 1. */
static inline visible_range queries_of_key(const mfa_cpu_plan* plan, int64_t j, int64_t i0,
                                           int64_t width) {
    return clip_range(mfa_cpu_query_begin(plan, j) - i0, mfa_cpu_query_end(plan, j) - i0, width);
}

/* The backward's probabilities from unscaled dot products: x = e^(x * scale - lse), with the
 * score of a hidden column taken as -inf (n a multiple of W). That gives 0 there, and NaN where
 * the row's lse is NaN, so a NaN row reaches every gradient of its group as the contract says.
 * A row that sees no key carries lse = +inf, which gives 0 whatever x is. The scale multiplies
 * the dot product, never an operand, and the exponent is formed in natural units, so nothing
 * overflows where the logits fit. A probability is at most 1: where logits are so large that
 * their f32 rounding exceeds 1, a score recomputed here may round above the lse the forward
 * stored, and its P is taken as 1 instead of e^(rounding). (A NaN exponent compares false and
 * stays NaN.) */
static inline vf probability(vf x, vf scale, vf lse, int64_t c0, visible_range range) {
    vf score = x * scale;
    if (c0 < range.begin || c0 + W > range.end)
        score = vselect(lanes_within(c0, range.begin, range.end), score, vsplat(-__builtin_inff()));
    const vf exponent = score - lse;
    return vexp2(vselect(exponent > vsplat(0.0f), vsplat(0.0f), exponent) * vsplat(kLog2e));
}

/* ... with one lse for the whole row (rows are queries) ... */
static inline void probabilities_row(float* x, int64_t n, float scale, float lse,
                                     visible_range range) {
    const vf f = vsplat(scale), l = vsplat(lse);
    for (int64_t i = 0; i < n; i += W) vstore(x + i, probability(vload(x + i), f, l, i, range));
}

/* ... or one per column (rows are keys, columns queries). */
static inline void probabilities_cols(float* x, int64_t n, float scale, const float* lse,
                                      visible_range range) {
    const vf f = vsplat(scale);
    for (int64_t i = 0; i < n; i += W)
        vstore(x + i, probability(vload(x + i), f, vload(lse + i), i, range));
}

} // namespace

#endif /* MFA_CPU_MASK_INL */
