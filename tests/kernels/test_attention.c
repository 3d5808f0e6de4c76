/*
 * The attention kernels on metal-sim, through the public C API, against the float64 reference
 * of test_reference.h. Cases are chosen to reach every kernel path rather than to be
 * large: sequence lengths that are not multiples of any block, D % 8 != 0, head dimensions that
 * force the uncached slab and split output columns, causal masks in both alignments (including
 * rows that see no key), sliding windows, GQA and MQA (including decode shapes, where the
 * forward packs a group's query heads into one threadgroup), Dv != D, strided and reversed
 * views, f32/f16/bf16, and every simulated family's tables.
 *
 * Tolerance model: the kernels compute in f32 from the dtype-rounded inputs (which the
 * reference also uses), so the error is f32 accumulation (~1e-5 relative for these sizes)
 * plus one rounding of each output to its dtype (half an ulp: 2^-11 f16, 2^-8 bf16, relative).
 * Each element must satisfy |got - ref| <= rtol * |ref| + atol * max|ref| with
 *   f32  rtol 1e-4   atol 2e-5
 *   f16  rtol 2^-10  atol 2e-4
 *   bf16 rtol 2^-7   atol 2e-3
 * i.e. about two output ulps plus a small absolute floor for elements that cancel. The floor
 * scales with max(max|ref|, 1): inputs are uniform in [-1, 1], so every term entering a result
 * is O(1) even when the result itself cancels to (near) zero, as dQ and dK do when a row sees a
 * single key.
 */
#include "test_reference.h"

/* ---- the case ---- */

typedef struct attention_case {
    const char* name;
    mfa_gpu_family family;
    mfa_dtype dtype;
    int64_t b, hq, hkv, nq, nk, d, dv;
    int causal;
    mfa_alignment alignment;
    int64_t window_left, window_right;
    float scale; /* 0: default */
    test_layout q_layout, kv_layout;
    int with_lse;
    int backward;
    uint64_t schedule_seed;
} attention_case;

/* Compares one tensor against a reference array in (b, h, s, d) order. */
static void compare(const char* case_name, const char* what, const test_tensor* got,
                    const double* ref, mfa_dtype out_dtype) {
    const double rtol = out_dtype == MFA_DTYPE_F32   ? 1e-4
                        : out_dtype == MFA_DTYPE_F16 ? 0x1p-10
                                                     : 0x1p-7;
    const double atol = out_dtype == MFA_DTYPE_F32   ? 2e-5
                        : out_dtype == MFA_DTYPE_F16 ? 2e-4
                                                     : 2e-3;
    const mfa_tensor* t = &got->t;
    const int64_t n = test_element_count(t);
    const double ref_max = fmax(1, ref_max_abs(ref, n));
    int64_t bad = 0, idx = 0;
    double worst = 0;
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d, ++idx) {
                    const double g = test_get(t, b, h, s, d), r = ref[idx];
                    int ok;
                    if (isinf(r))
                        ok = g == r;
                    else
                        ok = isfinite(g) && fabs(g - r) <= rtol * fabs(r) + atol * ref_max;
                    if (!ok) {
                        if (bad < 3)
                            fprintf(stderr, "  %s %s[%lld,%lld,%lld,%lld] = %.8g, expected %.8g\n",
                                    case_name, what, (long long)b, (long long)h, (long long)s,
                                    (long long)d, g, r);
                        ++bad;
                    }
                    if (isfinite(r) && fabs(g - r) > worst) worst = fabs(g - r);
                }
    CHECK(bad == 0,
          "%s: %s: %lld of %lld elements outside tolerance (max |err| %.3g, max |ref| %.3g)",
          case_name, what, (long long)bad, (long long)n, worst, ref_max);
}

/* A call's tensors (lse may be NULL: the call had none), then its context. */
static void free_call(mfa_context* ctx, test_tensor* q, test_tensor* k, test_tensor* v,
                      test_tensor* o, test_tensor* lse) {
    test_tensor* const all[5] = {q, k, v, o, lse};
    for (int i = 0; i < 5; ++i)
        if (all[i]) test_tensor_free(all[i]);
    mfa_context_destroy(ctx);
}

