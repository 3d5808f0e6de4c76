/* mfa_attention_merge and mfa_mask_summarize on every available backend, against references
 * written here in double from mfa.h's definitions: merges of 1 to 8 parts in each dtype, with
 * empty parts (lse -inf), all-empty rows, NaN and +inf, in place and out of place, and the
 * semantic check that merging attention over key blocks equals attention over all keys; mask
 * summaries of boolean and additive masks in every dtype, with partial blocks and broadcasting.
 * Bad arguments get a message naming them and write nothing. */
#include "test_reference.h"
#include "test_util.h"

#define CANARY 0x5A

static const mfa_dtype float_dtypes[3] = {MFA_DTYPE_F32, MFA_DTYPE_F16, MFA_DTYPE_BF16};

/* ---- Merge --------------------------------------------------------------------------------- */

enum { B = 2, H = 3, N = 5, DV = 7, MAX_PARTS = 8 };

typedef struct parts {
    int count;
    test_tensor out[MAX_PARTS], lse[MAX_PARTS];
    mfa_array out_arrays[MAX_PARTS], lse_arrays[MAX_PARTS];
    const mfa_array* outs[MAX_PARTS];
    const mfa_array* lses[MAX_PARTS];
} parts;

/* count parts of random outs (dtype of part i: dtypes[i % 3] rotated by rotate) and lses in
 * [-4, 4], with about one lse in five -inf (empty), and rows where every part is empty. */
static void parts_make(parts* p, int count, int rotate, test_layout layout) {
    memset(p, 0, sizeof *p);
    p->count = count;
    for (int i = 0; i < count; ++i) {
        p->out[i] = test_tensor_make(float_dtypes[(i + rotate) % 3], B, H, N, DV, layout);
        p->lse[i] = test_tensor_make(MFA_DTYPE_F32, B, H, N, 1, TEST_BHSD);
        test_fill_random(&p->out[i]);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t n = 0; n < N; ++n) {
                    double l = 4 * test_uniform();
                    if (test_uniform() < -0.6) l = -INFINITY;
                    if (b == 1 && h == 2 && n == 3) l = -INFINITY; /* every part empty */
                    test_set(&p->lse[i].t, b, h, n, 0, (float)l);
                }
        p->out_arrays[i] = test_array_of(&p->out[i].t);
        p->lse_arrays[i] = test_array_of(&p->lse[i].t);
        p->outs[i] = &p->out_arrays[i];
        p->lses[i] = &p->lse_arrays[i];
    }
}

static void parts_free(parts* p) {
    for (int i = 0; i < p->count; ++i) {
        test_tensor_free(&p->out[i]);
        test_tensor_free(&p->lse[i]);
    }
}

/* The merge of mfa.h, in double, from the parts as stored. */
static void reference_merge(const parts* p, double* out, double* lse) {
    const mfa_tensor* outs[MAX_PARTS];
    const mfa_tensor* lses[MAX_PARTS];
    for (int i = 0; i < p->count; ++i) outs[i] = &p->out[i].t, lses[i] = &p->lse[i].t;
    ref_merge(p->count, outs, lses, out, lse);
}

static void compare_merge(const char* label, const mfa_tensor* out, const mfa_tensor* lse,
                          const double* want_out, const double* want_lse) {
    char why[200];
    CHECK(ref_compare_merge(out, lse, want_out, want_lse, why, sizeof why), "%s: %s", label, why);
}

