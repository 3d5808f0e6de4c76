/* mfa_attention_compute on every available backend, for the dense problems the 0.1 calls also
 * express: forward (out, lse) and backward (dq, dk, dv) against the float64 reference of
 * test_reference.h, through compute and through mfa_attention_forward / _backward, each checked
 * against the reference (not against each other). And the ABI promise of mfa_attention_args:
 * its first release's layout, a newer program's larger struct and a smaller one, and what
 * mfa_attention_args_init writes for each size. */
#include "test_reference.h"
#include "test_util.h"

static const test_problem configs[] = {
    {"f32 causal bottom-right Nq < Nk", MFA_DTYPE_F32, 2, 2, 2, 9, 17, 16, 16, 1,
     MFA_ALIGN_BOTTOM_RIGHT, -1, -1, TEST_BHSD, 0},
    {"f16 GQA window top-left", MFA_DTYPE_F16, 1, 4, 2, 13, 11, 8, 8, 0, MFA_ALIGN_TOP_LEFT, 3, 2,
     TEST_BSHD, 0},
    {"bf16 Dv != D, reversed rows", MFA_DTYPE_BF16, 1, 2, 1, 7, 20, 16, 8, 1, MFA_ALIGN_TOP_LEFT, 5,
     -1, TEST_REVERSED, 0},
};

/* The nine arrays of a test_attention, and args pointing at them. */
typedef struct arrays {
    mfa_array q, k, v, out, lse, dout, dq, dk, dv;
} arrays;

static void arrays_of(const test_attention* a, arrays* x, mfa_attention_args* args,
                      mfa_direction direction) {
    x->q = test_array_of(&a->q.t), x->k = test_array_of(&a->k.t), x->v = test_array_of(&a->v.t);
    x->out = test_array_of(&a->out.t), x->lse = test_array_of(&a->lse.t),
    x->dout = test_array_of(&a->dout.t);
    x->dq = test_array_of(&a->dq.t), x->dk = test_array_of(&a->dk.t),
    x->dv = test_array_of(&a->dv.t);
    mfa_attention_args_init(args, sizeof *args);
    args->q = &x->q, args->k = &x->k, args->v = &x->v, args->out = &x->out, args->lse = &x->lse;
    if (direction == MFA_BACKWARD) {
        args->dout = &x->dout, args->dq = &x->dq, args->dk = &x->dk, args->dv = &x->dv;
    }
}

static void check(const char* label, const char* what, const test_tensor* got, mfa_dtype dtype,
                  const double* want, const double* magnitude, int64_t reduction,
                  double max_score) {
    char why[256];
    CHECK(ref_compare(&got->t, dtype, want, magnitude, reduction, max_score, why, sizeof why),
          "%s: %s: %s", label, what, why);
}

/* Forward and backward of one configuration, through entry point `via` (0: compute, 1: the 0.1
 * calls), against the reference read from the stored inputs. */
