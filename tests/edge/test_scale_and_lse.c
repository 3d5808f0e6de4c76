/* The scale, the log-sum-exp the backward is given, and large logits, on every available
 * backend; docs/bad-inputs.md ("Numerics at the edges") states the behaviour checked here. One
 * ctest per section (the first argument):
 *
 *   scale         a scale or operands that overflow f32 when multiplied together, where the
 *                 logits themselves fit: q = 4e37..8e37 with scale 10 (q * scale overflows,
 *                 logits 12..48), and scale = 3e38 with q ~ 1e-30 (scale * log2(e) overflows,
 *                 logits ~1e9). Results must be finite and match the float64 reference: out,
 *                 lse, dk and dv in the first case (dq is subnormal there, which a GPU may
 *                 flush); out (one-hot), lse and dv in the second, where dq and dk must be finite
 *                 (the backward of logits that large is not accurate, see large_logits);
 *   lse           a backward given lse = -inf for rows that do see keys: such a row is a row
 *                 that saw no key, so dq = 0 there, exactly, and it adds nothing to dk and dv;
 *                 every other row as the reference says;
 *   large_logits  the backward recomputes P from f32 scores and lse, so it is accurate only
 *                 while the logits' f32 rounding is far below 1: with logits up to a few
 *                 thousand it matches the reference; with logits of about 1e8 it still returns
 *                 MFA_OK and writes every element, whatever values they get (what the
 *                 documentation promises there, and no more).
 *
 * Inputs are built in each case's dtype and the reference reads them back. */
#include <float.h>

#include "test_reference.h"

static const char* backend_label;

static void scale_view(const mfa_tensor* t, double offset, double width, double factor) {
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d) {
                    /* uniform in [offset, offset + width) * factor */
                    const double u = (test_uniform() + 1) / 2;
                    test_set(t, b, h, s, d, (float)((offset + width * u) * factor));
                }
}

static int all_finite(const mfa_tensor* t) {
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d)
                    if (!isfinite(test_get(t, b, h, s, d))) return 0;
    return 1;
}

static void expect_match(const char* label, const char* what, const test_tensor* got,
                         mfa_dtype dtype, const double* want, const double* magnitude, int64_t n,
                         double max_score) {
    char why[256];
    CHECK(ref_compare(&got->t, dtype, want, magnitude, n, max_score, why, sizeof why), "%s: %s: %s",
          label, what, why);
}

/* out and lse into a's outputs, with the library's forward; 0 on failure (reported). */
static int forward(mfa_context* ctx, const char* label, test_attention* a,
                   const mfa_attention_params* params) {
    test_fill_nan(&a->out);
    test_fill_nan(&a->lse);
    const mfa_status s =
        mfa_attention_forward(ctx, params, &a->q.t, &a->k.t, &a->v.t, &a->out.t, &a->lse.t);
    CHECK(s == MFA_OK, "%s: forward: %s", label, mfa_last_error());
    return s == MFA_OK;
}

static int backward(mfa_context* ctx, const char* label, test_attention* a,
                    const mfa_attention_params* params) {
    test_fill_nan(&a->dq);
    test_fill_nan(&a->dk);
    test_fill_nan(&a->dv);
    const mfa_status s =
        mfa_attention_backward(ctx, params, &a->q.t, &a->k.t, &a->v.t, &a->out.t, &a->dout.t,
                               &a->lse.t, &a->dq.t, &a->dk.t, &a->dv.t);
    CHECK(s == MFA_OK, "%s: backward: %s", label, mfa_last_error());
    return s == MFA_OK;
}

/* ---- scale ---------------------------------------------------------------------------------- */

/* q * scale overflows f32 (q >= 4e37, scale 10) while every logit is 12 to 48: the kernels must
 * take the dot product first. k stays above FLT_MIN, so no operand is subnormal. */