static void run_case(const attention_case* c) {
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.gpu_family = c->family;
    options.sim_schedule_seed = c->schedule_seed;
    mfa_context* ctx = test_context(MFA_BACKEND_METAL_SIM, &options, c->name);
    if (!ctx) return;

    const mfa_attention_params params =
        test_params(c->causal, c->alignment, c->window_left, c->window_right, c->scale);

    test_tensor q = test_tensor_make(c->dtype, c->b, c->hq, c->nq, c->d, c->q_layout);
    test_tensor k = test_tensor_make(c->dtype, c->b, c->hkv, c->nk, c->d, c->kv_layout);
    test_tensor v = test_tensor_make(c->dtype, c->b, c->hkv, c->nk, c->dv, c->kv_layout);
    test_tensor o = test_tensor_make(c->dtype, c->b, c->hq, c->nq, c->dv, c->q_layout);
    test_tensor lse = test_tensor_make(MFA_DTYPE_F32, c->b, c->hq, c->nq, 1, TEST_BHSD);
    test_fill_random(&q);
    test_fill_random(&k);
    test_fill_random(&v);
    test_fill_nan(&o);
    test_fill_nan(&lse);
    const int need_lse = c->with_lse || c->backward;
    mfa_status status =
        mfa_attention_forward(ctx, &params, &q.t, &k.t, &v.t, &o.t, need_lse ? &lse.t : NULL);
    CHECK(status == MFA_OK, "%s: forward: %s", c->name, mfa_last_error());

    /* float64 reference from the rounded inputs */
    const ref_problem p = ref_problem_of(&q.t, &k.t, &v.t, &params);
    ref_result fwd = ref_forward(&p, &q.t, &k.t, &v.t);
    if (status == MFA_OK) {
        compare(c->name, "out", &o, fwd.out, c->dtype);
        if (need_lse) compare(c->name, "lse", &lse, fwd.lse, MFA_DTYPE_F32);
    }

    if (c->backward && status == MFA_OK) {
        test_tensor dout = test_tensor_make(c->dtype, c->b, c->hq, c->nq, c->dv, c->q_layout);
        test_fill_random(&dout);
        test_gradients g = test_gradients_make(c->dtype, c->b, c->hq, c->hkv, c->nq, c->nk, c->d,
                                               c->dv, c->q_layout, c->kv_layout);
        status = mfa_attention_backward(ctx, &params, &q.t, &k.t, &v.t, &o.t, &dout.t, &lse.t,
                                        &g.dq.t, &g.dk.t, &g.dv.t);
        CHECK(status == MFA_OK, "%s: backward: %s", c->name, mfa_last_error());
        /* Reference gradients; D uses the out tensor as given, as the API defines, and P the
         * reference's own lse. */
        ref_result grad = ref_backward(&p, &q.t, &k.t, &v.t, &o.t, &dout.t, NULL, &fwd);
        if (status == MFA_OK) {
            compare(c->name, "dq", &g.dq, grad.dq, c->dtype);
            compare(c->name, "dk", &g.dk, grad.dk, c->dtype);
            compare(c->name, "dv", &g.dv, grad.dv, c->dtype);
        }
        ref_free(&grad);
        test_tensor_free(&dout);
        test_gradients_free(&g);
    }
    ref_free(&fwd);
    free_call(ctx, &q, &k, &v, &o, &lse);
}

/* One query on one head against n keys: q [1, d], k [n, d], v [n, dv], o [1, dv], of dtype. */
static void make_single_query(mfa_dtype dtype, int64_t n, int64_t d, int64_t dv, test_tensor* q,
                              test_tensor* k, test_tensor* v, test_tensor* o) {
    *q = test_tensor_make(dtype, 1, 1, 1, d, TEST_BHSD);
    *k = test_tensor_make(dtype, 1, 1, n, d, TEST_BHSD);
    *v = test_tensor_make(dtype, 1, 1, n, dv, TEST_BHSD);
    *o = test_tensor_make(dtype, 1, 1, 1, dv, TEST_BHSD);
}

/* bf16 stores must round to nearest even. With q = 0 both keys get probability exactly 1/2,
 * so out = (v0 + v1) / 2 is exact in f32 and, for these v, lies exactly halfway between two
 * bf16 values: ties that truncation, round-half-up and round-to-nearest-even all resolve
 * differently. Checked bit for bit. */
