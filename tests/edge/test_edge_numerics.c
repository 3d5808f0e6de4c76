/* Numerics at the edges, on every available backend; docs/bad-inputs.md ("Numerics at the
 * edges") states the behaviour checked here. One ctest per section (the first argument):
 *
 *   large      scores far beyond the f16 range (f16 storage must not mean f16 scores), forward
 *              and backward; logits close to FLT_MAX, forward (the backward needs lse to be
 *              exact in absolute terms, which an f32 lse of 1e38 is not); logits that overflow
 *              f32 in one row may spoil that row but no other, and the call still succeeds;
 *   masked     rows that see no key: out = 0, lse = -inf, dq = 0, exactly;
 *   nonfinite  a NaN or Inf in one input: every output the reference makes non-finite must be
 *              non-finite (NaN propagates, it is never silently dropped); outputs of other
 *              batches and key/value head groups must still match the reference; outputs in the
 *              same group that do not depend on it may also turn non-finite (a masked
 *              probability is a 0 multiplied into the product, and 0 * NaN is NaN). A NaN query
 *              in a row that sees no key still gives that row out = 0, lse = -inf, dq = 0;
 *   subnormal  subnormal inputs and scale: honoured by the cpu backend; a GPU backend may flush
 *              them to zero (differences up to the dtype's smallest normal number).
 *
 * Every call must return MFA_OK and finish (ctest's timeout catches a hang). Inputs are built
 * in each case's dtype; the reference reads them back, so it sees exactly the stored values. */
#include "test_reference.h"

#include <float.h>

typedef struct shape {
    mfa_dtype dtype;
    int64_t b, hq, hkv, nq, nk, d, dv;
} shape;

typedef struct tensors {
    shape s;
    test_attention a;
    mfa_attention_params params;
} tensors;

static tensors make(shape s) {
    tensors t;
    t.s = s;
    t.a = test_attention_make(s.dtype, s.b, s.hq, s.hkv, s.nq, s.nk, s.d, s.dv, 0);
    mfa_attention_params_init(&t.params);
    return t;
}

static void release(tensors* t) { test_attention_free(&t->a); }

static void scale_all(test_tensor* x, double factor) {
    const mfa_tensor* t = &x->t;
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d)
                    test_set(t, b, h, s, d, (float)(test_get(t, b, h, s, d) * factor));
}

static ref_problem problem_of(const tensors* t) {
    return ref_problem_of(&t->a.q.t, &t->a.k.t, &t->a.v.t, &t->params);
}

/* Where test_non_finite_inputs put its NaN or Inf: the key/value head group it belongs to. The
 * heads of q-shaped outputs (query_heads 1) are query heads, `group` of them a key/value head. */
typedef struct bad_input {
    int query_heads;
    int64_t group, kv_head;
} bad_input;

/* One output against its reference. Finite inputs (bad NULL): within the dtype's tolerance
 * widened by `slack` (subnormal flushing), and exactly where the reference is infinite (the -inf
 * lse of empty rows). A NaN or Inf input: the non-finite rule of the header comment, without
 * slack. */
static void expect(const char* label, const char* what, const test_tensor* got, mfa_dtype dtype,
                   const double* want, const double* magnitude, int64_t n, double max_score,
                   double slack, const bad_input* bad) {
    const mfa_tensor* t = &got->t;
    const double max_want = ref_max_abs(want, test_element_count(t));
    int64_t at = 0, reported = 0;
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d, ++at) {
                    const double g = test_get(t, b, h, s, d), w = want[at];
                    const int same_group =
                        bad && (bad->query_heads ? h / bad->group : h) == bad->kv_head;
                    const double allowed =
                        ref_allowed_error(dtype, max_want, magnitude[at], n, max_score) + slack;
                    const char* wrong = NULL;
                    if (!isfinite(w)) {
                        if (bad ? isfinite(g) : g != w)
                            wrong = bad ? "the non-finite input was dropped"
                                        : "not the reference's infinity";
                    } else if (!(same_group && !isfinite(g)) && !(fabs(g - w) <= allowed)) {
                        wrong = bad && !same_group ? "a head group without the bad input changed"
                                                   : "wrong value";
                    }
                    if (wrong && reported++ == 0)
                        CHECK(0, "%s: %s[%lld, %lld, %lld, %lld] = %.9g, reference %.9g: %s", label,
                              what, (long long)b, (long long)h, (long long)s, (long long)d, g, w,
                              wrong);
                }
}

/* Runs forward, then backward around the library's own out and lse, and checks both against
 * the reference computed from the same stored values. */
