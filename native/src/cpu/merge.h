/*
 * Combining partial attention states. Attention over a key set split into disjoint parts can be
 * computed part by part: part k gives out_k (normalized over its own keys) and lse_k (natural
 * log, scale included, -inf for a part that saw no key). Then
 *   lse = log(sum_k e^lse_k)        out = sum_k e^(lse_k - lse) * out_k
 * is exactly attention over all the keys. Split-key decoding uses this to combine its tasks;
 * it is the one definition of the merge, for any caller.
 *
 * Plain C, static inline: every translation unit, whatever its ISA flags, gets its own copy.
 */
#ifndef MFA_CPU_MERGE_H
#define MFA_CPU_MERGE_H

#include <math.h>
#include <stdint.h>

/* The merged lse of `parts` partial lse values (lse[k * stride]), and into weights[k] the factor
 * e^(lse_k - lse) that part k's out is multiplied by. Parts that saw no key get weight 0; when no
 * part saw a key the result is -inf with all weights 0, so the merged out is 0. A NaN lse makes
 * the merged lse and every weight NaN, so NaN reaches the merged out. */
static inline float mfa_cpu_merge_weights(const float* lse, int64_t stride, int64_t parts,
                                          float* weights) {
    float peak = -INFINITY;
    for (int64_t k = 0; k < parts; ++k) {
        const float l = lse[k * stride];
        if (l != l) {
            for (int64_t i = 0; i < parts; ++i) weights[i] = NAN;
            return NAN;
        }
        if (l > peak) peak = l;
    }
    if (peak == -INFINITY) {
        for (int64_t k = 0; k < parts; ++k) weights[k] = 0.0f;
        return -INFINITY;
    }
    /* Relative to the largest part, so no exponential overflows; a +inf lse (an overflowed
     * part) gives inf - inf = NaN weights rather than a finite answer. */
    float total = 0.0f;
    for (int64_t k = 0; k < parts; ++k) {
        weights[k] = expf(lse[k * stride] - peak);
        total += weights[k];
    }
    for (int64_t k = 0; k < parts; ++k) weights[k] /= total;
    return peak + logf(total);
}

/* out[0 .. width) = sum_k weights[k] * part_k[0 .. width), part k at parts + k * stride. A part
 * of weight 0 is skipped, so an empty part's out (which may be anything) never reaches out. */
static inline void mfa_cpu_merge_rows(const float* parts, int64_t stride, int64_t count,
                                      const float* weights, int64_t width, float* out) {
    for (int64_t x = 0; x < width; ++x) out[x] = 0.0f;
    for (int64_t k = 0; k < count; ++k) {
        const float w = weights[k];
        if (w == 0.0f) continue;
        const float* part = parts + k * stride;
        for (int64_t x = 0; x < width; ++x) out[x] += w * part[x];
    }
}

#endif /* MFA_CPU_MERGE_H */
