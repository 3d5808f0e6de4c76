/*
 * What the portable driver hands the per-ISA kernels for one call: the validated problem, block
 * sizes, the visibility window, the packed operands of the heads being worked on, and one
 * workspace slot per participating thread.
 *
 * A call runs head chunk by head chunk. For each chunk a pack pass converts that chunk's operands
 * to f32 once, in the panel layouts the micro-kernel reads (below); then a compute pass runs the
 * tiles, every task reading the shared packs. Packing per tile instead would redo the conversion
 * and transposition once per row block, which costs as much as the products themselves.
 *
 * Layouts live here, not in the kernels, because the driver sizes every allocation before any
 * kernel runs (an allocation failure is reported before any output is written). Everything is
 * static inline so each per-ISA translation unit gets private copies.
 */
#ifndef MFA_CPU_PLAN_H
#define MFA_CPU_PLAN_H

#include "core/backend.h"

#include <stdint.h>

static const float mfa_cpu_log2e = 1.44269504088896341f;

typedef struct mfa_cpu_plan {
    const mfa_problem* problem;
    int64_t elem_size;
    /* Floats per packed panel (the micro-kernel's register width); every packed width is a
     * multiple, and the padded sequence lengths below are too. */
    int64_t panel_width;
    int64_t seq_q_padded;
    int64_t seq_k_padded;
    /* Rows of one compute task: query rows (forward, dQ) or key rows (dK/dV); the reduction
     * side is walked in blocks of the other size. Multiples of panel_width. */
    int64_t block_q;
    int64_t block_k;
    int64_t q_blocks; /* per query head */
    int64_t k_blocks; /* per key/value head */
    /* Rows converted by one pack task. */
    int64_t pack_rows;
    /* Scores are kept in base 2: scale * log2(e) is folded into the packed Q. */
    float score_scale;
    /* The chunk: key/value heads [first_kv_head, first_kv_head + chunk_kv_heads) counted over
     * batch x heads_kv, with all their query heads. */
    int64_t first_kv_head;
    int64_t chunk_kv_heads;
    float* kv_packs; /* kv_pack_floats per key/value head of the chunk */
    int64_t kv_pack_floats;
    /* Backward: the query heads of each key/value head this pass handles, as members
     * [first_member, first_member + members) of its group. A group too large for the pack
     * budget takes several passes, and then kv_grads carries each key/value head's f32 dK and
     * dV (mfa_cpu_kv_grads) from pass to pass; NULL when one pass covers the group. */
    int64_t first_member;
    int64_t members;
    float* q_packs; /* q_pack_floats per query head of the pass (backward only) */
    int64_t q_pack_floats;
    float* kv_grads;
    int64_t kv_grads_floats;
    float* workspace;
    int64_t workspace_slot_floats;
} mfa_cpu_plan;

/* Keys [key_begin, key_end) are visible from query row i (possibly empty). */
static inline int64_t mfa_cpu_key_begin(const mfa_cpu_plan* plan, int64_t i) {
    const int64_t lo = i + plan->problem->band_lo;
    return lo > 0 ? lo : 0;
}

static inline int64_t mfa_cpu_key_end(const mfa_cpu_plan* plan, int64_t i) {
    const int64_t seq_k = plan->problem->seq_k;
    const int64_t end = i + plan->problem->band_hi + 1;
    return end < seq_k ? end : seq_k;
}

/* Query rows [query_begin, query_end) see key j: the same rule solved for i. */
static inline int64_t mfa_cpu_query_begin(const mfa_cpu_plan* plan, int64_t j) {
    const int64_t lo = j - plan->problem->band_hi;
    return lo > 0 ? lo : 0;
}

static inline int64_t mfa_cpu_query_end(const mfa_cpu_plan* plan, int64_t j) {
    const int64_t seq_q = plan->problem->seq_q;
    const int64_t end = j - plan->problem->band_lo + 1;
    return end < seq_q ? end : seq_q;
}