static void test_operand_times_scale_overflows(mfa_context* ctx, mfa_dtype dtype) {
    char label[128];
    snprintf(label, sizeof label, "%s / q * scale overflows / %s", backend_label,
             mfa_dtype_name(dtype));
    test_attention a = test_attention_make(dtype, 1, 2, 1, 6, 9, 2, 4, TEST_BHSD);
    scale_view(&a.q.t, 1, 1, 4e37);
    scale_view(&a.k.t, 1, 1, 1.5e-38);
    scale_view(&a.dout.t, -1, 2, 1e-3); /* keeps dk = scale * dS^T q below FLT_MAX */
    const mfa_attention_params params = test_params(0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1, 10.0f);
    const ref_problem p = ref_problem_of(&a.q.t, &a.k.t, &a.v.t, &params);
    if (forward(ctx, label, &a, &params)) {
        ref_result f = ref_forward(&p, &a.q.t, &a.k.t, &a.v.t);
        expect_match(label, "out", &a.out, dtype, f.out, f.out_mag, 11, f.max_score);
        expect_match(label, "lse", &a.lse, MFA_DTYPE_F32, f.lse, f.lse_mag, 11, f.max_score);
        ref_free(&f);
        if (backward(ctx, label, &a, &params)) {
            ref_result g =
                ref_backward(&p, &a.q.t, &a.k.t, &a.v.t, &a.out.t, &a.dout.t, &a.lse.t, NULL);
            expect_match(label, "dk", &a.dk, dtype, g.dk, g.dk_mag, 21, g.max_score);
            expect_match(label, "dv", &a.dv, dtype, g.dv, g.dv_mag, 21, g.max_score);
            CHECK(all_finite(&a.dq.t), "%s: dq is not finite", label);
            ref_free(&g);
        }
    }
    test_attention_free(&a);
}

/* scale = 3e38: scale * log2(e) overflows f32, the logits (3e38 * q.k, q ~ 1e-30) are ~1e9.
 * Logits that far apart make every row's softmax one-hot, so out is the value row of the
 * largest logit, lse that logit, and dv the sum of the dout rows whose largest logit it is:
 * all exact to the storage dtype, checked directly (the reference's error bound grows with
 * the logits and would accept anything here). */
static void test_scale_times_log2e_overflows(mfa_context* ctx, mfa_dtype dtype) {
    char label[128];
    snprintf(label, sizeof label, "%s / scale * log2(e) overflows / %s", backend_label,
             mfa_dtype_name(dtype));
    enum { HQ = 2, NQ = 5, NK = 7, D = 4 };
    test_attention a = test_attention_make(dtype, 1, HQ, 1, NQ, NK, D, D, TEST_BHSD);
    scale_view(&a.q.t, 0.5, 1, 1e-30);
    const mfa_attention_params params = test_params(0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1, 3e38f);
    const ref_problem p = ref_problem_of(&a.q.t, &a.k.t, &a.v.t, &params);
    if (!forward(ctx, label, &a, &params)) {
        test_attention_free(&a);
        return;
    }
    const int backward_ok = backward(ctx, label, &a, &params);
    double dv_want[NK][D] = {{0}};
    double* s = ref_zeros(NK);
    for (int64_t h = 0; h < HQ; ++h)
        for (int64_t i = 0; i < NQ; ++i) {
            double max_score = 0;
            const double m = ref_scores(&p, &a.q.t, &a.k.t, 0, h, i, s, &max_score);
            int64_t best = 0;
            for (int64_t j = 1; j < NK; ++j)
                if (s[j] > s[best]) best = j;
            for (int64_t j = 0; j < NK; ++j)
                CHECK(j == best || s[best] - s[j] > 1e3 * fabs(s[best]) * ldexp(1.0, -24),
                      "%s: row (%lld, %lld): logits %lld and %lld are too close for a one-hot "
                      "softmax; change the inputs",
                      label, (long long)h, (long long)i, (long long)best, (long long)j);
            const double lse = test_get(&a.lse.t, 0, h, i, 0);
            CHECK(fabs(lse - m) <= 4 * ldexp(1.0, -24) * fabs(m),
                  "%s: lse[%lld, %lld] = %.9g, largest logit %.9g", label, (long long)h,
                  (long long)i, lse, m);
            for (int64_t y = 0; y < D; ++y) {
                const double want = test_get(&a.v.t, 0, 0, best, y);
                CHECK(test_get(&a.out.t, 0, h, i, y) == want,
                      "%s: out[%lld, %lld, %lld] = %.9g, value row %lld has %.9g", label,
                      (long long)h, (long long)i, (long long)y, test_get(&a.out.t, 0, h, i, y),
                      (long long)best, want);
                dv_want[best][y] += test_get(&a.dout.t, 0, h, i, y);
            }
        }
    free(s);
    if (backward_ok) {
        for (int64_t j = 0; j < NK; ++j)
            for (int64_t y = 0; y < D; ++y) {
                const double got = test_get(&a.dv.t, 0, 0, j, y), want = dv_want[j][y];
                /* a sum of at most HQ * NQ dout elements, rounded to the dtype */
                const double allowed = 4 * ref_unit_roundoff(dtype) * HQ * NQ + 1e-6;
                CHECK(fabs(got - want) <= allowed, "%s: dv[%lld, %lld] = %.9g, reference %.9g",
                      label, (long long)j, (long long)y, got, want);
            }
        CHECK(all_finite(&a.dq.t), "%s: dq is not finite", label);
        CHECK(all_finite(&a.dk.t), "%s: dk is not finite", label);
    }
    test_attention_free(&a);
}

