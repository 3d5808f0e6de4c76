// Online softmax. Scores are kept in natural units, scale * (q . k), and every exponential is
// exp2((s - m) * log2(e)): the difference of two scores times a constant, never a score times
// scale * log2(e). Nothing here can overflow while the logits themselves fit in f32, where
// folding log2(e) into the scale (scale * log2(e) overflows for scale > FLT_MAX / log2(e))
// or into the scores (for logits beyond FLT_MAX / log2(e)) could. Masked scores are a finite
// sentinel, not -inf: Metal compiles with fast math, which may assume no infinities.
//
// Non-finite inputs. A NaN score must reach its row's sum, output and log-sum-exp, and a NaN
// log-sum-exp every probability the backward recomputes from it (masked ones too: the float64
// reference's exp(-inf - NaN) is NaN). Fast math lets the compiler assume no NaN and no
// infinity: it may fold isnan() to false, answer a comparison with a NaN operand either way,
// and max() may return the non-NaN operand. So no comparison, max() or select here decides
// whether a NaN survives:
//   - masking picks kMaskedScore on integer indices (scores.h), and a masked score becomes
//     exactly 0 through exp2 alone, so no per-element test of a score is needed;
//   - a NaN reaches sums and outputs by arithmetic only: exp2(NaN - m) is NaN whatever max()
//     made of m, and adds, multiplies and simdgroup multiply-accumulates carry it from there;
//   - "the row saw no key" is read from the bits of its sum (integer compares, which fast math
//     leaves alone), not from `sum > 0`, which a NaN sum may answer either way;
//   - a factor that may be 0 is computed, never selected: fast math may fold x * (c ? 0 : y)
//     into c ? 0 : x * y, dropping a NaN x. One select of 0 is deliberate: the backward's
//     probabilities of a row whose stored lse is -inf (probability_from_stored_lse), decided
//     on the lse's bits; dropping a NaN score there is the contract, as masking drops one;
//   - the one float compare left (softmax_reference) keeps a NaN whichever way it goes;
//   - the score modifiers (modifiers.h) keep to the same rules: a boolean mask and an additive
//     -inf hide a pair on integer bits (its score becomes kMaskedScore, NaN or not, as masking
//     by the band does); softcap's tanh, ALiBi's subtraction and an additive mask's addition
//     carry a NaN by arithmetic; the softcap derivative of a hidden pair is a selected 0, so a
//     NaN score it hides cannot reach the gradients through a 0 probability;
//   - folding a term into a row (softmax_row_fold: a sink's logit, an earlier state's lse, a
//     partial result's lse) is arithmetic only: a NaN or +inf term gives a NaN weight, a -inf
//     one (a sink of -inf, a part that saw no key) the weight exp2(-inf) = 0. Where such a part
//     also has an output (an initial state, a merge), a part whose lse is -inf is told on its
//     bits and its output is not read at all: mfa.h says it is not read, and it may hold NaN;
//   - the sink gradient takes nothing from a row whose lse is -inf (a selected 0, as the
//     backward's probabilities of such a row are): mfa.h gives such rows zero gradients.
// On Metal this is a construction, not a language guarantee: under fast math the result of NaN
// arithmetic is formally unspecified, and only compiling without it (MTLCompileOptions, a host
// decision) would make it one. It relies on the GPU's exp2, add, multiply and fma returning NaN
// for a NaN operand, and on exp2 of -inf or of a hugely negative argument being 0, as it must
// be for ordinary scores far below the row maximum (and for masked ones: the difference of
// kMaskedScore and a large maximum, times log2(e), may round to -inf). The simulator compiles
// the same source with IEEE semantics and no fast-math folding: it checks the data flow
// (tests/edge/test_edge_numerics.c, section nonfinite), not what Apple's compiler may fold.
#ifndef MFA_ATTENTION_SOFTMAX_H
#define MFA_ATTENTION_SOFTMAX_H

#include "fragment.h"

// Any masked score (set on edge blocks only). Also the running maximum of a row that has seen
// nothing but masked scores, so every finite score, however negative, still counts.
constant float kMaskedScore = -FLT_MAX;
constant float kLog2E = 1.4426950408889634f;
constant float kLn2 = 0.6931471805599453f;
// The bits of the stored log-sum-exp of a row that saw no key (-inf).
constant uint kEmptyRowLogSumExpBits = 0xff800000u;

// exp(difference), for a difference of two scores (<= 0 but for rounding).
inline float exp_of_difference(float difference) { return exp2(difference * kLog2E); }

// Running statistics of one row, held identically by the four lanes that share it.
struct softmax_row {
    float max_score; // kMaskedScore until the row sees a key
    float sum;       // sum of exp(score - max_score) so far
};

inline softmax_row softmax_row_start() {
    softmax_row r;
    r.max_score = kMaskedScore;
    r.sum = 0.0f;
    return r;
}

