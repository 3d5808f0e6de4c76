/*
 * Backward pass. The pack pass converts the chunk's K, and Q and dO of their query heads, into
 * panels, along with lse and delta = rowsum(dO * O) per query row. Then blocks of key rows
 * accumulate dK and dV over every query head of their group (over several passes, carrying f32
 * sums, when the group's packs exceed the budget) and, from the same dS, each block's share of
 * dQ, which goes to f32 sums owned by the block's stripe; a last step adds the stripes' sums in
 * order (a unit of one stripe does all three in one task). Five products per pair of blocks
 * rather than the seven of a separate dQ pass (the split the GPU kernels use to avoid float
 * atomics), no atomics, and no N x N buffer: the stripes' sums are O(stripes x Nq) per head.
 *
 * With unscaled dot products s = q.k and the modifiers' score (scores.inl): P = e^(score - lse),
 * dS = P * (dO.v - delta) (times 1 - tanh^2 with softcap), dQ = scale * dS K,
 * dK = scale * dS^T Q, dV = P^T dO. The sinks' gradient needs only lse and delta: the query-side
 * pack leaves its share, and the driver adds the shares up.
 */
#ifndef MFA_CPU_BACKWARD_INL
#define MFA_CPU_BACKWARD_INL

#include "cpu/forward.inl"
#include "cpu/gemm.inl"
#include "cpu/kernels.h"
#include "cpu/pack.inl"
#include "cpu/plan.h"
#include "cpu/scores.inl"
#include "cpu/simd.inl"

#include <stdint.h>
#include <string.h>

