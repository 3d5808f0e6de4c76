// The two loops every attention kernel is made of, over an operand staged chunk by chunk:
//   compute_scores      S  = slab x traversed^T   (reduction over the head dimension)
//   accumulate_product  out += weights x traversed (over this threadgroup's output columns)
// where the slab is this simdgroup's 8 rows of a parallel operand (Q, dO, K or V), either held
// in registers for the whole kernel or re-staged chunk by chunk, and the traversed operand is
// the current block of rows of the other side.
#ifndef MFA_ATTENTION_ROWS_H
#define MFA_ATTENTION_ROWS_H

#include "staging.h"
#include "tiles.h"

// Loads this simdgroup's rows of `operand` (block_parallel rows from row0) into registers.
inline void cache_slab(thread simd_fragment* cache, threadgroup float* parallel_tile,
                       staged_operand operand, ushort thread_index, ushort simd_index) {
// Counted in cache fragments with a constant bound, so that, unrolled, every cache index is
// a constant and the cache stays in registers.
#pragma clang loop unroll(full)
    for (uint c = 0; c < MFA_CACHED_FRAGMENTS; c += fc_head_fragments) {
        const uint d0 = c * 8;
        if (d0 >= operand.width) continue; // uniform across the threadgroup
        stage_tile(parallel_tile, operand, fc_block_parallel, d0, operand.width, thread_index);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        load_slab(cache + c, parallel_tile, simd_index, fragments_in(operand.width - d0));
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
}

// One feature chunk [d0, d0 + block_head) of compute_scores.
inline void accumulate_score_chunk(thread simd_fragment* scores, const thread simd_fragment* cache,
                                   bool cached, threadgroup float* parallel_tile,
                                   staged_operand slab, threadgroup float* traversal_tile,
                                   staged_operand traversed, uint d0, ushort thread_index,
                                   ushort simd_index) {
    if (!cached) stage_tile(parallel_tile, slab, fc_block_parallel, d0, slab.width, thread_index);
    stage_tile(traversal_tile, traversed, fc_block_traversal, d0, traversed.width, thread_index);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const uint fragments = fragments_in(slab.width - d0);
    simd_fragment chunk[MFA_HEAD_FRAGMENTS];
    if (!cached) load_slab(chunk, parallel_tile, simd_index, fragments);
    accumulate_scores(scores, cached ? cache + d0 / 8 : chunk, traversal_tile, fragments);
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

// scores = slab x traversed^T over the full width (slab and traversed share it).
inline void compute_scores(thread simd_fragment* scores, const thread simd_fragment* cache,
                           bool cached, threadgroup float* parallel_tile, staged_operand slab,
                           threadgroup float* traversal_tile, staged_operand traversed,
                           ushort thread_index, ushort simd_index) {
    clear_fragments(scores, fc_traversal_fragments);
    if (cached) {
// As in cache_slab: a constant bound keeps the unrolled cache indices constant.
#pragma clang loop unroll(full)
        for (uint c = 0; c < MFA_CACHED_FRAGMENTS; c += fc_head_fragments) {
            if (c * 8 >= slab.width) continue;
            accumulate_score_chunk(scores, cache, true, parallel_tile, slab, traversal_tile,
                                   traversed, c * 8, thread_index, simd_index);
        }
    } else {
#pragma clang loop unroll(full)
        for (uint d0 = 0; d0 < slab.width; d0 += fc_block_head)
            accumulate_score_chunk(scores, cache, false, parallel_tile, slab, traversal_tile,
                                   traversed, d0, thread_index, simd_index);
    }
}

// out += weights x traversed[:, out_begin:out_end]; out[0] is column out_begin.
inline void accumulate_product(thread simd_fragment* out, const thread simd_fragment* weights,
                               threadgroup float* traversal_tile, staged_operand traversed,
                               uint out_begin, uint out_end, ushort thread_index) {
// Counted from out_begin so that, unrolled, every accumulator index is a constant.
#pragma clang loop unroll(full)
    for (uint offset = 0; offset < fc_block_out; offset += fc_block_head) {
        const uint d0 = out_begin + offset;
        if (d0 >= out_end) continue; // uniform across the threadgroup
        stage_tile(traversal_tile, traversed, fc_block_traversal, d0, out_end, thread_index);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        accumulate_output(out + offset / 8, weights, traversal_tile, fragments_in(out_end - d0));
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
}

// Output columns [begin, end) of a threadgroup: fc_out_fragments fragments, of which those past
// `end` are computed but never stored.
struct column_range {
    uint begin;
    uint end;
};

inline column_range output_columns(uint out_block, uint width) {
    column_range r;
    r.begin = out_block * fc_block_out;
    r.end = min(r.begin + fc_block_out, width);
    return r;
}

// Stores this lane's elements of an 8-row accumulator slab, times `factor`, into sequence row
// `row` of the output columns `cols`.
inline void store_rows(device uchar* dst, operand_slice slice, thread simd_fragment* acc,
                       column_range cols, int row, float factor, ushort lane) {
    const uint col0 = cols.begin + fragment_col(lane);
#pragma clang loop unroll(full)
    for (uint j = 0; j < fc_out_fragments; ++j)
        for (ushort e = 0; e < 2; ++e) {
            const uint col = col0 + j * 8 + e;
            if (col < cols.end)
                store_element(dst, slice.at(row, col), acc[j].thread_elements()[e] * factor);
        }
}

#endif
