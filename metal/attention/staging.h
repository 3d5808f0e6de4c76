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
// when there are too few queries to fill a threadgroup). In a paged cache (`paged`), row r is row
// page_rows[r - row0] of block page_blocks[r - row0] (locate_keys), block_stride elements per
// block.
struct staged_operand {
    device const uchar* data;
    operand_slice slice;
    int row0;
    int row_count; // rows at or past it stage as zero
    uint width;
    int rows_per_head; // 0: every row is in `slice`
    long head_stride;
    bool paged;
    long block_stride;
    threadgroup const int* page_blocks;
    threadgroup const int* page_rows;

    long at(int row, uint col) const {
        if (paged) {
            const int r = row - row0;
            return slice.base + long(page_blocks[r]) * block_stride +
                   long(page_rows[r]) * slice.row_stride + long(col) * slice.col_stride;
        }
        if (rows_per_head == 0) return slice.at(row, col);
        return slice.at(row % rows_per_head, col) + long(row / rows_per_head) * head_stride;
    }
};

// The rows of a single (batch, head) slice.
inline staged_operand single_head_rows(device const uchar* data, operand_slice slice, int row0,
                                       int row_count, uint width) {
    staged_operand rows;
    rows.data = data;
    rows.slice = slice;
    rows.row0 = row0;
    rows.row_count = row_count;
    rows.width = width;
    rows.rows_per_head = 0;
    rows.head_stride = 0;
    rows.paged = false;
    rows.block_stride = 0;
    rows.page_blocks = nullptr;
    rows.page_rows = nullptr;
    return rows;
}

// The keys of one sequence in a paged cache: slice is the cache's (block 0, kv head) slice.
inline staged_operand paged_rows(device const uchar* data, operand_slice slice, long block_stride,
                                 int row_count, uint width, threadgroup const int* page_blocks,
                                 threadgroup const int* page_rows) {
    staged_operand rows = single_head_rows(data, slice, 0, row_count, width);
    rows.paged = true;
    rows.block_stride = block_stride;
    rows.page_blocks = page_blocks;
    rows.page_rows = page_rows;
    return rows;
}

// Which block of a paged cache, and which row in it, holds each key of the traversal tile
// [key0, key0 + block_traversal) of sequence `batch`, for staged_operand::at. Keys at or past
// the sequence's end are staged as zero and never looked up (nor are the block-table entries
// past its reach, which may hold anything). Every thread's earlier reads of the table are
// behind the barrier that ends the previous tile's products.
inline void locate_keys(threadgroup int* page_blocks, threadgroup int* page_rows,
                        device const int* block_table, constant mfa_kernel_params& p, uint batch,
                        int key0, int key_count, ushort thread_index) {
    for (uint r = thread_index; r < fc_block_traversal; r += fc_threads) {
        const int key = key0 + int(r);
        if (key >= key_count) break;
        page_blocks[r] = load_int(block_table, p.block_table, batch, key / p.block_size);
        page_rows[r] = key % p.block_size;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
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
