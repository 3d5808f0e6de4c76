/*
 * Decoding: few query rows per key/value head (group x seq_q, e.g. one new token per query head
 * against a long cache). Packing K and V into panels would cost as much as reading them, so these
 * tasks read K and V where they lie, one block of keys at a time, and are memory-bound: every
 * byte of K and V is read once per call. The keys of each head are split into ranges, one task
 * each, so that a single head's cache still keeps every thread streaming; tasks of a split head
 * leave partial states that decode_merge_task combines through their log-sum-exps (merge.h).
 *
 * Products are f32 FMAs on dot products (scores: rows of Q against rows of K, reduced across the
 * vector) and broadcasts (out: P times rows of V). f32 and bf16 rows with adjacent elements are
 * read in place, bf16 widened in registers; anything else is converted a block at a time into
 * the task's tiles first.
 */
#ifndef MFA_CPU_DECODE_INL
#define MFA_CPU_DECODE_INL

#include "cpu/forward.inl"
#include "cpu/mask.inl"
#include "cpu/merge.h"
#include "cpu/pack.inl"
#include "cpu/plan.h"
#include "cpu/simd.inl"

#include <math.h>
#include <stdint.h>

namespace {

/* How rows of one storage dtype are read as f32 vectors, where they can be. */
template <class Storage>
struct vector_rows {
    enum { in_place = 0 };
    typedef f32_storage read_as; /* converted into f32 tiles first */
};

template <>
struct vector_rows<f32_storage> {
    enum { in_place = 1 };
    typedef f32_storage read_as;
    static vf load(const char* p) { return vload((const float*)p); }
};

template <>
struct vector_rows<bf16_storage> {
    enum { in_place = 1 };
    typedef bf16_storage read_as;
    static vf load(const char* p) { return vload_bf16(p); }
};

/* Accumulator registers the products below keep in flight: half the register file. */
#if MFA_CPU_VECTOR_BYTES == 64 || defined(__aarch64__)
static const int kDecodeAccumulators = 16;
#else
static const int kDecodeAccumulators = 8;
#endif

/* s[r * lds + j] = q_r . key_j for ROWS query rows (ldq apart) and `keys` key rows (key_step
 * bytes apart), depth a multiple of W. KEYS keys at a time share each load of the queries, and
 * ROWS x KEYS independent sums hide the FMA latency. */
template <int ROWS, int KEYS, class Rows>
static inline void dot_rows(const float* q, int64_t ldq, const char* k, int64_t key_step,
                            int64_t keys, int64_t depth, float* s, int64_t lds) {
    const int64_t size = Rows::size;
    int64_t j = 0;
    for (; j + KEYS <= keys; j += KEYS) {
        vf acc[ROWS][KEYS];
        for (int r = 0; r < ROWS; ++r)
            for (int c = 0; c < KEYS; ++c) acc[r][c] = vsplat(0.0f);
        for (int64_t x = 0; x < depth; x += W) {
            vf key[KEYS];
            for (int c = 0; c < KEYS; ++c)
                key[c] = vector_rows<Rows>::load(k + (j + c) * key_step + x * size);
            for (int r = 0; r < ROWS; ++r) {
                const vf query = vload(q + r * ldq + x);
                for (int c = 0; c < KEYS; ++c) acc[r][c] += query * key[c];
            }
        }
        for (int r = 0; r < ROWS; ++r)
            for (int c = 0; c < KEYS; ++c) s[r * lds + j + c] = hsum(acc[r][c]);
    }
    for (; j < keys; ++j) {
        vf acc[ROWS];
        for (int r = 0; r < ROWS; ++r) acc[r] = vsplat(0.0f);
        for (int64_t x = 0; x < depth; x += W) {
            const vf key = vector_rows<Rows>::load(k + j * key_step + x * size);
            for (int r = 0; r < ROWS; ++r) acc[r] += vload(q + r * ldq + x) * key;
        }
        for (int r = 0; r < ROWS; ++r) s[r * lds + j] = hsum(acc[r]);
    }
}

/* o[r * ldo + x0 .. + VECS * W) += sum_j p[r * ldp + j] * value_j[same columns] for ROWS rows:
 * each key's slice of V is read once, contiguously, into ROWS x VECS independent sums. */
template <int ROWS, int VECS, class Rows>
static inline void accumulate_columns(const float* p, int64_t ldp, const char* v,
                                      int64_t value_step, int64_t keys, int64_t x0, float* o,
                                      int64_t ldo) {
    const int64_t size = Rows::size;
    vf acc[ROWS][VECS];
    for (int r = 0; r < ROWS; ++r)
        for (int c = 0; c < VECS; ++c) acc[r][c] = vload(o + r * ldo + x0 + c * W);
    for (int64_t j = 0; j < keys; ++j) {
        const char* row = v + j * value_step + x0 * size;
        vf value[VECS];
        for (int c = 0; c < VECS; ++c) value[c] = vector_rows<Rows>::load(row + c * W * size);
        for (int r = 0; r < ROWS; ++r) {
            const vf weight = vsplat(p[r * ldp + j]);
            for (int c = 0; c < VECS; ++c) acc[r][c] += weight * value[c];
        }
    }
    for (int r = 0; r < ROWS; ++r)
        for (int c = 0; c < VECS; ++c) vstore(o + r * ldo + x0 + c * W, acc[r][c]);
}

/* ... over all columns [0, width), width a multiple of W. */
template <int ROWS, class Rows>
static inline void accumulate_rows(const float* p, int64_t ldp, const char* v, int64_t value_step,
                                   int64_t keys, int64_t width, float* o, int64_t ldo) {
    const int vecs = kDecodeAccumulators / ROWS > 8 ? 8 : kDecodeAccumulators / ROWS;
    int64_t x = 0;
    for (; x + vecs * W <= width; x += vecs * W)
        accumulate_columns<ROWS, (kDecodeAccumulators / ROWS > 8 ? 8 : kDecodeAccumulators / ROWS),
                           Rows>(p, ldp, v, value_step, keys, x, o, ldo);
    for (; x < width; x += W)
        accumulate_columns<ROWS, 1, Rows>(p, ldp, v, value_step, keys, x, o, ldo);
}

/* One block of keys for every row of the task: scores, then O += P V. */
template <class Rows>
static void decode_products(const float* q, int64_t rows, int64_t ldq, const char* k,
                            int64_t key_step, int64_t depth, int64_t keys, float* s, int64_t lds) {
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2)
        dot_rows<2, 4, Rows>(q + r * ldq, ldq, k, key_step, keys, depth, s + r * lds, lds);
    if (r < rows)
        dot_rows<1, 8, Rows>(q + r * ldq, ldq, k, key_step, keys, depth, s + r * lds, lds);
}