namespace {

static inline float* chunk_q_pack(const mfa_cpu_plan* plan, int64_t q_local) {
    return plan->q_packs + q_local * plan->q_pack_floats;
}

template <class Storage, class Ops>
static void pack_key_side(const mfa_cpu_plan* plan, const unit_task& u, int64_t block) {
    const mfa_problem* p = plan->problem;
    const int64_t j0 = block * plan->pack_rows;
    const int64_t count = min64(plan->pack_rows, u.seq.seq_k - j0);
    mfa_cpu_kv_pack pack;
    mfa_cpu_kv_pack_carve(plan, 1, chunk_kv_pack(plan, u.g_local), &pack);
    Ops::template pack_panels<Storage>(key_rows(plan, p->k, u.seq, u.kv.head, j0), count,
                                       p->head_dim, pack.k + Ops::units(j0) * NR,
                                       Ops::units(plan->seq_k_padded) * NR);
}

/* A row that sees no key has lse -inf; +inf in its place makes its P = e^(s - inf) = 0 whether
 * its (masked) s is finite or -inf, so no special case reaches the products. With dsinks, the
 * block's sum of p_sink * delta = e^(sink - lse) * delta over its rows (rows of lse -inf have
 * none) goes to its entry of sink_parts. */
template <class Storage, class Ops>
static void pack_query_side(const mfa_cpu_plan* plan, const unit_task& u, int64_t member_block,
                            float* slot) {
    const mfa_problem* p = plan->problem;
    const int64_t es = plan->elem_size;
    const mfa_cpu_sequence& seq = u.seq;
    const int64_t blocks = mfa_cpu_pack_blocks(plan, seq.seq_q);
    const int64_t member = member_block / blocks, block = member_block % blocks;
    const int64_t q_local = u.g_local * plan->members + member;
    const int64_t h = u.kv.head * p->group + plan->first_member + member;
    const int64_t i0 = block * plan->pack_rows;
    const int64_t count = min64(plan->pack_rows, seq.seq_q - i0);
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int64_t row_panels = Ops::units(plan->seq_q_padded) * NR;
    mfa_cpu_q_pack pack;
    mfa_cpu_q_pack_carve(plan, chunk_q_pack(plan, q_local), &pack);
    const strided_rows q = query_rows(p->q, es, seq, h, i0);
    const strided_rows dout = query_rows(p->dout, es, seq, h, i0);
    Ops::template pack_panels_transposed<Storage>(q, count, d, pack.qt + i0 * Ops::units(d));
    Ops::template pack_panels<Storage>(q, count, d, pack.q + Ops::units(i0) * NR, row_panels);
    Ops::template pack_panels_transposed<Storage>(dout, count, dv,
                                                  pack.doutt + i0 * Ops::units(dv));
    Ops::template pack_panels<Storage>(dout, count, dv, pack.dout + Ops::units(i0) * NR,
                                       row_panels);

    const strided_rows out = query_rows(p->out, es, seq, h, i0);
    const strided_rows lse = query_rows(p->lse, sizeof(float), seq, h, i0);
    const float sink = sink_of(plan, h);
    double sink_sum = 0.0;
    float* o = slot;
    float* dO = slot + mfa_cpu_round_up(dv, 16);
    const int64_t dv_vectors = mfa_cpu_round_up(dv, W);
    for (int64_t x = dv; x < dv_vectors; ++x) o[x] = dO[x] = 0.0f;
    const int64_t padded = mfa_cpu_round_up(count, NR);
    for (int64_t r = 0; r < padded; ++r) {
        float dot = 0.0f, l = -__builtin_inff();
        if (r < count) {
            load_row<Storage>(out.row(r), out.elem_step, dv, o, 1);
            load_row<Storage>(dout.row(r), dout.elem_step, dv, dO, 1);
            vf sum = vf{};
            for (int64_t x = 0; x < dv_vectors; x += W) sum += vload(o + x) * vload(dO + x);
            dot = hsum(sum);
            l = f32_storage::load(lse.row(r));
        }
        pack.delta[i0 + r] = dot;
        pack.lse[i0 + r] = l == -__builtin_inff() ? __builtin_inff() : l;
        if (l != -__builtin_inff()) sink_sum += (double)expf(sink - l) * dot;
    }
    if (plan->sink_parts)
        plan->sink_parts[(seq.batch * p->heads_q + h) * mfa_cpu_pack_blocks(plan, plan->seq_q_max) +
                         block] = sink_sum;
}

/* Pack block `local` of a unit (mfa_cpu_backward_unit_pack_tasks). */
template <class Storage, class Ops>
static void pack_unit_block(const mfa_cpu_plan* plan, const unit_task& u, int64_t local,
                            float* slot) {
    const int64_t key_tasks = mfa_cpu_backward_key_pack_tasks(plan, &u.seq);
    if (local < key_tasks)
        pack_key_side<Storage, Ops>(plan, u, local);
    else
        pack_query_side<Storage, Ops>(plan, u, local - key_tasks, slot);
}

template <class Storage, class Ops>
static void backward_pack_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    const unit_task u = unit_of_task(plan, task);
    pack_unit_block<Storage, Ops>(plan, u, u.local, slot);
}

/* One key row's dS = P * (dP - delta) over columns [0, n) (a multiple of W) of its tile, in
 * place of dP; delta varies along the columns (queries). With softcap, times the derivative of
 * the softcapped score (the chain rule through tanh). */
template <bool SOFTCAP>
static inline void softmax_grad_row(const float* p, float* dp, int64_t n, const float* delta,
                                    const float* softcap_grad) {
    for (int64_t c = 0; c < n; c += W) {
        vf ds = vload(p + c) * (vload(dp + c) - vload(delta + c));
        if (SOFTCAP) ds *= vload(softcap_grad + c);
        vstore(dp + c, ds);
    }
}

static inline void zero_floats(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = 0.0f;
}

/* The queries of a tile [i0, i0 + n) that key rows [j, j + count) of a sequence see, as tile
 * columns [begin, end) with begin at a panel's start: the mirror of the forward's strip_keys. */
static inline key_span strip_queries(const mfa_cpu_sequence& seq, int64_t j, int64_t count,
                                     int64_t i0, int64_t n) {
    const visible_range first = queries_of_key(seq, j, i0, n);
    const visible_range last = queries_of_key(seq, j + count - 1, i0, n);
    key_span queries = {panel_floor(first.begin > 0 ? first.begin : 0),
                        last.end > 0 ? last.end : 0};
    return queries;
}

