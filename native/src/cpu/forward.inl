/*
 * Forward pass. The pack task converts one block of a key/value head's K and V into panels; the
 * compute task runs FlashAttention's online softmax for one block of query rows over the visible
 * key blocks. Scores are the dot products times the scale, in natural units; the statistics and
 * the O accumulator are f32 whatever the operands are.
 */
#ifndef MFA_CPU_FORWARD_INL
#define MFA_CPU_FORWARD_INL

#include "cpu/gemm.inl"
#include "cpu/kernels.h"
#include "cpu/mask.inl"
#include "cpu/pack.inl"
#include "cpu/plan.h"
#include "cpu/simd.inl"

#include <math.h>
#include <stdint.h>

namespace {

/* The chunk's key/value head g_local as (batch, head). */
struct kv_head_ref {
    int64_t batch, head;
};

static inline kv_head_ref chunk_kv_head(const mfa_cpu_plan* plan, int64_t g_local) {
    const int64_t g = plan->first_kv_head + g_local;
    kv_head_ref ref = {g / plan->problem->heads_kv, g % plan->problem->heads_kv};
    return ref;
}

static inline float* chunk_kv_pack(const mfa_cpu_plan* plan, int64_t g_local) {
    return plan->kv_packs + g_local * plan->kv_pack_floats;
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The first row of a block that starts at or before `first`, aligned to a panel so that it
 * addresses whole packed panels; the extra rows are masked like any other invisible ones. */
static inline int64_t panel_floor(int64_t first) { return first / NR * NR; }

template <class Storage, class Ops>
static void forward_pack_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    (void)slot;
    const mfa_problem* p = plan->problem;
    const int64_t blocks = mfa_cpu_pack_blocks(plan, p->seq_k);
    const kv_head_ref head = chunk_kv_head(plan, task / blocks);
    const int64_t j0 = task % blocks * plan->pack_rows;
    const int64_t count = min64(plan->pack_rows, p->seq_k - j0);
    mfa_cpu_kv_pack pack;
    mfa_cpu_kv_pack_carve(plan, 0, chunk_kv_pack(plan, task / blocks), &pack);
    Ops::template pack_panels_transposed<Storage>(
        rows_of(p->k, plan->elem_size, head.batch, head.head, j0), count, p->head_dim,
        pack.kt + j0 * Ops::units(p->head_dim));
    Ops::template pack_panels<Storage>(rows_of(p->v, plan->elem_size, head.batch, head.head, j0),
                                       count, p->head_dim_v, pack.v + Ops::units(j0) * NR,
                                       Ops::units(plan->seq_k_padded) * NR);
}

template <class Storage, class Ops>
static void forward_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    const mfa_problem* p = plan->problem;
    const int64_t es = plan->elem_size;
    const int64_t per_kv_head = p->group * plan->q_blocks;
    const int64_t g_local = task / per_kv_head;
    const kv_head_ref kv = chunk_kv_head(plan, g_local);
    const int64_t h = kv.head * p->group + task % per_kv_head / plan->q_blocks;
    const int64_t b = kv.batch;
    /* Last blocks first: under a causal mask they see the most keys, and the longest tasks
     * should not be the last ones handed out. */
    const int64_t qb = plan->q_blocks - 1 - task % plan->q_blocks;
    const int64_t i0 = qb * plan->block_q;
    const int64_t rows = min64(plan->block_q, p->seq_q - i0);
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int64_t dv_pad = mfa_cpu_round_up(dv, NR);
    const int64_t du = Ops::units(d);

    mfa_cpu_kv_pack pack;
    mfa_cpu_kv_pack_carve(plan, 0, chunk_kv_pack(plan, g_local), &pack);
    mfa_cpu_forward_tiles t;
    mfa_cpu_forward_tiles_carve(plan, slot, &t);

    Ops::template pack_rows<Storage>(rows_of(p->q, es, b, h, i0), rows, d, t.q, du);
    for (int64_t i = 0; i < rows * dv_pad; ++i) t.o[i] = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
        t.row_max[r] = -__builtin_inff();
        t.row_sum[r] = 0.0f;
    }

    /* Visible ranges move monotonically with the row, so the block's keys are one interval. */
    const int64_t key_hi = mfa_cpu_key_end(plan, i0 + rows - 1);
    for (int64_t j0 = panel_floor(mfa_cpu_key_begin(plan, i0)); j0 < key_hi; j0 += plan->block_k) {
        const int64_t n = min64(plan->block_k, key_hi - j0);
        const int64_t n_pad = mfa_cpu_round_up(n, NR);
        Ops::gemm(rows, n, du, t.q, du, pack.kt + j0 * du, du * NR, t.s, n_pad, false);

        for (int64_t r = 0; r < rows; ++r) {
            float* s = t.s + r * n_pad;
            const visible_range range = keys_of_query(plan, i0 + r, j0, n);
            const float old_max = t.row_max[r];
            const float block_max = scale_mask_max(s, n_pad, p->scale, range.begin, range.end);
            /* NaN wins, so that it reaches O and lse instead of being skipped. */
            const float new_max =
                block_max > old_max || block_max != block_max ? block_max : old_max;
            if (new_max == -__builtin_inff()) {
                /* Nothing visible to this row yet: its P is 0, not e^(-inf - -inf). */
                for (int64_t c = 0; c < n_pad; ++c) s[c] = 0.0f;
                continue;
            }
            const float block_sum = exp_shifted_sum(s, n_pad, new_max);
            if (new_max != old_max) {
                const float correction = expf(old_max - new_max);
                t.row_sum[r] *= correction;
                scale_row(t.o + r * dv_pad, dv_pad, correction);
                t.row_max[r] = new_max;
            }
            t.row_sum[r] += block_sum;
        }
        const float* probabilities = Ops::operand(t.s, rows, n_pad, t.p);
        Ops::gemm(rows, dv, Ops::units(n), probabilities, Ops::units(n_pad),
                  pack.v + Ops::units(j0) * NR, Ops::units(plan->seq_k_padded) * NR, t.o, dv_pad,
                  true);
    }

    /* A row that saw no key keeps max -inf and sum 0: out 0 (its accumulator is 0) and
     * lse -inf, never 0/0. */
    for (int64_t r = 0; r < rows; ++r)
        scale_row(t.o + r * dv_pad, dv_pad, t.row_sum[r] == 0.0f ? 0.0f : 1.0f / t.row_sum[r]);
    store_rows<Storage>(rows_of(p->out, es, b, h, i0), rows, dv, t.o, dv_pad, 1.0f);
    if (p->lse.data) {
        const strided_rows lse = rows_of(p->lse, sizeof(float), b, h, i0);
        for (int64_t r = 0; r < rows; ++r) {
            const float sum = t.row_sum[r];
            f32_storage::store(lse.row(r),
                               sum == 0.0f ? -__builtin_inff() : t.row_max[r] + logf(sum));
        }
    }
}

} // namespace

#endif /* MFA_CPU_FORWARD_INL */