template <class Rows>
static void decode_accumulate(const float* p, int64_t rows, int64_t ldp, const char* v,
                              int64_t value_step, int64_t width, int64_t keys, float* o,
                              int64_t ldo) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        accumulate_rows<4, Rows>(p + r * ldp, ldp, v, value_step, keys, width, o + r * ldo, ldo);
    for (; r + 2 <= rows; r += 2)
        accumulate_rows<2, Rows>(p + r * ldp, ldp, v, value_step, keys, width, o + r * ldo, ldo);
    for (; r < rows; ++r)
        accumulate_rows<1, Rows>(p + r * ldp, ldp, v, value_step, keys, width, o + r * ldo, ldo);
}

/* Rows of the task: r = member * seq_q + i is query row i of query head member of the group. */
struct decode_row {
    int64_t head, query;
};

static inline decode_row decode_row_of(const mfa_cpu_plan* plan, int64_t kv_head, int64_t r) {
    const mfa_problem* p = plan->problem;
    decode_row row = {kv_head * p->group + r / p->seq_q, r % p->seq_q};
    return row;
}

/* Keys [lo, hi) that some row of a head sees; split into key_splits ranges of key_split_size. */
static inline int64_t decode_keys_begin(const mfa_cpu_plan* plan) {
    return mfa_cpu_key_begin(plan, 0);
}

