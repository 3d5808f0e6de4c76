// 8x8 simdgroup_matrix fragments: where a lane's two elements sit, row-wise reductions, and
// the tile products the kernels are made of.
//
// The element-to-lane mapping is unspecified by the MSL spec; this is the mapping Metal
// FlashAttention and MLX rely on, checked by the lane-layout probe (tests/kernels). Lane L
// holds elements (row, col) and (row, col + 1) with
//   row = 4 * bit4(L) + bits1..2(L),   col = 4 * bit3(L) + 2 * bit0(L),
// so the four lanes sharing a row are {L, L^1, L^8, L^9}.
#ifndef MFA_ATTENTION_FRAGMENT_H
#define MFA_ATTENTION_FRAGMENT_H

#include <metal_stdlib>
using namespace metal;

typedef simdgroup_matrix<float, 8, 8> simd_fragment;

inline ushort fragment_row(ushort lane) { return ushort(((lane >> 4) << 2) | ((lane >> 1) & 3)); }

inline ushort fragment_col(ushort lane) {
    return ushort((((lane >> 3) & 1) << 2) | ((lane & 1) << 1));
}

// Which quarter of its row a lane holds (0..3), counting columns in pairs.
inline ushort fragment_row_quarter(ushort lane) {
    return ushort((((lane >> 3) & 1) << 1) | (lane & 1));
}

inline float row_max(float value) {
    value = max(value, simd_shuffle_xor(value, ushort(1)));
    return max(value, simd_shuffle_xor(value, ushort(8)));
}

inline float row_sum(float value) {
    value += simd_shuffle_xor(value, ushort(1));
    return value + simd_shuffle_xor(value, ushort(8));
}

inline simd_fragment zero_fragment() { return make_filled_simdgroup_matrix<float, 8, 8>(0.0f); }

#endif