/* ---- lse = -inf ----------------------------------------------------------------------------- */

/* Every row sees every key; the backward is told that some rows saw none. */
static void test_backward_given_minus_infinite_lse(mfa_context* ctx, mfa_dtype dtype) {
    char label[128];
    snprintf(label, sizeof label, "%s / lse = -inf on rows that see keys / %s", backend_label,
             mfa_dtype_name(dtype));
    enum { HQ = 2, NQ = 7, NK = 9, D = 8, DV = 5 };
    static const struct {
        int64_t h, s;
    } declared_empty[] = {{0, 1}, {0, 4}, {1, 6}};
    test_attention a = test_attention_make(dtype, 1, HQ, 1, NQ, NK, D, DV, TEST_BHSD);
    const mfa_attention_params params = test_params(0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1, 0);
    const ref_problem p = ref_problem_of(&a.q.t, &a.k.t, &a.v.t, &params);
    if (!forward(ctx, label, &a, &params)) {
        test_attention_free(&a);
        return;
    }
    /* What the contract makes of those rows: nothing, as a dout of 0 would. */
    test_tensor dout_live = test_tensor_make(dtype, 1, HQ, NQ, DV, TEST_BHSD);
    memcpy(dout_live.storage, a.dout.storage, a.dout.bytes);
    for (size_t r = 0; r < sizeof declared_empty / sizeof declared_empty[0]; ++r) {
        test_set(&a.lse.t, 0, declared_empty[r].h, declared_empty[r].s, 0, -INFINITY);
        for (int64_t y = 0; y < DV; ++y)
            test_set(&dout_live.t, 0, declared_empty[r].h, declared_empty[r].s, y, 0);
    }
    if (backward(ctx, label, &a, &params)) {
        /* The reference's P = exp(s - lse) for the other rows; the declared rows' lse is
         * replaced by any finite value, their dout being 0. */
        test_tensor lse_live = test_tensor_make(MFA_DTYPE_F32, 1, HQ, NQ, 1, TEST_BHSD);
        memcpy(lse_live.storage, a.lse.storage, a.lse.bytes);
        for (size_t r = 0; r < sizeof declared_empty / sizeof declared_empty[0]; ++r)
            test_set(&lse_live.t, 0, declared_empty[r].h, declared_empty[r].s, 0, 0);
        ref_result g =
            ref_backward(&p, &a.q.t, &a.k.t, &a.v.t, &a.out.t, &dout_live.t, &lse_live.t, NULL);
        const int64_t n = D + DV + NK + NQ * HQ;
        for (size_t r = 0; r < sizeof declared_empty / sizeof declared_empty[0]; ++r)
            for (int64_t x = 0; x < D; ++x) {
                const double got =
                    test_get(&a.dq.t, 0, declared_empty[r].h, declared_empty[r].s, x);
                CHECK(got == 0, "%s: dq[%lld, %lld, %lld] = %.9g in a row whose lse is -inf, not 0",
                      label, (long long)declared_empty[r].h, (long long)declared_empty[r].s,
                      (long long)x, got);
            }
        expect_match(label, "dq", &a.dq, dtype, g.dq, g.dq_mag, n, g.max_score);
        expect_match(label, "dk", &a.dk, dtype, g.dk, g.dk_mag, n, g.max_score);
        expect_match(label, "dv", &a.dv, dtype, g.dv, g.dv_mag, n, g.max_score);
        ref_free(&g);
        test_tensor_free(&lse_live);
    }
    test_tensor_free(&dout_live);
    test_attention_free(&a);
}