template <class Storage>
static void decode_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    typedef typename vector_rows<Storage>::read_as Direct;
    const mfa_problem* p = plan->problem;
    const int64_t es = plan->elem_size;
    const int64_t g = task / plan->key_splits;
    const kv_head_ref kv = chunk_kv_head(plan, g);
    const int64_t b = kv.batch;
    const int64_t rows = mfa_cpu_decode_rows(plan);
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int64_t ld = mfa_cpu_round_up(d, 16), ldv = mfa_cpu_round_up(dv, 16);
    const int64_t bk = mfa_cpu_decode_block;
    const int64_t first = decode_keys_begin(plan) + task % plan->key_splits * plan->key_split_size;
    const int64_t last = min64(first + plan->key_split_size, mfa_cpu_key_end(plan, p->seq_q - 1));

    mfa_cpu_decode_tiles t;
    mfa_cpu_decode_tiles_carve(plan, slot, &t);
    for (int64_t r = 0; r < rows; ++r) {
        const decode_row row = decode_row_of(plan, kv.head, r);
        const strided_rows q = rows_of(p->q, es, b, row.head, row.query);
        load_row<Storage>(q.row(0), q.elem_step, d, t.q + r * ld, 1);
        for (int64_t x = d; x < ld; ++x) t.q[r * ld + x] = 0.0f;
        for (int64_t x = 0; x < ldv; ++x) t.o[r * ldv + x] = 0.0f;
        t.row_max[r] = -__builtin_inff();
        t.row_sum[r] = 0.0f;
    }

    const strided_rows keys = rows_of(p->k, es, b, kv.head, 0);
    const strided_rows values = rows_of(p->v, es, b, kv.head, 0);
    const bool in_place = vector_rows<Storage>::in_place && keys.elem_step == es &&
                          values.elem_step == es && d % W == 0 && dv % W == 0;
    for (int64_t j0 = first; j0 < last; j0 += bk) {
        const int64_t n = min64(bk, last - j0);
        const int64_t n_pad = mfa_cpu_round_up(n, W);
        if (in_place) {
            decode_products<Direct>(t.q, rows, ld, keys.row(j0), keys.row_step, d, n, t.s, bk);
        } else {
            pack_f32_rows<Storage>(rows_of(p->k, es, b, kv.head, j0), n, d, t.k, ld);
            decode_products<f32_storage>(t.q, rows, ld, (const char*)t.k, ld * 4, ld, n, t.s, bk);
        }
        for (int64_t r = 0; r < rows; ++r) {
            float* s = t.s + r * bk;
            const visible_range range = keys_of_query(plan, decode_row_of(plan, 0, r).query, j0, n);
            const float old_max = t.row_max[r];
            const float block_max = scale_mask_max(s, n_pad, p->scale, range.begin, range.end);
            const float new_max =
                block_max > old_max || block_max != block_max ? block_max : old_max;
            if (new_max == -__builtin_inff()) {
                for (int64_t c = 0; c < n_pad; ++c) s[c] = 0.0f;
                continue;
            }
            const float block_sum = exp_shifted_sum(s, n_pad, new_max);
            if (new_max != old_max) {
                const float correction = expf(old_max - new_max);
                t.row_sum[r] *= correction;
                scale_row(t.o + r * ldv, ldv, correction);
                t.row_max[r] = new_max;
            }
            t.row_sum[r] += block_sum;
        }
        if (in_place) {
            decode_accumulate<Direct>(t.s, rows, bk, values.row(j0), values.row_step, dv, n, t.o,
                                      ldv);
        } else {
            pack_f32_rows<Storage>(rows_of(p->v, es, b, kv.head, j0), n, dv, t.v, ldv);
            decode_accumulate<f32_storage>(t.s, rows, bk, (const char*)t.v, ldv * 4, ldv, n, t.o,
                                           ldv);
        }
    }

    for (int64_t r = 0; r < rows; ++r) {
        const float sum = t.row_sum[r];
        const float lse = sum == 0.0f ? -__builtin_inff() : t.row_max[r] + logf(sum);
        scale_row(t.o + r * ldv, ldv, sum == 0.0f ? 0.0f : 1.0f / sum);
        if (plan->key_splits > 1) {
            float* part =
                plan->partials + (task * rows + r) * mfa_cpu_decode_partial_row_floats(plan);
            for (int64_t x = 0; x < dv; ++x) part[x] = t.o[r * ldv + x];
            part[dv] = lse;
            continue;
        }
        const decode_row row = decode_row_of(plan, kv.head, r);
        store_rows<Storage>(rows_of(p->out, es, b, row.head, row.query), 1, dv, t.o + r * ldv, ldv,
                            1.0f);
        if (p->lse.data)
            f32_storage::store(rows_of(p->lse, sizeof(float), b, row.head, row.query).row(0), lse);
    }
}

/* The key splits of one key/value head merged into its rows' out and lse. */
template <class Storage>
static void decode_merge_task(const mfa_cpu_plan* plan, int64_t task, float* slot) {
    const mfa_problem* p = plan->problem;
    const int64_t rows = mfa_cpu_decode_rows(plan), splits = plan->key_splits;
    const int64_t dv = p->head_dim_v;
    const int64_t row_floats = mfa_cpu_decode_partial_row_floats(plan);
    const kv_head_ref kv = chunk_kv_head(plan, task);
    float* weights = slot;
    float* merged = slot + mfa_cpu_round_up(splits, 16);
    for (int64_t r = 0; r < rows; ++r) {
        const float* first = plan->partials + (task * splits * rows + r) * row_floats;
        const int64_t stride = rows * row_floats;
        const float lse = mfa_cpu_merge_weights(first + dv, stride, splits, weights);
        mfa_cpu_merge_rows(first, stride, splits, weights, dv, merged);
        const decode_row row = decode_row_of(plan, kv.head, r);
        store_rows<Storage>(rows_of(p->out, plan->elem_size, kv.batch, row.head, row.query), 1, dv,
                            merged, dv, 1.0f);
        if (p->lse.data)
            f32_storage::store(rows_of(p->lse, sizeof(float), kv.batch, row.head, row.query).row(0),
                               lse);
    }
}

} // namespace

#endif /* MFA_CPU_DECODE_INL */