static inline int64_t mfa_cpu_round_up(int64_t n, int64_t multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

/* Carves consecutive 64-byte-aligned float arrays out of one region. With base NULL it only
 * counts, which is how the driver sizes the region. */
typedef struct mfa_cpu_carver {
    float* base;
    int64_t used;
} mfa_cpu_carver;

static inline float* mfa_cpu_carve(mfa_cpu_carver* carver, int64_t floats) {
    float* region = carver->base ? carver->base + carver->used : (float*)0;
    carver->used += mfa_cpu_round_up(floats, 16);
    return region;
}

/* ---- Packs: one head's operands as f32 panels ---------------------------------------------
 * "Transposed" panels (for Q K^T-type products, reduction over the head dimension): panel p holds
 * sequence rows [p*NR, p*NR + NR) as depth x NR, at p * depth * NR.
 * "Row" panels (for P V-type products, reduction over the sequence): panel p holds columns
 * [p*NR, p*NR + NR) of every sequence row as seq_padded x NR, at p * seq_padded * NR. */

typedef struct mfa_cpu_kv_pack {
    float* kt; /* K, transposed panels (S = Q K^T) */
    float* v;  /* V, row panels (O += P V); forward only */
    float* k;  /* K, row panels (dQ += dS K); backward only */
    float* vt; /* V, transposed panels (dP = dO V^T); backward only */
} mfa_cpu_kv_pack;

static inline int64_t mfa_cpu_kv_pack_carve(const mfa_cpu_plan* plan, int backward, float* base,
                                            mfa_cpu_kv_pack* pack) {
    const mfa_problem* p = plan->problem;
    const int64_t nr = plan->panel_width, n = plan->seq_k_padded;
    mfa_cpu_carver c = {base, 0};
    pack->kt = mfa_cpu_carve(&c, p->head_dim * n);
    pack->v = backward ? (float*)0 : mfa_cpu_carve(&c, mfa_cpu_round_up(p->head_dim_v, nr) * n);
    pack->k = backward ? mfa_cpu_carve(&c, mfa_cpu_round_up(p->head_dim, nr) * n) : (float*)0;
    pack->vt = backward ? mfa_cpu_carve(&c, p->head_dim_v * n) : (float*)0;
    return c.used;
}

typedef struct mfa_cpu_q_pack {
    float* qt;      /* Q * scale * log2(e), transposed panels (S^T = K Q^T) */
    float* q;       /* Q, row panels (dK += dS^T Q) */
    float* doutt;   /* dO, transposed panels (dP^T = V dO^T) */
    float* dout;    /* dO, row panels (dV += P^T dO) */
    float* lse2;    /* lse * log2(e); +inf for rows that see no key and for padding */
    float* row_dot; /* rowsum(dO * O); 0 for padding */
} mfa_cpu_q_pack;

static inline int64_t mfa_cpu_q_pack_carve(const mfa_cpu_plan* plan, float* base,
                                           mfa_cpu_q_pack* pack) {
    const mfa_problem* p = plan->problem;
    const int64_t nr = plan->panel_width, n = plan->seq_q_padded;
    mfa_cpu_carver c = {base, 0};
    pack->qt = mfa_cpu_carve(&c, p->head_dim * n);
    pack->q = mfa_cpu_carve(&c, mfa_cpu_round_up(p->head_dim, nr) * n);
    pack->doutt = mfa_cpu_carve(&c, p->head_dim_v * n);
    pack->dout = mfa_cpu_carve(&c, mfa_cpu_round_up(p->head_dim_v, nr) * n);
    pack->lse2 = mfa_cpu_carve(&c, n);
    pack->row_dot = mfa_cpu_carve(&c, n);
    return c.used;
}

/* The dK and dV accumulators of one key/value head between passes: seq_k_padded rows of padded
 * D, then seq_k_padded rows of padded Dv. */
typedef struct mfa_cpu_kv_grads {
    float* dk;
    float* dv;
} mfa_cpu_kv_grads;

static inline int64_t mfa_cpu_kv_grads_carve(const mfa_cpu_plan* plan, float* base,
                                             mfa_cpu_kv_grads* grads) {
    const mfa_problem* p = plan->problem;
    const int64_t nr = plan->panel_width, n = plan->seq_k_padded;
    mfa_cpu_carver c = {base, 0};
    grads->dk = mfa_cpu_carve(&c, mfa_cpu_round_up(p->head_dim, nr) * n);
    grads->dv = mfa_cpu_carve(&c, mfa_cpu_round_up(p->head_dim_v, nr) * n);
    return c.used;
}

/* ---- Per-thread tiles ---------------------------------------------------------------------- */

/* Forward task: its Q rows (lda D), S/P, the O accumulator, the running max and sum per row. */
typedef struct mfa_cpu_forward_tiles {
    float *q, *s, *o, *row_max, *row_sum;
} mfa_cpu_forward_tiles;

static inline int64_t mfa_cpu_forward_tiles_carve(const mfa_cpu_plan* plan, float* base,
                                                  mfa_cpu_forward_tiles* tiles) {
    const mfa_problem* p = plan->problem;
    const int64_t bq = plan->block_q, bk = plan->block_k;
    const int64_t dv = mfa_cpu_round_up(p->head_dim_v, plan->panel_width);
    mfa_cpu_carver c = {base, 0};
    tiles->q = mfa_cpu_carve(&c, bq * p->head_dim);
    tiles->s = mfa_cpu_carve(&c, bq * bk);
    tiles->o = mfa_cpu_carve(&c, bq * dv);
    tiles->row_max = mfa_cpu_carve(&c, bq);
    tiles->row_sum = mfa_cpu_carve(&c, bq);
    return c.used;
}

/* Backward task: its rows' operands (Q and dO for dQ, K and V for dK/dV), S/P/dS and dP, and the
 * accumulators (dQ, or dK and dV). Both kinds of task share one slot size. */
typedef struct mfa_cpu_backward_tiles {
    float *rows, *rows_out_grad;
    float *s, *dp;
    float *acc, *acc_v;
} mfa_cpu_backward_tiles;

static inline int64_t mfa_cpu_backward_tiles_carve(const mfa_cpu_plan* plan, float* base,
                                                   mfa_cpu_backward_tiles* tiles) {
    const mfa_problem* p = plan->problem;
    const int64_t nr = plan->panel_width;
    const int64_t rows = plan->block_q > plan->block_k ? plan->block_q : plan->block_k;
    const int64_t d_pad = mfa_cpu_round_up(p->head_dim, nr);
    const int64_t dv_pad = mfa_cpu_round_up(p->head_dim_v, nr);
    mfa_cpu_carver c = {base, 0};
    tiles->rows = mfa_cpu_carve(&c, rows * p->head_dim);
    tiles->rows_out_grad = mfa_cpu_carve(&c, rows * p->head_dim_v);
    tiles->s = mfa_cpu_carve(&c, rows * rows);
    tiles->dp = mfa_cpu_carve(&c, rows * rows);
    tiles->acc = mfa_cpu_carve(&c, rows * d_pad);
    tiles->acc_v = mfa_cpu_carve(&c, rows * dv_pad);
    return c.used;
}

#endif /* MFA_CPU_PLAN_H */