static void test_merge_values(mfa_context* ctx, const char* backend) {
    char label[160];
    double want_out[B * H * N * DV], want_lse[B * H * N];
    for (int count = 1; count <= MAX_PARTS; ++count)
        for (int rotate = 0; rotate < 3; ++rotate) {
            parts p;
            parts_make(&p, count, rotate, rotate == 1 ? TEST_BSHD : TEST_BHSD);
            reference_merge(&p, want_out, want_lse);
            /* Out of place, out in each dtype. */
            for (int t = 0; t < 3; ++t) {
                test_tensor out = test_tensor_make(float_dtypes[t], B, H, N, DV, TEST_REVERSED);
                test_tensor lse = test_tensor_make(MFA_DTYPE_F32, B, H, N, 1, TEST_BHSD);
                test_fill_nan(&out);
                test_fill_nan(&lse);
                mfa_array out_array = test_array_of(&out.t), lse_array = test_array_of(&lse.t);
                snprintf(label, sizeof label, "%s: merge of %d parts (rotation %d) into %s",
                         backend, count, rotate, mfa_dtype_name(float_dtypes[t]));
                CHECK(mfa_attention_merge(ctx, count, p.outs, p.lses, &out_array, &lse_array) ==
                          MFA_OK,
                      "%s: %s", label, mfa_last_error());
                compare_merge(label, &out.t, &lse.t, want_out, want_lse);
                /* Without lse. */
                test_fill_nan(&out);
                CHECK(mfa_attention_merge(ctx, count, p.outs, p.lses, &out_array, NULL) == MFA_OK,
                      "%s without lse: %s", label, mfa_last_error());
                compare_merge(label, &out.t, NULL, want_out, NULL);
                test_tensor_free(&out);
                test_tensor_free(&lse);
            }
            /* In place, into the last part's out and the first part's lse. */
            snprintf(label, sizeof label, "%s: merge of %d parts (rotation %d) in place", backend,
                     count, rotate);
            const mfa_array in_place_out = p.out_arrays[count - 1];
            const mfa_array in_place_lse = p.lse_arrays[0];
            CHECK(mfa_attention_merge(ctx, count, p.outs, p.lses, &in_place_out, &in_place_lse) ==
                      MFA_OK,
                  "%s: %s", label, mfa_last_error());
            compare_merge(label, &p.out[count - 1].t, &p.lse[0].t, want_out, want_lse);
            parts_free(&p);
        }
}

/* NaN and +inf lses poison their row; a NaN in an empty part's out is never read, a NaN in a
 * part that saw keys propagates. */
static void test_merge_special_values(mfa_context* ctx, const char* backend) {
    parts p;
    parts_make(&p, 3, 0, TEST_BHSD);
    for (int i = 0; i < 3; ++i) {
        test_set(&p.lse[i].t, 0, 0, 0, 0, 1.0f);
        test_set(&p.lse[i].t, 0, 0, 1, 0, 1.0f);
        test_set(&p.lse[i].t, 0, 0, 2, 0, 1.0f);
        test_set(&p.lse[i].t, 0, 0, 3, 0, 1.0f);
    }
    test_set(&p.lse[1].t, 0, 0, 0, 0, NAN);      /* row 0: NaN lse */
    test_set(&p.lse[2].t, 0, 0, 1, 0, INFINITY); /* row 1: +inf lse */
    test_set(&p.lse[0].t, 0, 0, 2, 0, -INFINITY);
    test_set(&p.out[0].t, 0, 0, 2, 4, NAN); /* row 2: NaN in an empty part: not read */
    test_set(&p.out[1].t, 0, 0, 3, 5, NAN); /* row 3: NaN in a part with keys */
    test_tensor out = test_tensor_make(MFA_DTYPE_F32, B, H, N, DV, TEST_BHSD);
    test_tensor lse = test_tensor_make(MFA_DTYPE_F32, B, H, N, 1, TEST_BHSD);
    mfa_array out_array = test_array_of(&out.t), lse_array = test_array_of(&lse.t);
    CHECK(mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_array) == MFA_OK, "%s: %s",
          backend, mfa_last_error());
    for (int64_t d = 0; d < DV; ++d) {
        CHECK(isnan(test_get(&out.t, 0, 0, 0, d)) && isnan(test_get(&out.t, 0, 0, 1, d)),
              "%s: a NaN or +inf lse must make the row's out NaN (d = %lld)", backend,
              (long long)d);
        CHECK(isfinite(test_get(&out.t, 0, 0, 2, d)),
              "%s: the out of an empty part was read (d = %lld)", backend, (long long)d);
        CHECK(isnan(test_get(&out.t, 0, 0, 3, d)) == (d == 5),
              "%s: NaN in a part's out must propagate to its element only (d = %lld)", backend,
              (long long)d);
    }
    CHECK(isnan(test_get(&lse.t, 0, 0, 0, 0)) && isnan(test_get(&lse.t, 0, 0, 1, 0)),
          "%s: NaN or +inf lse must give a NaN lse", backend);
    CHECK(test_get(&lse.t, 0, 0, 2, 0) == (float)(1.0 + log(2.0)), "%s: lse of two equal parts %g",
          backend, test_get(&lse.t, 0, 0, 2, 0));
    test_tensor_free(&out);
    test_tensor_free(&lse);
    parts_free(&p);
}

