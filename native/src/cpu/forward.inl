/*
 * Forward pass. The pack task converts one block of a key/value head's K and V into panels; the
 * compute task runs FlashAttention's online softmax for one block of query rows over the visible
 * key blocks (skipping the tiles a mask hides entirely). Scores are the dot products through
 * the modifiers (scores.inl), in natural units; the statistics and the O accumulator are f32
 * whatever the operands are. Sinks and an initial state enter each row's state before its first
 * key (start_row).
 */
#ifndef MFA_CPU_FORWARD_INL
#define MFA_CPU_FORWARD_INL

#include "cpu/gemm.inl"
#include "cpu/kernels.h"
#include "cpu/pack.inl"
#include "cpu/plan.h"
#include "cpu/scores.inl"
#include "cpu/simd.inl"

#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* A task of the current pass: its unit of the chunk (index, key/value head, sequence) and its
 * index within the unit. */
struct unit_task {
    int64_t g_local;
    kv_head_ref kv;
    mfa_cpu_sequence seq;
    int64_t local;
};

static inline unit_task unit_of_task(const mfa_cpu_plan* plan, int64_t task) {
    unit_task u;
    u.g_local = mfa_cpu_task_unit(plan->task_prefix, plan->chunk_kv_heads, task, &u.local);
    u.kv = chunk_kv_head(plan, u.g_local);
    u.seq = mfa_cpu_sequence_of(plan, u.kv.batch);
    return u;
}

/* A query row's softmax state before its first key: nothing seen (max -inf, sum 0, O 0), or the
 * caller's initial state (out and lse given, merged as mfa_attention_merge merges), with the
 * row's sink folded in (a term e^sink in the sum and none in O). A NaN or +inf entry lse makes
 * the row NaN, as in a merge; an entry lse of -inf is an empty state whose out is not read. */
template <class Storage>
static void start_row(const mfa_cpu_plan* plan, const mfa_cpu_sequence& s, int64_t h, int64_t i,
                      float sink, float* o, int64_t width, float* row_max, float* row_sum) {
    const mfa_problem* p = plan->problem;
    float top = -__builtin_inff(), sum = 0.0f;
    for (int64_t x = 0; x < width; ++x) o[x] = 0.0f;
    if (p->initial_state) {
        const float lse = f32_storage::load(query_rows(p->lse, 4, s, h, i).row(0));
        if (lse != lse || lse == __builtin_inff()) {
            top = __builtin_nanf("");
            sum = 1.0f;
            for (int64_t x = 0; x < width; ++x) o[x] = __builtin_nanf("");
        } else if (lse != -__builtin_inff()) {
            const strided_rows out = query_rows(p->out, plan->elem_size, s, h, i);
            load_row<Storage>(out.row(0), out.elem_step, p->head_dim_v, o, 1);
            top = lse;
            sum = 1.0f;
        }
    }
    if (sink != -__builtin_inff()) {
        if (top == -__builtin_inff()) {
            top = sink;
            sum = 1.0f;
        } else {
            const float joint = sink > top || sink != sink ? sink : top;
            const float kept = expf(top - joint);
            sum = sum * kept + expf(sink - joint);
            if (kept != 1.0f) scale_row(o, width, kept);
            top = joint;
        }
    }
    *row_max = top;
    *row_sum = sum;
}

/* One block of scores into a row's running softmax: the scores become e^(s - max), and the
 * row's sum and O accumulator are rescaled when the max moves. */
static inline void online_softmax_row(float* s, int64_t n_pad, float block_max, float* row_max,
                                      float* row_sum, float* o, int64_t width) {
    const float old_max = *row_max;
    /* NaN wins, so that it reaches O and lse instead of being skipped. */
    const float new_max = block_max > old_max || block_max != block_max ? block_max : old_max;
    if (new_max == -__builtin_inff()) {
        /* Nothing visible to this row yet: its P is 0, not e^(-inf - -inf). */
        for (int64_t c = 0; c < n_pad; ++c) s[c] = 0.0f;
        return;
    }
    const float block_sum = exp_shifted_sum(s, n_pad, new_max);
    if (new_max != old_max) {
        const float correction = expf(old_max - new_max);
        *row_sum *= correction;
        scale_row(o, width, correction);
        *row_max = new_max;
    }
    *row_sum += block_sum;
}

/* A row's result from its state: a row that saw no key (and no sink or state) keeps max -inf
 * and sum 0: out 0 (its accumulator is 0) and lse -inf, never 0/0. */
static inline float finish_row(float* o, int64_t width, float row_max, float row_sum) {
    scale_row(o, width, row_sum == 0.0f ? 0.0f : 1.0f / row_sum);
    return row_sum == 0.0f ? -__builtin_inff() : row_max + logf(row_sum);
}

/* Paged caches with new keys: unit u's rows of k_new and v_new written into its cache rows
 * cache_seqlens[b] .. + new_len - 1, before any task reads them (the dtype is the caches'). */
static void copy_rows(const strided_rows& src, const strided_rows& dst, int64_t count,
                      int64_t width, int64_t elem_size) {
    for (int64_t r = 0; r < count; ++r) {
        const char* from = src.row(r);
        char* to = dst.row(r);
        if (src.elem_step == elem_size && dst.elem_step == elem_size) {
            memcpy(to, from, (size_t)(width * elem_size));
        } else {
            for (int64_t x = 0; x < width; ++x)
                memcpy(to + x * dst.elem_step, from + x * src.elem_step, (size_t)elem_size);
        }
    }
}

