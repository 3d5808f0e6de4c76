/*
 * The starting point is Metal FlashAttention's published block-size parameters (per family:
 * Apple9, and Apple7/8 together; FP32 and mixed precision), adapted to these kernels:
 *   - MFA's "cached" sets map onto our two cache flags (Q or K first, dO or V second). The
 *     output accumulators (O, dQ, dK, dV) are always in registers here; wide outputs are split
 *     across threadgroups (block_out) instead of being paged through device memory, because our
 *     outputs may be f16/bf16 in memory and paging through them would lose precision.
 *   - block_head is the width of a staged chunk; MFA's head block of 8 is kept where MFA found
 *     it best.
 *   - Staged tiles hold f16/bf16 operands as 16-bit (half the threadgroup memory and bytes of
 *     f32 staging), but fragments are widened to f32 at load, so a register operand costs twice
 *     MFA's registers: the 16-bit tables cache only up to D = 96 (MFA: up to 224).
 *   - Apple9 rows read every operand straight from device memory (direct = 1), as MFA reads K
 *     and V (and an uncached Q or dO, reloaded per block) there: Apple9's device loads share a
 *     cache with threadgroup memory, so a tile staged for the simdgroups to share saves no
 *     memory traffic and costs a copy and two barriers. The parallel slab is each simdgroup's
 *     own 8 rows, never shared, so staging it only ever served coalescing; the cached operands,
 *     loaded once, go the same way (MFA async-copies them, a copy engine these kernels do not
 *     use). A dense Apple9 kernel so stages nothing and has no barrier: block_head is only the
 *     width of each unrolled load-and-multiply step, and the 16 rows per threadgroup (MFA's)
 *     cost no traffic, which no longer depends on how many simdgroups would share a tile.
 *     Apple7/8 stage both operands (their device loads bypass that cache).
 *   - Backward-key-value's per-query L and delta are read into lanes and shuffled to the
 *     fragments' columns on every family: no threadgroup memory beside the tiles.
 * Rows are {max D, block_parallel, block_traversal, block_head, cache first, cache second,
 * direct}. The tables have not been measured on hardware for these kernels yet. To retune on a
 * Mac: edit rows here, run planner_unit (every row must fit 32 KB of threadgroup memory and the
 * kernels' register arrays; the planner also refuses a row outside them at run time), then
 * compare `python -m mfa_native bench --backend metal` before and after, and the census
 * (`python -m mfa_native census`) for the bytes each row moves.
 */
#include "planner/tables.h"

#define ROWS(array)                                                                                \
    { array, (uint32_t)(sizeof(array) / sizeof(array[0])) }

/* One table a line, its rows in order of D, so that each reads as one unit beside its reasons. */
/* clang-format off */
/* ---- Apple9 (M3, M4, A17 Pro and later): direct loads throughout, so no row needs
 * threadgroup memory; what bounds a row is its registers (the caches beside the accumulators). */
/* f32 forward: Q cached while 8 rows x D of f32 fit beside S and O (D <= 48); the block_head of
 * each row is MFA's head block. */
static const mfa_block_row apple9_forward_f32[] = {{8, 16, 128, 16, 1, 0, 1}, {16, 16, 64, 16, 1, 0, 1}, {48, 16, 32, 8, 1, 0, 1}, {192, 16, 64, 16, 0, 0, 1}, {384, 16, 128, 16, 0, 0, 1}};
/* 16-bit forward: Q cached up to D = 96 (see above), then reloaded per block, 32 columns a step. */
static const mfa_block_row apple9_forward_16bit[] = {{32, 16, 128, 16, 1, 0, 1}, {96, 16, 128, 32, 1, 0, 1}, {384, 16, 128, 32, 0, 0, 1}};
/* Backward-query: Q (and dO for the smallest D) cached while they fit beside dQ, P and dP. */
static const mfa_block_row apple9_backward_query_f32[] = {{16, 16, 64, 8, 1, 1, 1}, {32, 16, 64, 16, 1, 0, 1}, {192, 16, 64, 32, 1, 0, 1}, {384, 16, 128, 16, 0, 0, 1}};
static const mfa_block_row apple9_backward_query_16bit[] = {{80, 16, 64, 8, 1, 1, 1}, {192, 16, 64, 32, 0, 0, 1}, {384, 16, 128, 32, 0, 0, 1}};
/* Backward-key-value: K and V cached for small D, V alone up to 64 (80 for 16-bit), then both
 * reloaded per block; 16 rows per threadgroup as MFA. */
