// The visibility band: key j is visible from query i iff i + band_lo <= j <= i + band_hi
// (alignment, causal mask and window, derived once by the core). Whole blocks outside the band
// are never visited; blocks inside it skip the per-element test; only blocks on its edge, or on
// the end of a sequence, are masked element by element.
#ifndef MFA_ATTENTION_BAND_H
#define MFA_ATTENTION_BAND_H

#include "../attention_params.h"

// A half-open range of traversal blocks.
struct block_range {
    int begin;
    int end;
};

// Key blocks of width `block` that rows [row_first, row_last] can see.
inline block_range key_blocks_for_rows(constant mfa_kernel_params& p, int row_first, int row_last,
                                       int block) {
    const int first_key = max(0, row_first + p.band_lo);
    const int end_key = min(p.seq_k, row_last + p.band_hi + 1);
    block_range r;
    r.begin = first_key / block;
    r.end = first_key < end_key ? (end_key + block - 1) / block : r.begin;
    return r;
}

// Query blocks of height `block` that see keys [key_first, key_last].
inline block_range query_blocks_for_keys(constant mfa_kernel_params& p, int key_first, int key_last,
                                         int block) {
    const int first_query = max(0, key_first - p.band_hi);
    const int end_query = min(p.seq_q, key_last - p.band_lo + 1);
    block_range r;
    r.begin = first_query / block;
    r.end = first_query < end_query ? (end_query + block - 1) / block : r.begin;
    return r;
}

// Whether every (query, key) pair of the rectangle is visible and inside both sequences.
inline bool block_fully_visible(constant mfa_kernel_params& p, int query_first, int query_last,
                                int key_first, int key_last) {
    return query_last < p.seq_q && key_last < p.seq_k && key_first >= query_last + p.band_lo &&
           key_last <= query_first + p.band_hi;
}

inline bool visible(constant mfa_kernel_params& p, int query, int key) {
    return query < p.seq_q && key < p.seq_k && key >= query + p.band_lo && key <= query + p.band_hi;
}

#endif
