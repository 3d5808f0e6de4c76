/*
 * Forward pass. The pack task converts one block of a key/value head's K and V into panels; the
 * compute task runs FlashAttention's online softmax for one block of query rows over the visible
 * key blocks (skipping the tiles a mask hides entirely). Scores are the dot products through
 * the modifiers (scores.inl), in natural units; the statistics and the O accumulator are f32
 * whatever the operands are (plain scores, with no modifier, are scaled inside the exponent
 * instead: plain_softmax_row). Sinks and an initial state enter each row's state before its
 * first key (start_row).
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

/* How far a row's running max may lag behind its scores, in natural units (e^5.5 ~ 245),
 * before O and the sum are rescaled to a new one (FlashAttention-4's conditional rescaling).
 * Exact: the probabilities, their sum and O all stay relative to the same (stale) max m, and
 * both results are invariant to it: out = sum_j e^(s_j - m) v_j / sum_j e^(s_j - m), lse =
 * m + log(sum_j e^(s_j - m)). The lag only bounds the terms, which stay below e^5.5 and so far
 * from overflowing the f32 sum; f32 rounding is relative, so scaling every term by the same
 * factor changes no error. It saves the rescale whenever a block raises the max by a little,
 * which random-like scores do in most blocks after the first. */
static const float kMaxLag = 5.5f;

/* The online softmax for a row of plain scores (no softcap, ALiBi or bias: score = scale * dot,
 * scale > 0, scale * log2(e) = `exponent_scale` finite): s[0 .. n_pad) holds the row's dot
 * products, visible in `range`; the row's P goes to `p` as the P V product's operand
 * (Ops::operand_row: in place, or rounded to bf16 pairs), and *block_sum is the vector whose
 * lanes add up to the f32 P's sum (the caller reduces the sums of W rows at once, and adds them
 * to the rows' sums). The max is taken over the raw dot products of the range only (scale > 0
 * keeps the order), and the scale goes into the exponent's one FMA, dot * scale log2(e) -
 * m log2(e): one pass reads the row and one writes its operand, where the general path
 * (scores_row, online_softmax_row, Ops::operand) makes four. While no lane exceeds the row's
 * max by more than kMaxLag (most blocks after the first) the max stays, with no horizontal
 * reduction at all.
 * Returns false, having changed nothing, where the new max or its exponent would not be finite
 * (infinite or NaN scores, a row that has seen nothing, a NaN state): the general path then
 * takes the row and keeps its rules for those values. A NaN dot product below a finite max
 * needs no such care: its e^NaN makes the sum, and so lse and out, NaN, as the general path
 * does. */
