// Matrix products of a simdgroup's 8-row slab against a traversed tile, both staged in
// threadgroup memory or both read from device memory (fc_direct_loads). Register arrays are sized for the
// largest variant; loop bounds are function constants, so once a pipeline is specialised the
// unrolled loops index registers with constants and Metal keeps only the fragments that variant
// uses.
#ifndef MFA_ATTENTION_TILES_H
#define MFA_ATTENTION_TILES_H

#include "staging.h"

#define MFA_TRAVERSAL_FRAGMENTS (MFA_MAX_BLOCK_TRAVERSAL / 8)
#define MFA_OUT_FRAGMENTS       (MFA_MAX_BLOCK_OUT / 8)
#define MFA_CACHED_FRAGMENTS    (MFA_MAX_CACHED_HEAD / 8)
#define MFA_HEAD_FRAGMENTS      (MFA_MAX_BLOCK_HEAD / 8)

constant uint fc_traversal_fragments = fc_block_traversal / 8;
constant uint fc_head_fragments = fc_block_head / 8;
constant uint fc_out_fragments = fc_block_out / 8;

// Fragments of an 8-row slab that hold real columns of a chunk with `width` columns left.
inline uint fragments_in(uint width) { return (min(width, fc_block_head) + 7) / 8; }

inline void clear_fragments(thread simd_fragment* f, uint count) {
#pragma clang loop unroll(full)
    for (uint i = 0; i < count; ++i) f[i] = zero_fragment();
}

inline void scale_fragments(thread simd_fragment* f, uint count, float factor) {
#pragma clang loop unroll(full)
    for (uint i = 0; i < count; ++i) {
        f[i].thread_elements()[0] *= factor;
        f[i].thread_elements()[1] *= factor;
    }
}

// One feature chunk of the traversed operand: the block_traversal rows from operand.row0,
// columns [col0, col0 + block_head), the columns at or past col_end reading as zero. Staged in
// `tile`, or with fc_direct_loads read from the operand itself.
struct traversed_chunk {
    const threadgroup uchar* tile;
    staged_operand operand;
    uint col0;
    uint col_end;
    bool edge; // the chunk reaches past the operand's rows or col_end (direct reads only)
};

inline traversed_chunk chunk_of(const threadgroup uchar* tile, staged_operand operand, uint col0,
                                uint col_end) {
    traversed_chunk c;
    c.tile = tile;
    c.operand = operand;
    c.col0 = col0;
    c.col_end = col_end;
    c.edge = edge_tile(operand, operand.row0, fc_block_traversal, col0, fc_block_head, col_end);
    return c;
}

inline simd_fragment traversed_fragment(traversed_chunk chunk, uint row, uint col, bool transpose,
                                        ushort lane) {
    if (fc_direct_loads)
        return device_fragment(chunk.operand, chunk.operand.row0 + int(row), chunk.col0 + col,
                               chunk.col_end, transpose, chunk.edge, lane);
    return staged_fragment(chunk.tile, row, col, transpose, lane);
}

// The two products of a slab with one chunk of traversed rows, over the chunk's `fragments`
// real 8-column fragments k and the traversed rows' fragments t:
//   scores:  acc[t] += lhs[k] * chunk[t rows, k]^T   (S = Q K^T, dP = dO V^T, and their
//                                                      key-value-side twins; lhs: the slab)
//   output:  acc[k] += lhs[t] * chunk[t rows, k]     (O += P V, dQ += dS K, dV += P^T dO,
//                                                      dK += dS^T Q; lhs: the weights)
inline void multiply_chunk(thread simd_fragment* acc, const thread simd_fragment* lhs,
                           traversed_chunk chunk, bool scores, uint fragments, ushort lane) {
#pragma clang loop unroll(full)
    for (uint k = 0; k < fc_head_fragments; ++k) {
        // Skipped, not left with break: a second exit can stop the full unroll (clang 16 at -O2
        // kept such a loop, indexing its fragment array dynamically, so in stack memory); with
        // the constant bound as the only exit every unrolled index is a constant. The same
        // holds for every loop over fragments or feature chunks below and in rows.h.
        if (k >= fragments) continue;
#pragma clang loop unroll(full)
        for (uint t = 0; t < fc_traversal_fragments; ++t) {
            const simd_fragment rhs = traversed_fragment(chunk, t * 8, k * 8, scores, lane);
            if (scores)
                simdgroup_multiply_accumulate(acc[t], lhs[k], rhs, acc[t]);
            else
                simdgroup_multiply_accumulate(acc[k], lhs[t], rhs, acc[k]);
        }
    }
}

// The fragments of this simdgroup's 8 rows of the slab operand, columns [d0, d0 + block_head):
// from the staged [block_parallel x block_head] tile, or with fc_direct_loads from the operand
// itself (zero past its rows and width, tested only when the 8 rows reach past them).
inline void load_slab(thread simd_fragment* slab, const threadgroup uchar* tile,
                      staged_operand operand, uint d0, ushort simd_index, uint fragments,
                      ushort lane) {
    const int row = operand.row0 + int(simd_index) * 8;
    const bool edge = edge_tile(operand, row, 8, d0, fc_block_head, operand.width);
#pragma clang loop unroll(full)
    for (uint k = 0; k < fc_head_fragments; ++k) {
        if (k >= fragments) continue;
        slab[k] = fc_direct_loads
                      ? device_fragment(operand, row, d0 + k * 8, operand.width, false, edge, lane)
                      : staged_fragment(tile, uint(simd_index) * 8, k * 8, false, lane);
    }
}

#endif
