// Backward-key-value: one threadgroup per block of key rows of one sequence (and per block of
// output columns for wide heads) walks the query blocks of every query head that shares its
// key/value head:
//   P^T = exp(S^T - L),  dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T * (dP^T - delta) * ds/dx,
//   dK += scale * dS^T Q.
// Summing over the group inside the threadgroup is what makes GQA need no atomics.
#ifndef MFA_ATTENTION_BACKWARD_KEY_VALUE_H
#define MFA_ATTENTION_BACKWARD_KEY_VALUE_H

#include "backward_query.h"

inline void attention_backward_key_value(device const uchar* q, device const uchar* k,
                                         device const uchar* v, device const float* l,
                                         device const float* delta, device const uchar* dout,
                                         device uchar* dv, device uchar* dk, backward_extras x,
                                         constant mfa_kernel_params& p, threadgroup float* staging,
                                         uint3 group, ushort thread_index, ushort simd_index,
                                         ushort lane) {
    const staging_areas areas = staging_areas_of(staging);

    const uint kv_head = group.y, batch = group.z;
    const attention_sequence s = sequence_of(p, batch, x.cu_seqlens_q, x.cu_seqlens_k, nullptr);
    const parallel_rows rows = parallel_rows_of(p, group.x, s.seq_k, simd_index, lane);
    // The grid covers the longest sequence: the whole threadgroup leaves past this one's end.
    if (rows.first >= s.seq_k) return;
    const int key0 = rows.first, key_last = rows.last, key = rows.row;
    const column_range dk_cols = output_columns(rows.out_block, fc_head_dim);
    const column_range dv_cols = output_columns(rows.out_block, fc_head_dim_v);

    const staged_operand keys =
        key_side_rows(k, p.k, s, kv_head, key0, fc_head_dim, vector_rows(p, MFA_OPERAND_K));
    const staged_operand values =
        key_side_rows(v, p.v, s, kv_head, key0, fc_head_dim_v, vector_rows(p, MFA_OPERAND_V));

    simd_fragment k_cache[MFA_CACHED_FRAGMENTS];
    simd_fragment v_cache[MFA_CACHED_FRAGMENTS];
    cache_parallel_operands(k_cache, v_cache, areas.parallel_tile, keys, values, thread_index,
                            simd_index, lane);

    simd_fragment dk_acc[MFA_OUT_FRAGMENTS];
    simd_fragment dv_acc[MFA_OUT_FRAGMENTS];
    clear_fragments(dk_acc, fc_out_fragments);
    clear_fragments(dv_acc, fc_out_fragments);

    const block_range blocks = query_blocks_for_keys(s, key0, key_last, int(fc_block_traversal));
    for (uint head = kv_head * uint(p.group); head < (kv_head + 1) * uint(p.group); ++head) {
        staged_operand queries =
            query_side_rows(q, p.q, s, head, 0, fc_head_dim, vector_rows(p, MFA_OPERAND_Q));
        staged_operand grads = query_side_rows(dout, p.dout, s, head, 0, fc_head_dim_v,
                                               vector_rows(p, MFA_OPERAND_DOUT));
        const operand_slice l_slice = slice_from_row(p.l, s.batch, head, s.q_row0);
        const operand_slice delta_slice = slice_from_row(p.delta, s.batch, head, s.q_row0);
        const score_modifiers modifiers = modifiers_for(p, x.alibi, batch, head);

        for (int block = blocks.begin; block < blocks.end; ++block) {
            const int query0 = block * int(fc_block_traversal);
            const int query_end = query0 + int(fc_block_traversal) - 1;
            const uint verdict = tile_summary(p, x.block_mask, batch, head, head, query0,
                                              min(query_end, s.seq_q - 1), key0, key_last);
            if (verdict == 0) continue;
            const bool read_mask = fc_has_mask && verdict != 2;
            queries.row0 = query0;
            grads.row0 = query0;
            const bool edge = !block_fully_visible(s, query0, query_end, key0, key_last);

            // The block's L and delta; queries past the end read as rows that saw no key: every
            // probability 0.
            const query_columns query_lse = load_query_columns(
                l, l_slice, query0, s.seq_q, as_type<float>(kEmptyRowLogSumExpBits), lane);
            const query_columns query_delta =
                load_query_columns(delta, delta_slice, query0, s.seq_q, 0.0f, lane);

            // P^T = exp(S^T - L): rows are keys, columns queries.
            simd_fragment probs[MFA_TRAVERSAL_FRAGMENTS];
            simd_fragment softcap_derivative[MFA_TRAVERSAL_FRAGMENTS];
            compute_scores(probs, k_cache, fc_cache_parallel, areas.parallel_tile, keys,
                           areas.traversal_tile, queries, thread_index, simd_index, lane);
            to_scores(probs, softcap_derivative, p, s, edge, read_mask, modifiers, x.mask,
                      score_orientation::key_rows, min(key, key_last), query0, lane);
            to_probabilities(probs, 0.0f, &query_lse, lane);

            // dP^T = V dO^T
            simd_fragment dprobs[MFA_TRAVERSAL_FRAGMENTS];
            compute_scores(dprobs, v_cache, fc_cache_parallel2, areas.parallel_tile, values,
                           areas.traversal_tile, grads, thread_index, simd_index, lane);

            accumulate_product(dv_acc, probs, areas.traversal_tile, grads, dv_cols.begin,
                               dv_cols.end, thread_index, lane);

            // dS^T = P^T * (dP^T - delta) (* softcap's derivative), in place of dP^T.
            to_score_gradients(dprobs, probs, softcap_derivative, 0.0f, &query_delta, lane);
            accumulate_product(dk_acc, dprobs, areas.traversal_tile, queries, dk_cols.begin,
                               dk_cols.end, thread_index, lane);
        }
    }

    if (key >= s.seq_k) return;
    store_rows(dk, slice_from_row(p.dk, s.batch, kv_head, s.k_row0), dk_acc, dk_cols, key, p.scale,
               lane);
    store_rows(dv, slice_from_row(p.dv, s.batch, kv_head, s.k_row0), dv_acc, dv_cols, key, 1.0f,
               lane);
}

#endif
