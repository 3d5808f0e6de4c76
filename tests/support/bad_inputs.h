/* The bad inputs of the C API, one table: each row breaks one thing in a valid call and states
 * the status the call must return and a text its message must contain.
 *
 *   tests/c/test_validation.c runs every row: status and message, no output byte written, no
 *   input byte changed, no context created;
 *   tests/edge/test_bad_inputs_doc.c checks that docs/bad-inputs.md lists exactly the
 *   documented rows, with this table's status and text.
 *
 * The starting point of every row is the doc's: a valid call on a cpu context, f32,
 * q [2, 4, 5, 8], k [2, 2, 7, 8], v [2, 2, 7, 6], out [2, 4, 5, 6], lse [2, 4, 5, 1], dense
 * [B, H, N, D] strides; dout, dq, dk and dv shaped like out, q, k and v. */
#ifndef MFA_TESTS_BAD_INPUTS_H
#define MFA_TESTS_BAD_INPUTS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { BAD_B = 2, BAD_HQ = 4, BAD_HKV = 2, BAD_NQ = 5, BAD_NK = 7, BAD_D = 8, BAD_DV = 6 };

/* What a row calls: mfa_attention_forward or mfa_attention_backward on the fixture, the
 * fixture through mfa_attention_compute (its arrays and args, in f->direction, with the arrays a
 * row adds: modifiers, packed offsets, a paged cache), mfa_attention_merge on the parts a row
 * sets up, or a call of its own whose status it leaves in the fixture. */
typedef enum bad_input_kind {
    BAD_FORWARD,
    BAD_BACKWARD,
    BAD_COMPUTE,
    BAD_MERGE,
    BAD_CALL
} bad_input_kind;

enum { BAD_EXTRAS = 6 }; /* arrays a row may add */

/* A valid forward and backward problem that a row breaks in one place. */
typedef struct bad_input_fixture {
    test_attention a;
    mfa_attention_params params;
    int pass_q, pass_k, pass_v, pass_out, pass_lse; /* 0: that argument is NULL */
    mfa_context* ctx;
    mfa_status status;    /* of a row's own call */
    void* pointer;        /* what a row's call returned, if a pointer */
    int created_context;  /* the row called mfa_context_create ... */
    mfa_context* created; /* ... which must have set this to NULL */
    double seconds;       /* mfa_context_last_gpu_time's output; must stay -1 */
    /* BAD_COMPUTE: the problem above as mfa_attention_compute's arguments, and the arrays a
     * row adds (bad_input_extra), every one of which the failed call must leave unchanged. */
    mfa_direction direction;
    mfa_array arrays[9]; /* q, k, v, out, lse, dout, dq, dk, dv */
    mfa_attention_args args;
    int pass_args; /* 0: args is NULL */
    test_tensor extras[BAD_EXTRAS];
    mfa_array extra_arrays[BAD_EXTRAS];
    int extra_count;
    /* BAD_MERGE: the call's parts and outputs. */
    int32_t merge_count;
    const mfa_array* merge_outs[2];
    const mfa_array* merge_lses[2];
    const mfa_array *merge_out, *merge_lse;
} bad_input_fixture;

/* The cpu context of the valid call, made by the test before any row runs. */
static mfa_context* bad_input_cpu_context;

static mfa_context_options bad_input_options;
static mfa_capabilities bad_input_caps;

static bad_input_fixture bad_input_fixture_make(void) {
    bad_input_fixture f;
    memset(&f, 0, sizeof f);
    f.a = test_attention_make(MFA_DTYPE_F32, BAD_B, BAD_HQ, BAD_HKV, BAD_NQ, BAD_NK, BAD_D, BAD_DV,
                              TEST_BHSD);
    test_fill_random(&f.a.out);
    test_fill_random(&f.a.lse);
    mfa_attention_params_init(&f.params);
    f.pass_q = f.pass_k = f.pass_v = f.pass_out = f.pass_lse = 1;
    f.ctx = bad_input_cpu_context;
    f.seconds = -1;
    f.direction = MFA_FORWARD;
    const test_tensor* tensors[9] = {&f.a.q,    &f.a.k,  &f.a.v,  &f.a.out, &f.a.lse,
                                     &f.a.dout, &f.a.dq, &f.a.dk, &f.a.dv};
    for (int i = 0; i < 9; ++i) f.arrays[i] = test_array_of(&tensors[i]->t);
    mfa_attention_args_init(&f.args, sizeof f.args);
    f.pass_args = 1;
    return f;
}

/* An array a row adds: a zero-filled dense array of that dtype and shape. */
static mfa_array* bad_input_extra(bad_input_fixture* f, mfa_dtype dtype, int64_t b, int64_t h,
                                  int64_t s, int64_t d) {
    const int i = f->extra_count++;
    f->extras[i] = test_tensor_make(dtype, b, h, s, d, TEST_BHSD);
    memset(f->extras[i].storage, 0, f->extras[i].bytes);
    f->extra_arrays[i] = test_array_of(&f->extras[i].t);
    return &f->extra_arrays[i];
}

/* An added int32 array holding `values` in order. */
static mfa_array* bad_input_i32(bad_input_fixture* f, int64_t b, int64_t s, const int32_t* values) {
    mfa_array* a = bad_input_extra(f, MFA_DTYPE_I32, b, 1, 1, s);
    memcpy(a->data, values, (size_t)(b * s) * sizeof *values);
    return a;
}

/* A dense view [1, heads, rows, width] of an array's storage. */
static void bad_input_pack(mfa_array* a, int64_t heads, int64_t rows, int64_t width) {
    const int64_t shape[4] = {1, heads, rows, width};
    const int64_t strides[4] = {heads * rows * width, rows * width, width, 1};
    memcpy(a->shape, shape, sizeof shape);
    memcpy(a->strides, strides, sizeof strides);
}