static void run_config(mfa_context* ctx, const char* backend, const test_problem* c, int via) {
    char label[200];
    snprintf(label, sizeof label, "%s: %s via %s", backend, c->name,
             via ? "mfa_attention_forward/backward" : "mfa_attention_compute");
    test_attention a =
        test_attention_make(c->dtype, c->b, c->hq, c->hkv, c->nq, c->nk, c->d, c->dv, c->layout);
    const mfa_attention_params params =
        test_params(c->causal, c->alignment, c->left, c->right, c->scale);
    test_fill_nan(&a.out);
    test_fill_nan(&a.lse);
    arrays x;
    mfa_attention_args args;
    mfa_status status;
    if (via == 0) {
        arrays_of(&a, &x, &args, MFA_FORWARD);
        status = mfa_attention_compute(ctx, MFA_FORWARD, &params, &args);
    } else {
        status = mfa_attention_forward(ctx, &params, &a.q.t, &a.k.t, &a.v.t, &a.out.t, &a.lse.t);
    }
    CHECK(status == MFA_OK, "%s: forward failed: %s", label, mfa_last_error());
    const ref_problem problem = ref_problem_of(&a.q.t, &a.k.t, &a.v.t, &params);
    ref_result want = ref_forward(&problem, &a.q.t, &a.k.t, &a.v.t);
    check(label, "out", &a.out, c->dtype, want.out, want.out_mag, c->nk, want.max_score);
    check(label, "lse", &a.lse, MFA_DTYPE_F32, want.lse, want.lse_mag, c->nk, want.max_score);

    test_fill_nan(&a.dq);
    test_fill_nan(&a.dk);
    test_fill_nan(&a.dv);
    if (via == 0) {
        arrays_of(&a, &x, &args, MFA_BACKWARD);
        status = mfa_attention_compute(ctx, MFA_BACKWARD, &params, &args);
    } else {
        status = mfa_attention_backward(ctx, &params, &a.q.t, &a.k.t, &a.v.t, &a.out.t, &a.dout.t,
                                        &a.lse.t, &a.dq.t, &a.dk.t, &a.dv.t);
    }
    CHECK(status == MFA_OK, "%s: backward failed: %s", label, mfa_last_error());
    /* The gradients of the forward as stored, which is what the backward reads. */
    ref_result grads =
        ref_backward(&problem, &a.q.t, &a.k.t, &a.v.t, &a.out.t, &a.dout.t, &a.lse.t, NULL);
    const int64_t longest = c->nk > c->nq ? c->nk : c->nq;
    check(label, "dq", &a.dq, c->dtype, grads.dq, grads.dq_mag, longest, grads.max_score);
    check(label, "dk", &a.dk, c->dtype, grads.dk, grads.dk_mag, longest * c->hq, grads.max_score);
    check(label, "dv", &a.dv, c->dtype, grads.dv, grads.dv_mag, longest * c->hq, grads.max_score);
    ref_free(&grads);
    ref_free(&want);
    test_attention_free(&a);
}

/* ---- mfa_attention_args sizes ---------------------------------------------------------------- */

/* mfa_attention_args as libmfa 0.2.0, its first release, laid it out. */
typedef struct args_0_2_0 {
    size_t struct_size;
    float softcap;
    int32_t initial_state;
    int64_t max_seqlen_q;
    int64_t max_seqlen_k;
    const mfa_array *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    const mfa_array *mask, *block_mask, *alibi_slopes, *sinks, *dsinks;
    const mfa_array *cu_seqlens_q, *cu_seqlens_k;
    const mfa_array *block_table, *cache_seqlens, *k_new, *v_new;
} args_0_2_0;

typedef struct args_next {
    args_0_2_0 first;
    int64_t appended;
} args_next;

static int all_bytes(const void* p, size_t from, size_t to, unsigned char byte) {
    for (size_t i = from; i < to; ++i)
        if (((const unsigned char*)p)[i] != byte) return 0;
    return 1;
}