template <class Ops>
static inline bool plain_softmax_row(const float* s, float* p, int64_t n_pad, visible_range range,
                                     float scale, float exponent_scale, float* row_max,
                                     float* row_sum, float* o, int64_t width, vf* block_sum) {
    const vf hidden = vsplat(-__builtin_inff()), zero = vsplat(0.0f);
    /* Vectors [first, end) hold the visible columns (none where the range is empty: then it may
     * lie before the row, see clip_range). */
    const bool any = range.begin < range.end;
    const int64_t first = any ? range.begin / W * W : 0;
    const int64_t end = any ? mfa_cpu_round_up(range.end, W) : 0;
    /* The max: the vectors the range covers whole in a loop of their own, a partial first and
     * last one masked (the range may fit in one vector). */
    const auto masked = [&](int64_t c) {
        return vselect(lanes_within(c, range.begin, range.end), vload(s + c), hidden);
    };
    vf top = hidden;
    int64_t at = first;
    if (at < end && (at < range.begin || at + W > range.end)) {
        top = masked(at);
        at += W;
    }
    /* Four running maxima: one would wait out the max's latency on every vector. */
    const int64_t whole_end = any ? range.end / W * W : 0;
    vf tops[4] = {top, hidden, hidden, hidden};
    for (; at + 4 * W <= whole_end; at += 4 * W)
        for (int u = 0; u < 4; ++u) tops[u] = vmax(tops[u], vload(s + at + u * W));
    for (; at < whole_end; at += W) tops[0] = vmax(tops[0], vload(s + at));
    if (at < end) tops[0] = vmax(tops[0], masked(at));
    top = vmax(vmax(tops[0], tops[1]), vmax(tops[2], tops[3]));
    const float old_max = *row_max;
    /* false for a max of -inf, +inf or NaN, or one whose exponent overflows. */
    const bool kept = __builtin_isfinite(old_max * kLog2e) &&
                      !vany(top * vsplat(scale) > vsplat(old_max + kMaxLag));
    if (!kept) {
        const float block_max = scale * hmax(top);
        const float new_max = block_max > old_max ? block_max : old_max;
        if (!__builtin_isfinite(new_max * kLog2e)) return false;
        if (old_max == -__builtin_inff() || new_max - old_max > kMaxLag) {
            /* A row whose max was -inf has sum 0 and O 0 (start_row): nothing to rescale. */
            if (old_max != -__builtin_inff()) {
                const float correction = expf(old_max - new_max);
                *row_sum *= correction;
                scale_row(o, width, correction);
            }
            *row_max = new_max;
        }
    }
    const vf factor = vsplat(exponent_scale), shift = vsplat(-*row_max * kLog2e);
    /* e^(score - max) of vector c, 0 outside the range. */
    const auto probability = [&](int64_t c) {
        if (c < first || c >= end) return zero;
        const vf e = vexp2(vload(s + c) * factor + shift);
        if (c < range.begin || c + W > range.end)
            return vselect(lanes_within(c, range.begin, range.end), e, zero);
        return e;
    };
    vf sum = zero;
    if (range.begin == 0 && range.end == n_pad) {
        /* Every column visible (the usual unmasked tile): no per-vector range tests, which
         * also leave the compiler the registers to keep the exponential's constants in. */
        for (int64_t c = 0; c < n_pad; c += 2 * W) {
            const vf lo = vexp2(vload(s + c) * factor + shift);
            const vf hi = vexp2(vload(s + c + W) * factor + shift);
            Ops::store_operand_pair(p, c, lo, hi);
            sum += lo + hi;
        }
    } else {
        for (int64_t c = 0; c < n_pad; c += 2 * W) {
            const vf lo = probability(c), hi = probability(c + W);
            Ops::store_operand_pair(p, c, lo, hi);
            sum += lo + hi;
        }
    }
    *block_sum = sum;
    return true;
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

/* The keys of a tile [j0, j0 + n) that rows [i, i + count) of a sequence see, as tile columns:
 * [begin, end) with begin at a panel's start, so that the products can start there. Visible
 * ranges move monotonically with the row, so the first row's start and the last row's end
 * bound them all. */
struct key_span {
    int64_t begin, end;
};

static inline key_span strip_keys(const mfa_cpu_sequence& seq, int64_t i, int64_t count, int64_t j0,
                                  int64_t n) {
    const visible_range first = keys_of_query(seq, i, j0, n);
    const visible_range last = keys_of_query(seq, i + count - 1, j0, n);
    /* An empty range is clipped to an empty one that may lie before the tile: clamp at 0. */
    key_span keys = {panel_floor(first.begin > 0 ? first.begin : 0), last.end > 0 ? last.end : 0};
    return keys;
}

/* Keys of the forward block of rows [i0, i0 + rows) at j0 (j0 < key_hi): block_k of them, or
 * up to wide_block_k (whole multiples of block_k, or the rest of the keys) where every row sees
 * all of them; wide_block_k is block_k where a mask applies. */
static inline int64_t forward_block_keys(const mfa_cpu_plan* plan, const mfa_cpu_sequence& seq,
                                         int64_t i0, int64_t rows, int64_t j0, int64_t key_hi) {
    const int64_t n = min64(plan->block_k, key_hi - j0);
    if (plan->wide_block_k == plan->block_k || mfa_cpu_key_begin(&seq, i0 + rows - 1) > j0)
        return n;
    const int64_t seen = min64(mfa_cpu_key_end(&seq, i0), key_hi) - j0;
    int64_t wide = min64(plan->wide_block_k, seen);
    if (j0 + wide < key_hi) wide = wide / plan->block_k * plan->block_k;
    return wide > n ? wide : n;
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

    /* Plain scores (no modifiers; per tile, no bias) take plain_softmax_row, which needs the
     * scale's exponent factor finite (mfa.h only asks that the logits be). */
    const float exponent_scale = p->scale * kLog2e;
    const bool plain_scores =
        mods.kinds == 0 && p->scale > 0.0f && __builtin_isfinite(exponent_scale);
    const int64_t v_stride = Ops::units(plan->seq_k_padded) * NR;

    /* Visible ranges move monotonically with the row, so the block's keys are one interval. */
    const int64_t key_hi = mfa_cpu_key_end(&seq, i0 + rows - 1);
    for (int64_t j0 = panel_floor(mfa_cpu_key_begin(&seq, i0)), n = 0; j0 < key_hi; j0 += n) {
        n = forward_block_keys(plan, seq, i0, rows, j0, key_hi);
        const int64_t n_pad = mfa_cpu_round_up(n, NR);
        const int64_t s_ld = mfa_cpu_score_stride(n_pad);
        const mask_tile_kind mask =
            mask_tile(plan, b, h, i0, rows, j0, n, false, t.bias, n_pad, n_pad);
        if (mask == kTileHidden) continue;
        /* Where the band hides part of the tile (a causal diagonal, a window's edges), the
         * products run strip by strip of Ops::strip_rows rows over the keys each strip sees: a
         * causal diagonal tile of 128 rows then costs about half a full one (5/8 in the AMX
         * build's strips of 32). The columns a strip skips are never read as scores (the softmax
         * passes mask them, whatever they hold) and become 0 in P. */
        const bool banded =
            mfa_cpu_key_begin(&seq, i0 + rows - 1) > j0 || mfa_cpu_key_end(&seq, i0) < j0 + n;
        const int64_t strip = Ops::strip_rows;
        if (banded) {
            for (int64_t r0 = 0; r0 < rows; r0 += strip) {
                const key_span keys = strip_keys(seq, i0 + r0, min64(strip, rows - r0), j0, n);
                if (keys.end > keys.begin)
                    Ops::gemm(min64(strip, rows - r0), keys.end - keys.begin, du, t.q + r0 * du, du,
                              pack.kt + (j0 + keys.begin) * du, du * NR,
                              t.s + r0 * s_ld + keys.begin, s_ld, false);
            }
        } else {
            Ops::gemm(rows, n, du, t.q, du, pack.kt + j0 * du, du * NR, t.s, s_ld, false);
        }
        const scores_row_fn scores = scores_row_for(mods, mask == kTileBias);
        const bool plain = plain_scores && mask != kTileBias;
        for (int64_t r0 = 0; r0 < rows; r0 += W) {
            vf sums[W];
            float block_sums[W];
            for (int64_t r = r0; r < r0 + W; ++r) {
                sums[r - r0] = vf{};
                if (r >= rows) continue;
                float* s = t.s + r * s_ld;
                float* operand = Ops::operand_row(t.s, t.p, r, s_ld);
                const visible_range range = keys_of_query(seq, i0 + r, j0, n);
                if (plain && plain_softmax_row<Ops>(s, operand, n_pad, range, p->scale,
                                                    exponent_scale, t.row_max + r, t.row_sum + r,
                                                    t.o + r * dv_pad, dv_pad, sums + (r - r0)))
                    continue;
                const float block_max = scores(s, n_pad, mods, i0 + r + seq.diag - j0,
                                               t.bias ? t.bias + r * n_pad : t.bias, range);
                online_softmax_row(s, n_pad, block_max, t.row_max + r, t.row_sum + r,
                                   t.o + r * dv_pad, dv_pad);
                Ops::operand(s, 1, n_pad, operand);
            }
            if (plain) {
                hsums<W>(sums, block_sums);
                for (int64_t r = r0; r < r0 + W && r < rows; ++r)
                    t.row_sum[r] += block_sums[r - r0];
            }
        }
        const float* probabilities = Ops::operand_row(t.s, t.p, 0, s_ld);
        const int64_t ld = Ops::units(s_ld);
        if (banded) {
            for (int64_t r0 = 0; r0 < rows; r0 += strip) {
                const key_span keys = strip_keys(seq, i0 + r0, min64(strip, rows - r0), j0, n);
                const int64_t u0 = Ops::units(keys.begin);
                if (keys.end > keys.begin)
                    Ops::gemm(min64(strip, rows - r0), dv, Ops::units(keys.end) - u0,
                              probabilities + r0 * ld + u0, ld,
                              pack.v + Ops::units(j0 + keys.begin) * NR, v_stride,
                              t.o + r0 * dv_pad, dv_pad, true);
            }
        } else {
            Ops::gemm(rows, dv, Ops::units(n), probabilities, ld, pack.v + Ops::units(j0) * NR,
                      v_stride, t.o, dv_pad, true);
        }
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