/* Attention over all keys equals the merge of attention over disjoint key blocks, each computed
 * by mfa_attention_forward: the convention (natural log, scale included) is the calls' own. */
static void test_merge_of_attention(mfa_context* ctx, const char* backend) {
    enum { HKV = 1, NQ = 6, NK = 23, D = 8 };
    const int64_t cuts[4] = {0, 9, 10, NK}; /* blocks of 9, 1 and 13 keys */
    test_attention a = test_attention_make(MFA_DTYPE_F32, 1, 2, HKV, NQ, NK, D, D, TEST_BHSD);
    const mfa_attention_params whole = test_params(1, MFA_ALIGN_BOTTOM_RIGHT, -1, -1, 0.3f);
    test_tensor outs[3], lses[3];
    mfa_array out_arrays[3], lse_arrays[3];
    const mfa_array *out_ptrs[3], *lse_ptrs[3];
    for (int part = 0; part < 3; ++part) {
        /* Keys [lo, lo + n): the whole call's bottom-right causal rule, j <= i + NK - NQ, is
         * j - lo <= i + (NK - NQ - lo) in the block's own indices: a right window edge of
         * NK - NQ - lo under top-left alignment. */
        const int64_t lo = cuts[part], n = cuts[part + 1] - cuts[part];
        mfa_tensor k = a.k.t, v = a.v.t;
        k.data = (char*)k.data + lo * k.strides[2] * 4;
        v.data = (char*)v.data + lo * v.strides[2] * 4;
        k.shape[2] = v.shape[2] = n;
        const int64_t offset = NK - NQ - lo;
        const mfa_attention_params part_params =
            test_params(0, MFA_ALIGN_TOP_LEFT, -1, offset >= 0 ? offset : -1, 0.3f);
        outs[part] = test_tensor_make(MFA_DTYPE_F32, 1, 2, NQ, D, TEST_BHSD);
        lses[part] = test_tensor_make(MFA_DTYPE_F32, 1, 2, NQ, 1, TEST_BHSD);
        CHECK(offset >= 0, "test setup: block %d starts after the diagonal", part);
        CHECK(mfa_attention_forward(ctx, &part_params, &a.q.t, &k, &v, &outs[part].t,
                                    &lses[part].t) == MFA_OK,
              "%s: forward of block %d: %s", backend, part, mfa_last_error());
        out_arrays[part] = test_array_of(&outs[part].t);
        lse_arrays[part] = test_array_of(&lses[part].t);
        out_ptrs[part] = &out_arrays[part];
        lse_ptrs[part] = &lse_arrays[part];
    }
    test_tensor out = test_tensor_make(MFA_DTYPE_F32, 1, 2, NQ, D, TEST_BSHD);
    test_tensor lse = test_tensor_make(MFA_DTYPE_F32, 1, 2, NQ, 1, TEST_BHSD);
    mfa_array out_array = test_array_of(&out.t), lse_array = test_array_of(&lse.t);
    CHECK(mfa_attention_merge(ctx, 3, out_ptrs, lse_ptrs, &out_array, &lse_array) == MFA_OK,
          "%s: merge: %s", backend, mfa_last_error());
    const ref_problem problem = ref_problem_of(&a.q.t, &a.k.t, &a.v.t, &whole);
    ref_result want = ref_forward(&problem, &a.q.t, &a.k.t, &a.v.t);
    char why[256];
    CHECK(ref_compare(&out.t, MFA_DTYPE_F32, want.out, want.out_mag, NK, want.max_score, why,
                      sizeof why),
          "%s: merged out vs attention over all keys: %s", backend, why);
    CHECK(ref_compare(&lse.t, MFA_DTYPE_F32, want.lse, want.lse_mag, NK, want.max_score, why,
                      sizeof why),
          "%s: merged lse vs attention over all keys: %s", backend, why);
    ref_free(&want);
    for (int part = 0; part < 3; ++part) {
        test_tensor_free(&outs[part]);
        test_tensor_free(&lses[part]);
    }
    test_tensor_free(&out);
    test_tensor_free(&lse);
    test_attention_free(&a);
}