/* The fixture's forward as packed sequences: its storage viewed as one batch of B x N rows a
 * head (q [1, 4, 10, 8], k [1, 2, 14, 8], ...), two sequences of 5 queries and 7 keys, and
 * cu_seqlens_q = {0, 5, 10}, cu_seqlens_k = {0, 7, 14} (extras 0 and 1). */
static void bad_input_packed(bad_input_fixture* f) {
    bad_input_pack(&f->arrays[0], BAD_HQ, BAD_B * BAD_NQ, BAD_D);
    bad_input_pack(&f->arrays[1], BAD_HKV, BAD_B * BAD_NK, BAD_D);
    bad_input_pack(&f->arrays[2], BAD_HKV, BAD_B * BAD_NK, BAD_DV);
    bad_input_pack(&f->arrays[3], BAD_HQ, BAD_B * BAD_NQ, BAD_DV);
    bad_input_pack(&f->arrays[4], BAD_HQ, BAD_B * BAD_NQ, 1);
    f->args.cu_seqlens_q = bad_input_i32(f, 1, 3, (const int32_t[]){0, BAD_NQ, 2 * BAD_NQ});
    f->args.cu_seqlens_k = bad_input_i32(f, 1, 3, (const int32_t[]){0, BAD_NK, 2 * BAD_NK});
    f->args.max_seqlen_q = BAD_NQ;
    f->args.max_seqlen_k = BAD_NK;
}

/* The fixture's forward over a paged cache: k and v are caches of 4 blocks of block_size rows
 * (extras 0 and 1), the block table {{0, 1}, {2, 3}} (extra 2) and cache_seqlens {7, 12}
 * (extra 3); with appends, 2 new keys and values a sequence (extras 4 and 5). */
static void bad_input_paged(bad_input_fixture* f, int64_t block_size, int appends) {
    f->arrays[1] = *bad_input_extra(f, MFA_DTYPE_F32, 4, BAD_HKV, block_size, BAD_D);
    f->arrays[2] = *bad_input_extra(f, MFA_DTYPE_F32, 4, BAD_HKV, block_size, BAD_DV);
    f->args.block_table = bad_input_i32(f, BAD_B, 2, (const int32_t[]){0, 1, 2, 3});
    f->args.cache_seqlens = bad_input_i32(f, BAD_B, 1, (const int32_t[]){7, 12});
    if (appends) {
        f->args.k_new = bad_input_extra(f, MFA_DTYPE_F32, BAD_B, BAD_HKV, 2, BAD_D);
        f->args.v_new = bad_input_extra(f, MFA_DTYPE_F32, BAD_B, BAD_HKV, 2, BAD_DV);
    }
}

/* The fixture's problem as a backward through mfa_attention_compute, with sinks (extra 0) and
 * dsinks (extra 1). */
static void bad_input_dsinks(bad_input_fixture* f) {
    f->direction = MFA_BACKWARD;
    f->args.sinks = bad_input_extra(f, MFA_DTYPE_F32, 1, BAD_HQ, 1, 1);
    f->args.dsinks = bad_input_extra(f, MFA_DTYPE_F32, 1, BAD_HQ, 1, 1);
}

/* A merge of two parts, the fixture's out and lse and two added arrays like them (extras 0 and
 * 1), into out and lse arrays of their own (extras 2 and 3). */
static void bad_input_merge(bad_input_fixture* f) {
    f->merge_count = 2;
    f->merge_outs[0] = &f->arrays[3];
    f->merge_lses[0] = &f->arrays[4];
    f->merge_outs[1] = bad_input_extra(f, MFA_DTYPE_F32, BAD_B, BAD_HQ, BAD_NQ, BAD_DV);
    f->merge_lses[1] = bad_input_extra(f, MFA_DTYPE_F32, BAD_B, BAD_HQ, BAD_NQ, 1);
    f->merge_out = bad_input_extra(f, MFA_DTYPE_F32, BAD_B, BAD_HQ, BAD_NQ, BAD_DV);
    f->merge_lse = bad_input_extra(f, MFA_DTYPE_F32, BAD_B, BAD_HQ, BAD_NQ, 1);
}

/* mfa_context_create with default options changed by `change`; *out starts as a non-NULL
 * sentinel, so a failed create that does not reset it shows. */
static mfa_status bad_input_create(bad_input_fixture* f, int backend,
                                   void (*change)(mfa_context_options*)) {
    mfa_context_options_init(&bad_input_options);
    if (change) change(&bad_input_options);
    f->created_context = 1;
    f->created = (mfa_context*)&bad_input_options;
    return mfa_context_create((mfa_backend)backend, &bad_input_options, &f->created);
}
static void options_size(mfa_context_options* o) { o->struct_size = 3; }
static void threads_negative(mfa_context_options* o) { o->num_threads = -1; }
static void threads_too_many(mfa_context_options* o) { o->num_threads = 4097; }
static void family_unknown(mfa_context_options* o) { o->gpu_family = (mfa_gpu_family)5; }
static void family_set(mfa_context_options* o) { o->gpu_family = MFA_GPU_FAMILY_APPLE8; }
static void seed_set(mfa_context_options* o) { o->sim_schedule_seed = 42; }
static void family_apple7(mfa_context_options* o) { o->gpu_family = MFA_GPU_FAMILY_APPLE7; }
static void seed_7(mfa_context_options* o) { o->sim_schedule_seed = 7; }