static void test_bf16_ties(void) {
    /* pairs (v0, v1) as bf16 bit patterns; 0x3f80 = 1.0, one bf16 ulp at 1.0 is 2^-7 */
    static const uint16_t v0[4] = {0x3f80, 0x3f81, 0xbf81, 0x3f80};
    static const uint16_t v1[4] = {0x3f81, 0x3f82, 0xbf82, 0x3f84};
    mfa_context* ctx = test_context(MFA_BACKEND_METAL_SIM, NULL, "bf16 ties");
    if (!ctx) return;
    test_tensor q, k, v, o;
    make_single_query(MFA_DTYPE_BF16, 2, 1, 4, &q, &k, &v, &o);
    ((uint16_t*)q.t.data)[0] = 0;
    ((uint16_t*)k.t.data)[0] = test_f32_to_bf16(0.5f);
    ((uint16_t*)k.t.data)[1] = test_f32_to_bf16(-0.25f);
    for (int d = 0; d < 4; ++d) {
        ((uint16_t*)v.t.data)[d] = v0[d];
        ((uint16_t*)v.t.data)[4 + d] = v1[d];
    }
    mfa_status status = mfa_attention_forward(ctx, NULL, &q.t, &k.t, &v.t, &o.t, NULL);
    CHECK(status == MFA_OK, "bf16 ties: forward: %s", mfa_last_error());
    for (int d = 0; d < 4 && status == MFA_OK; ++d) {
        /* exact in f32: two bf16 values and their halved sum */
        const float mean = (test_bf16_to_f32(v0[d]) + test_bf16_to_f32(v1[d])) / 2;
        const uint16_t expected = test_f32_to_bf16(mean), got = ((uint16_t*)o.t.data)[d];
        CHECK(got == expected, "bf16 ties: out[%d] = 0x%04x, expected 0x%04x (mean %.9g)", d, got,
              expected, mean);
    }
    free_call(ctx, &q, &k, &v, &o, NULL);
}

/* A row whose scores are all finite but far below any "nothing seen yet" floor still sees its
 * keys: scores -1e30, -3e30, -2e30 (q = 1, k as given, scale 1) give out = v[0] and
 * lse = -1e30 exactly (the other terms are exp(-1e30) = 0). */
static void test_very_negative_scores(void) {
    mfa_context* ctx = test_context(MFA_BACKEND_METAL_SIM, NULL, "very negative scores");
    if (!ctx) return;
    test_tensor q, k, v, o;
    make_single_query(MFA_DTYPE_F32, 3, 1, 2, &q, &k, &v, &o);
    test_tensor lse = test_tensor_make(MFA_DTYPE_F32, 1, 1, 1, 1, TEST_BHSD);
    static const float keys[3] = {-1e30f, -3e30f, -2e30f};
    static const float values[6] = {0.25f, -0.5f, 7.0f, 8.0f, 9.0f, 10.0f};
    ((float*)q.t.data)[0] = 1.0f;
    memcpy(k.t.data, keys, sizeof keys);
    memcpy(v.t.data, values, sizeof values);
    mfa_attention_params params;
    mfa_attention_params_init(&params);
    params.scale = 1.0f;
    mfa_status status = mfa_attention_forward(ctx, &params, &q.t, &k.t, &v.t, &o.t, &lse.t);
    CHECK(status == MFA_OK, "very negative scores: forward: %s", mfa_last_error());
    if (status == MFA_OK) {
        const float* out = o.t.data;
        const float l = *(const float*)lse.t.data;
        CHECK(out[0] == values[0] && out[1] == values[1], "out = (%g, %g), expected (%g, %g)",
              out[0], out[1], values[0], values[1]);
        CHECK(fabs(l - -1e30) <= 1e-6 * 1e30, "lse = %g, expected -1e30", l);
    }
    free_call(ctx, &q, &k, &v, &o, &lse);
}