static void expect(const char* label, mfa_status got, mfa_status expected, const char* substring) {
    CHECK(got == expected, "%s: status %s, expected %s; message: %s", label, mfa_status_string(got),
          mfa_status_string(expected), mfa_last_error());
    CHECK(strstr(mfa_last_error(), substring) != NULL, "%s: message \"%s\" does not mention \"%s\"",
          label, mfa_last_error(), substring);
}

static int filled_with(const test_tensor* t, unsigned char byte) {
    for (size_t i = 0; i < t->bytes; ++i)
        if (((const unsigned char*)t->storage)[i] != byte) return 0;
    return 1;
}

static void test_merge_arguments(mfa_context* ctx) {
    const mfa_status INVALID = MFA_ERROR_INVALID_ARGUMENT;
    parts p;
    parts_make(&p, 3, 0, TEST_BHSD);
    test_tensor out = test_tensor_make(MFA_DTYPE_F32, B, H, N, DV, TEST_BHSD);
    test_tensor lse = test_tensor_make(MFA_DTYPE_F32, B, H, N, 1, TEST_BHSD);
    mfa_array out_array = test_array_of(&out.t), lse_array = test_array_of(&lse.t);
#define MERGE_CASE(label, status, substring, call)                                                 \
    do {                                                                                           \
        memset(out.storage, CANARY, out.bytes);                                                    \
        memset(lse.storage, CANARY, lse.bytes);                                                    \
        expect(label, call, status, substring);                                                    \
        CHECK(filled_with(&out, CANARY) && filled_with(&lse, CANARY), "%s: output written",        \
              label);                                                                              \
    } while (0)
    MERGE_CASE("ctx", INVALID, "ctx is NULL",
               mfa_attention_merge(NULL, 3, p.outs, p.lses, &out_array, &lse_array));
    MERGE_CASE("count", INVALID, "count must be >= 1, got 0",
               mfa_attention_merge(ctx, 0, p.outs, p.lses, &out_array, &lse_array));
    /* Rejected before the parts are read: p.outs has 3 entries. */
    MERGE_CASE("count overflow", MFA_ERROR_SIZE_OVERFLOW, "count = 1073741824 parts: at most",
               mfa_attention_merge(ctx, 1073741824, p.outs, p.lses, &out_array, &lse_array));
    MERGE_CASE("outs", INVALID, "outs is NULL",
               mfa_attention_merge(ctx, 3, NULL, p.lses, &out_array, &lse_array));
    MERGE_CASE("lses", INVALID, "lses is NULL",
               mfa_attention_merge(ctx, 3, p.outs, NULL, &out_array, &lse_array));
    MERGE_CASE("out", INVALID, "out is NULL",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, NULL, &lse_array));
    const mfa_array* saved = p.outs[1];
    p.outs[1] = NULL;
    MERGE_CASE("part NULL", INVALID, "outs[1] is NULL",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_array));
    p.outs[1] = saved;
    p.lse_arrays[2].dtype = MFA_DTYPE_F16;
    MERGE_CASE("part lse dtype", INVALID, "lses[2].dtype must be f32 (lse is always f32), got f16",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_array));
    p.lse_arrays[2].dtype = MFA_DTYPE_F32;
    p.out_arrays[1].shape[2] = N - 1;
    MERGE_CASE("part shape", INVALID,
               "outs[1].shape[2] (seq) must equal outs[0].shape[2] = 5, got 4",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_array));
    p.out_arrays[1].shape[2] = N;
    p.lse_arrays[0].shape[3] = 2;
    MERGE_CASE("part lse shape", INVALID, "lses[0].shape[3] must be 1, got 2",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_array));
    p.lse_arrays[0].shape[3] = 1;
    out_array.dtype = MFA_DTYPE_BOOL;
    MERGE_CASE("out dtype", INVALID, "out.dtype must be f32, f16 or bf16",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_array));
    out_array.dtype = MFA_DTYPE_F32;
    out_array.shape[3] = DV + 1;
    MERGE_CASE("out shape", INVALID, "out.shape[3] (head dim) must equal outs[0].shape[3] = 7",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_array));
    out_array.shape[3] = DV;
    out_array.strides[1] = 0;
    MERGE_CASE("out broadcast", INVALID, "out: stride 0 of dim 1 (heads) makes elements overlap",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_array));
    out_array = test_array_of(&out.t);
    lse_array.data = out.storage;
    MERGE_CASE("lse overlaps out", INVALID, "out overlaps lse",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_array));
    lse_array = test_array_of(&lse.t);
    /* In place is exactly one part's view; anything else that overlaps a part is refused. */
    mfa_array shifted = p.out_arrays[1];
    shifted.data = (float*)shifted.data + 1;
    shifted.shape[3] = DV - 1;
    {
        mfa_array narrow[3] = {p.out_arrays[0], p.out_arrays[1], p.out_arrays[2]};
        const mfa_array* narrow_ptrs[3] = {&narrow[0], &narrow[1], &narrow[2]};
        for (int i = 0; i < 3; ++i) narrow[i].shape[3] = DV - 1;
        expect("out overlaps a part",
               mfa_attention_merge(ctx, 3, narrow_ptrs, p.lses, &shifted, NULL), INVALID,
               "out overlaps outs[1]");
        mfa_array as_f16 = p.out_arrays[0];
        as_f16.dtype = p.out_arrays[0].dtype == MFA_DTYPE_F32 ? MFA_DTYPE_F16 : MFA_DTYPE_F32;
        expect("in place with another dtype",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &as_f16, NULL), INVALID,
               "out overlaps outs[0]");
        CHECK(mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &p.lse_arrays[0]) == MFA_OK,
              "lse in place of a part's lse, out elsewhere: %s", mfa_last_error());
        mfa_array lse_over_out = lse_array;
        lse_over_out.data = p.out[2].storage;
        expect("lse onto a part's out",
               mfa_attention_merge(ctx, 3, p.outs, p.lses, &out_array, &lse_over_out), INVALID,
               "lse overlaps outs[2]");
    }