/* One block of key rows [j0, j0 + rows): dK and dV over every query head of the pass and every
 * visible query block, and each block's dQ contribution (dS K) added into the stripe's sums. Five
 * products per pair of blocks: S^T, dP^T, dV += P^T dO, dK += dS^T Q, dQ += dS K.
 *
 * The first four run strip by strip of key rows (one strip of all of them where the band hides
 * nothing), each strip's P and dS made between its products (P stays in s, dS replaces dP, so
 * that both are there for the row products). Where the band hides part of the tile (a causal
 * diagonal, a window's edges) the strips are Ops::strip_rows rows and each runs over the queries it
 * sees, and dQ runs strip by strip of as many query rows over the keys each sees, as the
 * forward's products do: a causal diagonal tile then costs about 60 % of a full one. Columns a
 * strip skips are never read as P, and its dS there is set to 0, which is what dQ's strips read
 * of them. */
template <class Storage, class Ops>
static void key_block_grads(const mfa_cpu_plan* plan, const unit_task& u, int64_t stripe,
                            int64_t j0, const mfa_cpu_backward_tiles& t) {
    const mfa_problem* p = plan->problem;
    const mfa_cpu_sequence& seq = u.seq;
    const int64_t g_local = u.g_local;
    const int64_t rows = min64(plan->block_k, seq.seq_k - j0);
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int64_t d_pad = mfa_cpu_round_up(d, NR), dv_pad = mfa_cpu_round_up(dv, NR);
    const int64_t du = Ops::units(d), dvu = Ops::units(dv);
    const int64_t row_panels = Ops::units(plan->seq_q_padded) * NR;

    mfa_cpu_kv_pack kv_pack;
    mfa_cpu_kv_pack_carve(plan, 1, chunk_kv_pack(plan, g_local), &kv_pack);
    const float* keys = kv_pack.k + Ops::units(j0) * NR;
    const int64_t key_panels = Ops::units(plan->seq_k_padded) * NR;
    Ops::template pack_rows<Storage>(key_rows(plan, p->k, seq, u.kv.head, j0), rows, d, t.rows, du);
    Ops::template pack_rows<Storage>(key_rows(plan, p->v, seq, u.kv.head, j0), rows, dv,
                                     t.rows_out_grad, dvu);
    mfa_cpu_kv_grads carried = {0, 0};
    if (plan->kv_grads) {
        mfa_cpu_kv_grads_carve(plan, plan->kv_grads + g_local * plan->kv_grads_floats, &carried);
        carried.dk += j0 * d_pad;
        carried.dv += j0 * dv_pad;
    }
    const bool continues = plan->first_member > 0;
    for (int64_t i = 0; i < rows * d_pad; ++i) t.acc[i] = continues ? carried.dk[i] : 0.0f;
    for (int64_t i = 0; i < rows * dv_pad; ++i) t.acc_v[i] = continues ? carried.dv[i] : 0.0f;

    const int64_t query_hi = mfa_cpu_query_end(&seq, j0 + rows - 1);
    for (int64_t member = 0; member < plan->members; ++member) {
        const int64_t h = u.kv.head * p->group + plan->first_member + member;
        const score_modifiers mods = modifiers_of(plan, seq, h);
        mfa_cpu_q_pack q_pack;
        mfa_cpu_q_pack_carve(plan, chunk_q_pack(plan, g_local * plan->members + member), &q_pack);
        float* dq = mfa_cpu_dq_stripe(plan, g_local, stripe, member);
        for (int64_t i0 = panel_floor(mfa_cpu_query_begin(&seq, j0)); i0 < query_hi;
             i0 += plan->block_q) {
            const int64_t n = min64(plan->block_q, query_hi - i0);
            const int64_t n_pad = mfa_cpu_round_up(n, NR);
            const int64_t ld = Ops::units(n_pad);
            const mask_tile_kind mask =
                mask_tile(plan, seq.batch, h, i0, n, j0, rows, true, t.bias, n_pad, n_pad);
            if (mask == kTileHidden) continue;
            const probabilities_row_fn probabilities_of =
                probabilities_row_for(mods, mask == kTileBias);
            const bool banded = mfa_cpu_query_begin(&seq, j0 + rows - 1) > i0 ||
                                mfa_cpu_query_end(&seq, j0) < i0 + n;
            const int64_t strip = banded ? Ops::strip_rows : rows;
            for (int64_t r0 = 0; r0 < rows; r0 += strip) {
                const int64_t count = min64(strip, rows - r0);
                const key_span span =
                    banded ? strip_queries(seq, j0 + r0, count, i0, n) : key_span{0, n};
                /* Columns [first, end) of the strip's rows hold P and dS, 0 outside. */
                const bool any = span.end > span.begin;
                const int64_t first = any ? span.begin : 0;
                const int64_t end = any ? mfa_cpu_round_up(span.end, W) : 0;
                float* s = t.s + r0 * n_pad;
                float* ds = t.dp + r0 * n_pad;
                if (any) {
                    Ops::gemm(count, span.end - first, du, t.rows + r0 * du, du,
                              q_pack.qt + (i0 + first) * du, du * NR, s + first, n_pad, false);
                    Ops::gemm(count, span.end - first, dvu, t.rows_out_grad + r0 * dvu, dvu,
                              q_pack.doutt + (i0 + first) * dvu, dvu * NR, ds + first, n_pad,
                              false);
                }
                for (int64_t r = r0; r < r0 + count; ++r) {
                    float* s_row = t.s + r * n_pad;
                    float* ds_row = t.dp + r * n_pad;
                    float* softcap_grad =
                        t.softcap_grad ? t.softcap_grad + r * n_pad + first : t.softcap_grad;
                    zero_floats(ds_row, first);
                    zero_floats(ds_row + end, n_pad - end);
                    if (!any) continue;
                    const visible_range range = queries_of_key(seq, j0 + r, i0, n);
                    const visible_range shifted = {range.begin - first, range.end - first};
                    probabilities_of(s_row + first, end - first, mods,
                                     i0 + first + seq.diag - (j0 + r),
                                     t.bias ? t.bias + r * n_pad + first : t.bias,
                                     q_pack.lse + i0 + first, shifted, softcap_grad);
                    if (t.softcap_grad)
                        softmax_grad_row<true>(s_row + first, ds_row + first, end - first,
                                               q_pack.delta + i0 + first, softcap_grad);
                    else
                        softmax_grad_row<false>(s_row + first, ds_row + first, end - first,
                                                q_pack.delta + i0 + first, softcap_grad);
                }
                if (!any) continue;
                const int64_t u0 = Ops::units(first), depth = Ops::units(span.end) - u0;
                float* pairs = t.operand + r0 * ld;
                const float* probabilities = Ops::operand(s, count, n_pad, pairs);
                Ops::gemm(count, dv, depth, probabilities + u0, ld,
                          q_pack.dout + Ops::units(i0 + first) * NR, row_panels,
                          t.acc_v + r0 * dv_pad, dv_pad, true);
                const float* ds_rows = Ops::operand(ds, count, n_pad, pairs);
                Ops::gemm(count, d, depth, ds_rows + u0, ld, q_pack.q + Ops::units(i0 + first) * NR,
                          row_panels, t.acc + r0 * d_pad, d_pad, true);
            }
            const float* ds_t = Ops::operand_at(t.dp, rows, n_pad, t.operand);
            if (!banded) {
                Ops::gemm_at(n, d, Ops::units(rows), ds_t, n_pad, keys, key_panels, dq + i0 * d_pad,
                             d_pad);
                continue;
            }
            for (int64_t q0 = 0; q0 < n; q0 += Ops::strip_rows) {
                const int64_t count = min64(Ops::strip_rows, n - q0);
                const key_span seen = strip_keys(seq, i0 + q0, count, j0, rows);
                if (seen.end <= seen.begin) continue;
                const int64_t k0 = Ops::units(seen.begin);
                Ops::gemm_at(count, d, Ops::units(seen.end) - k0, ds_t + k0 * n_pad + q0, n_pad,
                             keys + k0 * NR, key_panels, dq + (i0 + q0) * d_pad, d_pad);
            }
        }
    }
    if (plan->first_member + plan->members < p->group) {
        memcpy(carried.dk, t.acc, sizeof(float) * rows * d_pad);
        memcpy(carried.dv, t.acc_v, sizeof(float) * rows * dv_pad);
        return;
    }
    store_rows<Storage>(key_rows(plan, p->dk, seq, u.kv.head, j0), rows, d, t.acc, d_pad, p->scale);
    store_rows<Storage>(key_rows(plan, p->dv, seq, u.kv.head, j0), rows, dv, t.acc_v, dv_pad, 1.0f);
}