/* Gives x a fresh storage of n elements (poisoned like any output), keeping its view. */
static void bad_input_widen(test_tensor* x, size_t n) {
    free(x->storage);
    x->bytes = n * mfa_dtype_size(x->t.dtype);
    x->storage = calloc(n, mfa_dtype_size(x->t.dtype));
    x->t.data = x->storage;
}

/* out laid out in B and H with strides 150 and 60 (blocks of 30 = N x Dv elements): block
 * starts 60h + 150b are distinct for h < 4, b < 2, so no two elements share an address, but
 * 150 does not exceed the 209 elements the smaller strides span. */
static void out_distinct_but_not_nested(bad_input_fixture* f) {
    bad_input_widen(&f->a.out, 150 + 3 * 60 + 30);
    f->a.out.t.strides[0] = 150;
    f->a.out.t.strides[1] = 60;
}

/* q and out share one buffer of 16-element rows: q uses elements 0..7 of each row, out 8..13.
 * No byte is shared, but each one's extent contains the other's. */
static void out_interleaved_with_q(bad_input_fixture* f) {
    bad_input_widen(&f->a.q, (size_t)BAD_B * BAD_HQ * BAD_NQ * 16);
    const int64_t strides[4] = {BAD_HQ * BAD_NQ * 16, BAD_NQ * 16, 16, 1};
    memcpy(f->a.q.t.strides, strides, sizeof strides);
    test_fill_random(&f->a.q);
    f->a.out.t.data = (float*)f->a.q.storage + 8;
    memcpy(f->a.out.t.strides, strides, sizeof strides);
}

/* X(id, kind, status, text, statements breaking fixture f): the rows of docs/bad-inputs.md, in
 * its order. */