static void run(mfa_context* ctx, const char* label, tensors* t, double slack, int forward_only) {
    test_fill_nan(&t->a.out);
    test_fill_nan(&t->a.lse);
    mfa_status s = mfa_attention_forward(ctx, &t->params, &t->a.q.t, &t->a.k.t, &t->a.v.t,
                                         &t->a.out.t, &t->a.lse.t);
    CHECK(s == MFA_OK, "%s: forward: %s", label, mfa_last_error());
    if (s != MFA_OK) return;
    const ref_problem p = problem_of(t);
    ref_result f = ref_forward(&p, &t->a.q.t, &t->a.k.t, &t->a.v.t);
    const int64_t n = p.seq_k + p.head_dim;
    expect(label, "out", &t->a.out, t->s.dtype, f.out, f.out_mag, n, f.max_score, slack, NULL);
    expect(label, "lse", &t->a.lse, MFA_DTYPE_F32, f.lse, f.lse_mag, n, f.max_score, slack, NULL);
    ref_free(&f);
    if (forward_only) return;

    s = mfa_attention_backward(ctx, &t->params, &t->a.q.t, &t->a.k.t, &t->a.v.t, &t->a.out.t,
                               &t->a.dout.t, &t->a.lse.t, &t->a.dq.t, &t->a.dk.t, &t->a.dv.t);
    CHECK(s == MFA_OK, "%s: backward: %s", label, mfa_last_error());
    if (s != MFA_OK) return;
    ref_result g = ref_backward(&p, &t->a.q.t, &t->a.k.t, &t->a.v.t, &t->a.out.t, &t->a.dout.t,
                                &t->a.lse.t, NULL);
    const int64_t m = p.head_dim + p.head_dim_v + p.seq_k + p.seq_q * (p.heads_q / p.heads_kv);
    expect(label, "dq", &t->a.dq, t->s.dtype, g.dq, g.dq_mag, m, g.max_score, slack, NULL);
    expect(label, "dk", &t->a.dk, t->s.dtype, g.dk, g.dk_mag, m, g.max_score, slack, NULL);
    expect(label, "dv", &t->a.dv, t->s.dtype, g.dv, g.dv_mag, m, g.max_score, slack, NULL);
    ref_free(&g);
}

static void label_of(char* label, size_t n, const char* backend, const char* name,
                     mfa_dtype dtype) {
    snprintf(label, n, "%s / %s / %s", backend, name, mfa_dtype_name(dtype));
}

static const mfa_dtype dtypes[] = {MFA_DTYPE_F32, MFA_DTYPE_F16, MFA_DTYPE_BF16};

/* Scores far outside the f16 range: q and k of size ~200 give |q.k| / sqrt(16) up to ~1e5. */
static void test_large_scores(mfa_context* ctx, const char* backend) {
    for (int i = 0; i < 3; ++i) {
        char label[128];
        label_of(label, sizeof label, backend, "scores beyond f16 range", dtypes[i]);
        tensors t = make((shape){dtypes[i], 1, 2, 1, 9, 13, 16, 8});
        scale_all(&t.a.q, 200);
        scale_all(&t.a.k, 200);
        run(ctx, label, &t, 0, 0);
        release(&t);
    }
}

/* Logits of about 1e38, just below FLT_MAX, with scale 1: f32 and bf16 can hold the inputs. */
static void test_logits_near_f32_limit(mfa_context* ctx, const char* backend) {
    for (int i = 0; i < 3; i += 2) {
        char label[128];
        label_of(label, sizeof label, backend, "logits near FLT_MAX", dtypes[i]);
        tensors t = make((shape){dtypes[i], 1, 1, 1, 4, 6, 1, 4});
        scale_all(&t.a.q, 1e19);
        scale_all(&t.a.k, 1e19);
        t.params.scale = 1.0f;
        run(ctx, label, &t, 0, 1);
        release(&t);
    }
}

/* Logits that overflow f32 in one row only (head 0, row 2): the call succeeds and every other
 * row is exactly as the reference says. What the overflowing row holds is not specified. */
static void test_overflowing_logits_stay_in_their_row(mfa_context* ctx, const char* backend) {
    char label[128];
    label_of(label, sizeof label, backend, "logits overflowing f32", MFA_DTYPE_F32);
    tensors t = make((shape){MFA_DTYPE_F32, 1, 2, 1, 5, 7, 4, 4});
    t.params.scale = 1.0f;
    for (int64_t d = 0; d < 4; ++d) test_set(&t.a.q.t, 0, 0, 2, d, 3e38f);
    CHECK(mfa_attention_forward(ctx, &t.params, &t.a.q.t, &t.a.k.t, &t.a.v.t, &t.a.out.t,
                                &t.a.lse.t) == MFA_OK,
          "%s: %s", label, mfa_last_error());
    const ref_problem p = problem_of(&t);
    ref_result f = ref_forward(&p, &t.a.q.t, &t.a.k.t, &t.a.v.t);
    for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 5; ++i) {
            if (h == 0 && i == 2) continue;
            const int64_t row = h * 5 + i;
            for (int64_t y = 0; y < 4; ++y) {
                const double g = test_get(&t.a.out.t, 0, h, i, y), w = f.out[row * 4 + y];
                CHECK(fabs(g - w) <=
                          ref_allowed_error(MFA_DTYPE_F32, 1, f.out_mag[row * 4 + y], 11, 0),
                      "%s: row (%lld, %lld) was disturbed: %g, reference %g", label, (long long)h,
                      (long long)i, g, w);
            }
        }
    ref_free(&f);
    release(&t);
}