#undef MERGE_CASE
    test_tensor_free(&out);
    test_tensor_free(&lse);
    parts_free(&p);
}

/* ---- Mask summaries ------------------------------------------------------------------------ */

enum { SQ = 100, SK = 130 }; /* 2 x 3 blocks of 64, the last ones partial */

/* A mask where block (r, c) is all visible, all hidden, or mixed, by (r + 2c) % 3, with mixed
 * blocks hiding one pair; additive masks add a nonzero value in mixed blocks and use -0 among
 * the zeros. */
static void fill_mask(const mfa_tensor* t, int variant) {
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t i = 0; i < t->shape[2]; ++i)
                for (int64_t j = 0; j < t->shape[3]; ++j) {
                    const int kind = (int)((i / 64 + 2 * (j / 64) + b + h + variant) % 3);
                    const int odd = (i * 7 + j * 3 + b) % 97 == 5;
                    int64_t o = test_offset(t, b, h, i, j);
                    if (t->dtype == MFA_DTYPE_BOOL) {
                        const unsigned char visible = kind == 0 ? 7 : kind == 1 ? 0 : !odd;
                        ((unsigned char*)t->data)[o] = visible;
                    } else {
                        const float value = kind == 0   ? ((i + j) % 2 ? 0.0f : -0.0f)
                                            : kind == 1 ? -INFINITY
                                            : odd       ? ((i + j) % 2 ? -INFINITY : 0.5f)
                                                        : 0.0f;
                        test_set(t, b, h, i, j, value);
                    }
                }
}

static int classify(const mfa_tensor* t, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (t->dtype == MFA_DTYPE_BOOL)
        return ((const unsigned char*)t->data)[test_offset(t, b, h, i, j)] ? 2 : 0;
    const double value = test_get(t, b, h, i, j);
    return value == -INFINITY ? 0 : value == 0 ? 2 : 1;
}

