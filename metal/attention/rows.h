// The two loops every attention kernel is made of, over an operand chunk by chunk:
//   compute_scores      S  = slab x traversed^T   (reduction over the head dimension)
//   accumulate_product  out += weights x traversed (over this threadgroup's output columns)
// where the slab is this simdgroup's 8 rows of a parallel operand (Q, dO, K or V), either held
// in registers for the whole kernel or reloaded chunk by chunk, and the traversed operand is
// the current block of rows of the other side, loaded chunk by chunk. Both are staged through
// threadgroup memory or, with fc_direct_loads, read fragment by fragment from device memory (no
// staging, no barrier).
#ifndef MFA_ATTENTION_ROWS_H
#define MFA_ATTENTION_ROWS_H

#include "band.h"
#include "tiles.h"

// The tiled kernels' threadgroup memory, carved as mfa_staging_bytes counts it: the parallel
// operands' tile, the traversed operands' tile (both empty with fc_direct_loads), then 4-byte
// entries per traversed row (row_vectors).
struct staging_areas {
    threadgroup uchar* parallel_tile;
    threadgroup uchar* traversal_tile;
    threadgroup uchar* row_vectors;
};

inline staging_areas staging_areas_of(threadgroup float* staging) {
    const uint row_bytes = fc_staging_pitch * fc_element_size;
    staging_areas a;
    a.parallel_tile = (threadgroup uchar*)staging;
    a.traversal_tile = a.parallel_tile + fc_staged_parallel * row_bytes;
    a.row_vectors = a.traversal_tile + fc_staged_traversal * row_bytes;
    return a;
}

// The rows from row0 of a sequence's query-side operands (Q, dO: query head `head`) and of its
// key-side ones (K, V: key/value head `kv_head`), `width` features each.
inline staged_operand query_side_rows(device const uchar* data, constant mfa_operand_layout& layout,
                                      thread const attention_sequence& s, uint head, int row0,
                                      uint width, bool vectors) {
    return single_head_rows(data, slice_from_row(layout, s.batch, head, s.q_row0), row0, s.seq_q,
                            width, vectors);
}

inline staged_operand key_side_rows(device const uchar* data, constant mfa_operand_layout& layout,
                                    thread const attention_sequence& s, uint kv_head, int row0,
                                    uint width, bool vectors) {
    return single_head_rows(data, slice_from_row(layout, s.batch, kv_head, s.k_row0), row0, s.seq_k,
                            width, vectors);
}

