/*
 * The kernels' KV-cache paths on metal-sim, through mfa_attention_compute, against the float64
 * reference of test_reference.h, at the shapes where the planner takes them (the Python suites'
 * cases are too small to): decoding against long caches, where the forward splits the keys
 * across threadgroups and a combine pass merges the splits (with sinks and initial states),
 * initial states over rows that several threadgroups share (Dv wider than one accumulator,
 * also folded by the combine), and paged caches with shuffled blocks, partial last blocks and
 * appended keys, split as well. The planner's choices for these shapes are checked in
 * tests/planner; here the results are.
 *
 * Tolerances: ref_compare's model (test_reference.h): the dtype's rounding of the result plus
 * f32 accumulation over the reduction length, which for split keys includes the combine's sum
 * over the splits (a few terms more than Nk).
 */
#include "test_reference.h"

/* Rows [first, first + count) of axis 2 of t, a view into the same memory. */
static mfa_tensor rows_of(const mfa_tensor* t, int64_t first, int64_t count) {
    mfa_tensor view = *t;
    view.data = (char*)t->data + (size_t)(first * t->strides[2]) * mfa_dtype_size(t->dtype);
    view.shape[2] = count;
    return view;
}

/* Batch entry b of t, a view into the same memory. */
static mfa_tensor batch_of(const mfa_tensor* t, int64_t b) {
    mfa_tensor view = *t;
    view.data = (char*)t->data + (size_t)(b * t->strides[0]) * mfa_dtype_size(t->dtype);
    view.shape[0] = 1;
    return view;
}

static mfa_context* sim_context(mfa_gpu_family family, const char* label) {
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.gpu_family = family;
    return test_context(MFA_BACKEND_METAL_SIM, &options, label);
}

static void check(const char* label, const char* what, const mfa_tensor* got, mfa_dtype dtype,
                  const double* want, const double* magnitude, int64_t reduction,
                  double max_score) {
    char why[256];
    CHECK(ref_compare(got, dtype, want, magnitude, reduction, max_score, why, sizeof why),
          "%s: %s: %s", label, what, why);
}

/* One forward of q against k, v (views), with sinks (NULL: none) and an initial state. */
static mfa_status forward(mfa_context* ctx, const mfa_attention_params* params, const mfa_tensor* q,
                          const mfa_tensor* k, const mfa_tensor* v, const mfa_tensor* out,
                          const mfa_tensor* lse, const mfa_tensor* sinks, int initial_state) {
    const mfa_array aq = test_array_of(q), ak = test_array_of(k), av = test_array_of(v),
                    ao = test_array_of(out), al = test_array_of(lse);
    mfa_array as;
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    args.q = &aq, args.k = &ak, args.v = &av, args.out = &ao, args.lse = &al;
    args.initial_state = initial_state;
    if (sinks) {
        as = test_array_of(sinks);
        args.sinks = &as;
    }
    return mfa_attention_compute(ctx, MFA_FORWARD, params, &args);
}

typedef struct dense_case {
    const char* name;
    mfa_gpu_family family;
    mfa_dtype dtype;
    int64_t b, hq, hkv, nq, nk, d, dv;
    int causal, with_sinks;
    int64_t first_keys; /* > 0: a first call over keys [0, first_keys), then an initial-state
                           call over the rest; 0: one call */
} dense_case;

/* A dense forward, in one call or as two calls accumulating into an initial state, against the
 * reference over all keys. */