/* mfa.h's summary, from the mask as stored, indexed through broadcasting. */
static int reference_code(const mfa_tensor* mask, int64_t b, int64_t h, int64_t r, int64_t c,
                          int64_t seq_q, int64_t seq_k) {
    int hidden = 0, plain = 0, other = 0;
    for (int64_t i = r * MFA_MASK_BLOCK; i < seq_q && i < (r + 1) * MFA_MASK_BLOCK; ++i)
        for (int64_t j = c * MFA_MASK_BLOCK; j < seq_k && j < (c + 1) * MFA_MASK_BLOCK; ++j) {
            const int kind =
                classify(mask, mask->shape[0] == 1 ? 0 : b, mask->shape[1] == 1 ? 0 : h,
                         mask->shape[2] == 1 ? 0 : i, mask->shape[3] == 1 ? 0 : j);
            hidden |= kind == 0;
            plain |= kind == 2;
            other |= kind == 1;
        }
    return other || (hidden && plain) ? 1 : hidden ? 0 : 2;
}

static void check_summary(const char* label, const mfa_tensor* mask, const test_tensor* summary,
                          int64_t seq_q, int64_t seq_k) {
    const mfa_tensor* s = &summary->t;
    for (int64_t b = 0; b < s->shape[0]; ++b)
        for (int64_t h = 0; h < s->shape[1]; ++h)
            for (int64_t r = 0; r < s->shape[2]; ++r)
                for (int64_t c = 0; c < s->shape[3]; ++c) {
                    const int got = ((const unsigned char*)s->data)[test_offset(s, b, h, r, c)];
                    const int want = reference_code(mask, b, h, r, c, seq_q, seq_k);
                    if (got != want) {
                        CHECK(0, "%s: summary[%lld, %lld, %lld, %lld] = %d, reference %d", label,
                              (long long)b, (long long)h, (long long)r, (long long)c, got, want);
                        return;
                    }
                }
}

static void test_mask_summaries(mfa_context* ctx, const char* backend) {
    const mfa_dtype dtypes[4] = {MFA_DTYPE_BOOL, MFA_DTYPE_F32, MFA_DTYPE_F16, MFA_DTYPE_BF16};
    const struct {
        int64_t b, h, q, k; /* mask dims; 1 broadcasts */
        int batch_stride_zero;
    } shapes[] = {{2, 3, SQ, SK, 0}, {1, 3, SQ, SK, 0}, {2, 1, SQ, 1, 0}, {1, 1, 1, SK, 0},
                  {2, 3, SQ, SK, 1}, {1, 1, 64, 64, 0}, {2, 2, 1, 1, 0}};
    char label[160];
    int codes_seen[3] = {0, 0, 0};
    for (size_t d = 0; d < 4; ++d)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
            const int64_t seq_q = shapes[s].q == 1 ? SQ : shapes[s].q;
            const int64_t seq_k = shapes[s].k == 1 ? SK : shapes[s].k;
            test_tensor mask = test_tensor_make(dtypes[d], shapes[s].b, shapes[s].h, shapes[s].q,
                                                shapes[s].k, s % 2 ? TEST_BSHD : TEST_BHSD);
            fill_mask(&mask.t, (int)s);
            mfa_array mask_array = test_array_of(&mask.t);
            int64_t summary_b = shapes[s].b;
            if (shapes[s].batch_stride_zero) { /* batch 2 through stride 0: summary batch 1 */
                mask_array.strides[0] = 0;
                mask.t.strides[0] = 0;
                summary_b = 1;
            }
            const int64_t rows = (seq_q + 63) / 64, cols = (seq_k + 63) / 64;
            test_tensor summary =
                test_tensor_make(MFA_DTYPE_BOOL, summary_b, shapes[s].h, rows, cols, TEST_BHSD);
            memset(summary.storage, 0xEE, summary.bytes);
            mfa_array summary_array = test_array_of(&summary.t);
            snprintf(label, sizeof label, "%s: summary of a %s mask [%lld, %lld, %lld, %lld]%s",
                     backend, mfa_dtype_name(dtypes[d]), (long long)shapes[s].b,
                     (long long)shapes[s].h, (long long)shapes[s].q, (long long)shapes[s].k,
                     shapes[s].batch_stride_zero ? " (batch stride 0)" : "");
            CHECK(mfa_mask_summarize(ctx, &mask_array, seq_q, seq_k, &summary_array) == MFA_OK,
                  "%s: %s", label, mfa_last_error());
            mfa_tensor as_read = mask.t;
            if (shapes[s].batch_stride_zero) as_read.shape[0] = 1;
            check_summary(label, &as_read, &summary, seq_q, seq_k);
            for (size_t i = 0; i < summary.bytes; ++i) {
                const unsigned char code = ((unsigned char*)summary.storage)[i];
                if (code <= 2) codes_seen[code] = 1;
            }
            test_tensor_free(&summary);
            test_tensor_free(&mask);
        }
    CHECK(codes_seen[0] && codes_seen[1] && codes_seen[2],
          "%s: the masks exercised only some codes (%d %d %d)", backend, codes_seen[0],
          codes_seen[1], codes_seen[2]);
}

