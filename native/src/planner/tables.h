/*
 * tables.h - block-size tables of the attention planner, as data.
 *
 * One table per (device class, precision class, pass). A table is a list of rows sorted by
 * max_head_dim; the first row whose max_head_dim >= the larger of D and Dv applies, and the
 * last row covers everything beyond. Retune on a Mac by editing tables.c only.
 */
#ifndef MFA_PLANNER_TABLES_H
#define MFA_PLANNER_TABLES_H

#include <stdint.h>

#include "planner/planner.h"

typedef struct mfa_block_row {
    uint32_t max_head_dim;
    uint32_t block_parallel;  /* multiple of 8 */
    uint32_t block_traversal; /* multiple of 8, <= MFA_MAX_BLOCK_TRAVERSAL */
    uint32_t block_head;      /* multiple of 8 */
    uint8_t cache_parallel;   /* Q (forward, backward-query) or K (backward-key-value) */
    uint8_t cache_parallel2;  /* dO (backward-query) or V (backward-key-value) */
    uint8_t direct_loads;     /* every operand read from device memory, nothing staged */
} mfa_block_row;

typedef struct mfa_block_table {
    const mfa_block_row* rows;
    uint32_t num_rows;
} mfa_block_table;

/* Precision classes: F32 memory, or 16-bit memory (f16 and bf16). */
typedef enum mfa_precision_class {
    MFA_PRECISION_F32 = 0,
    MFA_PRECISION_16BIT = 1
} mfa_precision_class;

/* The table for a pass; family is APPLE7, APPLE8 or APPLE9 (checked by the caller). */
mfa_block_table mfa_block_table_for(mfa_gpu_family family, mfa_precision_class precision,
                                    mfa_pass_kind pass);

/* The applicable row of table for head dimension head_dim (>= 1). */
const mfa_block_row* mfa_block_row_for(mfa_block_table table, int64_t head_dim);

#endif /* MFA_PLANNER_TABLES_H */
