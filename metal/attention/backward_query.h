// Backward-query: delta = rowsum(dO * O) (saved for backward-key-value and the sink gradient) and
//   dQ = scale * sum_j dS_ij K_j,   dS = P * (dP - delta) * ds/dx,   P = exp(S - L),   dP = dO V^T
// where ds/dx is softcap's derivative (1 without softcap): one threadgroup per block of query
// rows of one sequence (and per block of dQ columns for wide D).
#ifndef MFA_ATTENTION_BACKWARD_QUERY_H
#define MFA_ATTENTION_BACKWARD_QUERY_H

#include "rows.h"
#include "scores.h"

// The operands of the backward passes beyond the dense ones; absent ones are null.
struct backward_extras {
    device const uchar* mask;
    device const uchar* block_mask;
    device const float* alibi;
    device const int* cu_seqlens_q;
    device const int* cu_seqlens_k;
};

// rowsum(dO * O) of this lane's row, split over the four lanes that share the row.
inline float output_gradient_dot(device const uchar* o, operand_slice o_slice,
                                 device const uchar* dout, operand_slice dout_slice, int row,
                                 int seq_q, ushort lane) {
    float partial = 0.0f;
    if (row < seq_q)
        for (uint col = fragment_row_quarter(lane); col < fc_head_dim_v; col += 4)
            partial +=
                load_element(dout, dout_slice.at(row, col)) * load_element(o, o_slice.at(row, col));
    return row_sum(partial);
}

// The per-query values (the stored lse, delta) of a block of traversed queries, where queries
// are the columns of every tile (backward-key-value): lane i of each simdgroup holds those of
// queries query0 + i, query0 + 32 + i, ..., and the lanes of a fragment's column take theirs by
// shuffle, so a block's values cost each simdgroup one device read per query and no threadgroup
// memory or barrier. Queries past the end hold past_end.
struct query_columns {
    float lanes[MFA_TRAVERSAL_FRAGMENTS / 4];
};

inline query_columns load_query_columns(device const float* values, operand_slice slice, int query0,
                                        int seq_q, float past_end, ushort lane) {
    query_columns q;
#pragma clang loop unroll(full)
    for (uint g = 0; g * 32 < fc_block_traversal; ++g) {
        const uint i = g * 32 + lane;
        const int query = query0 + int(i);
        q.lanes[g] =
            i < fc_block_traversal && query < seq_q ? values[slice.at(query, 0)] : past_end;
    }
    return q;
}

// The backward's per-element terms of a tile, in place. Each takes a per-query value: one per
// lane row where queries are the rows (backward-query: row_value), one per column where they are
// the columns (backward-key-value: columns, null otherwise).
inline float query_value(float row_value, const thread query_columns* columns, uint t, ushort e,
                         ushort lane) {
    if (!columns) return row_value;
    // Column fragment_col + e of fragment t is query 8 t + fragment_col + e of the block.
    return simd_shuffle(columns->lanes[t / 4], ushort((t % 4) * 8 + fragment_col(lane) + e));
}

// P = exp(S - L) with the forward's log-sum-exp, in place of S: no running statistics needed.
inline void to_probabilities(thread simd_fragment* scores, float row_lse,
                             const thread query_columns* column_lse, ushort lane) {
#pragma clang loop unroll(full)
    for (uint t = 0; t < fc_traversal_fragments; ++t)
        for (ushort e = 0; e < 2; ++e)
            scores[t].thread_elements()[e] = probability_from_stored_lse(
                scores[t].thread_elements()[e], query_value(row_lse, column_lse, t, e, lane));
}

// dS = P * (dP - delta) (* softcap's derivative), in place of dP.
inline void to_score_gradients(thread simd_fragment* dprobs, const thread simd_fragment* probs,
                               const thread simd_fragment* softcap_derivative, float row_delta,
                               const thread query_columns* column_delta, ushort lane) {
#pragma clang loop unroll(full)
    for (uint t = 0; t < fc_traversal_fragments; ++t)
        for (ushort e = 0; e < 2; ++e) {
            float ds =
                probs[t].thread_elements()[e] *
                (dprobs[t].thread_elements()[e] - query_value(row_delta, column_delta, t, e, lane));
            if (fc_has_softcap) ds *= softcap_derivative[t].thread_elements()[e];
            dprobs[t].thread_elements()[e] = ds;
        }
}

// The parallel rows of a backward threadgroup: group.x counts (row block, output block), the
// output block fastest; `rows` rows in all (queries or keys of the sequence). first..last are
// the block's rows, `row` this lane's (possibly past the end).
struct parallel_rows {
    uint out_block;
    int first;
    int last;
    int row;
};

inline parallel_rows parallel_rows_of(constant mfa_kernel_params& p, uint group_x, int rows,
                                      ushort simd_index, ushort lane) {
    parallel_rows r;
    r.out_block = group_x % uint(p.out_blocks);
    r.first = int(group_x / uint(p.out_blocks) * fc_block_parallel);
    r.last = min(r.first + int(fc_block_parallel), rows) - 1;
    r.row = r.first + int(simd_index) * 8 + int(fragment_row(lane));
    return r;
}