/* Rows that see no key: Nq > Nk under bottom-right causal masking leaves the first Nq - Nk
 * rows empty; so does a zero-wide top-left window for rows past the last key. */
static void expect_empty_rows(const char* label, const tensors* t, int64_t first, int64_t end) {
    for (int64_t h = 0; h < t->s.hq; ++h)
        for (int64_t r = first; r < end; ++r) {
            CHECK(test_get(&t->a.lse.t, 0, h, r, 0) == -INFINITY,
                  "%s: lse of empty row (%lld, %lld) is "
                  "not -inf",
                  label, (long long)h, (long long)r);
            for (int64_t d = 0; d < t->s.dv; ++d)
                CHECK(test_get(&t->a.out.t, 0, h, r, d) == 0,
                      "%s: out of empty row (%lld, %lld) is not 0", label, (long long)h,
                      (long long)r);
            for (int64_t d = 0; d < t->s.d; ++d)
                CHECK(test_get(&t->a.dq.t, 0, h, r, d) == 0,
                      "%s: dq of empty row (%lld, %lld) is not 0", label, (long long)h,
                      (long long)r);
        }
}

static void test_fully_masked_rows(mfa_context* ctx, const char* backend) {
    for (int i = 0; i < 3; ++i) {
        char label[128];
        label_of(label, sizeof label, backend, "causal rows before the first key", dtypes[i]);
        tensors t = make((shape){dtypes[i], 1, 2, 2, 11, 4, 8, 8});
        t.params.causal = 1;
        run(ctx, label, &t, 0, 0);
        expect_empty_rows(label, &t, 0, 11 - 4);
        release(&t);
    }
    char label[128];
    label_of(label, sizeof label, backend, "zero-wide window past the keys", MFA_DTYPE_F32);
    tensors t = make((shape){MFA_DTYPE_F32, 1, 1, 1, 8, 3, 4, 4});
    t.params.alignment = MFA_ALIGN_TOP_LEFT;
    t.params.window_left = 0;
    t.params.window_right = 0;
    run(ctx, label, &t, 0, 0);
    expect_empty_rows(label, &t, 3, 8);
    release(&t);
}