// What a row's exponentials are taken relative to: its running maximum, except while that is
// still kMaskedScore (the row has seen only masked, -inf or NaN scores), where
// exp(kMaskedScore - kMaskedScore) = 1 would count masked scores. Any finite value far above
// kMaskedScore makes them exactly 0 and keeps NaN scores NaN, so masking costs one test per row
// and block instead of one per element.
inline float softmax_reference(float max_score) {
    return max_score == kMaskedScore ? 0.0f : max_score;
}

// Whether a row's weights sum to exactly +0: it saw no key (every weight was a masked 0, or
// the exp2 of a -inf score). Tested on the bits: under fast math `sum > 0` may say anything for
// a NaN sum, and a row a NaN reached is not empty.
inline bool softmax_row_is_empty(softmax_row row) { return as_type<uint>(row.sum) == 0u; }

// Replaces the scores of one 8 x (8 * count) slab by exp(score - new max) and returns the
// factor exp(old max - new max) by which earlier partial results must be rescaled.
inline float softmax_row_update(thread softmax_row& row, thread simd_fragment* scores, uint count) {
    float block_max = kMaskedScore;
#pragma clang loop unroll(full)
    for (uint t = 0; t < count; ++t) {
        const float2 s = scores[t].thread_elements();
        block_max = max(block_max, max(s.x, s.y));
    }
    const float new_max = max(row.max_score, row_max(block_max));
    const float reference = softmax_reference(new_max);
    float block_sum = 0.0f;
#pragma clang loop unroll(full)
    for (uint t = 0; t < count; ++t)
        for (ushort e = 0; e < 2; ++e) {
            const float p = exp_of_difference(scores[t].thread_elements()[e] - reference);
            scores[t].thread_elements()[e] = p;
            block_sum += p;
        }
    // No test for a row that has seen no key: what it holds (zeros, NaNs) needs no rescaling,
    // and exp(kMaskedScore - new_max) is 1 or exactly 0 (see softmax_reference).
    const float correction = exp_of_difference(row.max_score - new_max);
    row.sum = row.sum * correction + row_sum(block_sum);
    row.max_score = new_max;
    return correction;
}

// Natural-log log-sum-exp of the row, -inf when it saw no key, NaN when a NaN reached it.
inline float softmax_row_log_sum_exp(softmax_row row) {
    return softmax_row_is_empty(row) ? as_type<float>(kEmptyRowLogSumExpBits)
                                     : row.max_score + log2(row.sum) * kLn2;
}

// Folds one more term of the softmax into a row: a part whose log-sum-exp is `lse` relative to
// the row's scores (a sink: its logit t, which adds exp(t) to the sum and nothing to the output;
// an earlier partial result: its lse). The row's accumulator is then rescaled by `correction`,
// and a part's normalised output joins it times `weight`. A row that has seen nothing takes the
// part's maximum: exp(kMaskedScore - lse) is 0 for every finite lse, exactly (see
// softmax_reference), and a -inf part leaves the row as it was.
struct fold_factors {
    float correction;
    float weight;
};

inline fold_factors softmax_row_fold(thread softmax_row& row, float lse) {
    const float new_max = max(row.max_score, lse);
    fold_factors f;
    f.correction = exp_of_difference(row.max_score - new_max);
    f.weight = exp_of_difference(lse - new_max);
    row.sum = row.sum * f.correction + f.weight;
    row.max_score = new_max;
    return f;
}

// Whether a stored log-sum-exp is -inf: a row or part that saw no key (on the bits).
inline bool lse_is_empty(float lse) { return as_type<uint>(lse) == kEmptyRowLogSumExpBits; }

// 1 / sum, or 0 for a row that saw no key, whose output accumulator is exactly 0.
inline float softmax_row_normalizer(softmax_row row) {
    return softmax_row_is_empty(row) ? 0.0f : 1.0f / row.sum;
}

// The backward's P = exp(score - lse) from the stored natural-log lse of the score's row.
//   - lse = -inf (tested on the bits: fast math may fold comparisons with infinity): the row
//     is one that saw no key, or one its caller declares so (mfa.h); all of its probabilities
//     are 0, whatever its scores, so it gets dq = 0 and adds nothing to dk and dv. Selecting
//     the 0 drops a NaN score of such a row, as masking drops those of a row that saw no key.
//   - otherwise masked scores need no test: the lse of a row that saw a key is at least its
//     largest score, and every float above kMaskedScore is at least 2^104 above it, so the
//     exponential is exactly 0. A NaN lse (a NaN reached the row in the forward) makes all of
//     the row's probabilities NaN, masked ones too, as exp(-inf - NaN) does in the reference.
inline float probability_from_stored_lse(float score, float stored_lse) {
    const bool empty = as_type<uint>(stored_lse) == kEmptyRowLogSumExpBits;
    const float p = exp_of_difference(score - (empty ? 0.0f : stored_lse));
    return empty ? 0.0f : p;
}

#endif
