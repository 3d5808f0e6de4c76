// The score modifiers of mfa.h (mfa_attention_args), for one lane's row of a score tile:
//   s = scale * q.k;  softcap: s = cap * tanh(s / cap);  ALiBi: s -= slope * |p(i) - j|;
//   additive mask: s += mask(b, h, i, j);  boolean mask: the pair is hidden where it is false,
// and the block summary that lets a tile skip the mask, or the whole tile. Every modifier is a
// function constant: a kernel compiled without it has none of this code.
#ifndef MFA_ATTENTION_MODIFIERS_H
#define MFA_ATTENTION_MODIFIERS_H

#include "band.h"
#include "softmax.h"

// The bits of an additive mask's -inf (the pair is hidden).
constant uint kNegativeInfinityBits = 0xff800000u;

// What one lane needs to modify the scores of its row: where its (batch, head) slice of the
// mask starts, and its ALiBi slope.
struct score_modifiers {
    long mask_base;
    long mask_query_stride;
    long mask_key_stride;
    float slope;
};

// The modifiers of query head `head` of batch `batch` (the caller's batch index: masks and
// slopes are indexed by sequence, also in packed calls).
inline score_modifiers modifiers_for(constant mfa_kernel_params& p, device const float* alibi,
                                     uint batch, uint head) {
    score_modifiers m;
    m.mask_base = 0;
    m.mask_query_stride = 0;
    m.mask_key_stride = 0;
    m.slope = 0.0f;
    if (fc_has_mask) {
        m.mask_base =
            p.mask.origin + long(batch) * p.mask.stride[0] + long(head) * p.mask.stride[1];
        m.mask_query_stride = p.mask.stride[2];
        m.mask_key_stride = p.mask.stride[3];
    }
    if (fc_has_alibi)
        m.slope = alibi[p.alibi.origin + long(batch) * p.alibi.stride[0] +
                        long(head) * p.alibi.stride[1]];
    return m;
}

// A tile's verdict from the mask's block summary (mfa_mask_summarize): 0 when every entry it
// covers says every pair is hidden (the tile is skipped), 2 when every one says every pair is
// visible with nothing added (the mask is not read), 1 otherwise. The tile covers queries
// [query_first, query_last] of heads [head_first, head_last] and keys [key_first, key_last],
// all inside the sequence. Every thread reads the same few bytes, so the verdict is uniform.
// Without a summary (fc_has_block_mask unset) every tile is 1: a mask, if any, is read.
inline uint tile_summary(constant mfa_kernel_params& p, device const uchar* block_mask, uint batch,
                         uint head_first, uint head_last, int query_first, int query_last,
                         int key_first, int key_last) {
    if (!fc_has_block_mask) return 1;
    bool all_hidden = true, all_plain = true;
    // A summary shared by every head (stride 0) is read once.
    if (p.block_mask.stride[1] == 0) head_last = head_first;
    for (uint h = head_first; h <= head_last; ++h)
        for (int r = query_first / MFA_KERNEL_MASK_BLOCK; r <= query_last / MFA_KERNEL_MASK_BLOCK;
             ++r)
            for (int c = key_first / MFA_KERNEL_MASK_BLOCK; c <= key_last / MFA_KERNEL_MASK_BLOCK;
                 ++c) {
                const uchar code =
                    block_mask[p.block_mask.origin + long(batch) * p.block_mask.stride[0] +
                               long(h) * p.block_mask.stride[1] + long(r) * p.block_mask.stride[2] +
                               long(c) * p.block_mask.stride[3]];
                all_hidden = all_hidden && code == 0;
                all_plain = all_plain && code == 2;
            }
    return all_hidden ? 0u : (all_plain ? 2u : 1u);
}

// s = cap * tanh(s / cap), with d(cap * tanh(s / cap)) / ds = 1 - tanh^2 in *derivative.
// precise::tanh: it is bounded for every finite and infinite argument and NaN only for NaN,
// where a fast tanh built from exponentials may give inf / inf for large ones.
inline float apply_softcap(constant mfa_kernel_params& p, float score, thread float& derivative) {
    const float t = precise::tanh(score * p.softcap_inverse);
    derivative = 1.0f - t * t;
    return p.softcap * t;
}

// The score of (query, key) after ALiBi and the mask, or kMaskedScore where the mask hides it.
// Called only for pairs inside both sequences (the mask is read there alone). A boolean mask
// and an additive -inf are chosen on integer bits, as the band is, so that fast math decides
// nothing about a NaN: a hidden pair drops its score, NaN or not, as a masked one does.
inline float apply_mask(constant mfa_kernel_params& p, thread const score_modifiers& m,
                        device const uchar* mask, int query, int key, float score) {
    const long at = m.mask_base + long(query) * m.mask_query_stride + long(key) * m.mask_key_stride;
    if (fc_mask_dtype == MFA_KERNEL_DTYPE_BOOL) return mask[at] != 0 ? score : kMaskedScore;
    const float added = load_element_as(fc_mask_dtype, mask, at);
    return as_type<uint>(added) == kNegativeInfinityBits ? kMaskedScore : score + added;
}

// -slope * |p(i) - j| with p(i) = query + diag_offset, the distance exact in 64 bits.
inline float alibi_bias(thread const score_modifiers& m, thread const attention_sequence& s,
                        int query, int key) {
    const long distance = long(query) + long(s.diag_offset) - long(key);
    return -m.slope * float(distance < 0 ? -distance : distance);
}

#endif