static const mfa_block_row apple9_backward_key_value_f32[] = {{16, 16, 64, 8, 1, 1, 1}, {32, 16, 32, 16, 1, 1, 1}, {64, 16, 32, 16, 0, 1, 1}, {128, 16, 128, 16, 0, 0, 1}, {384, 16, 128, 16, 0, 0, 1}};
static const mfa_block_row apple9_backward_key_value_16bit[] = {{56, 16, 64, 8, 1, 1, 1}, {80, 16, 32, 16, 0, 1, 1}, {144, 16, 128, 16, 0, 0, 1}, {384, 16, 128, 32, 0, 0, 1}};

/* ---- Apple7 / Apple8 (M1, M2, A14 - A16): both operands staged ---- */
/* f32 forward: 32 rows per threadgroup share each staged K/V tile (MFA's M1 shape); Q cached up
 * to D = 24; block_head = D up to 56 (one chunk, fewest barriers), 16 beyond. */
static const mfa_block_row apple7_forward_f32[] = {{24, 32, 64, 24, 1, 0, 0}, {32, 32, 64, 32, 0, 0, 0}, {56, 32, 32, 56, 0, 0, 0}, {384, 32, 80, 16, 0, 0, 0}};
/* 16-bit forward: 32 rows share each 128-key tile, so a staged byte serves 32 rows; Q cached up
 * to D = 96. */
static const mfa_block_row apple7_forward_16bit[] = {{96, 32, 128, 32, 1, 0, 0}, {384, 32, 128, 32, 0, 0, 0}};
static const mfa_block_row apple7_backward_query_f32[] = {{16, 32, 64, 16, 1, 0, 0}, {56, 32, 64, 24, 0, 0, 0}, {384, 32, 80, 16, 0, 0, 0}};
static const mfa_block_row apple7_backward_query_16bit[] = {{32, 32, 64, 32, 1, 0, 0}, {384, 32, 64, 32, 0, 0, 0}};
/* Backward-key-value: V cached for the smallest D (beside dK, dV, P^T, dP^T), then staged. */
static const mfa_block_row apple7_backward_key_value_f32[] = {{16, 32, 32, 16, 0, 1, 0}, {24, 32, 64, 24, 0, 0, 0}, {384, 32, 80, 16, 0, 0, 0}};
static const mfa_block_row apple7_backward_key_value_16bit[] = {{16, 32, 64, 16, 0, 1, 0}, {56, 32, 80, 32, 0, 0, 0}, {384, 32, 64, 32, 0, 0, 0}};
/* clang-format on */

mfa_block_table mfa_block_table_for(mfa_gpu_family family, mfa_precision_class precision,
                                    mfa_pass_kind pass) {
    static const mfa_block_table apple9[2][3] = {
        {ROWS(apple9_forward_f32), ROWS(apple9_backward_query_f32),
         ROWS(apple9_backward_key_value_f32)},
        {ROWS(apple9_forward_16bit), ROWS(apple9_backward_query_16bit),
         ROWS(apple9_backward_key_value_16bit)},
    };
    static const mfa_block_table apple7[2][3] = {
        {ROWS(apple7_forward_f32), ROWS(apple7_backward_query_f32),
         ROWS(apple7_backward_key_value_f32)},
        {ROWS(apple7_forward_16bit), ROWS(apple7_backward_query_16bit),
         ROWS(apple7_backward_key_value_16bit)},
    };
    return family == MFA_GPU_FAMILY_APPLE9 ? apple9[precision][pass] : apple7[precision][pass];
}

const mfa_block_row* mfa_block_row_for(mfa_block_table table, int64_t head_dim) {
    for (uint32_t i = 0; i < table.num_rows; ++i)
        if ((int64_t)table.rows[i].max_head_dim >= head_dim) return &table.rows[i];
    return &table.rows[table.num_rows - 1];
}