#define BAD_INPUTS_DOCUMENTED(X)                                                                   \
    X("ctx-null", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "ctx is NULL", f->ctx = NULL)           \
    X("create-out-null", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "out is NULL",                      \
      f->status = mfa_context_create(MFA_BACKEND_CPU, NULL, NULL))                                 \
    X("create-backend-unknown", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT,                              \
      "backend = 42 is not an mfa_backend", f->status = bad_input_create(f, 42, NULL))             \
    X("create-options-size", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "options.struct_size = 3",      \
      f->status = bad_input_create(f, MFA_BACKEND_CPU, options_size))                              \
    X("create-threads-negative", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT,                             \
      "options.num_threads must be in [0, 4096]",                                                  \
      f->status = bad_input_create(f, MFA_BACKEND_CPU, threads_negative))                          \
    X("create-threads-too-many", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "got 4097",                 \
      f->status = bad_input_create(f, MFA_BACKEND_CPU, threads_too_many))                          \
    X("create-family-unknown", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT,                               \
      "options.gpu_family = 5 is not an mfa_gpu_family",                                           \
      f->status = bad_input_create(f, MFA_BACKEND_METAL_SIM, family_unknown))                      \
    X("create-family-not-sim", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT,                               \
      "apply to the metal-sim backend only",                                                       \
      f->status = bad_input_create(f, MFA_BACKEND_CPU, family_set))                                \
    X("create-seed-not-sim", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT,                                 \
      "apply to the metal-sim backend only",                                                       \
      f->status = bad_input_create(f, MFA_BACKEND_CPU, seed_set))                                  \
    X("caps-null", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "caps is NULL",                           \
      f->status = mfa_context_capabilities(f->ctx, NULL))                                          \
    X("caps-size", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "caps->struct_size = 4",                  \
      bad_input_caps.struct_size = 4;                                                              \
      f->status = mfa_context_capabilities(f->ctx, &bad_input_caps))                               \
    X("tensor-null", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "k is NULL", f->pass_k = 0)          \
    X("out-null", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "out is NULL", f->pass_out = 0)         \
    X("data-null", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "v.data is NULL",                      \
      f->a.v.t.data = NULL)                                                                        \
    X("dtype-unknown", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "q.dtype = 9 is not an mfa_dtype", \
      f->a.q.t.dtype = (mfa_dtype)9)                                                               \
    X("dtype-mixed", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "k.dtype must be f32",               \
      f->a.k.t.dtype = MFA_DTYPE_F16)                                                              \
    X("out-dtype", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "out.dtype must be f32",               \
      f->a.out.t.dtype = MFA_DTYPE_BF16)                                                           \
    X("lse-dtype", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                        \
      "lse.dtype must be f32 (lse is always f32)", f->a.lse.t.dtype = MFA_DTYPE_F16)               \
    X("shape-zero", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                       \
      "q.shape[2] (seq) must be >= 1, got 0", f->a.q.t.shape[2] = 0)                               \
    X("shape-negative", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                   \
      "v.shape[3] (head dim) must be >= 1, got -4", f->a.v.t.shape[3] = -4)                        \
    X("batch-mismatch", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                   \
      "v.shape[0] (batch) must equal q.shape[0] = 2, got 1", f->a.v.t.shape[0] = 1)                \
    X("head-dim-mismatch", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                \
      "k.shape[3] (head dim) must equal q.shape[3] = 8, got 9", f->a.k.t.shape[3] = BAD_D + 1)     \
    X("kv-heads-mismatch", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                \
      "v.shape[1] (heads) must equal k.shape[1] = 2, got 1", f->a.v.t.shape[1] = 1)                \
    X("kv-seq-mismatch", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                  \
      "v.shape[2] (seq) must equal k.shape[2] = 7, got 6", f->a.v.t.shape[2] = BAD_NK - 1)         \
    X("heads-not-multiple", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                               \
      "q.shape[1] (heads) = 3 must be a multiple of k.shape[1]", f->a.q.t.shape[1] = 3;            \
      f->a.out.t.shape[1] = 3; f->a.lse.t.shape[1] = 3)                                            \
    X("out-shape", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                        \
      "out.shape[3] (head dim) must equal v.shape[3] = 6, got 8", f->a.out.t.shape[3] = BAD_D)     \
    X("lse-shape", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "lse.shape[3] must be 1, got 2",       \
      f->a.lse.t.shape[3] = 2)                                                                     \
    X("lse-shape-zero", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "lse.shape[3] must be 1, got 0",  \
      f->a.lse.t.shape[3] = 0)                                                                     \
    X("head-dim-too-large", BAD_FORWARD, MFA_ERROR_UNSUPPORTED,                                    \
      "q.shape[3] (head dim) = 1048576 exceeds the cpu backend's maximum",                         \
      f->a.q.t.shape[3] = f->a.k.t.shape[3] = (int64_t)1 << 20;                                    \
      f->a.q.t.strides[3] = f->a.k.t.strides[3] = 0)                                               \
    X("element-count-overflow", BAD_FORWARD, MFA_ERROR_SIZE_OVERFLOW,                              \
      "q: element offsets of shape", f->a.q.t.shape[0] = (int64_t)1 << 40;                         \
      f->a.q.t.shape[2] = (int64_t)1 << 40; f->a.q.t.strides[0] = f->a.q.t.strides[2] = 0)         \
    X("offset-overflow", BAD_FORWARD, MFA_ERROR_SIZE_OVERFLOW, "overflow 64 bits",                 \
      f->a.k.t.strides[2] = INT64_MAX / 2)                                                         \
    X("offset-int64-max", BAD_FORWARD, MFA_ERROR_SIZE_OVERFLOW,                                    \
      "k: the byte range of the tensor (element offsets 0 to 9223372036854775807)",                \
      f->a.k.t.strides[2] = (INT64_MAX - 175) / 6)                                                 \
    X("address-overflow", BAD_FORWARD, MFA_ERROR_SIZE_OVERFLOW, "v: the byte range of the tensor", \
      f->a.v.t.strides[0] = (int64_t)1 << 61)                                                      \
    X("address-negative", BAD_FORWARD, MFA_ERROR_SIZE_OVERFLOW,                                    \
      "does not fit in the address space", f->a.v.t.strides[1] = -((int64_t)1 << 60))              \
    X("misaligned", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                       \
      "k.data is not aligned to its element size (4 bytes)",                                       \
      f->a.k.t.data = (char*)f->a.k.t.data + 2)                                                    \
    X("output-broadcast", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                 \
      "out: stride 0 of dim 1 (heads) makes elements overlap", f->a.out.t.strides[1] = 0)          \
    X("output-self-overlap", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "makes elements overlap",    \
      f->a.out.t.strides[2] = 2)                                                                   \
    X("output-aliases-input", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "out overlaps q",           \
      f->a.out.t.data = f->a.q.t.data)                                                             \
    X("outputs-alias", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "out overlaps lse",                \
      f->a.lse.t.data = f->a.out.t.data)                                                           \
    X("output-strides-not-nested", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                        \
      "out: stride 150 of dim 0 (batch) makes elements overlap", out_distinct_but_not_nested(f))   \
    X("output-extent-interleaves", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "out overlaps q",      \
      out_interleaved_with_q(f))                                                                   \
    X("params-size", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "params.struct_size",                \
      f->params.struct_size = sizeof f->params - 8)                                                \
    X("scale-nan", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "params.scale must be finite",         \
      f->params.scale = NAN)                                                                       \
    X("scale-inf", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                        \
      "params.scale must be finite, got -inf", f->params.scale = -INFINITY)                        \
    X("causal-flag", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                      \
      "params.causal must be 0 or 1, got 2", f->params.causal = 2)                                 \
    X("alignment-unknown", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                \
      "params.alignment = 3 is not an mfa_alignment", f->params.alignment = (mfa_alignment)3)      \
    X("window-below-minus-one", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "got (-1, -5)",           \
      f->params.window_right = -5)                                                                 \
    X("backward-lse-null", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT, "lse is NULL",                \
      f->pass_lse = 0)                                                                             \
    X("backward-dout-shape", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT,                             \
      "dout.shape[2] (seq) must equal q.shape[2] = 5, got 6", f->a.dout.t.shape[2] = BAD_NQ + 1)   \
    X("backward-grad-dtype", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT, "dq.dtype must be f32",     \
      f->a.dq.t.dtype = MFA_DTYPE_F16)                                                             \
    X("backward-grad-aliases-input", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT, "dk overlaps k",    \
      f->a.dk.t.data = f->a.k.t.data)                                                              \
    X("backward-grads-alias", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT, "dq overlaps dv",          \
      f->a.dv.t.data = f->a.dq.t.data)                                                             \
    X("backward-grad-broadcast", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT,                         \
      "dv: stride 0 of dim 2 (seq) makes elements overlap", f->a.dv.t.strides[2] = 0)              \
    X("alloc-overflow", BAD_CALL, MFA_ERROR_SIZE_OVERFLOW, "rounded up to whole",                  \
      f->pointer = mfa_alloc(SIZE_MAX);                                                            \
      f->status = f->pointer == NULL ? MFA_ERROR_SIZE_OVERFLOW : MFA_OK)                           \
    X("args-null", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT, "args is NULL", f->pass_args = 0)      \
    X("args-size", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                        \
      "is larger than this library's mfa_attention_args", f->args.struct_size += 8)                \
    X("direction-unknown", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                \
      "direction = 2 is not an mfa_direction", f->direction = (mfa_direction)2)                    \
    X("forward-with-gradient", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                            \
      "dq is given to a forward call", f->args.dq = &f->arrays[0])                                 \
    X("array-data-and-buffer", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                            \
      "v.data and v.buffer are both set", f->arrays[2].buffer = f->arrays[2].data)                 \
    X("array-in-buffer-on-cpu", BAD_COMPUTE, MFA_ERROR_UNSUPPORTED,                                \
      "q is in a device buffer: the cpu backend takes host memory only",                           \
      f->arrays[0].buffer = f->arrays[0].data;                                                     \
      f->arrays[0].data = NULL)                                                                    \
    X("softcap-negative", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                 \
      "args.softcap must be finite and >= 0 (0 = none), got -1", f->args.softcap = -1.0f)          \
    X("mask-dtype", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                       \
      "args.mask.dtype must be f32 or bool",                                                       \
      f->args.mask = bad_input_extra(f, MFA_DTYPE_I32, BAD_B, BAD_HQ, BAD_NQ, BAD_NK))             \
    X("mask-shape", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                       \
      "args.mask.shape[2] (query) must equal q.shape[2] = 5 or be 1, got 4",                       \
      f->args.mask = bad_input_extra(f, MFA_DTYPE_BOOL, BAD_B, BAD_HQ, BAD_NQ - 1, BAD_NK))        \
    X("mask-aliases-output", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT, "out overlaps args.mask",    \
      f->args.mask = bad_input_extra(f, MFA_DTYPE_F32, 1, 1, BAD_NQ, BAD_NK);                      \
      f->extra_arrays[0].data = f->a.out.storage)                                                  \
    X("block-mask-without-mask", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                          \
      "args.block_mask is given without args.mask",                                                \
      f->args.block_mask = bad_input_extra(f, MFA_DTYPE_BOOL, BAD_B, BAD_HQ, 1, 1))                \
    X("alibi-shape", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                      \
      "args.alibi_slopes.shape[1] (heads) must equal q.shape[1] = 4, got 2",                       \
      f->args.alibi_slopes = bad_input_extra(f, MFA_DTYPE_F32, 1, BAD_HQ / 2, 1, 1))               \
    X("sinks-dtype", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                      \
      "args.sinks.dtype must be f32 (sinks are f32), got f16",                                     \
      f->args.sinks = bad_input_extra(f, MFA_DTYPE_F16, 1, BAD_HQ, 1, 1))                          \
    X("varlen-offsets-missing", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                           \
      "args.cu_seqlens_k is NULL; packed sequences need",                                          \
      f->args.cu_seqlens_q = bad_input_extra(f, MFA_DTYPE_I32, 1, 1, 1, 3))                        \
    X("softcap-nan", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                      \
      "args.softcap must be finite and >= 0 (0 = none), got nan", f->args.softcap = NAN)           \
    X("softcap-inf", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                      \
      "args.softcap must be finite and >= 0 (0 = none), got inf", f->args.softcap = INFINITY)      \
    X("mask-dtype-other-float", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                           \
      "args.mask.dtype must be f32 or bool (boolean, or additive in f32 or q's dtype), got f16",   \
      f->args.mask = bad_input_extra(f, MFA_DTYPE_F16, 1, 1, BAD_NQ, BAD_NK))                      \
    X("mask-not-broadcastable", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                           \
      "args.mask.shape[1] (heads) must equal q.shape[1] = 4 or be 1, got 2",                       \
      f->args.mask = bad_input_extra(f, MFA_DTYPE_BOOL, 1, BAD_HQ / 2, BAD_NQ, BAD_NK))            \
    X("block-mask-shape", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                 \
      "args.block_mask.shape[2] (query) must equal ceil(Nq / MFA_MASK_BLOCK) = 1, got 2",          \
      f->args.mask = bad_input_extra(f, MFA_DTYPE_BOOL, 1, 1, BAD_NQ, BAD_NK);                     \
      f->args.block_mask = bad_input_extra(f, MFA_DTYPE_BOOL, 1, 1, 2, 1))                         \
    X("alibi-dtype", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                      \
      "args.alibi_slopes.dtype must be f32 (ALiBi slopes are f32), got bf16",                      \
      f->args.alibi_slopes = bad_input_extra(f, MFA_DTYPE_BF16, 1, BAD_HQ, 1, 1))                  \
    X("sinks-shape", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                      \
      "args.sinks.shape[1] (heads) must equal q.shape[1] = 4, got 2",                              \
      f->args.sinks = bad_input_extra(f, MFA_DTYPE_F32, 1, BAD_HQ / 2, 1, 1))                      \
    X("dsinks-without-sinks", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                             \
      "args.dsinks is given without args.sinks", bad_input_dsinks(f);                              \
      f->args.sinks = NULL)                                                                        \
    X("dsinks-aliases-output", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT, "dq overlaps args.dsinks", \
      bad_input_dsinks(f);                                                                         \
      f->extra_arrays[1].data = f->a.dq.storage)                                                   \
    X("varlen-offsets-decrease", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                          \
      "args.cu_seqlens_q decreases at entry 1: -1 after 0", bad_input_packed(f);                   \
      ((int32_t*)f->extra_arrays[0].data)[1] = -1)                                                 \
    X("varlen-offsets-length", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                            \
      "args.cu_seqlens_k.shape[3] (offsets) must equal args.cu_seqlens_q.shape[3] = 3, got 2",     \
      bad_input_packed(f);                                                                         \
      f->extra_arrays[1].shape[3] = 2)                                                             \
    X("varlen-offsets-beyond", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                            \
      "args.cu_seqlens_k[2] = 15 must equal the packed length k.shape[2] = 14",                    \
      bad_input_packed(f);                                                                         \
      ((int32_t*)f->extra_arrays[1].data)[2] = 2 * BAD_NK + 1)                                     \
    X("varlen-sequence-too-long", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                         \
      "args.cu_seqlens_q: sequence 0 has 5 queries, more than args.max_seqlen_q = 4",              \
      bad_input_packed(f);                                                                         \
      f->args.max_seqlen_q = BAD_NQ - 1)                                                           \
    X("varlen-max-seqlen", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                \
      "args.max_seqlen_k must be in [1, 2^31 - 1]", bad_input_packed(f);                           \
      f->args.max_seqlen_k = 0)                                                                    \
    X("paged-block-size", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                                 \
      "k.shape[2] (block size) must be a multiple of 8 from 8 to 256 with a paged KV cache, got "  \
      "12",                                                                                        \
      bad_input_paged(f, 12, 0))                                                                   \
    X("paged-block-size-too-large", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                       \
      "must be a multiple of 8 from 8 to 256 with a paged KV cache, got 264",                      \
      bad_input_paged(f, 264, 0))                                                                  \
    X("paged-block-out-of-range", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                         \
      "args.block_table[1, 1] = 4 is not a block of the cache: k.shape[0] = 4 blocks",             \
      bad_input_paged(f, 8, 1);                                                                    \
      ((int32_t*)f->extra_arrays[2].data)[3] = 4)                                                  \
    X("paged-length-beyond-cache", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                        \
      "args.cache_seqlens[1] = 17 plus 0 new keys exceeds the capacity of a sequence, "            \
      "args.block_table.shape[3] * block_size = 2 * 8 = 16",                                       \
      bad_input_paged(f, 8, 0);                                                                    \
      ((int32_t*)f->extra_arrays[3].data)[1] = 17)                                                 \
    X("paged-append-beyond-cache", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                        \
      "args.cache_seqlens[1] = 15 plus 2 new keys exceeds the capacity of a sequence",             \
      bad_input_paged(f, 8, 1);                                                                    \
      ((int32_t*)f->extra_arrays[3].data)[1] = 15)                                                 \
    X("paged-block-written-twice", BAD_COMPUTE, MFA_ERROR_INVALID_ARGUMENT,                        \
      "args.block_table: block 0 receives new keys at [0, 0] and at [1, 1]",                       \
      bad_input_paged(f, 8, 1);                                                                    \
      ((int32_t*)f->extra_arrays[3].data)[0] = 6; ((int32_t*)f->extra_arrays[2].data)[3] = 0)      \
    X("merge-part-shape", BAD_MERGE, MFA_ERROR_INVALID_ARGUMENT,                                   \
      "outs[1].shape[2] (seq) must equal outs[0].shape[2] = 5, got 4", bad_input_merge(f);         \
      f->extra_arrays[0].shape[2] = BAD_NQ - 1)                                                    \
    X("merge-lse-shape", BAD_MERGE, MFA_ERROR_INVALID_ARGUMENT,                                    \
      "lses[1].shape[1] (heads) must equal outs[0].shape[1] = 4, got 2", bad_input_merge(f);       \
      f->extra_arrays[1].shape[1] = BAD_HQ / 2)                                                    \
    X("merge-out-shape", BAD_MERGE, MFA_ERROR_INVALID_ARGUMENT,                                    \
      "out.shape[3] (head dim) must equal outs[0].shape[3] = 6, got 5", bad_input_merge(f);        \
      f->extra_arrays[2].shape[3] = BAD_DV - 1)                                                    \
    X("merge-count", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "count must be >= 1, got 0",            \
      f->status = mfa_attention_merge(bad_input_cpu_context, 0, NULL, NULL, NULL, NULL))           \
    X("summary-seq", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "seq_q must be >= 1, got 0",            \
      f->status = mfa_mask_summarize(bad_input_cpu_context, NULL, 0, 1, NULL))