/* ---- large logits --------------------------------------------------------------------------- */

static int every_element_written(const test_tensor* x) {
    const unsigned char* bytes = x->storage;
    const size_t element = mfa_dtype_size(x->t.dtype);
    for (size_t i = 0; i < x->bytes; i += element) {
        size_t ones = 0;
        while (ones < element && bytes[i + ones] == 0xff) ++ones;
        if (ones == element) return 0; /* still test_fill_nan's pattern */
    }
    return 1;
}

static void test_large_logit_backward(mfa_context* ctx, double size, int accurate) {
    char label[128];
    snprintf(label, sizeof label, "%s / backward, inputs of size %g", backend_label, size);
    test_attention a = test_attention_make(MFA_DTYPE_F32, 1, 2, 1, 9, 13, 8, 8, TEST_BHSD);
    scale_view(&a.q.t, -1, 2, size);
    scale_view(&a.k.t, -1, 2, size);
    const mfa_attention_params params = test_params(0, MFA_ALIGN_BOTTOM_RIGHT, -1, -1, 1.0f);
    const ref_problem p = ref_problem_of(&a.q.t, &a.k.t, &a.v.t, &params);
    if (forward(ctx, label, &a, &params) && backward(ctx, label, &a, &params)) {
        const test_tensor* grads[] = {&a.dq, &a.dk, &a.dv};
        const char* names[] = {"dq", "dk", "dv"};
        ref_result g =
            ref_backward(&p, &a.q.t, &a.k.t, &a.v.t, &a.out.t, &a.dout.t, &a.lse.t, NULL);
        const double* want[] = {g.dq, g.dk, g.dv};
        const double* magnitude[] = {g.dq_mag, g.dk_mag, g.dv_mag};
        for (int i = 0; i < 3; ++i) {
            CHECK(every_element_written(grads[i]), "%s: %s was not entirely written", label,
                  names[i]);
            if (accurate)
                expect_match(label, names[i], grads[i], MFA_DTYPE_F32, want[i], magnitude[i],
                             8 + 8 + 13 + 9 * 2, g.max_score);
        }
        ref_free(&g);
    }
    test_attention_free(&a);
}

/* ---- driver --------------------------------------------------------------------------------- */

static const char* const sections[] = {"scale", "lse", "large_logits"};

static void run_section(const char* section, mfa_context* ctx, mfa_backend backend) {
    backend_label = mfa_backend_name(backend);
    static const mfa_dtype all[] = {MFA_DTYPE_F32, MFA_DTYPE_F16, MFA_DTYPE_BF16};
    if (strcmp(section, "scale") == 0) {
        /* f16 cannot hold these operands; f32 and bf16 (the same exponent range) can. */
        test_operand_times_scale_overflows(ctx, MFA_DTYPE_F32);
        test_operand_times_scale_overflows(ctx, MFA_DTYPE_BF16);
        test_scale_times_log2e_overflows(ctx, MFA_DTYPE_F32);
        test_scale_times_log2e_overflows(ctx, MFA_DTYPE_BF16);
    } else if (strcmp(section, "lse") == 0) {
        for (int i = 0; i < 3; ++i) test_backward_given_minus_infinite_lse(ctx, all[i]);
    } else {
        /* |q.k| up to 8 * 10^2 and 8 * 30^2 (f32 rounding ~5e-5, ~4e-4): accurate; then up to
         * 8 * 10^8 (rounding ~50): only written. */
        test_large_logit_backward(ctx, 10, 1);
        test_large_logit_backward(ctx, 30, 1);
        test_large_logit_backward(ctx, 1e4, 0);
    }
}

int main(int argc, char** argv) {
    return test_main_sections(argc, argv, "test_scale_and_lse", sections,
                              (int)(sizeof sections / sizeof sections[0]), run_section);
}
