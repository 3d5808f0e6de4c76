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

inline void attention_backward_query(device const uchar* q, device const uchar* k,
                                     device const uchar* v, device const uchar* o,
                                     device const float* l, device float* delta_out,
                                     device const uchar* dout, device uchar* dq, backward_extras x,
                                     constant mfa_kernel_params& p, threadgroup float* staging,
                                     uint3 group, ushort thread_index, ushort simd_index,
                                     ushort lane) {
    threadgroup float* parallel_tile = staging;
    threadgroup float* traversal_tile = staging + fc_block_parallel * fc_block_head;

    const uint out_block = group.x % uint(p.out_blocks);
    const int row0 = int(group.x / uint(p.out_blocks) * fc_block_parallel);
    const uint head = group.y, batch = group.z, kv_head = head / uint(p.group);
    const attention_sequence s = sequence_of(p, batch, x.cu_seqlens_q, x.cu_seqlens_k, nullptr);
    // The grid covers the longest sequence: the whole threadgroup leaves past this one's end.
    if (row0 >= s.seq_q) return;
    const int row_last = min(row0 + int(fc_block_parallel), s.seq_q) - 1;
    const int row = row0 + int(simd_index) * 8 + int(fragment_row(lane));

    const staged_operand queries = single_head_rows(q, slice_from_row(p.q, s.batch, head, s.q_row0),
                                                    row0, s.seq_q, fc_head_dim);
    const staged_operand grads = single_head_rows(
        dout, slice_from_row(p.dout, s.batch, head, s.q_row0), row0, s.seq_q, fc_head_dim_v);
    staged_operand keys = single_head_rows(k, slice_from_row(p.k, s.batch, kv_head, s.k_row0), 0,
                                           s.seq_k, fc_head_dim);
    staged_operand values = single_head_rows(v, slice_from_row(p.v, s.batch, kv_head, s.k_row0), 0,
                                             s.seq_k, fc_head_dim_v);
    const column_range out_cols = output_columns(out_block, fc_head_dim);
    const score_modifiers modifiers = modifiers_for(p, x.alibi, batch, head);

    const float delta = output_gradient_dot(o, slice_from_row(p.o, s.batch, head, s.q_row0), dout,
                                            grads.slice, row, s.seq_q, lane);
    if (out_block == 0 && fragment_row_quarter(lane) == 0 && row < s.seq_q)
        delta_out[slice_from_row(p.delta, s.batch, head, s.q_row0).at(row, 0)] = delta;
    // Rows past the end read as rows that saw no key: every probability 0.
    const float lse = row < s.seq_q ? l[slice_from_row(p.l, s.batch, head, s.q_row0).at(row, 0)]
                                    : as_type<float>(kEmptyRowLogSumExpBits);

    simd_fragment q_cache[MFA_CACHED_FRAGMENTS];
    if (fc_cache_parallel) cache_slab(q_cache, parallel_tile, queries, thread_index, simd_index);
    simd_fragment dout_cache[MFA_CACHED_FRAGMENTS];
    if (fc_cache_parallel2) cache_slab(dout_cache, parallel_tile, grads, thread_index, simd_index);

    simd_fragment dq_acc[MFA_OUT_FRAGMENTS];
    clear_fragments(dq_acc, fc_out_fragments);

    const block_range blocks = key_blocks_for_rows(s, row0, row_last, int(fc_block_traversal));
    for (int block = blocks.begin; block < blocks.end; ++block) {
        const int key0 = block * int(fc_block_traversal);
        const int key_last = key0 + int(fc_block_traversal) - 1;
        bool read_mask = fc_has_mask;
        if (fc_has_block_mask) {
            const uint verdict = tile_summary(p, x.block_mask, batch, head, head, row0, row_last,
                                              key0, min(key_last, s.seq_k - 1));
            if (verdict == 0) continue;
            read_mask = verdict != 2;
        }
        keys.row0 = key0;
        values.row0 = key0;

        // P = exp(S - L) with the forward's log-sum-exp: no running statistics needed.
        simd_fragment probs[MFA_TRAVERSAL_FRAGMENTS];
        simd_fragment softcap_derivative[MFA_TRAVERSAL_FRAGMENTS];
        compute_scores(probs, q_cache, fc_cache_parallel, parallel_tile, queries, traversal_tile,
                       keys, thread_index, simd_index);
        const bool edge = !block_fully_visible(s, row0, row_last, key0, key_last);
        to_scores(probs, softcap_derivative, p, s, edge, read_mask, modifiers, x.mask,
                  score_orientation::query_rows, min(row, row_last), key0, lane);

        simd_fragment dprobs[MFA_TRAVERSAL_FRAGMENTS];
        compute_scores(dprobs, dout_cache, fc_cache_parallel2, parallel_tile, grads, traversal_tile,
                       values, thread_index, simd_index);

// dS = P * (dP - delta) (* softcap's derivative), in place of dP.
#pragma clang loop unroll(full)
        for (uint t = 0; t < fc_traversal_fragments; ++t)
            for (ushort e = 0; e < 2; ++e) {
                const float prob = probability_from_stored_lse(probs[t].thread_elements()[e], lse);
                float ds = prob * (dprobs[t].thread_elements()[e] - delta);
                if (fc_has_softcap) ds *= softcap_derivative[t].thread_elements()[e];
                dprobs[t].thread_elements()[e] = ds;
            }
        accumulate_product(dq_acc, dprobs, traversal_tile, keys, out_cols.begin, out_cols.end,
                           thread_index);
    }

    if (row >= s.seq_q) return;
    store_rows(dq, slice_from_row(p.dq, s.batch, head, s.q_row0), dq_acc, out_cols, row, p.scale,
               lane);
}

#endif