inline void attention_backward_query(device const uchar* q, device const uchar* k,
                                     device const uchar* v, device const uchar* o,
                                     device const float* l, device float* delta_out,
                                     device const uchar* dout, device uchar* dq, backward_extras x,
                                     constant mfa_kernel_params& p, threadgroup float* staging,
                                     uint3 group, ushort thread_index, ushort simd_index,
                                     ushort lane) {
    const staging_areas areas = staging_areas_of(staging);

    const uint head = group.y, batch = group.z, kv_head = head / uint(p.group);
    const attention_sequence s = sequence_of(p, batch, x.cu_seqlens_q, x.cu_seqlens_k, nullptr);
    const parallel_rows rows = parallel_rows_of(p, group.x, s.seq_q, simd_index, lane);
    // The grid covers the longest sequence: the whole threadgroup leaves past this one's end.
    if (rows.first >= s.seq_q) return;
    const int row0 = rows.first, row_last = rows.last, row = rows.row;

    const staged_operand queries =
        query_side_rows(q, p.q, s, head, row0, fc_head_dim, vector_rows(p, MFA_OPERAND_Q));
    const staged_operand grads = query_side_rows(dout, p.dout, s, head, row0, fc_head_dim_v,
                                                 vector_rows(p, MFA_OPERAND_DOUT));
    staged_operand keys =
        key_side_rows(k, p.k, s, kv_head, 0, fc_head_dim, vector_rows(p, MFA_OPERAND_K));
    staged_operand values =
        key_side_rows(v, p.v, s, kv_head, 0, fc_head_dim_v, vector_rows(p, MFA_OPERAND_V));
    const column_range out_cols = output_columns(rows.out_block, fc_head_dim);
    const score_modifiers modifiers = modifiers_for(p, x.alibi, batch, head);

    const float delta = output_gradient_dot(o, slice_from_row(p.o, s.batch, head, s.q_row0), dout,
                                            grads.slice, row, s.seq_q, lane);
    if (rows.out_block == 0 && fragment_row_quarter(lane) == 0 && row < s.seq_q)
        delta_out[slice_from_row(p.delta, s.batch, head, s.q_row0).at(row, 0)] = delta;
    // Rows past the end read as rows that saw no key: every probability 0.
    const float lse = row < s.seq_q ? l[slice_from_row(p.l, s.batch, head, s.q_row0).at(row, 0)]
                                    : as_type<float>(kEmptyRowLogSumExpBits);

    simd_fragment q_cache[MFA_CACHED_FRAGMENTS];
    simd_fragment dout_cache[MFA_CACHED_FRAGMENTS];
    cache_parallel_operands(q_cache, dout_cache, areas.parallel_tile, queries, grads, thread_index,
                            simd_index, lane);

    simd_fragment dq_acc[MFA_OUT_FRAGMENTS];
    clear_fragments(dq_acc, fc_out_fragments);

    const block_range blocks = key_blocks_for_rows(s, row0, row_last, int(fc_block_traversal));
    for (int block = blocks.begin; block < blocks.end; ++block) {
        const int key0 = block * int(fc_block_traversal);
        const int key_last = key0 + int(fc_block_traversal) - 1;
        const uint verdict = tile_summary(p, x.block_mask, batch, head, head, row0, row_last, key0,
                                          min(key_last, s.seq_k - 1));
        if (verdict == 0) continue;
        const bool read_mask = fc_has_mask && verdict != 2;
        keys.row0 = key0;
        values.row0 = key0;

        // P = exp(S - L), then dP = dO V^T and dS.
        simd_fragment probs[MFA_TRAVERSAL_FRAGMENTS];
        simd_fragment softcap_derivative[MFA_TRAVERSAL_FRAGMENTS];
        compute_scores(probs, q_cache, fc_cache_parallel, areas.parallel_tile, queries,
                       areas.traversal_tile, keys, thread_index, simd_index, lane);
        const bool edge = !block_fully_visible(s, row0, row_last, key0, key_last);
        to_scores(probs, softcap_derivative, p, s, edge, read_mask, modifiers, x.mask,
                  score_orientation::query_rows, min(row, row_last), key0, lane);
        to_probabilities(probs, lse, nullptr, lane);

        simd_fragment dprobs[MFA_TRAVERSAL_FRAGMENTS];
        compute_scores(dprobs, dout_cache, fc_cache_parallel2, areas.parallel_tile, grads,
                       areas.traversal_tile, values, thread_index, simd_index, lane);
        to_score_gradients(dprobs, probs, softcap_derivative, delta, nullptr, lane);
        accumulate_product(dq_acc, dprobs, areas.traversal_tile, keys, out_cols.begin, out_cols.end,
                           thread_index, lane);
    }

    if (row >= s.seq_q) return;
    store_rows(dq, slice_from_row(p.dq, s.batch, head, s.q_row0), dq_acc, out_cols, row, p.scale,
               lane);
}

#endif