int main(int argc, char** argv) {
    const mfa_gpu_family A7 = MFA_GPU_FAMILY_APPLE7, A8 = MFA_GPU_FAMILY_APPLE8,
                         A9 = MFA_GPU_FAMILY_APPLE9;
    const mfa_dtype F32 = MFA_DTYPE_F32, F16 = MFA_DTYPE_F16, BF16 = MFA_DTYPE_BF16;
    const mfa_alignment BR = MFA_ALIGN_BOTTOM_RIGHT, TL = MFA_ALIGN_TOP_LEFT;
    const test_layout BHSD = TEST_BHSD, BSHD = TEST_BSHD, REVERSED = TEST_REVERSED;
    /* The inputs this suite has always drawn: its own seed for the shared generator. */
    test_rng_state = 0x243F6A8885A308D3ull;
    /* One case a line, under the names of its columns. */
    /* clang-format off */
    /* name, family, dtype, b, hq, hkv, nq, nk, d, dv, causal, align, wl, wr, scale,
       q layout, kv layout, lse, backward, seed */
    const attention_case cases[] = {
        {"plain_f32", A9, F32, 1, 2, 2, 37, 45, 40, 40, 0, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"gqa_dv_f32", A7, F32, 2, 4, 2, 19, 33, 24, 16, 0, BR, -1, -1, 0.3f, BHSD, BHSD, 1, 1, 7},
        {"causal_br_f16", A9, F16, 1, 2, 1, 20, 50, 64, 64, 1, BR, -1, -1, 0, BSHD, BSHD, 1, 1, 0},
        {"causal_br_empty_rows_bf16", A8, BF16, 1, 1, 1, 50, 20, 32, 32, 1, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"causal_tl_bf16", A9, BF16, 1, 3, 1, 41, 23, 16, 24, 1, TL, -1, -1, 0, BHSD, BSHD, 1, 1, 3},
        {"window_d9_f32", A9, F32, 1, 1, 1, 70, 70, 9, 9, 0, BR, 5, 3, 0, BHSD, BHSD, 1, 1, 0},
        {"window_diag_only_f16", A7, F16, 1, 2, 2, 33, 33, 8, 8, 0, TL, 0, 0, 0, BHSD, BHSD, 1, 1, 0},
        {"window_causal_mqa_f32", A7, F32, 1, 4, 1, 64, 80, 72, 72, 1, BR, 17, -1, 0, REVERSED, BHSD, 1, 1, 11},
        {"no_lse_f16", A9, F16, 2, 1, 1, 9, 130, 33, 65, 0, BR, -1, -1, 0, BHSD, BHSD, 0, 0, 0},
        {"wide_d300_f32", A9, F32, 1, 1, 1, 20, 21, 300, 300, 0, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"wide_d260_dv136_bf16", A7, BF16, 1, 2, 1, 17, 12, 260, 136, 1, TL, -1, -1, 0, BSHD, BHSD, 1, 1, 0},
        {"decode_gqa_f16", A9, F16, 2, 8, 2, 1, 77, 64, 64, 1, BR, -1, -1, 0, BSHD, BSHD, 1, 1, 13},
        {"packed_window_split_bf16", A7, BF16, 1, 6, 1, 5, 40, 40, 200, 0, TL, 3, 0, 0, BHSD, BSHD, 1, 1, 0},
        {"packed_empty_rows_f32", A9, F32, 1, 4, 2, 9, 3, 16, 16, 1, BR, -1, -1, 0, REVERSED, BHSD, 1, 1, 0},
        {"tiny_d1_dv3_f16", A9, F16, 1, 1, 1, 1, 1, 1, 3, 0, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"d2_causal_f32", A8, F32, 3, 2, 2, 5, 3, 2, 2, 1, BR, -1, -1, 2.5f, BSHD, BSHD, 1, 1, 9},
        {"d512_f16", A9, F16, 1, 1, 1, 9, 10, 512, 512, 0, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"d1024_dv1000_bf16", A7, BF16, 1, 2, 1, 7, 11, 1024, 1000, 1, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 5},
    };
    /* clang-format on */
    const size_t count = sizeof cases / sizeof cases[0];
    const char* filter = argc > 1 ? argv[1] : NULL;
    for (size_t i = 0; i < count; ++i) {
        if (!test_case_selected(filter, cases[i].name)) continue;
        const int before = test_failures;
        run_case(&cases[i]);
        test_case_report(cases[i].name, before);
    }
    if (!filter) {
        const int before = test_failures;
        test_bf16_ties();
        test_case_report("bf16_store_ties", before);
        const int before2 = test_failures;
        test_very_negative_scores();
        test_case_report("very_negative_scores", before2);
    }
    return test_finish("metal-sim attention");
}