static void test_summary_arguments(mfa_context* ctx) {
    const mfa_status INVALID = MFA_ERROR_INVALID_ARGUMENT;
    test_tensor mask = test_tensor_make(MFA_DTYPE_BOOL, 2, 3, SQ, SK, TEST_BHSD);
    fill_mask(&mask.t, 0);
    test_tensor summary = test_tensor_make(MFA_DTYPE_BOOL, 2, 3, 2, 3, TEST_BHSD);
    /* Each case breaks the valid call's arguments (call_ctx, mask_arg, seq_q, summary_arg, and
     * m and s, the arrays they point at) with its statements. */
#define SUMMARY_CASE(label, substring, ...)                                                        \
    do {                                                                                           \
        mfa_context* call_ctx = ctx;                                                               \
        int64_t seq_q = SQ;                                                                        \
        mfa_array m = test_array_of(&mask.t), s = test_array_of(&summary.t);                       \
        const mfa_array *mask_arg = &m, *summary_arg = &s;                                         \
        __VA_ARGS__;                                                                               \
        memset(summary.storage, CANARY, summary.bytes);                                            \
        expect(label, mfa_mask_summarize(call_ctx, mask_arg, seq_q, SK, summary_arg), INVALID,     \
               substring);                                                                         \
        CHECK(filled_with(&summary, CANARY), "%s: summary written", label);                        \
    } while (0)
    SUMMARY_CASE("ctx", "ctx is NULL", call_ctx = NULL);
    SUMMARY_CASE("seq_q", "seq_q must be >= 1, got 0", seq_q = 0);
    SUMMARY_CASE("mask NULL", "mask is NULL", mask_arg = NULL);
    SUMMARY_CASE("summary NULL", "summary is NULL", summary_arg = NULL);
    SUMMARY_CASE("mask rows", "mask.shape[2] (query) must equal seq_q = 90 or be 1, got 100",
                 seq_q = 90);
    SUMMARY_CASE("mask dtype", "mask.dtype must be f32, f16, bf16 or bool",
                 m.dtype = MFA_DTYPE_I32);
    SUMMARY_CASE("summary rows",
                 "summary.shape[2] (query) must equal ceil(seq_q / MFA_MASK_BLOCK) = 2, got 1",
                 s.shape[2] = 1);
    SUMMARY_CASE("summary dtype", "summary.dtype must be bool", s.dtype = MFA_DTYPE_F32);
    SUMMARY_CASE("summary batch of a full mask",
                 "summary.shape[0] (batch) must equal mask.shape[0] = 2, got 1", s.shape[0] = 1);
    SUMMARY_CASE("summary overlaps mask", "summary overlaps mask", s.data = mask.storage);
    SUMMARY_CASE("summary broadcast", "summary: stride 0 of dim 3 (key) makes elements overlap",
                 s.strides[3] = 0);
#undef SUMMARY_CASE
    test_tensor_free(&summary);
    test_tensor_free(&mask);
}

static void run_backend(mfa_context* ctx, mfa_backend backend) {
    const char* name = mfa_backend_name(backend);
    printf("test_merge: %s\n", name);
    test_merge_values(ctx, name);
    test_merge_special_values(ctx, name);
    test_merge_of_attention(ctx, name);
    test_mask_summaries(ctx, name);
    if (backend == MFA_BACKEND_CPU) {
        test_merge_arguments(ctx);
        test_summary_arguments(ctx);
    }
}

int main(void) {
    test_each_backend(NULL, run_backend);
    return test_finish("test_merge");
}