static void run_dense(const dense_case* c) {
    mfa_context* ctx = sim_context(c->family, c->name);
    if (!ctx) return;
    const mfa_attention_params params = test_params(c->causal, MFA_ALIGN_BOTTOM_RIGHT, -1, -1, 0);
    test_tensor q = test_tensor_make(c->dtype, c->b, c->hq, c->nq, c->d, TEST_BHSD);
    test_tensor k = test_tensor_make(c->dtype, c->b, c->hkv, c->nk, c->d, TEST_BSHD);
    test_tensor v = test_tensor_make(c->dtype, c->b, c->hkv, c->nk, c->dv, TEST_BSHD);
    test_tensor o = test_tensor_make(c->dtype, c->b, c->hq, c->nq, c->dv, TEST_BHSD);
    test_tensor lse = test_tensor_make(MFA_DTYPE_F32, c->b, c->hq, c->nq, 1, TEST_BHSD);
    test_tensor sinks = test_tensor_make(MFA_DTYPE_F32, 1, c->hq, 1, 1, TEST_BHSD);
    test_fill_random(&q);
    test_fill_random(&k);
    test_fill_random(&v);
    test_fill_random(&sinks);
    test_fill_nan(&o);
    test_fill_nan(&lse);
    double* sink_logits = malloc(sizeof(double) * (size_t)c->hq);
    for (int64_t h = 0; h < c->hq; ++h) sink_logits[h] = test_get(&sinks.t, 0, h, 0, 0);
    const mfa_tensor* sink_view = c->with_sinks ? &sinks.t : NULL;

    mfa_status status;
    if (c->first_keys > 0) {
        /* The sinks join the softmax once: with the first part only, which the second folds in
         * as its initial state. The first part's keys are the last rows of a causal call's band
         * only when it sees all of them, so these cases are not causal. */
        const mfa_tensor k0 = rows_of(&k.t, 0, c->first_keys), v0 = rows_of(&v.t, 0, c->first_keys);
        const mfa_tensor k1 = rows_of(&k.t, c->first_keys, c->nk - c->first_keys);
        const mfa_tensor v1 = rows_of(&v.t, c->first_keys, c->nk - c->first_keys);
        status = forward(ctx, &params, &q.t, &k0, &v0, &o.t, &lse.t, sink_view, 0);
        CHECK(status == MFA_OK, "%s: first part: %s", c->name, mfa_last_error());
        if (status == MFA_OK) status = forward(ctx, &params, &q.t, &k1, &v1, &o.t, &lse.t, NULL, 1);
        CHECK(status == MFA_OK, "%s: initial-state part: %s", c->name, mfa_last_error());
    } else {
        status = forward(ctx, &params, &q.t, &k.t, &v.t, &o.t, &lse.t, sink_view, 0);
        CHECK(status == MFA_OK, "%s: forward: %s", c->name, mfa_last_error());
    }
    if (status == MFA_OK) {
        ref_problem p = ref_problem_of(&q.t, &k.t, &v.t, &params);
        if (c->with_sinks) p.sinks = sink_logits;
        ref_result want = ref_forward(&p, &q.t, &k.t, &v.t);
        check(c->name, "out", &o.t, c->dtype, want.out, want.out_mag, c->nk + 32, want.max_score);
        check(c->name, "lse", &lse.t, MFA_DTYPE_F32, want.lse, want.lse_mag, c->nk + 32,
              want.max_score);
        ref_free(&want);
    }
    free(sink_logits);
    test_tensor* all[] = {&q, &k, &v, &o, &lse, &sinks};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_tensor_free(all[i]);
    mfa_context_destroy(ctx);
}

typedef struct paged_case {
    const char* name;
    mfa_gpu_family family;
    mfa_dtype dtype;
    int64_t hq, hkv, nq, d, block_size, new_len;
    int64_t cached[2]; /* keys already in each of two sequences' caches */
} paged_case;

/* Two sequences whose caches are scattered over shuffled blocks of one pool (the other blocks
 * hold NaN, which no key of theirs may reach), with new_len keys appended to each, against the
 * reference over each sequence's keys as dense arrays. The appended rows must be in the caches
 * afterwards. */