/* More rows of the same rules on other arguments, dimensions and values, which the document
 * leaves to the rows above. */
#define BAD_INPUTS_MORE(X)                                                                         \
    X("dtype-unknown-7", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "not an mfa_dtype",              \
      f->a.q.t.dtype = (mfa_dtype)7)                                                               \
    X("out-dtype-f16", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "out.dtype must be f32",           \
      f->a.out.t.dtype = MFA_DTYPE_F16)                                                            \
    X("head-dim-mismatch-smaller", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                        \
      "k.shape[3] (head dim) must equal q.shape[3] = 8", f->a.k.t.shape[3] = 4)                    \
    X("alignment-unknown-5", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "not an mfa_alignment",      \
      f->params.alignment = (mfa_alignment)5)                                                      \
    X("window-right-minus-seven", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                         \
      "window_left and window_right", f->params.window_right = -7)                                 \
    X("create-family-apple7-not-sim", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT,                        \
      "metal-sim backend only", f->status = bad_input_create(f, MFA_BACKEND_CPU, family_apple7))   \
    X("create-seed-7-not-sim", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "metal-sim backend only",     \
      f->status = bad_input_create(f, MFA_BACKEND_CPU, seed_7))                                    \
    X("q-null", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "q is NULL", f->pass_q = 0)               \
    X("v-null", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "v is NULL", f->pass_v = 0)               \
    X("q-data-null", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "q.data is NULL",                    \
      f->a.q.t.data = NULL)                                                                        \
    X("v-dtype", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "v.dtype must be f32",                   \
      f->a.v.t.dtype = MFA_DTYPE_BF16)                                                             \
    X("k-shape-negative", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                 \
      "k.shape[3] (head dim) must be >= 1, got -3", f->a.k.t.shape[3] = -3)                        \
    X("k-batch-mismatch", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                 \
      "k.shape[0] (batch) must equal q.shape[0] = 2, got 1", f->a.k.t.shape[0] = 1)                \
    X("out-seq", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                          \
      "out.shape[2] (seq) must equal q.shape[2] = 5", f->a.out.t.shape[2] = 7)                     \
    X("lse-heads", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                                        \
      "lse.shape[1] (heads) must equal q.shape[1] = 4", f->a.lse.t.shape[1] = 2)                   \
    X("scale-plus-inf", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "params.scale must be finite",    \
      f->params.scale = INFINITY)                                                                  \
    X("params-size-larger", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "params.struct_size",         \
      f->params.struct_size = sizeof f->params + 8)                                                \
    X("window-left-below-minus-one", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                      \
      "window_left and window_right", f->params.window_left = -2)                                  \
    X("output-broadcast-seq", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "makes elements overlap",   \
      f->a.out.t.strides[2] = 0)                                                                   \
    X("output-self-overlap-heads", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT,                        \
      "makes elements overlap", f->a.out.t.strides[1] = 3)                                         \
    X("output-aliases-q", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "out overlaps q",               \
      f->a.out.t.data = f->a.q.t.data)                                                             \
    X("outputs-overlap", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "overlaps",                      \
      f->a.lse.t.data = (char*)f->a.out.t.data + 4)                                                \
    X("element-count-overflow-strided", BAD_FORWARD, MFA_ERROR_SIZE_OVERFLOW, "overflow 64 bits",  \
      f->a.q.t.shape[0] = (int64_t)1 << 40;                                                        \
      f->a.q.t.strides[0] = (int64_t)1 << 40)                                                      \
    X("byte-count-overflow", BAD_FORWARD, MFA_ERROR_SIZE_OVERFLOW, "address space",                \
      f->a.k.t.strides[0] = INT64_MAX / 2)                                                         \
    X("address-negative-batch", BAD_FORWARD, MFA_ERROR_SIZE_OVERFLOW, "address space",             \
      f->a.k.t.strides[0] = -(INT64_MAX / 4))                                                      \
    X("misaligned-v", BAD_FORWARD, MFA_ERROR_INVALID_ARGUMENT, "not aligned",                      \
      f->a.v.t.data = (char*)f->a.v.t.data + 1)                                                    \
    X("backward-dout-head-dim", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT,                          \
      "dout.shape[3] (head dim) must equal v.shape[3] = 6", f->a.dout.t.shape[3] = 5)              \
    X("backward-dq-seq", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT,                                 \
      "dq.shape[2] (seq) must equal q.shape[2] = 5", f->a.dq.t.shape[2] = 4)                       \
    X("backward-dk-dtype", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT, "dk.dtype must be f32",       \
      f->a.dk.t.dtype = MFA_DTYPE_F16)                                                             \
    X("backward-dv-heads", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT,                               \
      "dv.shape[1] (heads) must equal v.shape[1] = 2", f->a.dv.t.shape[1] = 4)                     \
    X("backward-dv-aliases-dk", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT, "overlaps",              \
      f->a.dv.t.data = f->a.dk.t.data)                                                             \
    X("backward-dq-aliases-dout", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT, "dq overlaps dout",    \
      f->a.dout.t.data = f->a.dq.t.data)                                                           \
    X("backward-dk-data-null", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT, "dk.data is NULL",        \
      f->a.dk.t.data = NULL)                                                                       \
    X("backward-dk-broadcast", BAD_BACKWARD, MFA_ERROR_INVALID_ARGUMENT, "makes elements overlap", \
      f->a.dk.t.strides[0] = 0)                                                                    \
    X("caps-ctx-null", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "ctx is NULL",                        \
      f->status = mfa_context_capabilities(NULL, NULL))                                            \
    X("caps-size-zero", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "struct_size",                       \
      bad_input_caps.struct_size = 0;                                                              \
      f->status = mfa_context_capabilities(f->ctx, &bad_input_caps))                               \
    X("gpu-time-not-metal", BAD_CALL, MFA_ERROR_UNSUPPORTED, "metal backend only",                 \
      f->status = mfa_context_last_gpu_time(f->ctx, &f->seconds))                                  \
    X("gpu-time-ctx-null", BAD_CALL, MFA_ERROR_INVALID_ARGUMENT, "ctx is NULL",                    \
      f->status = mfa_context_last_gpu_time(NULL, &f->seconds))