static void append_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    (void)slot;
    const mfa_problem* p = plan->problem;
    const mfa_paged& paged = p->paged;
    const unit_task u = unit_of_task(plan, task);
    const int64_t cached = u.seq.seq_k - paged.new_len, es = plan->elem_size;
    copy_rows(rows_of(paged.k_new, es, u.seq.batch, u.kv.head, 0),
              key_rows(plan, p->k, u.seq, u.kv.head, cached), paged.new_len, p->head_dim, es);
    copy_rows(rows_of(paged.v_new, es, u.seq.batch, u.kv.head, 0),
              key_rows(plan, p->v, u.seq, u.kv.head, cached), paged.new_len, p->head_dim_v, es);
}

template <class Storage, class Ops>
static void forward_pack_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    (void)slot;
    const mfa_problem* p = plan->problem;
    const unit_task u = unit_of_task(plan, task);
    const int64_t j0 = u.local * plan->pack_rows;
    const int64_t count = min64(plan->pack_rows, u.seq.seq_k - j0);
    mfa_cpu_kv_pack pack;
    mfa_cpu_kv_pack_carve(plan, 0, chunk_kv_pack(plan, u.g_local), &pack);
    Ops::template pack_panels_transposed<Storage>(key_rows(plan, p->k, u.seq, u.kv.head, j0), count,
                                                  p->head_dim,
                                                  pack.kt + j0 * Ops::units(p->head_dim));
    Ops::template pack_panels<Storage>(key_rows(plan, p->v, u.seq, u.kv.head, j0), count,
                                       p->head_dim_v, pack.v + Ops::units(j0) * NR,
                                       Ops::units(plan->seq_k_padded) * NR);
}

template <class Storage, class Ops>
static void forward_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    const mfa_problem* p = plan->problem;
    const int64_t es = plan->elem_size;
    const unit_task u = unit_of_task(plan, task);
    const mfa_cpu_sequence& seq = u.seq;
    const int64_t q_blocks = mfa_cpu_blocks(seq.seq_q, plan->block_q);
    const int64_t h = u.kv.head * p->group + u.local / q_blocks;
    const int64_t b = seq.batch;
    /* Last blocks first: under a causal mask they see the most keys, and the longest tasks
     * should not be the last ones handed out. */
    const int64_t qb = q_blocks - 1 - u.local % q_blocks;
    const int64_t i0 = qb * plan->block_q;
    const int64_t rows = min64(plan->block_q, seq.seq_q - i0);
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int64_t dv_pad = mfa_cpu_round_up(dv, NR);
    const int64_t du = Ops::units(d);
    const score_modifiers mods = modifiers_of(plan, seq, h);
    const float sink = sink_of(plan, h);

    mfa_cpu_kv_pack pack;
    mfa_cpu_kv_pack_carve(plan, 0, chunk_kv_pack(plan, u.g_local), &pack);
    mfa_cpu_forward_tiles t;
    mfa_cpu_forward_tiles_carve(plan, slot, &t);

    Ops::template pack_rows<Storage>(query_rows(p->q, es, seq, h, i0), rows, d, t.q, du);
    for (int64_t r = 0; r < rows; ++r)
        start_row<Storage>(plan, seq, h, i0 + r, sink, t.o + r * dv_pad, dv_pad, t.row_max + r,
                           t.row_sum + r);

    /* Visible ranges move monotonically with the row, so the block's keys are one interval. */
    const int64_t key_hi = mfa_cpu_key_end(&seq, i0 + rows - 1);
    for (int64_t j0 = panel_floor(mfa_cpu_key_begin(&seq, i0)); j0 < key_hi; j0 += plan->block_k) {
        const int64_t n = min64(plan->block_k, key_hi - j0);
        const int64_t n_pad = mfa_cpu_round_up(n, NR);
        const mask_tile_kind mask =
            mask_tile(plan, b, h, i0, rows, j0, n, false, t.bias, n_pad, n_pad);
        if (mask == kTileHidden) continue;
        Ops::gemm(rows, n, du, t.q, du, pack.kt + j0 * du, du * NR, t.s, n_pad, false);
        const scores_row_fn scores = scores_row_for(mods, mask == kTileBias);
        for (int64_t r = 0; r < rows; ++r) {
            float* s = t.s + r * n_pad;
            const visible_range range = keys_of_query(seq, i0 + r, j0, n);
            const float block_max = scores(s, n_pad, mods, i0 + r + seq.diag - j0,
                                           t.bias ? t.bias + r * n_pad : t.bias, range);
            online_softmax_row(s, n_pad, block_max, t.row_max + r, t.row_sum + r, t.o + r * dv_pad,
                               dv_pad);
        }
        const float* probabilities = Ops::operand(t.s, rows, n_pad, t.p);
        Ops::gemm(rows, dv, Ops::units(n), probabilities, Ops::units(n_pad),
                  pack.v + Ops::units(j0) * NR, Ops::units(plan->seq_k_padded) * NR, t.o, dv_pad,
                  true);
    }

    const strided_rows lse = query_rows(p->lse, sizeof(float), seq, h, i0);
    for (int64_t r = 0; r < rows; ++r) {
        const float row_lse = finish_row(t.o + r * dv_pad, dv_pad, t.row_max[r], t.row_sum[r]);
        if (p->lse.data) f32_storage::store(lse.row(r), row_lse);
    }
    store_rows<Storage>(query_rows(p->out, es, seq, h, i0), rows, dv, t.o, dv_pad, 1.0f);
}

} // namespace

#endif /* MFA_CPU_FORWARD_INL */
