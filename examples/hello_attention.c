/* The smallest complete use of libmfa from C: causal self-attention on a [1, 2, 64, 32] float
 * problem, forward and backward, on the best backend of this machine.
 *
 *   cc hello_attention.c $(pkg-config --cflags --libs mfa) -lm -o hello_attention
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "mfa.h"

enum { BATCH = 1, HEADS = 2, SEQ = 64, DIM = 32 };

/* A contiguous [B, H, N, D] float tensor over caller memory. */
static mfa_tensor bhsd(float* data, int64_t d) {
    mfa_tensor t = {data, MFA_DTYPE_F32, {BATCH, HEADS, SEQ, d}, {HEADS * SEQ * d, SEQ * d, d, 1}};
    return t;
}

static int fail(const char* what, mfa_status status) {
    fprintf(stderr, "%s failed: %s: %s\n", what, mfa_status_string(status), mfa_last_error());
    return 1;
}

int main(void) {
    const size_t n = (size_t)BATCH * HEADS * SEQ * DIM;
    float* buffers[8];
    for (int i = 0; i < 8; ++i) {
        buffers[i] = (float*)malloc(n * sizeof(float));
        if (!buffers[i]) return 1;
    }
    for (size_t i = 0; i < n; ++i) {
        buffers[0][i] = sinf(0.1f * (float)i);  /* q */
        buffers[1][i] = cosf(0.07f * (float)i); /* k */
        buffers[2][i] = sinf(0.05f * (float)i); /* v */
        buffers[4][i] = 1.0f;                   /* dout */
    }
    float lse_data[BATCH * HEADS * SEQ];
    mfa_tensor q = bhsd(buffers[0], DIM), k = bhsd(buffers[1], DIM), v = bhsd(buffers[2], DIM);
    mfa_tensor out = bhsd(buffers[3], DIM), dout = bhsd(buffers[4], DIM);
    mfa_tensor dq = bhsd(buffers[5], DIM), dk = bhsd(buffers[6], DIM), dv = bhsd(buffers[7], DIM);
    mfa_tensor lse = {lse_data, MFA_DTYPE_F32, {BATCH, HEADS, SEQ, 1}, {HEADS * SEQ, SEQ, 1, 1}};

    mfa_context* ctx;
    mfa_status status = mfa_context_create(MFA_BACKEND_AUTO, NULL, &ctx);
    if (status != MFA_OK) return fail("mfa_context_create", status);
    printf("libmfa %s on %s (%s)\n", mfa_version_string(),
           mfa_backend_name(mfa_context_backend(ctx)), mfa_context_device_name(ctx));

    mfa_attention_params params;
    mfa_attention_params_init(&params);
    params.causal = 1;
    status = mfa_attention_forward(ctx, &params, &q, &k, &v, &out, &lse);
    if (status != MFA_OK) return fail("mfa_attention_forward", status);
    status = mfa_attention_backward(ctx, &params, &q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv);
    if (status != MFA_OK) return fail("mfa_attention_backward", status);

    /* Row 0 sees only key 0: its output is v[0] exactly and its log-sum-exp is its one score. */
    double score = 0;
    for (int d = 0; d < DIM; ++d) score += (double)buffers[0][d] * buffers[1][d];
    score /= sqrt((double)DIM);
    printf("out[0, 0, 0, :3] = %.5f %.5f %.5f (v[0] = %.5f %.5f %.5f)\n",
           out.data ? buffers[3][0] : 0, buffers[3][1], buffers[3][2], buffers[2][0], buffers[2][1],
           buffers[2][2]);
    printf("lse[0, 0, 0] = %.6f (expected %.6f)\n", lse_data[0], score);
    int ok = fabs(buffers[3][0] - buffers[2][0]) < 1e-6 && fabs(lse_data[0] - score) < 1e-5;
    mfa_context_destroy(ctx);
    for (int i = 0; i < 8; ++i) free(buffers[i]);
    puts(ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
}