static void run_paged(const paged_case* c) {
    mfa_context* ctx = sim_context(c->family, c->name);
    if (!ctx) return;
    enum { B = 2 };
    const mfa_attention_params params = test_params(1, MFA_ALIGN_BOTTOM_RIGHT, -1, -1, 0);
    int64_t lengths[B], blocks[B], max_blocks = 0, num_blocks = 1; /* one spare block */
    for (int b = 0; b < B; ++b) {
        lengths[b] = c->cached[b] + c->new_len;
        blocks[b] = (lengths[b] + c->block_size - 1) / c->block_size;
        if (blocks[b] > max_blocks) max_blocks = blocks[b];
        num_blocks += blocks[b];
    }
    const int64_t longest = lengths[0] > lengths[1] ? lengths[0] : lengths[1];
    test_tensor q = test_tensor_make(c->dtype, B, c->hq, c->nq, c->d, TEST_BHSD);
    test_tensor keys = test_tensor_make(c->dtype, B, c->hkv, longest, c->d, TEST_BHSD);
    test_tensor values = test_tensor_make(c->dtype, B, c->hkv, longest, c->d, TEST_BHSD);
    test_tensor k_cache =
        test_tensor_make(c->dtype, num_blocks, c->hkv, c->block_size, c->d, TEST_BSHD);
    test_tensor v_cache =
        test_tensor_make(c->dtype, num_blocks, c->hkv, c->block_size, c->d, TEST_BSHD);
    test_tensor k_new = test_tensor_make(c->dtype, B, c->hkv, c->new_len, c->d, TEST_BHSD);
    test_tensor v_new = test_tensor_make(c->dtype, B, c->hkv, c->new_len, c->d, TEST_BHSD);
    test_tensor table = test_tensor_make(MFA_DTYPE_I32, B, 1, 1, max_blocks, TEST_BHSD);
    test_tensor cache_seqlens = test_tensor_make(MFA_DTYPE_I32, B, 1, 1, 1, TEST_BHSD);
    test_tensor o = test_tensor_make(c->dtype, B, c->hq, c->nq, c->d, TEST_BHSD);
    test_tensor lse = test_tensor_make(MFA_DTYPE_F32, B, c->hq, c->nq, 1, TEST_BHSD);
    test_fill_random(&q);
    test_fill_random(&keys);
    test_fill_random(&values);
    test_fill_nan(&k_cache);
    test_fill_nan(&v_cache);
    test_fill_nan(&o);
    test_fill_nan(&lse);
    /* Blocks handed out in a fixed shuffled order: steps of a stride coprime to the pool's
     * size visit every block once. */
    int32_t* table_entries = table.storage;
    int64_t next = 0, stride = 7;
    while (num_blocks % stride == 0) stride += 2;
    for (int b = 0; b < B; ++b) {
        ((int32_t*)cache_seqlens.storage)[b] = (int32_t)c->cached[b];
        for (int64_t i = 0; i < max_blocks; ++i) {
            int32_t id = -1; /* past the sequence's reach: never read */
            if (i < blocks[b]) {
                next = (next + stride) % num_blocks;
                id = (int32_t)next;
            }
            table_entries[b * max_blocks + i] = id;
        }
        for (int64_t h = 0; h < c->hkv; ++h)
            for (int64_t j = 0; j < lengths[b]; ++j)
                for (int64_t x = 0; x < c->d; ++x) {
                    const float kv = (float)test_get(&keys.t, b, h, j, x);
                    const float vv = (float)test_get(&values.t, b, h, j, x);
                    if (j < c->cached[b]) {
                        const int64_t blk = table_entries[b * max_blocks + j / c->block_size];
                        test_set(&k_cache.t, blk, h, j % c->block_size, x, kv);
                        test_set(&v_cache.t, blk, h, j % c->block_size, x, vv);
                    } else {
                        test_set(&k_new.t, b, h, j - c->cached[b], x, kv);
                        test_set(&v_new.t, b, h, j - c->cached[b], x, vv);
                    }
                }
    }
    const mfa_array aq = test_array_of(&q.t), ak = test_array_of(&k_cache.t),
                    av = test_array_of(&v_cache.t), ao = test_array_of(&o.t),
                    al = test_array_of(&lse.t), at = test_array_of(&table.t),
                    ac = test_array_of(&cache_seqlens.t), akn = test_array_of(&k_new.t),
                    avn = test_array_of(&v_new.t);
    mfa_attention_args args;
    mfa_attention_args_init(&args, sizeof args);
    args.q = &aq, args.k = &ak, args.v = &av, args.out = &ao, args.lse = &al;
    args.block_table = &at, args.cache_seqlens = &ac;
    if (c->new_len > 0) args.k_new = &akn, args.v_new = &avn;
    const mfa_status status = mfa_attention_compute(ctx, MFA_FORWARD, &params, &args);
    CHECK(status == MFA_OK, "%s: paged forward: %s", c->name, mfa_last_error());
    for (int b = 0; status == MFA_OK && b < B; ++b) {
        const mfa_tensor qb = batch_of(&q.t, b), ob = batch_of(&o.t, b), lb = batch_of(&lse.t, b);
        const mfa_tensor kb = rows_of(&keys.t, 0, lengths[b]),
                         vb = rows_of(&values.t, 0, lengths[b]);
        const mfa_tensor kbb = batch_of(&kb, b), vbb = batch_of(&vb, b);
        const ref_problem p = ref_problem_of(&qb, &kbb, &vbb, &params);
        ref_result want = ref_forward(&p, &qb, &kbb, &vbb);
        check(c->name, "out", &ob, c->dtype, want.out, want.out_mag, lengths[b] + 32,
              want.max_score);
        check(c->name, "lse", &lb, MFA_DTYPE_F32, want.lse, want.lse_mag, lengths[b] + 32,
              want.max_score);
        ref_free(&want);
        /* The appended keys are in the cache rows their positions map to, bit for bit. */
        for (int64_t h = 0; h < c->hkv; ++h)
            for (int64_t n = 0; n < c->new_len; ++n) {
                const int64_t j = c->cached[b] + n;
                const int64_t blk = table_entries[b * max_blocks + j / c->block_size];
                for (int64_t x = 0; x < c->d; ++x) {
                    const double got = test_get(&k_cache.t, blk, h, j % c->block_size, x);
                    const double got_v = test_get(&v_cache.t, blk, h, j % c->block_size, x);
                    CHECK(got == test_get(&k_new.t, b, h, n, x) &&
                              got_v == test_get(&v_new.t, b, h, n, x),
                          "%s: sequence %d: appended key %lld is not in the cache", c->name, b,
                          (long long)j);
                }
            }
    }
    test_tensor* all[] = {&q,     &keys,  &values,        &k_cache, &v_cache, &k_new,
                          &v_new, &table, &cache_seqlens, &o,       &lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_tensor_free(all[i]);
    mfa_context_destroy(ctx);
}

int main(int argc, char** argv) {
    const mfa_gpu_family A7 = MFA_GPU_FAMILY_APPLE7, A8 = MFA_GPU_FAMILY_APPLE8,
                         A9 = MFA_GPU_FAMILY_APPLE9;
    const mfa_dtype F32 = MFA_DTYPE_F32, F16 = MFA_DTYPE_F16, BF16 = MFA_DTYPE_BF16;
    test_rng_state = 0x13198A2E03707344ull;
    /* name, family, dtype, b, hq, hkv, nq, nk, d, dv, causal, sinks, first_keys */
    const dense_case dense[] = {
        /* Decoding against long caches: split keys, GQA heads packed, sinks in the combine. */
        {"decode_split_sinks_f32", A9, F32, 2, 8, 2, 1, 1000, 64, 64, 1, 1, 0},
        {"decode_split_bf16", A7, BF16, 1, 4, 1, 3, 777, 40, 48, 1, 0, 0},
        {"decode_split_wide_dv_f16", A8, F16, 1, 2, 2, 1, 600, 32, 200, 1, 1, 0},
        /* Initial states: split halves, and rows shared by two output blocks (Dv = 200). */
        {"initial_state_split_f32", A9, F32, 1, 4, 2, 1, 1200, 64, 64, 0, 1, 500},
        {"initial_state_wide_dv_bf16", A7, BF16, 1, 2, 2, 40, 70, 32, 200, 0, 1, 30},
        {"initial_state_plain_f16", A8, F16, 2, 2, 1, 17, 45, 16, 16, 0, 0, 20},
    };
    /* name, family, dtype, hq, hkv, nq, d, block_size, new_len, cached */
    const paged_case paged[] = {
        {"paged_decode_split_append_f16", A9, F16, 4, 2, 1, 64, 16, 1, {700, 333}},
        {"paged_chunk_bf16", A7, BF16, 2, 1, 5, 32, 24, 3, {100, 0}},
        {"paged_empty_append_f32", A8, F32, 2, 2, 2, 16, 8, 2, {0, 41}},
    };
    const char* filter = argc > 1 ? argv[1] : NULL;
    for (size_t i = 0; i < sizeof dense / sizeof dense[0]; ++i) {
        if (!test_case_selected(filter, dense[i].name)) continue;
        const int before = test_failures;
        run_dense(&dense[i]);
        test_case_report(dense[i].name, before);
    }
    for (size_t i = 0; i < sizeof paged / sizeof paged[0]; ++i) {
        if (!test_case_selected(filter, paged[i].name)) continue;
        const int before = test_failures;
        run_paged(&paged[i]);
        test_case_report(paged[i].name, before);
    }
    return test_finish("metal-sim kv cache");
}
