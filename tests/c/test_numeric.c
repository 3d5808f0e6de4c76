/* Forward and backward results of every available backend against the float64 reference of
 * test_reference.h. */
#include "test_reference.h"

/* Outputs are compared with an absolute tolerance relative to the largest reference value:
 * fp32 accumulation over at most a few hundred terms keeps f32 results within ~1e-5 of that
 * scale; f16 and bf16 outputs are rounded once on store (2^-11 and 2^-8 relative) and their
 * inputs are exact in the reference, so a few units of that rounding bound the error. */
static double tolerance(mfa_dtype dtype) {
    switch (dtype) {
        case MFA_DTYPE_F32: return 2e-5;
        case MFA_DTYPE_F16: return 4e-3;
        default: return 3e-2;
    }
}

static void compare(const char* label, const char* what, const test_tensor* got, const double* want,
                    double tol) {
    const mfa_tensor* t = &got->t;
    double max_ref = 0, max_err = 0;
    int64_t n = test_element_count(t);
    for (int64_t i = 0; i < n; ++i)
        if (fabs(want[i]) > max_ref) max_ref = fabs(want[i]);
    int64_t at = 0;
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d, ++at) {
                    double g = test_get(t, b, h, s, d);
                    double e = isfinite(g) ? fabs(g - want[at]) : INFINITY;
                    if (e > max_err) max_err = e;
                }
    CHECK(max_err <= tol * (max_ref > 1 ? max_ref : 1),
          "%s: %s max error %.3g (scale %.3g, tol %.3g)", label, what, max_err, max_ref, tol);
}

static void compare_lse(const char* label, const test_tensor* got, const double* want) {
    const mfa_tensor* t = &got->t;
    int64_t at = 0;
    double max_err = 0;
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s, ++at) {
                double g = test_get(t, b, h, s, 0);
                if (want[at] == -INFINITY) {
                    CHECK(g == -INFINITY, "%s: lse of a fully masked row is %g, not -inf", label,
                          g);
                    continue;
                }
                double e = isfinite(g) ? fabs(g - want[at]) : INFINITY;
                if (e > max_err) max_err = e;
            }
    /* lse is f32 for every dtype; scores of |x| < 1 inputs stay small, so 1e-4 is loose for
     * f32 accumulation and tight enough to catch a base-2 / natural-log mix-up. */
    CHECK(max_err <= 1e-4, "%s: lse max error %.3g", label, max_err);
}

static void run(mfa_context* ctx, const char* backend, const test_problem* c) {
    char label[160];
    snprintf(label, sizeof label, "%s/%s", backend, c->name);
    test_attention t =
        test_attention_make(c->dtype, c->b, c->hq, c->hkv, c->nq, c->nk, c->d, c->dv, c->layout);
    /* NaN-poison the outputs: every element must be written. */
    test_fill_nan(&t.out);
    test_fill_nan(&t.dq);
    test_fill_nan(&t.dk);
    test_fill_nan(&t.dv);

    const mfa_attention_params params =
        test_params(c->causal, c->alignment, c->left, c->right, c->scale);

    mfa_status s = mfa_attention_forward(ctx, &params, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.lse.t);
    CHECK(s == MFA_OK, "%s: forward failed: %s", label, mfa_last_error());
    if (s == MFA_OK) {
        s = mfa_attention_backward(ctx, &params, &t.q.t, &t.k.t, &t.v.t, &t.out.t, &t.dout.t,
                                   &t.lse.t, &t.dq.t, &t.dk.t, &t.dv.t);
        CHECK(s == MFA_OK, "%s: backward failed: %s", label, mfa_last_error());
    }
    if (s == MFA_OK) {
        /* The reference reads only the library's inputs, never its outputs: its gradients are
         * taken around its own out and lse. */
        const ref_problem p = ref_problem_of(&t.q.t, &t.k.t, &t.v.t, &params);
        ref_result f = ref_forward(&p, &t.q.t, &t.k.t, &t.v.t);
        ref_result g = ref_backward(&p, &t.q.t, &t.k.t, &t.v.t, NULL, &t.dout.t, NULL, &f);
        const double tol = tolerance(c->dtype);
        compare(label, "out", &t.out, f.out, tol);
        compare_lse(label, &t.lse, f.lse);
        /* Gradients go through one more rounded product (dS) in low precision. */
        compare(label, "dq", &t.dq, g.dq, 2 * tol);
        compare(label, "dk", &t.dk, g.dk, 2 * tol);
        compare(label, "dv", &t.dv, g.dv, 2 * tol);
        ref_free(&f);
        ref_free(&g);
    }
    test_attention_free(&t);
}