typedef struct bad_input {
    const char* id;
    int documented; /* a row of docs/bad-inputs.md */
    bad_input_kind kind;
    mfa_status status;
    const char* text;
} bad_input;

#define BAD_INPUT_DOCUMENTED(id, kind, status, text, ...) {id, 1, kind, status, text},
#define BAD_INPUT_MORE(id, kind, status, text, ...)       {id, 0, kind, status, text},
static const bad_input bad_inputs[] = {BAD_INPUTS_DOCUMENTED(BAD_INPUT_DOCUMENTED)
                                           BAD_INPUTS_MORE(BAD_INPUT_MORE)};
#undef BAD_INPUT_DOCUMENTED
#undef BAD_INPUT_MORE
#define BAD_INPUT_COUNT ((int)(sizeof bad_inputs / sizeof bad_inputs[0]))

/* Breaks the fixture as row `index` says (and makes the row's own call). */
static void bad_input_break(int index, bad_input_fixture* f) {
    int i = 0;
#define BAD_INPUT_APPLY(id, kind, status, text, ...)                                               \
    if (index == i++) {                                                                            \
        __VA_ARGS__;                                                                               \
    }
    BAD_INPUTS_DOCUMENTED(BAD_INPUT_APPLY)
    BAD_INPUTS_MORE(BAD_INPUT_APPLY)
#undef BAD_INPUT_APPLY
}

