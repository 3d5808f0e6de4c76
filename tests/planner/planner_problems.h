/*
 * planner_problems.h - problems to plan, over dummy addresses: planning reads a view's strides
 * and whether it is present, never its memory. Shared by the planner's unit tests and
 * planner_variants.
 */
#ifndef MFA_TESTS_PLANNER_PROBLEMS_H
#define MFA_TESTS_PLANNER_PROBLEMS_H

#include <string.h>

#include "core/validate.h"

/* Distinct non-null addresses for the views of a problem. */
static char planner_problem_base[32];

static inline void contiguous(mfa_view* view, char* base, int64_t h, int64_t n, int64_t d) {
    view->data = base;
    view->stride[3] = 1;
    view->stride[2] = d;
    view->stride[1] = n * d;
    view->stride[0] = h * n * d;
}

/* A dense bhsd problem, bottom-right aligned, contiguous, with or without lse. */
static inline mfa_problem make_problem(mfa_dtype dtype, int64_t b, int64_t hq, int64_t hkv,
                                       int64_t nq, int64_t nk, int64_t d, int64_t dv,
                                       int with_lse) {
    char* base = planner_problem_base;
    mfa_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = dtype;
    p.batch = b;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.group = hq / hkv;
    p.seq_q = nq;
    p.seq_k = nk;
    p.head_dim = d;
    p.head_dim_v = dv;
    p.scale = 0.125f;
    mfa_visibility_band(nq, nk, nk - nq, -1, -1, &p.band_lo, &p.band_hi);
    contiguous(&p.q, base + 1, hq, nq, d);
    contiguous(&p.k, base + 2, hkv, nk, d);
    contiguous(&p.v, base + 3, hkv, nk, dv);
    contiguous(&p.out, base + 4, hq, nq, dv);
    contiguous(&p.lse, base + 5, hq, nq, 1);
    if (!with_lse) p.lse.data = NULL;
    contiguous(&p.dout, base + 6, hq, nq, dv);
    contiguous(&p.dq, base + 7, hq, nq, d);
    contiguous(&p.dk, base + 8, hkv, nk, d);
    contiguous(&p.dv, base + 9, hkv, nk, dv);
    return p;
}

#endif /* MFA_TESTS_PLANNER_PROBLEMS_H */
