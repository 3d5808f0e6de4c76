// Operand tiles: cooperative copies from device memory into threadgroup memory, in the
// operands' own precision (16-bit operands move as 16-bit bits), and the 8x8 fragments the
// matrix products read from such a tile or, with fc_direct_loads, straight from device
// memory. Everything outside the operand (rows past the sequence, columns past the head
// dimension) reads as zero, so partial tiles need no special case in the matrix products: zero
// rows and columns contribute nothing, which is how D % 8 != 0 avoids a slow path. The bounds
// are tested only on a tile that reaches past them (an edge tile).
#ifndef MFA_ATTENTION_STAGING_H
#define MFA_ATTENTION_STAGING_H

#include "fragment.h"
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
    bool vectors; // rows may be read MFA_VECTOR_ELEMENTS at a time (vector_operands)

    // Only a forward over a paged cache, or one packing a GQA group, has such rows: the
    // function constants keep every other variant's addressing to one multiply-add per index.
    long at(int row, uint col) const {
        if (fc_paged && paged) {
            const int r = row - row0;
            return slice.base + long(page_blocks[r]) * block_stride +
                   long(page_rows[r]) * slice.row_stride + long(col) * slice.col_stride;
        }
        if (!fc_pack_group || rows_per_head == 0) return slice.at(row, col);
        return slice.at(row % rows_per_head, col) + long(row / rows_per_head) * head_stride;
    }
};

// Whether operand `operand`'s rows may be read MFA_VECTOR_ELEMENTS elements at a time.
inline bool vector_rows(constant mfa_kernel_params& p, uint operand) {
    return (p.vector_operands >> operand) & 1u;
}

// The rows of a single (batch, head) slice.
inline staged_operand single_head_rows(device const uchar* data, operand_slice slice, int row0,
                                       int row_count, uint width, bool vectors) {
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
    rows.vectors = vectors;
    return rows;
}

// The keys of one sequence in a paged cache: slice is the cache's (block 0, kv head) slice.
inline staged_operand paged_rows(device const uchar* data, operand_slice slice, long block_stride,
                                 int row_count, uint width, bool vectors,
                                 threadgroup const int* page_blocks,
                                 threadgroup const int* page_rows) {
    staged_operand rows = single_head_rows(data, slice, 0, row_count, width, vectors);
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

// Whether rows [row0, row0 + rows) and columns [col0, col0 + width) reach past the operand's
// rows or past column col_end: only then are elements tested one by one.
inline bool edge_tile(staged_operand operand, int row0, uint rows, uint col0, uint width,
                      uint col_end) {
    return row0 + int(rows) > operand.row_count || col0 + width > col_end;
}

// Row r, column c of tile = operand(row0 + r, col0 + c) for r < rows, c < block_head (rows of
// fc_staging_pitch elements), zero outside the operand and at or past column col_end. A copy of
// the element's bits: the precision is kept, and a fragment load widens it. An interior tile of
// an operand whose rows allow it (`vectors`) moves MFA_VECTOR_ELEMENTS elements per load and
// store (block_head and the pitch are multiples of it, so a vector never leaves a row); an edge
// tile, or a misaligned operand, one element at a time.
inline void stage_tile(threadgroup uchar* tile, staged_operand operand, uint rows, uint col0,
                       uint col_end, ushort thread_index) {
    const bool edge = edge_tile(operand, operand.row0, rows, col0, fc_block_head, col_end);
    if (!edge && operand.vectors) {
        const uint row_vectors = fc_block_head / MFA_VECTOR_ELEMENTS;
        for (uint e = thread_index; e < rows * row_vectors; e += fc_threads) {
            const uint r = e / row_vectors;
            const uint c = e % row_vectors * MFA_VECTOR_ELEMENTS;
            const long from = operand.at(operand.row0 + int(r), col0 + c);
            const uint at = r * fc_staging_pitch + c;
            if (fc_element_size == 4)
                *(threadgroup float4*)((threadgroup float*)tile + at) =
                    *(device const float4*)((device const float*)operand.data + from);
            else
                *(threadgroup ushort4*)((threadgroup ushort*)tile + at) =
                    *(device const ushort4*)((device const ushort*)operand.data + from);
        }
        return;
    }
    for (uint e = thread_index; e < rows * fc_block_head; e += fc_threads) {
        const uint r = e / fc_block_head;
        const uint c = e % fc_block_head;
        const int row = operand.row0 + int(r);
        const uint col = col0 + c;
        const bool inside = !edge || (row < operand.row_count && col < col_end);
        const uint at = r * fc_staging_pitch + c;
        if (fc_element_size == 4) {
            float value = 0.0f;
            if (inside) value = ((device const float*)operand.data)[operand.at(row, col)];
            ((threadgroup float*)tile)[at] = value;
        } else {
            ushort bits = 0; // +0 in f16 and bf16 alike
            if (inside) bits = ((device const ushort*)operand.data)[operand.at(row, col)];
            ((threadgroup ushort*)tile)[at] = bits;
        }
    }
}

// An element of a 16-bit operand, from its bits.
inline float widen_bits(ushort bits) {
    return fc_dtype == MFA_KERNEL_DTYPE_F16 ? float(as_type<half>(bits)) : bf16_bits_to_float(bits);
}

// The 8x8 block at (row, col) of a staged tile, or its transpose. f32 tiles go through
// simdgroup_load. From a 16-bit tile each lane reads its own two elements (one 32-bit load,
// or two 16-bit ones transposed) and widens them, as MLX's steel kernels load their fragments:
// the products stay f32, and bf16 needs no hardware bfloat (Apple7/8) nor MSL 3.1.
inline simd_fragment staged_fragment(const threadgroup uchar* tile, uint row, uint col,
                                     bool transpose, ushort lane) {
    simd_fragment f;
    if (fc_element_size == 4) {
        simdgroup_load(f, (const threadgroup float*)tile + row * fc_staging_pitch + col,
                       fc_staging_pitch, ulong2(0, 0), transpose);
        return f;
    }
    const threadgroup ushort* bits = (const threadgroup ushort*)tile;
    const uint r = fragment_row(lane), c = fragment_col(lane);
    if (transpose) {
        // Element (r, c + e) of the transpose is element (c + e, r) of the block.
        const uint at = (row + c) * fc_staging_pitch + col + r;
        f.thread_elements()[0] = widen_bits(bits[at]);
        f.thread_elements()[1] = widen_bits(bits[at + fc_staging_pitch]);
    } else {
        // c is even and so is the pitch: the pair is 4-byte aligned.
        const ushort2 pair =
            *(const threadgroup ushort2*)(bits + (row + r) * fc_staging_pitch + col + c);
        f.thread_elements()[0] = widen_bits(pair.x);
        f.thread_elements()[1] = widen_bits(pair.y);
    }
    return f;
}

// The 8x8 block at operand rows [row, row + 8), columns [col, col + 8), or its transpose, read
// by each lane straight from device memory; zero at or past the operand's last row and column
// col_end, tested only when `edge`.
inline simd_fragment device_fragment(staged_operand operand, int row, uint col, uint col_end,
                                     bool transpose, bool edge, ushort lane) {
    simd_fragment f;
    const uint r = fragment_row(lane), c = fragment_col(lane);
    for (ushort e = 0; e < 2; ++e) {
        const int element_row = row + int(transpose ? c + e : r);
        const uint element_col = col + (transpose ? r : c + e);
        float value = 0.0f;
        if (!edge || (element_row < operand.row_count && element_col < col_end))
            value = load_element(operand.data, operand.at(element_row, element_col));
        f.thread_elements()[e] = value;
    }
    return f;
}

#endif
