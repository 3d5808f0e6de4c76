/*
 * What the portable driver hands the per-ISA kernels for one call: the validated problem, the
 * block sizes, the visibility window, and one workspace slot per participating thread.
 *
 * Workspace layouts live here, not in the kernels, because the driver must size the allocation
 * before any kernel runs (an allocation failure is reported before any output is written).
 * Everything is static inline so the per-ISA translation units get private copies.
 */
#ifndef MFA_CPU_PLAN_H
#define MFA_CPU_PLAN_H

#include "core/backend.h"

#include <stdint.h>

typedef struct mfa_cpu_plan {
    const mfa_problem* problem;
    int64_t elem_size;
    /* Query rows owned by one forward or dQ task, and key rows owned by one dK/dV task. */
    int64_t block_q;
    int64_t block_k;
    int64_t q_blocks; /* per (batch, query head) */
    int64_t k_blocks; /* per (batch, key/value head) */
    /* The problem's window with bounds wider than seq_q + seq_k clamped to that (which changes
     * no visibility) so that i + diag_offset +- bound cannot overflow; -1 = unbounded. */
    int64_t window_left;
    int64_t window_right;
    /* Scores are kept in base 2: scale * log2(e) is folded into the packed Q. */
    float score_scale;
    /* Backward: rowsum(dO * O) per query row, [batch][heads_q][seq_q] contiguous. */
    float* row_dot;
    /* Floats of NR-wide panels the micro-kernel reads; every packed width is a multiple. */
    int64_t panel_width;
    float* workspace;
    int64_t workspace_slot_floats;
} mfa_cpu_plan;

/* Keys [key_begin, key_end) are visible from query row i (possibly empty). */
static inline int64_t mfa_cpu_key_begin(const mfa_cpu_plan* plan, int64_t i)
{
    if (plan->window_left < 0)
        return 0;
    const int64_t lo = i + plan->problem->diag_offset - plan->window_left;
    return lo > 0 ? lo : 0;
}

static inline int64_t mfa_cpu_key_end(const mfa_cpu_plan* plan, int64_t i)
{
    const int64_t seq_k = plan->problem->seq_k;
    if (plan->window_right < 0)
        return seq_k;
    const int64_t end = i + plan->problem->diag_offset + plan->window_right + 1;
    return end < seq_k ? end : seq_k;
}

/* Query rows [query_begin, query_end) see key j: the same rule solved for i. */
static inline int64_t mfa_cpu_query_begin(const mfa_cpu_plan* plan, int64_t j)
{
    if (plan->window_right < 0)
        return 0;
    const int64_t lo = j - plan->problem->diag_offset - plan->window_right;
    return lo > 0 ? lo : 0;
}

static inline int64_t mfa_cpu_query_end(const mfa_cpu_plan* plan, int64_t j)
{
    const int64_t seq_q = plan->problem->seq_q;
    if (plan->window_left < 0)
        return seq_q;
    const int64_t end = j - plan->problem->diag_offset + plan->window_left + 1;
    return end < seq_q ? end : seq_q;
}

static inline int64_t mfa_cpu_round_up(int64_t n, int64_t multiple)
{
    return (n + multiple - 1) / multiple * multiple;
}

/* Carves consecutive 64-byte-aligned float arrays out of one slot. With base NULL it only
 * counts, which is how the driver sizes the slot. */
typedef struct mfa_cpu_carver {
    float* base;
    int64_t used;
} mfa_cpu_carver;

static inline float* mfa_cpu_carve(mfa_cpu_carver* carver, int64_t floats)
{
    float* region = carver->base ? carver->base + carver->used : (float*)0;
    carver->used += mfa_cpu_round_up(floats, 16);
    return region;
}

/* Forward, per task: Q (block_q x D, lda D), S/P (block_q x padded block_k), K^T and V as
 * packed panels, the O accumulator, and the running max and sum per row. */
typedef struct mfa_cpu_forward_tiles {
    float *q, *s, *kt, *v, *o, *row_max, *row_sum;
} mfa_cpu_forward_tiles;

static inline int64_t mfa_cpu_forward_tiles_carve(const mfa_cpu_plan* plan, float* base,
                                                  mfa_cpu_forward_tiles* tiles)
{
    const mfa_problem* p = plan->problem;
    const int64_t nr = plan->panel_width;
    const int64_t bq = plan->block_q, bk = mfa_cpu_round_up(plan->block_k, nr);
    const int64_t dv = mfa_cpu_round_up(p->head_dim_v, nr);
    mfa_cpu_carver c = {base, 0};
    tiles->q = mfa_cpu_carve(&c, bq * p->head_dim);
    tiles->s = mfa_cpu_carve(&c, bq * bk);
    tiles->kt = mfa_cpu_carve(&c, p->head_dim * bk);
    tiles->v = mfa_cpu_carve(&c, bk * dv);
    tiles->o = mfa_cpu_carve(&c, bq * dv);
    tiles->row_max = mfa_cpu_carve(&c, bq);
    tiles->row_sum = mfa_cpu_carve(&c, bq);
    return c.used;
}

/* Backward, query side (dQ task): the row operands (A of the products), the key-side panels
 * (B of the products), S/P and dP/dS, and the dQ accumulator. The key side (dK/dV task) is the
 * mirror image with queries and keys exchanged. Both share one slot size. */
typedef struct mfa_cpu_backward_tiles {
    float *rows, *rows_out_grad;    /* Q, dO (dQ task) or K, V (dK/dV task), row-major */
    float *cols_t, *cols_out_grad_t; /* K^T, V^T or Q^T, dO^T: panels over the other side */
    float *cols, *cols_out_grad;    /* K (dQ task) or Q, dO (dK/dV task): panels over D / Dv */
    float *lse, *row_dot;           /* per query row, base-2 log-sum-exp and rowsum(dO * O) */
    float *s, *dp;
    float *acc, *acc_v;             /* dQ, or dK and dV */
} mfa_cpu_backward_tiles;

static inline int64_t mfa_cpu_backward_tiles_carve(const mfa_cpu_plan* plan, float* base,
                                                   mfa_cpu_backward_tiles* tiles)
{
    const mfa_problem* p = plan->problem;
    const int64_t nr = plan->panel_width;
    const int64_t rows = plan->block_q > plan->block_k ? plan->block_q : plan->block_k;
    const int64_t cols = mfa_cpu_round_up(rows, nr);
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int64_t d_pad = mfa_cpu_round_up(d, nr), dv_pad = mfa_cpu_round_up(dv, nr);
    mfa_cpu_carver c = {base, 0};
    tiles->rows = mfa_cpu_carve(&c, rows * d);
    tiles->rows_out_grad = mfa_cpu_carve(&c, rows * dv);
    tiles->cols_t = mfa_cpu_carve(&c, d * cols);
    tiles->cols_out_grad_t = mfa_cpu_carve(&c, dv * cols);
    tiles->cols = mfa_cpu_carve(&c, cols * d_pad);
    tiles->cols_out_grad = mfa_cpu_carve(&c, cols * dv_pad);
    tiles->lse = mfa_cpu_carve(&c, cols);
    tiles->row_dot = mfa_cpu_carve(&c, cols);
    tiles->s = mfa_cpu_carve(&c, rows * cols);
    tiles->dp = mfa_cpu_carve(&c, rows * cols);
    tiles->acc = mfa_cpu_carve(&c, rows * d_pad);
    tiles->acc_v = mfa_cpu_carve(&c, rows * dv_pad);
    return c.used;
}

#endif /* MFA_CPU_PLAN_H */