static void test_non_finite_inputs(mfa_context* ctx, const char* backend) {
    static const struct {
        const char* name;
        int tensor; /* 0 q, 1 k, 2 v, 3 dout */
        int64_t h, s, d;
        float value;
    } cases[] = {
        {"NaN in q", 0, 3, 3, 2, NAN},    {"+Inf in q", 0, 0, 4, 0, INFINITY},
        {"NaN in k", 1, 0, 5, 1, NAN},    {"-Inf in k", 1, 1, 2, 3, -INFINITY},
        {"NaN in v", 2, 0, 6, 0, NAN},    {"+Inf in v", 2, 1, 1, 2, INFINITY},
        {"NaN in dout", 3, 1, 5, 1, NAN},
    };
    const int64_t group = 2;
    for (int i = 0; i < 3; ++i)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
            char label[128];
            label_of(label, sizeof label, backend, cases[c].name, dtypes[i]);
            tensors t = make((shape){dtypes[i], 1, 4, 2, 8, 8, 4, 4});
            t.params.causal = 1;
            test_tensor* target[] = {&t.a.q, &t.a.k, &t.a.v, &t.a.dout};
            test_set(&target[cases[c].tensor]->t, 0, cases[c].h, cases[c].s, cases[c].d,
                     cases[c].value);
            const int64_t kv_head =
                cases[c].tensor == 1 || cases[c].tensor == 2 ? cases[c].h : cases[c].h / group;
            mfa_status s = mfa_attention_forward(ctx, &t.params, &t.a.q.t, &t.a.k.t, &t.a.v.t,
                                                 &t.a.out.t, &t.a.lse.t);
            CHECK(s == MFA_OK, "%s: forward: %s", label, mfa_last_error());
            if (s != MFA_OK) {
                release(&t);
                continue;
            }
            const ref_problem p = problem_of(&t);
            ref_result f = ref_forward(&p, &t.a.q.t, &t.a.k.t, &t.a.v.t);
            const bad_input in_q_heads = {1, group, kv_head}, in_kv_heads = {0, group, kv_head};
            expect(label, "out", &t.a.out, dtypes[i], f.out, f.out_mag, 12, f.max_score, 0,
                   &in_q_heads);
            expect(label, "lse", &t.a.lse, MFA_DTYPE_F32, f.lse, f.lse_mag, 12, f.max_score, 0,
                   &in_q_heads);
            ref_free(&f);
            s = mfa_attention_backward(ctx, &t.params, &t.a.q.t, &t.a.k.t, &t.a.v.t, &t.a.out.t,
                                       &t.a.dout.t, &t.a.lse.t, &t.a.dq.t, &t.a.dk.t, &t.a.dv.t);
            CHECK(s == MFA_OK, "%s: backward: %s", label, mfa_last_error());
            if (s == MFA_OK) {
                ref_result g = ref_backward(&p, &t.a.q.t, &t.a.k.t, &t.a.v.t, &t.a.out.t,
                                            &t.a.dout.t, &t.a.lse.t, NULL);
                expect(label, "dq", &t.a.dq, dtypes[i], g.dq, g.dq_mag, 32, g.max_score, 0,
                       &in_q_heads);
                expect(label, "dk", &t.a.dk, dtypes[i], g.dk, g.dk_mag, 32, g.max_score, 0,
                       &in_kv_heads);
                expect(label, "dv", &t.a.dv, dtypes[i], g.dv, g.dv_mag, 32, g.max_score, 0,
                       &in_kv_heads);
                ref_free(&g);
            }
            release(&t);
        }
    /* NaN queries in rows that see no key: those rows are still exactly empty. */
    for (int i = 0; i < 3; ++i) {
        char label[128];
        label_of(label, sizeof label, backend, "NaN queries in rows that see no key", dtypes[i]);
        tensors t = make((shape){dtypes[i], 1, 2, 2, 11, 4, 8, 8});
        t.params.causal = 1;
        for (int64_t h = 0; h < 2; ++h)
            for (int64_t r = 0; r < 11 - 4; ++r)
                for (int64_t d = 0; d < 8; ++d) test_set(&t.a.q.t, 0, h, r, d, NAN);
        CHECK(mfa_attention_forward(ctx, &t.params, &t.a.q.t, &t.a.k.t, &t.a.v.t, &t.a.out.t,
                                    &t.a.lse.t) == MFA_OK,
              "%s: forward: %s", label, mfa_last_error());
        CHECK(mfa_attention_backward(ctx, &t.params, &t.a.q.t, &t.a.k.t, &t.a.v.t, &t.a.out.t,
                                     &t.a.dout.t, &t.a.lse.t, &t.a.dq.t, &t.a.dk.t,
                                     &t.a.dv.t) == MFA_OK,
              "%s: backward: %s", label, mfa_last_error());
        expect_empty_rows(label, &t, 0, 11 - 4);
        release(&t);
    }
}

/* Subnormal values everywhere they can appear: v (so out is subnormal), q and k (so scores
 * underflow), and a subnormal scale. */
static void test_subnormals(mfa_context* ctx, const char* backend, int may_flush) {
    static const double smallest_normal[] = {FLT_MIN, 6.103515625e-05, FLT_MIN};
    for (int i = 0; i < 3; ++i) {
        char label[128];
        const double tiny = smallest_normal[i] / 64; /* subnormal in the dtype */
        label_of(label, sizeof label, backend, "subnormal values", dtypes[i]);
        tensors t = make((shape){dtypes[i], 1, 1, 1, 6, 9, 5, 3});
        scale_all(&t.a.v, tiny);
        scale_all(&t.a.q, tiny);
        run(ctx, label, &t, may_flush ? smallest_normal[i] : 0, 0);
        release(&t);

        label_of(label, sizeof label, backend, "subnormal scale", dtypes[i]);
        t = make((shape){dtypes[i], 1, 1, 1, 6, 9, 5, 3});
        t.params.scale = 1e-40f;
        run(ctx, label, &t, may_flush ? FLT_MIN : 0, 0);
        release(&t);
    }
}

static const char* const sections[] = {"large", "masked", "nonfinite", "subnormal"};

static void run_section(const char* section, mfa_context* ctx, mfa_backend which) {
    const char* backend = mfa_backend_name(which);
    if (strcmp(section, "large") == 0) {
        test_large_scores(ctx, backend);
        test_logits_near_f32_limit(ctx, backend);
        test_overflowing_logits_stay_in_their_row(ctx, backend);
    } else if (strcmp(section, "masked") == 0) {
        test_fully_masked_rows(ctx, backend);
    } else if (strcmp(section, "nonfinite") == 0) {
        test_non_finite_inputs(ctx, backend);
    } else {
        test_subnormals(ctx, backend, which != MFA_BACKEND_CPU);
    }
}

int main(int argc, char** argv) {
    return test_main_sections(argc, argv, "test_edge_numerics", sections,
                              (int)(sizeof sections / sizeof sections[0]), run_section);
}