// Loads this simdgroup's rows of `operand` (block_parallel rows from row0) into registers, where
// the planner chose to (`cached`, a function constant).
inline void cache_slab(bool cached, thread simd_fragment* cache, threadgroup uchar* parallel_tile,
                       staged_operand operand, ushort thread_index, ushort simd_index,
                       ushort lane) {
    if (!cached) return;
// Counted in cache fragments up to the operand's width, a function constant: unrolled, every
// cache index is a constant and the cache stays in registers, and the loop's size is that of
// the chunks it has (a bound of MFA_CACHED_FRAGMENTS would make the unroller weigh them all).
#pragma clang loop unroll(full)
    for (uint c = 0; c * 8 < operand.width; c += fc_head_fragments) {
        const uint d0 = c * 8;
        if (!fc_direct_loads) {
            stage_tile(parallel_tile, operand, fc_block_parallel, d0, operand.width, thread_index);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        load_slab(cache + c, parallel_tile, operand, d0, simd_index,
                  fragments_in(operand.width - d0), lane);
        if (!fc_direct_loads) threadgroup_barrier(mem_flags::mem_threadgroup);
    }
}

// The backward's two parallel operands, each in registers where the planner chose to: the first
// (Q or K) with fc_cache_parallel, the second (dO or V) with fc_cache_parallel2.
inline void cache_parallel_operands(thread simd_fragment* first_cache,
                                    thread simd_fragment* second_cache,
                                    threadgroup uchar* parallel_tile, staged_operand first,
                                    staged_operand second, ushort thread_index, ushort simd_index,
                                    ushort lane) {
    cache_slab(fc_cache_parallel, first_cache, parallel_tile, first, thread_index, simd_index,
               lane);
    cache_slab(fc_cache_parallel2, second_cache, parallel_tile, second, thread_index, simd_index,
               lane);
}

// One feature chunk [d0, d0 + block_head) of compute_scores. The barriers order the chunk's
// staging before its reads and its reads before the next chunk's staging; with fc_direct_loads
// nothing is staged and there is nothing to order.
inline void accumulate_score_chunk(thread simd_fragment* scores, const thread simd_fragment* cache,
                                   bool cached, threadgroup uchar* parallel_tile,
                                   staged_operand slab, threadgroup uchar* traversal_tile,
                                   staged_operand traversed, uint d0, ushort thread_index,
                                   ushort simd_index, ushort lane) {
    if (!fc_direct_loads) {
        if (!cached)
            stage_tile(parallel_tile, slab, fc_block_parallel, d0, slab.width, thread_index);
        stage_tile(traversal_tile, traversed, fc_block_traversal, d0, traversed.width,
                   thread_index);
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    const uint fragments = fragments_in(slab.width - d0);
    simd_fragment chunk[MFA_HEAD_FRAGMENTS];
    if (!cached) load_slab(chunk, parallel_tile, slab, d0, simd_index, fragments, lane);
    multiply_chunk(scores, cached ? cache + d0 / 8 : chunk,
                   chunk_of(traversal_tile, traversed, d0, traversed.width), true, fragments, lane);
    if (!fc_direct_loads) threadgroup_barrier(mem_flags::mem_threadgroup);
}

// scores = slab x traversed^T over the full width (slab and traversed share it).
inline void compute_scores(thread simd_fragment* scores, const thread simd_fragment* cache,
                           bool cached, threadgroup uchar* parallel_tile, staged_operand slab,
                           threadgroup uchar* traversal_tile, staged_operand traversed,
                           ushort thread_index, ushort simd_index, ushort lane) {
    clear_fragments(scores, fc_traversal_fragments);
    if (cached) {
// As in cache_slab: a function-constant bound keeps the unrolled cache indices constant.
#pragma clang loop unroll(full)
        for (uint c = 0; c * 8 < slab.width; c += fc_head_fragments) {
            accumulate_score_chunk(scores, cache, true, parallel_tile, slab, traversal_tile,
                                   traversed, c * 8, thread_index, simd_index, lane);
        }
    } else {
#pragma clang loop unroll(full)
        for (uint d0 = 0; d0 < slab.width; d0 += fc_block_head)
            accumulate_score_chunk(scores, cache, false, parallel_tile, slab, traversal_tile,
                                   traversed, d0, thread_index, simd_index, lane);
    }
}

// out += weights x traversed[:, out_begin:out_end]; out[0] is column out_begin.
inline void accumulate_product(thread simd_fragment* out, const thread simd_fragment* weights,
                               threadgroup uchar* traversal_tile, staged_operand traversed,
                               uint out_begin, uint out_end, ushort thread_index, ushort lane) {
// Counted from out_begin so that, unrolled, every accumulator index is a constant.
#pragma clang loop unroll(full)
    for (uint offset = 0; offset < fc_block_out; offset += fc_block_head) {
        const uint d0 = out_begin + offset;
        if (d0 >= out_end) continue; // uniform across the threadgroup
        if (!fc_direct_loads) {
            stage_tile(traversal_tile, traversed, fc_block_traversal, d0, out_end, thread_index);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        multiply_chunk(out + offset / 8, weights, chunk_of(traversal_tile, traversed, d0, out_end),
                       false, fragments_in(out_end - d0), lane);
        if (!fc_direct_loads) threadgroup_barrier(mem_flags::mem_threadgroup);
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

// Stores this lane's elements of an 8-row accumulator slab into sequence row `row` of the
// output columns `cols`, as `dtype`: acc * factor, plus, `with_entry`, entry_weight times the
// element already there (an initial state's output, read just before it is overwritten).
inline void store_rows_as(uint dtype, device uchar* dst, operand_slice slice,
                          thread simd_fragment* acc, column_range cols, int row, float factor,
                          bool with_entry, float entry_weight, ushort lane) {
    const uint col0 = cols.begin + fragment_col(lane);
#pragma clang loop unroll(full)
    for (uint j = 0; j < fc_out_fragments; ++j)
        for (ushort e = 0; e < 2; ++e) {
            const uint col = col0 + j * 8 + e;
            if (col >= cols.end) continue;
            const long at = slice.at(row, col);
            float value = acc[j].thread_elements()[e] * factor;
            if (with_entry) value += entry_weight * load_element_as(dtype, dst, at);
            store_element_as(dtype, dst, at, value);
        }
}

inline void store_rows(device uchar* dst, operand_slice slice, thread simd_fragment* acc,
                       column_range cols, int row, float factor, ushort lane) {
    store_rows_as(fc_dtype, dst, slice, acc, cols, row, factor, false, 0.0f, lane);
}

#endif