/* Stripe s of a key/value head: key blocks s, s + stripes, ... (round-robin, so that under a
 * causal mask every stripe gets long and short blocks alike), into its own dQ sums. A unit of one
 * stripe (mfa_cpu_backward_whole_unit) is packed here first and its dQ stored here at the end. */
template <class Storage, class Ops>
static void backward_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    const mfa_problem* p = plan->problem;
    const unit_task u = unit_of_task(plan, task);
    const int64_t stripe = u.local, stripes = mfa_cpu_backward_tasks(plan, &u.seq);
    const bool whole = mfa_cpu_backward_whole_unit(plan, &u.seq);
    const int64_t d_pad = mfa_cpu_round_up(p->head_dim, NR);
    const int64_t used = u.seq.seq_q * d_pad;
    if (whole)
        for (int64_t block = 0; block < mfa_cpu_backward_unit_pack_tasks(plan, &u.seq); ++block)
            pack_unit_block<Storage, Ops>(plan, u, block, slot);
    mfa_cpu_backward_tiles t;
    mfa_cpu_backward_tiles_carve(plan, slot, &t);
    for (int64_t member = 0; member < plan->members; ++member) {
        float* dq = mfa_cpu_dq_stripe(plan, u.g_local, stripe, member);
        for (int64_t i = 0; i < used; ++i) dq[i] = 0.0f;
    }
    const int64_t k_blocks = mfa_cpu_blocks(u.seq.seq_k, plan->block_k);
    for (int64_t kb = stripe; kb < k_blocks; kb += stripes)
        key_block_grads<Storage, Ops>(plan, u, stripe, kb * plan->block_k, t);
    if (!whole) return;
    for (int64_t member = 0; member < plan->members; ++member) {
        const int64_t h = u.kv.head * p->group + plan->first_member + member;
        store_rows<Storage>(query_rows(p->dq, plan->elem_size, u.seq, h, 0), u.seq.seq_q,
                            p->head_dim, mfa_cpu_dq_stripe(plan, u.g_local, 0, member), d_pad,
                            p->scale);
    }
}

