// One sequence of a call and its visibility band: key j is visible from query i iff
// i + band_lo <= j <= i + band_hi (alignment, causal mask and window). A dense call has one
// band, derived once by the core; packed sequences and paged caches have their own lengths per
// sequence, so each threadgroup derives its sequence's band as mfa_problem_band does. Whole
// blocks outside the band are never visited; blocks inside it skip the per-element test; only
// blocks on its edge, or on the end of a sequence, are masked element by element.
#ifndef MFA_ATTENTION_BAND_H
#define MFA_ATTENTION_BAND_H

#include "memory.h"

// The sequence a threadgroup works on: its lengths, its band, where its rows start in packed
// operands, and the aligned position p(i) = i + diag_offset of its query i.
struct attention_sequence {
    int seq_q;
    int seq_k;
    int band_lo;
    int band_hi;
    int diag_offset;
    long q_row0; // first row of the sequence in q, out, lse, dout, dq (packed; else 0)
    long k_row0; // ... in k, v, dk, dv (packed; else 0)
    uint batch;  // batch index of the operands: b, or 0 in packed ones (whose batch stride is 0)
};

// mfa_visibility_band for one sequence: the window around p(i) clamped to [-seq_q, seq_k]. In
// 64 bits: the windows are at most 2^31 - 1 (the planner clamps larger ones, which see the same
// keys) and the lengths at most 2^30.
inline void derive_band(constant mfa_kernel_params& p, thread attention_sequence& s) {
    const long diag = s.diag_offset, lowest = -long(s.seq_q), highest = s.seq_k;
    long lo = p.window_left < 0 ? lowest : diag - long(p.window_left);
    long hi = p.window_right < 0 ? highest : diag + long(p.window_right);
    lo = lo < lowest ? lowest : lo;
    hi = hi > highest ? highest : hi;
    s.band_lo = int(lo > highest ? highest : lo);
    s.band_hi = int(hi < lowest ? lowest : hi);
}

// Sequence b of the call: the problem's own lengths and band for a dense call; for packed
// sequences the rows between consecutive offsets; for a paged cache the keys it holds, with the
// appended ones.
inline attention_sequence sequence_of(constant mfa_kernel_params& p, uint b,
                                      device const int* cu_seqlens_q,
                                      device const int* cu_seqlens_k,
                                      device const int* cache_seqlens) {
    attention_sequence s;
    s.seq_q = p.seq_q;
    s.seq_k = p.seq_k;
    s.band_lo = p.band_lo;
    s.band_hi = p.band_hi;
    s.q_row0 = 0;
    s.k_row0 = 0;
    s.batch = b;
    if (fc_varlen) {
        const int q0 = load_int(cu_seqlens_q, p.cu_seqlens_q, 0, b);
        const int k0 = load_int(cu_seqlens_k, p.cu_seqlens_k, 0, b);
        s.seq_q = load_int(cu_seqlens_q, p.cu_seqlens_q, 0, b + 1) - q0;
        s.seq_k = load_int(cu_seqlens_k, p.cu_seqlens_k, 0, b + 1) - k0;
        s.q_row0 = q0;
        s.k_row0 = k0;
        s.batch = 0;
    }
    if (fc_paged) s.seq_k = load_int(cache_seqlens, p.cache_seqlens, b, 0) + p.new_len;
    s.diag_offset = p.bottom_right ? s.seq_k - s.seq_q : 0;
    if (fc_varlen || fc_paged) derive_band(p, s);
    return s;
}

// A half-open range of traversal blocks.
struct block_range {
    int begin;
    int end;
};

// Key blocks of width `block` that rows [row_first, row_last] can see.
inline block_range key_blocks_for_rows(thread const attention_sequence& s, int row_first,
                                       int row_last, int block) {
    const int first_key = max(0, row_first + s.band_lo);
    const int end_key = min(s.seq_k, row_last + s.band_hi + 1);
    block_range r;
    r.begin = first_key / block;
    r.end = first_key < end_key ? (end_key + block - 1) / block : r.begin;
    return r;
}

// Query blocks of height `block` that see keys [key_first, key_last].
inline block_range query_blocks_for_keys(thread const attention_sequence& s, int key_first,
                                         int key_last, int block) {
    const int first_query = max(0, key_first - s.band_hi);
    const int end_query = min(s.seq_q, key_last - s.band_lo + 1);
    block_range r;
    r.begin = first_query / block;
    r.end = first_query < end_query ? (end_query + block - 1) / block : r.begin;
    return r;
}

// Whether every (query, key) pair of the rectangle is visible and inside both sequences.
inline bool block_fully_visible(thread const attention_sequence& s, int query_first, int query_last,
                                int key_first, int key_last) {
    return query_last < s.seq_q && key_last < s.seq_k && key_first >= query_last + s.band_lo &&
           key_last <= query_first + s.band_hi;
}

inline bool visible(thread const attention_sequence& s, int query, int key) {
    return query < s.seq_q && key < s.seq_k && key >= query + s.band_lo && key <= query + s.band_hi;
}

#endif
