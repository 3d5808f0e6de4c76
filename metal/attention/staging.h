// Cooperative copies of operand tiles from device memory into threadgroup memory, converted to
// f32. Everything outside the operand (rows past the sequence, columns past the head
// dimension) is staged as zero, so partial tiles need no special case in the matrix products:
// zero rows and columns contribute nothing, which is how D % 8 != 0 avoids a slow path.
#ifndef MFA_ATTENTION_STAGING_H
#define MFA_ATTENTION_STAGING_H

#include "memory.h"

// Rows [row0, row0 + block) of an operand of `width` features, in one (batch, head) slice, or
// in consecutive heads when rows_per_head > 0: row r is then position r % rows_per_head of head
// r / rows_per_head after the slice's (how the forward packs the query heads of a GQA group
// when there are too few queries to fill a threadgroup).
struct staged_operand {
    device const uchar* data;
    operand_slice slice;
    int row0;
    int row_count; // rows at or past it stage as zero
    uint width;
    int rows_per_head; // 0: every row is in `slice`
    long head_stride;

    long at(int row, uint col) const {
        if (rows_per_head == 0) return slice.at(row, col);
        return slice.at(row % rows_per_head, col) + long(row / rows_per_head) * head_stride;
    }
};

// The rows of a single (batch, head) slice.
inline staged_operand single_head_rows(device const uchar* data, operand_slice slice, int row0,
                                       int row_count, uint width) {
    const staged_operand rows = {data, slice, row0, row_count, width, 0, 0};
    return rows;
}

// tile[r * block_head + c] = operand(row0 + r, col0 + c) for r < rows, c < block_head, zero
// outside the operand and at or past column col_end.
inline void stage_tile(threadgroup float* tile, staged_operand operand, uint rows, uint col0,
                       uint col_end, ushort thread_index) {
    for (uint e = thread_index; e < rows * fc_block_head; e += fc_threads) {
        const uint r = e / fc_block_head;
        const uint c = e % fc_block_head;
        const int row = operand.row0 + int(r);
        const uint col = col0 + c;
        float value = 0.0f;
        if (row < operand.row_count && col < col_end)
            value = load_element(operand.data, operand.at(row, col));
        tile[e] = value;
    }
}

#endif
