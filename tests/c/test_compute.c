/* mfa_attention_compute on every available backend, for the dense problems the 0.1 calls also
 * express: forward (out, lse) and backward (dq, dk, dv) against the float64 reference of
 * test_reference.h, through compute and through mfa_attention_forward / _backward, each checked
 * against the reference (not against each other). mfa_attention_args' sizes are
 * test_abi_sizes.c's. */
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

static void run_backend(mfa_context* ctx, mfa_backend backend) {
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; ++c)
        for (int via = 0; via < 2; ++via)
            run_config(ctx, mfa_backend_name(backend), &configs[c], via);
}

int main(void) {
    test_each_backend(NULL, run_backend);
    return test_finish("test_compute");
}