static void test_args_sizes(mfa_context* ctx) {
    enum { B = 1, HQ = 2, HKV = 1, NQ = 5, NK = 9, D = 4, DV = 3 };
    test_attention a = test_attention_make(MFA_DTYPE_F32, B, HQ, HKV, NQ, NK, D, DV, TEST_BHSD);
    arrays x;
    mfa_attention_args current;
    arrays_of(&a, &x, &current, MFA_FORWARD);

    /* A 0.2.0 program's struct, set by hand and exactly sized (AddressSanitizer builds catch a
     * read past it), is read: the result matches the reference. */
    args_0_2_0* old = (args_0_2_0*)calloc(1, sizeof *old);
    old->struct_size = sizeof *old;
    old->q = &x.q, old->k = &x.k, old->v = &x.v, old->out = &x.out, old->lse = &x.lse;
    test_fill_nan(&a.out);
    CHECK(mfa_attention_compute(ctx, MFA_FORWARD, NULL,
                                (const mfa_attention_args*)(const void*)old) == MFA_OK,
          "0.2.0 args rejected: %s", mfa_last_error());
    const ref_problem problem = ref_problem_of(&a.q.t, &a.k.t, &a.v.t, NULL);
    ref_result want = ref_forward(&problem, &a.q.t, &a.k.t, &a.v.t);
    check("0.2.0 args", "out", &a.out, MFA_DTYPE_F32, want.out, want.out_mag, NK, want.max_score);
    ref_free(&want);

    /* A newer program's struct (a field appended) is refused, naming the struct. */
    args_next* newer = (args_next*)calloc(1, sizeof *newer);
    newer->first = *old;
    newer->first.struct_size = sizeof *newer;
    test_fill_nan(&a.out);
    CHECK(mfa_attention_compute(ctx, MFA_FORWARD, NULL,
                                (const mfa_attention_args*)(const void*)newer) ==
              MFA_ERROR_INVALID_ARGUMENT,
          "args larger than the library's accepted");
    CHECK(strstr(mfa_last_error(), "args.struct_size") &&
              strstr(mfa_last_error(), "mfa_attention_args") &&
              strstr(mfa_last_error(), "newer mfa.h"),
          "message: %s", mfa_last_error());
    CHECK(all_bytes(a.out.storage, 0, a.out.bytes, 0xff), "out written by a refused call");

    /* Smaller than the first release's: no release had it. */
    old->struct_size = sizeof *old - sizeof(void*);
    CHECK(mfa_attention_compute(ctx, MFA_FORWARD, NULL,
                                (const mfa_attention_args*)(const void*)old) ==
              MFA_ERROR_INVALID_ARGUMENT,
          "args smaller than 0.2.0's accepted");
    CHECK(strstr(mfa_last_error(), "libmfa 0.2.0") &&
              strstr(mfa_last_error(), "mfa_attention_args_init()"),
          "message: %s", mfa_last_error());
    CHECK(all_bytes(a.out.storage, 0, a.out.bytes, 0xff), "out written by a refused call");
    CHECK(sizeof(args_0_2_0) == sizeof(mfa_attention_args),
          "mfa.h grew mfa_attention_args: this test's newer-program case now needs the layout "
          "of the release that adds the field");

    /* The sized init: zeros and struct_size in exactly the caller's bytes. */
    const size_t big = sizeof(mfa_attention_args) + 16;
    unsigned char* bytes = (unsigned char*)malloc(big + 8);
    memset(bytes, 0xEE, big + 8);
    mfa_attention_args_init((mfa_attention_args*)(void*)bytes, big);
    size_t size;
    memcpy(&size, bytes, sizeof size);
    CHECK(size == big && all_bytes(bytes, sizeof size, big, 0) &&
              all_bytes(bytes, big, big + 8, 0xEE),
          "init of a larger struct: struct_size %zu, or bytes wrong", size);
    CHECK(mfa_attention_compute(ctx, MFA_FORWARD, NULL, (const mfa_attention_args*)(void*)bytes) ==
              MFA_ERROR_INVALID_ARGUMENT,
          "a larger struct, even zero-filled, must be refused");
    const size_t small = 40;
    memset(bytes, 0xEE, big + 8);
    mfa_attention_args_init((mfa_attention_args*)(void*)bytes, small);
    memcpy(&size, bytes, sizeof size);
    CHECK(size == small && all_bytes(bytes, sizeof size, small, 0) &&
              all_bytes(bytes, small, big + 8, 0xEE),
          "init of a smaller struct wrote past it (struct_size %zu)", size);
    memset(bytes, 0xEE, big + 8);
    mfa_attention_args_init((mfa_attention_args*)(void*)bytes, sizeof(size_t) - 1);
    CHECK(all_bytes(bytes, 0, big + 8, 0xEE), "init of a struct too small for struct_size wrote");
    mfa_attention_args_init(NULL, sizeof(mfa_attention_args));

    free(bytes);
    free(newer);
    free(old);
    test_attention_free(&a);
}

static void run_backend(mfa_context* ctx, mfa_backend backend) {
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; ++c)
        for (int via = 0; via < 2; ++via)
            run_config(ctx, mfa_backend_name(backend), &configs[c], via);
    if (backend == MFA_BACKEND_CPU) test_args_sizes(ctx);
}

int main(void) {
    test_each_backend(NULL, run_backend);
    return test_finish("test_compute");
}
