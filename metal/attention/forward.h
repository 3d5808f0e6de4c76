// Forward: O = softmax(scale Q K^T + mask) V and L = logsumexp, one threadgroup per block of
// query rows (and per block of output columns when Dv is wider than the accumulator).
//
// With fc_pack_group the rows of a threadgroup are (query head, query) pairs of all the query
// heads that share one key/value head, laid end to end: a decode step with one query per head
// then fills the threadgroup with the group's heads, and each key/value block is read once for
// all of them instead of once per head.
#ifndef MFA_ATTENTION_FORWARD_H
#define MFA_ATTENTION_FORWARD_H

#include "rows.h"
#include "scores.h"

inline void attention_forward(device const uchar* q, device const uchar* k, device const uchar* v,
                              device uchar* o, device float* l, constant mfa_kernel_params& p,
                              threadgroup float* staging, uint3 group, ushort thread_index,
                              ushort simd_index, ushort lane) {
    threadgroup float* parallel_tile = staging;
    threadgroup float* traversal_tile = staging + fc_block_parallel * fc_block_head;

    const uint out_block = group.x % uint(p.out_blocks);
    const int row0 = int(group.x / uint(p.out_blocks) * fc_block_parallel);
    const uint batch = group.z;
    const uint kv_head = fc_pack_group ? group.y : group.y / uint(p.group);
    const uint first_head = fc_pack_group ? group.y * uint(p.group) : group.y;
    const int rows_per_head = fc_pack_group ? p.seq_q : 0;
    const int row_count = fc_pack_group ? p.group * p.seq_q : p.seq_q;
    const int row_last = min(row0 + int(fc_block_parallel), row_count) - 1;

    // This lane's row, and the query head and query it stands for.
    const int row = row0 + int(simd_index) * 8 + int(fragment_row(lane));
    const uint head = first_head + uint(fc_pack_group ? row / p.seq_q : 0);
    const int query = fc_pack_group ? row % p.seq_q : row;
    // The queries the block's rows stand for, for the band: a block that spans two heads
    // covers queries from the end of one head and the start of the next.
    int query_first = row0, query_last = row_last;
    if (fc_pack_group) {
        const bool one_head = row0 / p.seq_q == row_last / p.seq_q;
        query_first = one_head ? row0 % p.seq_q : 0;
        query_last = one_head ? row_last % p.seq_q : p.seq_q - 1;
    }

    const staged_operand queries = {q,
                                    slice_of(p.q, batch, first_head),
                                    row0,
                                    row_count,
                                    fc_head_dim,
                                    rows_per_head,
                                    p.q.stride[1]};
    staged_operand keys =
        single_head_rows(k, slice_of(p.k, batch, kv_head), 0, p.seq_k, fc_head_dim);
    staged_operand values =
        single_head_rows(v, slice_of(p.v, batch, kv_head), 0, p.seq_k, fc_head_dim_v);
    const column_range out_cols = output_columns(out_block, fc_head_dim_v);

    simd_fragment q_cache[MFA_CACHED_FRAGMENTS];
    if (fc_cache_parallel) cache_slab(q_cache, parallel_tile, queries, thread_index, simd_index);

    simd_fragment out[MFA_OUT_FRAGMENTS];
    clear_fragments(out, fc_out_fragments);
    softmax_row stats = softmax_row_start();

    const block_range blocks =
        key_blocks_for_rows(p, query_first, query_last, int(fc_block_traversal));
    for (int block = blocks.begin; block < blocks.end; ++block) {
        const int key0 = block * int(fc_block_traversal);
        keys.row0 = key0;
        values.row0 = key0;

        // S = scale Q K^T, then P = exp(S - m) with the running max m.
        simd_fragment scores[MFA_TRAVERSAL_FRAGMENTS];
        compute_scores(scores, q_cache, fc_cache_parallel, parallel_tile, queries, traversal_tile,
                       keys, thread_index, simd_index);
        const bool edge = !block_fully_visible(p, query_first, query_last, key0,
                                               key0 + int(fc_block_traversal) - 1);
        to_scores(scores, p, edge, score_orientation::query_rows, query, key0, lane);
        const float correction = softmax_row_update(stats, scores, fc_traversal_fragments);

        // O = O * exp(m_old - m_new) + P V
        scale_fragments(out, fc_out_fragments, correction);
        accumulate_product(out, scores, traversal_tile, values, out_cols.begin, out_cols.end,
                           thread_index);
    }

    if (row >= row_count) return;
    store_rows(o, slice_of(p.o, batch, head), out, out_cols, query, softmax_row_normalizer(stats),
               lane);
    if (fc_has_lse && out_block == 0 && fragment_row_quarter(lane) == 0)
        l[slice_of(p.l, batch, head).at(query, 0)] = softmax_row_log_sum_exp(stats);
}

#endif
