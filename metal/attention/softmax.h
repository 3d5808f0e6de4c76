// Online softmax in the exp2 domain. Scores are kept in log2 units, s * scale * log2(e), so
// every exponential is one exp2. Masked scores are a finite sentinel, not -inf: Metal compiles
// with fast math, which may assume no infinities.
#ifndef MFA_ATTENTION_SOFTMAX_H
#define MFA_ATTENTION_SOFTMAX_H

#include "fragment.h"

// Any masked score; exp2(kMaskedScore - m) is 0 for every reachable m.
constant float kMaskedScore = -FLT_MAX;
// Floor of the running maximum. Keeping m finite and far above kMaskedScore makes a row that
// has seen only masked scores accumulate exactly zero instead of exp2(0) = 1 per element.
constant float kEmptyRowMax = -1.0e30f;
// Log-sum-exp (log2 units) given to rows that saw no key, so exp2(s - L) is 0 in the backward.
constant float kEmptyRowLogSumExp2 = 1.0e30f;
constant float kLog2E = 1.4426950408889634f;
constant float kLn2 = 0.6931471805599453f;

// Running statistics of one row, held identically by the four lanes that share it.
struct softmax_row {
    float max_score;  // log2 units, >= kEmptyRowMax
    float sum;        // sum of exp2(score - max_score) so far
};

inline softmax_row softmax_row_start() {
    softmax_row r;
    r.max_score = kEmptyRowMax;
    r.sum = 0.0f;
    return r;
}

// Replaces the scores of one 8 x (8 * count) slab by exp2(score - new max) and returns the
// factor exp2(old max - new max) by which earlier partial results must be rescaled.
inline float softmax_row_update(thread softmax_row& row, thread simd_fragment* scores, uint count) {
    float block_max = kMaskedScore;
    #pragma unroll
    for (uint t = 0; t < count; ++t) {
        const float2 s = scores[t].thread_elements();
        block_max = max(block_max, max(s.x, s.y));
    }
    const float new_max = max(row.max_score, row_max(block_max));
    float block_sum = 0.0f;
    #pragma unroll
    for (uint t = 0; t < count; ++t) {
        const float2 p = exp2(float2(scores[t].thread_elements()) - new_max);
        scores[t].thread_elements()[0] = p.x;
        scores[t].thread_elements()[1] = p.y;
        block_sum += p.x + p.y;
    }
    const float correction = exp2(row.max_score - new_max);
    row.sum = row.sum * correction + row_sum(block_sum);
    row.max_score = new_max;
    return correction;
}

// Natural-log log-sum-exp of the row, or -inf when it saw no key.
inline float softmax_row_log_sum_exp(softmax_row row) {
    return row.sum > 0.0f ? (row.max_score + log2(row.sum)) * kLn2 : as_type<float>(0xff800000u);
}

// Log2-unit log-sum-exp for the backward from the stored natural-log value; -inf (a row that
// saw nothing) becomes a large finite value, tested on the bits because fast math may fold
// comparisons with infinity.
inline float log_sum_exp2_from_stored(float stored) {
    return as_type<uint>(stored) == 0xff800000u ? kEmptyRowLogSumExp2 : stored * kLog2E;
}

#endif