static const test_problem configs[] = {
    {"plain f32", MFA_DTYPE_F32, 1, 2, 2, 17, 17, 16, 16, 0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BHSD, 0},
    {"nq<nk causal bottom-right", MFA_DTYPE_F32, 2, 2, 1, 9, 23, 8, 5, 1, MFA_ALIGN_BOTTOM_RIGHT,
     -1, -1, TEST_BHSD, 0},
    {"nq>nk causal bottom-right (masked rows)", MFA_DTYPE_F32, 1, 3, 3, 21, 6, 12, 12, 1,
     MFA_ALIGN_BOTTOM_RIGHT, -1, -1, TEST_BHSD, 0},
    {"causal top-left", MFA_DTYPE_F32, 1, 2, 2, 13, 30, 7, 9, 1, MFA_ALIGN_TOP_LEFT, -1, -1,
     TEST_BSHD, 0},
    {"window gqa bshd", MFA_DTYPE_F32, 2, 4, 2, 40, 33, 33, 20, 0, MFA_ALIGN_BOTTOM_RIGHT, 5, 2,
     TEST_BSHD, 0},
    {"window masks rows", MFA_DTYPE_F32, 1, 2, 1, 12, 40, 4, 4, 0, MFA_ALIGN_TOP_LEFT, 0, -1,
     TEST_BHSD, 0},
    {"mqa custom scale", MFA_DTYPE_F32, 1, 6, 1, 31, 19, 24, 40, 0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BHSD, 0.3f},
    {"single row and key", MFA_DTYPE_F32, 1, 1, 1, 1, 1, 1, 1, 0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BHSD, 0},
    {"large head dim", MFA_DTYPE_F32, 1, 1, 1, 9, 70, 300, 130, 1, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BHSD, 0},
    {"f16 causal gqa", MFA_DTYPE_F16, 1, 4, 2, 37, 37, 64, 64, 1, MFA_ALIGN_BOTTOM_RIGHT, -1, -1,
     TEST_BSHD, 0},
    {"bf16 window", MFA_DTYPE_BF16, 2, 2, 2, 29, 45, 32, 16, 0, MFA_ALIGN_BOTTOM_RIGHT, 8, 8,
     TEST_BHSD, 0},
};

static void run_all(mfa_backend backend, const mfa_context_options* options, const char* label) {
    mfa_context* ctx = test_context(backend, options, label);
    if (!ctx) return;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; ++i) run(ctx, label, &configs[i]);
    mfa_context_destroy(ctx);
}

int main(void) {
    run_all(MFA_BACKEND_CPU, NULL, "cpu");
    if (mfa_backend_available(MFA_BACKEND_METAL_SIM)) {
        mfa_context_options options;
        mfa_context_options_init(&options);
        options.gpu_family = MFA_GPU_FAMILY_APPLE7;
        run_all(MFA_BACKEND_METAL_SIM, &options, "metal-sim/apple7");
        options.gpu_family = MFA_GPU_FAMILY_APPLE9;
        options.sim_schedule_seed = 12345;
        run_all(MFA_BACKEND_METAL_SIM, &options, "metal-sim/apple9/shuffled");
    } else {
        printf("metal-sim not available in this build: only the cpu backend was checked\n");
    }
    return test_finish("test_numeric");
}
