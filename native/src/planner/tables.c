/*
 * The starting point is Metal FlashAttention's published block-size parameters (per family:
 * Apple9, and Apple7/8 together; FP32 and mixed precision), adapted to these kernels:
 *   - MFA's "cached" sets map onto our two cache flags (Q or K first, dO or V second). The
 *     output accumulators (O, dQ, dK, dV) are always in registers here; wide outputs are split
 *     across threadgroups (block_out) instead of being paged through device memory, because our
 *     outputs may be f16/bf16 in memory and paging through them would lose precision.
 *   - block_head is the width of the threadgroup staging tile; MFA's head block of 8 is kept
 *     where MFA found it best.
 *   - Every register operand here is f32 (16-bit inputs are widened when staged), while MFA's
 *     mixed-precision rows hold 16-bit Q/K/V in registers. A cached operand therefore costs
 *     twice MFA's registers, so the 16-bit tables cache only up to D = 96 (MFA: up to 224).
 * The tables have not been measured on hardware for these kernels yet. To retune on a Mac: edit
 * rows here, run planner_unit (every row must fit 32 KB of threadgroup memory and the kernels'
 * register arrays; the planner also refuses a row outside them at run time), then compare
 * `python -m mfa_native bench --backend metal` before and after.
 */
#include "planner/tables.h"

#define ROWS(array)                                                                                \
    { array, (uint32_t)(sizeof(array) / sizeof(array[0])) }

/* ---- Apple9 (M3, M4, A17 Pro and later) ---- */
static const mfa_block_row apple9_forward_f32[] = {
    {8, 16, 128, 16, 1, 0},  {16, 16, 64, 16, 1, 0},   {48, 16, 32, 8, 1, 0},
    {192, 16, 64, 16, 0, 0}, {384, 16, 128, 16, 0, 0},
};
static const mfa_block_row apple9_forward_16bit[] = {
    {32, 16, 128, 16, 1, 0},
    {96, 16, 128, 32, 1, 0},
    {384, 16, 128, 32, 0, 0},
};
static const mfa_block_row apple9_backward_query_f32[] = {
    {16, 16, 64, 8, 1, 1},
    {32, 16, 64, 16, 1, 0},
    {192, 16, 64, 32, 1, 0},
    {384, 16, 128, 16, 0, 0},
};
static const mfa_block_row apple9_backward_query_16bit[] = {
    {80, 16, 64, 8, 1, 1},
    {192, 16, 64, 32, 0, 0},
    {384, 16, 128, 32, 0, 0},
};
static const mfa_block_row apple9_backward_key_value_f32[] = {
    {16, 16, 64, 8, 1, 1},    {32, 16, 32, 16, 1, 1},   {64, 16, 32, 16, 0, 1},
    {128, 16, 128, 16, 0, 0}, {384, 16, 128, 16, 0, 0},
};
static const mfa_block_row apple9_backward_key_value_16bit[] = {
    {56, 16, 64, 8, 1, 1},
    {80, 16, 32, 16, 0, 1},
    {144, 16, 128, 16, 0, 0},
    {384, 16, 128, 32, 0, 0},
};

/* ---- Apple7 / Apple8 (M1, M2, A14 - A16) ---- */
static const mfa_block_row apple7_forward_f32[] = {
    {24, 32, 64, 24, 1, 0},
    {32, 32, 64, 32, 0, 0},
    {56, 32, 32, 56, 0, 0},
    {384, 32, 80, 16, 0, 0},
};
static const mfa_block_row apple7_forward_16bit[] = {
    {96, 32, 128, 32, 1, 0},
    {384, 32, 128, 32, 0, 0},
};
static const mfa_block_row apple7_backward_query_f32[] = {
    {16, 32, 64, 16, 1, 0},
    {56, 32, 64, 24, 0, 0},
    {384, 32, 80, 16, 0, 0},
};
static const mfa_block_row apple7_backward_query_16bit[] = {
    {32, 32, 64, 32, 1, 0},
    {384, 32, 64, 32, 0, 0},
};
static const mfa_block_row apple7_backward_key_value_f32[] = {
    {16, 32, 32, 16, 0, 1},
    {24, 32, 64, 24, 0, 0},
    {384, 32, 80, 16, 0, 0},
};
static const mfa_block_row apple7_backward_key_value_16bit[] = {
    {16, 32, 64, 16, 0, 1},
    {56, 32, 80, 32, 0, 0},
    {384, 32, 64, 32, 0, 0},
};

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
