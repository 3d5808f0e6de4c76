// Forward: O = softmax(scores) V and L = logsumexp, one threadgroup per block of query rows (and
// per block of output columns when Dv is wider than the accumulator, and per split of the keys
// when the planner splits them), of one sequence.
//
// With fc_pack_group the rows of a threadgroup are (query head, query) pairs of all the query
// heads that share one key/value head, laid end to end: a decode step with one query per head
// then fills the threadgroup with the group's heads, and each key/value block is read once for
// all of them instead of once per head.
//
// How a row ends: with fc_split_keys each split of the keys writes its normalised partial output
// and its lse to scratch, and the combine pass merges the splits (with the sinks and an initial
// state); otherwise the row folds in its sink and its initial state here and stores O and L.
// (An initial state read and rewritten here needs every threadgroup of the row to be the one
// that stores its L: one output block. The planner sends wider rows through the combine.)
#ifndef MFA_ATTENTION_FORWARD_H
#define MFA_ATTENTION_FORWARD_H

#include "rows.h"
#include "scores.h"

// The operands of the forward beyond q, k, v, o and l; absent ones are null.
struct forward_extras {
    device const uchar* mask;
    device const uchar* block_mask;
    device const float* alibi;
    device const float* sinks;
    device const int* cu_seqlens_q;
    device const int* cu_seqlens_k;
    device const int* block_table;
    device const int* cache_seqlens;
    device float* partial_o;
    device float* partial_l;
};

