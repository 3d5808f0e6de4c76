// Cooperative copies of operand tiles from device memory into threadgroup memory, converted to
// f32. Everything outside the operand (rows past the sequence, columns past the head
// dimension) is staged as zero, so partial tiles need no special case in the matrix products:
// zero rows and columns contribute nothing, which is how D % 8 != 0 avoids a slow path.
#ifndef MFA_ATTENTION_STAGING_H
#define MFA_ATTENTION_STAGING_H

#include "memory.h"

// tile[r * cols + c] = operand(row0 + r, col0 + c) for r < rows, c < cols.
inline void stage_tile(threadgroup float* tile, device const uchar* operand, operand_slice slice,
                       int row0, int row_count, uint rows, uint col0, uint col_count, uint cols,
                       ushort thread_index) {
    for (uint e = thread_index; e < rows * cols; e += fc_threads) {
        const uint r = e / cols;
        const uint c = e % cols;
        const int row = row0 + int(r);
        const uint col = col0 + c;
        float value = 0.0f;
        if (row < row_count && col < col_count) value = load_element(operand, slice.at(row, col));
        tile[e] = value;
    }
}

#endif
