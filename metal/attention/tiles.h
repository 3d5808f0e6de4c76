// Matrix products of a simdgroup's 8-row slab against tiles staged in threadgroup memory.
// Register arrays are sized for the largest variant; loop bounds are function constants, so
// once a pipeline is specialised the unrolled loops index registers with constants and Metal
// keeps only the fragments that variant uses.
#ifndef MFA_ATTENTION_TILES_H
#define MFA_ATTENTION_TILES_H

#include "constants.h"
#include "fragment.h"

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

// scores[t] += slab[:, k] * traversed[t rows, k]^T for the staged feature chunk: the
// "row slab x traversed rows transposed" product (S = Q K^T, dP = dO V^T, and their
// key-value-side twins). slab(k) is the slab's k-th 8-column simd_fragment of this chunk.
inline void accumulate_scores(thread simd_fragment* scores, const thread simd_fragment* slab,
                              const threadgroup float* traversed, uint fragments) {
#pragma clang loop unroll(full)
    for (uint k = 0; k < fc_head_fragments; ++k) {
        // Skipped, not left with break: a second exit can stop the full unroll (clang 16 at -O2
        // kept such a loop, indexing its fragment array dynamically, so in stack memory); with
        // the constant bound as the only exit every unrolled index is a constant. The same
        // holds for every loop over fragments or feature chunks below and in rows.h.
        if (k >= fragments) continue;
#pragma clang loop unroll(full)
        for (uint t = 0; t < fc_traversal_fragments; ++t) {
            const simd_fragment rhs = load_fragment(traversed, fc_block_head, t * 8, k * 8, true);
            simdgroup_multiply_accumulate(scores[t], slab[k], rhs, scores[t]);
        }
    }
}

// out[j] += weights[t] * traversed[t rows, j]: the "probabilities x traversed rows" product
// (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q) for one staged feature chunk.
inline void accumulate_output(thread simd_fragment* out, const thread simd_fragment* weights,
                              const threadgroup float* traversed, uint fragments) {
#pragma clang loop unroll(full)
    for (uint j = 0; j < fc_head_fragments; ++j) {
        if (j >= fragments) continue;
#pragma clang loop unroll(full)
        for (uint t = 0; t < fc_traversal_fragments; ++t) {
            const simd_fragment rhs = load_fragment(traversed, fc_block_head, t * 8, j * 8, false);
            simdgroup_multiply_accumulate(out[j], weights[t], rhs, out[j]);
        }
    }
}

// The fragments of this simdgroup's 8 rows in a staged [block_parallel x block_head] tile.
inline void load_slab(thread simd_fragment* slab, const threadgroup float* tile, ushort simd_index,
                      uint fragments) {
#pragma clang loop unroll(full)
    for (uint k = 0; k < fc_head_fragments; ++k) {
        if (k >= fragments) continue;
        slab[k] = load_fragment(tile, fc_block_head, uint(simd_index) * 8, k * 8, false);
    }
}

#endif