/* dQ of one block of query rows: scale times the stripes' sums, added in stripe order (none
 * for a sequence without keys: dQ is 0). */
template <class Storage>
static void backward_dq_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    const mfa_problem* p = plan->problem;
    const unit_task u = unit_of_task(plan, task);
    const int64_t q_blocks = mfa_cpu_blocks(u.seq.seq_q, plan->block_q);
    const int64_t member = u.local / q_blocks;
    const int64_t h = u.kv.head * p->group + plan->first_member + member;
    const int64_t i0 = u.local % q_blocks * plan->block_q;
    const int64_t rows = min64(plan->block_q, u.seq.seq_q - i0);
    const int64_t d_pad = mfa_cpu_round_up(p->head_dim, NR);
    const int64_t stripes = mfa_cpu_backward_tasks(plan, &u.seq);
    float* sum = slot;
    for (int64_t i = 0; i < rows * d_pad; ++i) sum[i] = 0.0f;
    for (int64_t stripe = 0; stripe < stripes; ++stripe) {
        const float* part = mfa_cpu_dq_stripe(plan, u.g_local, stripe, member) + i0 * d_pad;
        for (int64_t i = 0; i < rows * d_pad; i += W)
            vstore(sum + i, vload(sum + i) + vload(part + i));
    }
    store_rows<Storage>(query_rows(p->dq, plan->elem_size, u.seq, h, i0), rows, p->head_dim, sum,
                        d_pad, p->scale);
}

} // namespace

#endif /* MFA_CPU_BACKWARD_INL */