inline void attention_forward(device const uchar* q, device const uchar* k, device const uchar* v,
                              device uchar* o, device float* l, forward_extras x,
                              constant mfa_kernel_params& p, threadgroup float* staging,
                              uint3 group, ushort thread_index, ushort simd_index, ushort lane) {
    const staging_areas areas = staging_areas_of(staging);
    threadgroup int* page_blocks = (threadgroup int*)areas.row_vectors;
    threadgroup int* page_rows = page_blocks + fc_block_traversal;

    // group.x counts (row block, split, output block), the output block fastest.
    const uint out_block = group.x % uint(p.out_blocks);
    const uint rest = group.x / uint(p.out_blocks);
    const uint split = fc_split_keys ? rest % uint(p.splits) : 0;
    const int row0 = int((fc_split_keys ? rest / uint(p.splits) : rest) * fc_block_parallel);
    const uint batch = group.z;
    const attention_sequence s =
        sequence_of(p, batch, x.cu_seqlens_q, x.cu_seqlens_k, x.cache_seqlens);
    const uint kv_head = fc_pack_group ? group.y : group.y / uint(p.group);
    const uint first_head = fc_pack_group ? group.y * uint(p.group) : group.y;
    const int rows_per_head = fc_pack_group ? s.seq_q : 0;
    const int row_count = fc_pack_group ? p.group * s.seq_q : s.seq_q;
    // The grid covers the longest sequence: the whole threadgroup leaves past this one's end.
    if (row0 >= row_count) return;
    const int row_last = min(row0 + int(fc_block_parallel), row_count) - 1;

    // This lane's row, and the query head and query it stands for (rows past the end stand for
    // the last one: they read inside the operands, and their results are not stored).
    const int row = row0 + int(simd_index) * 8 + int(fragment_row(lane));
    const int lane_row = min(row, row_last);
    const uint head = first_head + uint(fc_pack_group ? lane_row / s.seq_q : 0);
    const int query = fc_pack_group ? lane_row % s.seq_q : lane_row;
    // The queries and heads the block's rows stand for, for the band and the mask summary: a
    // block that spans heads covers queries from the end of one head and the start of the next.
    int query_first = row0, query_last = row_last;
    uint head_first = first_head, head_last = first_head;
    if (fc_pack_group) {
        const bool one_head = row0 / s.seq_q == row_last / s.seq_q;
        query_first = one_head ? row0 % s.seq_q : 0;
        query_last = one_head ? row_last % s.seq_q : s.seq_q - 1;
        head_first = first_head + uint(row0 / s.seq_q);
        head_last = first_head + uint(row_last / s.seq_q);
    }

    staged_operand queries =
        single_head_rows(q, slice_from_row(p.q, s.batch, first_head, s.q_row0), row0, row_count,
                         fc_head_dim, vector_rows(p, MFA_OPERAND_Q));
    queries.rows_per_head = rows_per_head;
    queries.head_stride = p.q.stride[1];
    staged_operand keys, values;
    if (fc_paged) {
        keys = paged_rows(k, slice_of(p.k, 0, kv_head), p.k.stride[0], s.seq_k, fc_head_dim,
                          vector_rows(p, MFA_OPERAND_K), page_blocks, page_rows);
        values = paged_rows(v, slice_of(p.v, 0, kv_head), p.v.stride[0], s.seq_k, fc_head_dim_v,
                            vector_rows(p, MFA_OPERAND_V), page_blocks, page_rows);
    } else {
        keys = key_side_rows(k, p.k, s, kv_head, 0, fc_head_dim, vector_rows(p, MFA_OPERAND_K));
        values = key_side_rows(v, p.v, s, kv_head, 0, fc_head_dim_v, vector_rows(p, MFA_OPERAND_V));
    }
    const column_range out_cols = output_columns(out_block, fc_head_dim_v);
    const score_modifiers modifiers = modifiers_for(p, x.alibi, batch, head);

    simd_fragment q_cache[MFA_CACHED_FRAGMENTS];
    cache_slab(fc_cache_parallel, q_cache, areas.parallel_tile, queries, thread_index, simd_index,
               lane);

    simd_fragment out[MFA_OUT_FRAGMENTS];
    clear_fragments(out, fc_out_fragments);
    softmax_row stats = softmax_row_start();

    // The entry state's lse of this lane's row, read before any lane can overwrite it: the four
    // lanes of a row read it, and one of them stores the new L (after the barrier below).
    const operand_slice o_slice = slice_from_row(p.o, s.batch, head, s.q_row0);
    const operand_slice l_slice = slice_from_row(p.l, s.batch, head, s.q_row0);
    const float entry_lse = fc_initial_state ? l[l_slice.at(query, 0)] : 0.0f;

    block_range blocks = key_blocks_for_rows(s, query_first, query_last, int(fc_block_traversal));
    if (fc_split_keys) {
        const int per_split = p.split_keys / int(fc_block_traversal);
        blocks.begin = max(blocks.begin, int(split) * per_split);
        blocks.end = min(blocks.end, (int(split) + 1) * per_split);
    }
    for (int block = blocks.begin; block < blocks.end; ++block) {
        const int key0 = block * int(fc_block_traversal);
        const int key_last = key0 + int(fc_block_traversal) - 1;
        const uint verdict =
            tile_summary(p, x.block_mask, batch, head_first, head_last, query_first, query_last,
                         key0, min(key_last, s.seq_k - 1));
        if (verdict == 0) continue;
        const bool read_mask = fc_has_mask && verdict != 2;
        if (fc_paged)
            locate_keys(page_blocks, page_rows, x.block_table, p, batch, key0, s.seq_k,
                        thread_index);
        keys.row0 = key0;
        values.row0 = key0;

        // S = the scores of the tile, then P = exp(S - m) with the running max m.
        simd_fragment scores[MFA_TRAVERSAL_FRAGMENTS];
        compute_scores(scores, q_cache, fc_cache_parallel, areas.parallel_tile, queries,
                       areas.traversal_tile, keys, thread_index, simd_index, lane);
        const bool edge = !block_fully_visible(s, query_first, query_last, key0, key_last);
        to_scores(scores, nullptr, p, s, edge, read_mask, modifiers, x.mask,
                  score_orientation::query_rows, query, key0, lane);
        const float correction = softmax_row_update(stats, scores, fc_traversal_fragments);

        // O = O * exp(m_old - m_new) + P V
        scale_fragments(out, fc_out_fragments, correction);
        accumulate_product(out, scores, areas.traversal_tile, values, out_cols.begin, out_cols.end,
                           thread_index, lane);
    }

    if (fc_initial_state) threadgroup_barrier(mem_flags::mem_device);
    if (row >= row_count) return;
    const bool writes_lse = out_block == 0 && fragment_row_quarter(lane) == 0;
    if (fc_split_keys) {
        operand_slice part = slice_from_row(p.partial_o, s.batch, head, s.q_row0);
        part.base += long(split) * p.split_stride_o;
        store_rows_as(MFA_KERNEL_DTYPE_F32, (device uchar*)x.partial_o, part, out, out_cols, query,
                      softmax_row_normalizer(stats), false, 0.0f, lane);
        if (writes_lse)
            x.partial_l[long(split) * p.split_stride_l +
                        slice_from_row(p.partial_l, s.batch, head, s.q_row0).at(query, 0)] =
                softmax_row_log_sum_exp(stats);
        return;
    }
    if (fc_has_sinks) {
        const float sink = x.sinks[p.sinks.origin + long(head) * p.sinks.stride[1]];
        scale_fragments(out, fc_out_fragments, softmax_row_fold(stats, sink).correction);
    }
    // O = (O * correction + weight * entry O) / sum with an initial state, whose output is read
    // only where its lse says it saw a key.
    const bool with_entry = fc_initial_state && !lse_is_empty(entry_lse);
    fold_factors entry = {1.0f, 0.0f};
    if (with_entry) entry = softmax_row_fold(stats, entry_lse);
    const float normalizer = softmax_row_normalizer(stats);
    store_rows_as(fc_dtype, o, o_slice, out, out_cols, query, entry.correction * normalizer,
                  with_entry, entry.weight * normalizer, lane);
    if (fc_has_lse && writes_lse) l[l_slice.at(query, 0)] = softmax_row_log_sum_exp(stats);
}

#endif
