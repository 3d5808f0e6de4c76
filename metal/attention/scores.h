// Raw dot products -> scores, scale * (q . k), with the band applied on edge blocks only.
#ifndef MFA_ATTENTION_SCORES_H
#define MFA_ATTENTION_SCORES_H

#include "band.h"
#include "softmax.h"

// Which side of the score tile is the query: the forward and backward-query kernels hold
// queries in rows and keys in columns; backward-key-value holds the transpose.
enum class score_orientation { query_rows, key_rows };

// scores[t] *= scale, and, when `edge`, masked where the (query, key) pair is invisible. The
// dot products are computed unscaled, so a scale that multiplies an operand past FLT_MAX
// (q = 1e38, scale = 10) cannot spoil a logit that fits.
// row: this lane's row index in the sequence; column0: index of the slab's column 0.
inline void to_scores(thread simd_fragment* scores, constant mfa_kernel_params& p, bool edge,
                      score_orientation orientation, int row, int column0, ushort lane) {
    const int column = column0 + int(fragment_col(lane));
#pragma unroll
    for (uint t = 0; t < fc_traversal_fragments; ++t)
        for (ushort e = 0; e < 2; ++e) {
            float s = scores[t].thread_elements()[e] * p.scale;
            if (edge) {
                const int other = column + int(t * 8 + e);
                const bool seen = orientation == score_orientation::query_rows
                                      ? visible(p, row, other)
                                      : visible(p, other, row);
                s = seen ? s : kMaskedScore;
            }
            scores[t].thread_elements()[e] = s;
        }
}

#endif