#define BAD_INPUT_SENTINEL 0xA5

static void bad_input_poison(test_tensor* x) { memset(x->storage, BAD_INPUT_SENTINEL, x->bytes); }

static int bad_input_untouched(const test_tensor* x) {
    for (size_t i = 0; i < x->bytes; ++i)
        if (((const unsigned char*)x->storage)[i] != BAD_INPUT_SENTINEL) return 0;
    return 1;
}

/* Runs row `index` on ctx (f->ctx; rows of their own call choose theirs): the status and
 * message it states, no output byte written, no input byte changed, no array a row added
 * changed, no context left created. */
static void bad_input_run(int index, mfa_context* ctx) {
    const bad_input* row = &bad_inputs[index];
    bad_input_fixture f = bad_input_fixture_make();
    f.ctx = ctx;
    /* A message no row expects ("caps->struct_size = 0 ..."), so a row whose call forgot to set
     * its own cannot pass on a leftover one. */
    mfa_capabilities tiny;
    tiny.struct_size = 0;
    mfa_context_capabilities(bad_input_cpu_context, &tiny);
    bad_input_break(index, &f);
    test_tensor* inputs[] = {&f.a.q, &f.a.k, &f.a.v, &f.a.dout};
    unsigned char* before[4];
    for (int i = 0; i < 4; ++i) {
        before[i] = (unsigned char*)malloc(inputs[i]->bytes);
        memcpy(before[i], inputs[i]->storage, inputs[i]->bytes);
    }
    unsigned char* extras_before[BAD_EXTRAS];
    for (int i = 0; i < f.extra_count; ++i) {
        extras_before[i] = (unsigned char*)malloc(f.extras[i].bytes);
        memcpy(extras_before[i], f.extras[i].storage, f.extras[i].bytes);
    }
    mfa_status status = f.status;
    const int backward =
        row->kind == BAD_BACKWARD || (row->kind == BAD_COMPUTE && f.direction == MFA_BACKWARD);
    test_tensor* outputs[3] = {&f.a.out, &f.a.lse, NULL};
    if (backward) outputs[0] = &f.a.dq, outputs[1] = &f.a.dk, outputs[2] = &f.a.dv;
    if (row->kind != BAD_CALL && row->kind != BAD_MERGE)
        for (int i = 0; i < 3; ++i)
            if (outputs[i]) bad_input_poison(outputs[i]);
    if (row->kind == BAD_FORWARD) {
        status =
            mfa_attention_forward(f.ctx, &f.params, f.pass_q ? &f.a.q.t : NULL,
                                  f.pass_k ? &f.a.k.t : NULL, f.pass_v ? &f.a.v.t : NULL,
                                  f.pass_out ? &f.a.out.t : NULL, f.pass_lse ? &f.a.lse.t : NULL);
    } else if (row->kind == BAD_BACKWARD) {
        status = mfa_attention_backward(f.ctx, &f.params, &f.a.q.t, &f.a.k.t, &f.a.v.t, &f.a.out.t,
                                        &f.a.dout.t, f.pass_lse ? &f.a.lse.t : NULL, &f.a.dq.t,
                                        &f.a.dk.t, &f.a.dv.t);
    } else if (row->kind == BAD_COMPUTE) {
        f.args.q = &f.arrays[0], f.args.k = &f.arrays[1], f.args.v = &f.arrays[2];
        f.args.out = &f.arrays[3], f.args.lse = &f.arrays[4];
        if (backward) {
            f.args.dout = &f.arrays[5], f.args.dq = &f.arrays[6], f.args.dk = &f.arrays[7];
            f.args.dv = &f.arrays[8];
        }
        status = mfa_attention_compute(f.ctx, f.direction, &f.params, f.pass_args ? &f.args : NULL);
    } else if (row->kind == BAD_MERGE) {
        status = mfa_attention_merge(f.ctx, f.merge_count, f.merge_outs, f.merge_lses, f.merge_out,
                                     f.merge_lse);
    }
    for (int i = 0; i < 3 && row->kind != BAD_CALL && row->kind != BAD_MERGE; ++i)
        CHECK(!outputs[i] || bad_input_untouched(outputs[i]), "%s: an output was written", row->id);
    CHECK_ERROR(row->id, status, row->status, row->text);
    for (int i = 0; i < 4; ++i) {
        CHECK(memcmp(before[i], inputs[i]->storage, inputs[i]->bytes) == 0,
              "%s: an input was written", row->id);
        free(before[i]);
    }
    for (int i = 0; i < f.extra_count; ++i) {
        CHECK(memcmp(extras_before[i], f.extras[i].storage, f.extras[i].bytes) == 0,
              "%s: added array %d was written", row->id, i);
        free(extras_before[i]);
        test_tensor_free(&f.extras[i]);
    }
    CHECK(f.seconds == -1, "%s: the GPU time was written", row->id);
    mfa_free(f.pointer);
    if (f.created_context) {
        CHECK(f.created == NULL, "%s: a failed mfa_context_create did not set *out to NULL",
              row->id);
        if (f.created != NULL && f.created != (mfa_context*)&bad_input_options)
            mfa_context_destroy(f.created);
    }
    test_attention_free(&f.a);
}

/* Whether a row states a rule of the arguments alone, which every backend applies alike
 * (mfa.h: invalid arguments are reported before what a backend supports). */
static int bad_input_any_backend(const bad_input* row) {
    return (row->kind == BAD_COMPUTE || row->kind == BAD_MERGE) &&
           row->status != MFA_ERROR_UNSUPPORTED;
}

#endif
