/*
 * The contract between libmfa's core (validation, errors, dispatch) and its backends.
 *
 * The core validates every argument of a public call and turns it into an mfa_problem: a
 * normalized, already-checked description in which defaults are resolved and the alignment,
 * causal mask and window are one visibility band. A backend therefore never re-validates and
 * never sees an mfa_attention_params or an mfa_tensor. Plain C so the Objective-C host can
 * include it.
 */
#ifndef MFA_CORE_BACKEND_H
#define MFA_CORE_BACKEND_H

#include "mfa.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A validated strided view. Element (b, h, s, d) is at
 * data + elem_size * (b*stride[0] + h*stride[1] + s*stride[2] + d*stride[3]). */
typedef struct mfa_view {
    char* data;
    int64_t stride[4];
} mfa_view;

/* Visibility of key j from query i, for every backend, is one band of diagonals:
 *   visible(i, j) = band_lo <= j - i <= band_hi        (0 <= i < seq_q, 0 <= j < seq_k)
 * The core derives it once from mfa.h's rule (alignment, causal, window) and clamps both ends to
 * [-seq_q, seq_k]. Clamping changes no visibility, since every j - i lies strictly inside that
 * range; it makes "unbounded" an ordinary value, keeps i + band_lo and j - band_hi from
 * overflowing, and lets the kernels take the band as 32-bit integers. Backends use it as is. */
typedef struct mfa_problem {
    mfa_dtype dtype; /* q, k, v, out, dout, dq, dk, dv */
    int64_t batch;
    int64_t heads_q;
    int64_t heads_kv; /* divides heads_q; query head h reads kv head h / group */
    int64_t group;    /* heads_q / heads_kv */
    int64_t seq_q;
    int64_t seq_k;
    int64_t head_dim;   /* D */
    int64_t head_dim_v; /* Dv */
    float scale;        /* resolved: never 0, always finite */
    int64_t band_lo;    /* lowest visible j - i; in [-seq_q, seq_k] */
    int64_t band_hi;    /* highest visible j - i; in [-seq_q, seq_k] */
    mfa_view q, k, v, out;
    mfa_view lse;              /* f32, stride[3] unused; data NULL when not requested (forward) */
    mfa_view dout, dq, dk, dv; /* backward only */
} mfa_problem;

/* What a backend implements. `state` is the backend's per-context object. Entry points are
 * called concurrently from many threads with the same state; they must be thread-safe.
 * Errors are reported with mfa_set_error() and returned as a status. */
typedef struct mfa_backend_ops {
    mfa_backend backend;
    int (*available)(void); /* usable on this machine */
    mfa_status (*create)(const mfa_context_options* options, void** state);
    void (*destroy)(void* state);
    const char* (*device_name)(void* state);
    void (*capabilities)(void* state, mfa_capabilities* caps); /* full struct, core copies */
    mfa_status (*forward)(void* state, const mfa_problem* problem);
    mfa_status (*backward)(void* state, const mfa_problem* problem);
    /* Optional; NULL where the backend records no GPU time. Seconds the GPU spent on the most
     * recently completed call (mfa_context_last_gpu_time); seconds is never NULL. Fails with
     * MFA_ERROR_INVALID_ARGUMENT while no call has completed. */
    mfa_status (*last_gpu_time)(void* state, double* seconds);
} mfa_backend_ops;

/* The backends compiled into this library; NULL where a backend was not built. */
const mfa_backend_ops* mfa_cpu_backend_ops(void);
const mfa_backend_ops* mfa_metal_backend_ops(void);
const mfa_backend_ops* mfa_metal_sim_backend_ops(void);

/* Record an error for the calling thread (printf-style) and return status, so a backend can
 * write `return mfa_set_error(MFA_ERROR_DEVICE, "...", ...);`. */
mfa_status mfa_set_error(mfa_status status, const char* format, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* MFA_CORE_BACKEND_H */
