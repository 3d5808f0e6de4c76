// Raw dot products -> scores: scale * (q . k), then the score modifiers the kernel was compiled
// with (modifiers.h), with the band applied on edge blocks only and the mask read only on tiles
// its summary does not clear.
#ifndef MFA_ATTENTION_SCORES_H
#define MFA_ATTENTION_SCORES_H

#include "modifiers.h"

// Which side of the score tile is the query: the forward and backward-query kernels hold
// queries in rows and keys in columns; backward-key-value holds the transpose.
enum class score_orientation { query_rows, key_rows };

// scores[t] = the scores of the tile, from the raw dot products. The dot products are computed
// unscaled, so a scale that multiplies an operand past FLT_MAX (q = 1e38, scale = 10) cannot
// spoil a logit that fits. Where the pair is hidden (by the band when `edge`, by the mask when
// `read_mask`) the score is kMaskedScore. With softcap, softcap_derivative[t] (unless null: the
// forward needs none) receives
// d score / d (scale q.k) for the backward: 1 - tanh^2 for a shown pair, and 0 for a hidden one,
// whose probability is 0 and which must not turn a NaN score into a NaN gradient.
// row: this lane's row in its sequence, inside it (the caller clamps the rows past the end, whose
// results it discards, so that the mask is read only inside the sequence); column0: index of the
// tile's column 0.
inline void to_scores(thread simd_fragment* scores, thread simd_fragment* softcap_derivative,
                      constant mfa_kernel_params& p, thread const attention_sequence& s, bool edge,
                      bool read_mask, thread const score_modifiers& m, device const uchar* mask,
                      score_orientation orientation, int row, int column0, ushort lane) {
    const int column = column0 + int(fragment_col(lane));
#pragma clang loop unroll(full)
    for (uint t = 0; t < fc_traversal_fragments; ++t)
        for (ushort e = 0; e < 2; ++e) {
            float score = scores[t].thread_elements()[e] * p.scale;
            float derivative = 1.0f;
            if (fc_has_softcap) score = apply_softcap(p, score, derivative);
            const int other = column + int(t * 8 + e);
            const int query = orientation == score_orientation::query_rows ? row : other;
            const int key = orientation == score_orientation::query_rows ? other : row;
            if (fc_has_alibi) score += alibi_bias(m, s, query, key);
            bool seen = true;
            if (edge) seen = visible(s, query, key);
            if (fc_has_mask && read_mask && seen) score = apply_mask(p, m, mask, query, key, score);
            if (edge) score = seen ? score : kMaskedScore;
            scores[t].thread_elements()[e] = score;
            if (fc_has_softcap && softcap_derivative != nullptr)
                softcap_derivative[t].thread_elements()[e] =
                    as_type<uint>(score) == as_type<uint>(kMaskedScore) ? 0.0f : derivative;
        }
}

#endif
