/* The float64 attention reference of every C suite, written independently of libmfa: explicit
 * scores, softmax and gradients, one query row at a time, read straight from strided mfa_tensor
 * views (any dtype) through test_util.h, with the visibility rule of mfa.h, GQA and Dv != D, and
 * the score modifiers of mfa_attention_args (mask, softcap, ALiBi, sinks) as mfa.h defines them.
 * Packed and paged layouts are the caller's to cut into dense per-sequence views.
 *
 * Results are dense double arrays in [b][h][s][d] order. Alongside each result the reference
 * returns its "magnitude": the same sums taken over absolute values, which bounds how much fp32
 * rounding inside the library can move that element (see ref_allowed_error). */
#ifndef MFA_TEST_REFERENCE_H
#define MFA_TEST_REFERENCE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "mfa.h"
#include "test_util.h"

TEST_ORACLE_BEGIN

typedef struct ref_problem {
    int64_t batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v;
    double scale; /* already resolved: never 0 */
    int causal;
    mfa_alignment alignment;
    int64_t window_left, window_right; /* -1 = unbounded */
    /* Score modifiers (mfa.h, mfa_attention_args); zero / NULL where the call has none. */
    double softcap;         /* > 0: s = softcap * tanh(s / softcap) */
    const double* alibi;    /* slopes, [batch][heads_q] */
    const mfa_tensor* mask; /* BOOL (hides where 0) or additive; a size-1 axis broadcasts */
    const double* sinks;    /* logits, [heads_q] */
} ref_problem;

/* The problem of a call on q, k and v with params (NULL: the defaults), read from what the library
 * is given: shapes from the tensors, and scale 0 resolved as the library resolves its float
 * params.scale, to 1/sqrt(D) rounded to float. */
static ref_problem ref_problem_of(const mfa_tensor* q, const mfa_tensor* k, const mfa_tensor* v,
                                  const mfa_attention_params* params) {
    mfa_attention_params defaults;
    if (!params) {
        mfa_attention_params_init(&defaults);
        params = &defaults;
    }
    const ref_problem p = {
        q->shape[0],
        q->shape[1],
        k->shape[1],
        q->shape[2],
        k->shape[2],
        q->shape[3],
        v->shape[3],
        params->scale != 0 ? params->scale : (float)(1.0 / sqrt((double)q->shape[3])),
        params->causal,
        params->alignment,
        params->window_left,
        params->window_right};
    return p;
}

/* The visibility rule of mfa.h, restated; in 128 bits because windows may be as large as
 * INT64_MAX. */
static int ref_visible(const ref_problem* p, int64_t i, int64_t j) {
    const __int128 pos = i + (p->alignment == MFA_ALIGN_BOTTOM_RIGHT ? p->seq_k - p->seq_q : 0);
    if (p->causal && j > pos) return 0;
    if (p->window_left >= 0 && j < pos - (__int128)p->window_left) return 0;
    if (p->window_right >= 0 && j > pos + p->window_right) return 0;
    return 1;
}

typedef struct ref_result {
    double *out, *lse;             /* forward */
    double *dq, *dk, *dv, *dsinks; /* backward; dsinks [heads_q] with sinks */
    double *out_mag, *lse_mag, *dq_mag, *dk_mag, *dv_mag, *dsinks_mag;
    double max_score; /* largest |scaled score| seen: fp32 errors in it pass into P */
} ref_result;

static double* ref_zeros(int64_t n) {
    return (double*)calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

static void ref_free(ref_result* r) {
    double* all[] = {r->out,     r->lse,     r->dq,     r->dk,     r->dv,     r->dsinks,
                     r->out_mag, r->lse_mag, r->dq_mag, r->dk_mag, r->dv_mag, r->dsinks_mag};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

/* Element (b, h, i, j) of the mask, broadcast along its size-1 axes: for a boolean mask 1 where
 * the pair is visible and 0 where it is hidden; for an additive one its value. */
static double ref_mask_at(const mfa_tensor* m, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t at[4] = {m->shape[0] == 1 ? 0 : b, m->shape[1] == 1 ? 0 : h,
                           m->shape[2] == 1 ? 0 : i, m->shape[3] == 1 ? 0 : j};
    if (m->dtype == MFA_DTYPE_BOOL)
        return ((const uint8_t*)m->data)[test_offset(m, at[0], at[1], at[2], at[3])] != 0;
    return test_get(m, at[0], at[1], at[2], at[3]);
}

/* The aligned position p(i) of query row i. */
static int64_t ref_position(const ref_problem* p, int64_t i) {
    return i + (p->alignment == MFA_ALIGN_BOTTOM_RIGHT ? p->seq_k - p->seq_q : 0);
}

/* Scores of row (b, h, i) into s[] (-inf where hidden) through mfa.h's steps: scale, softcap,
 * ALiBi, the mask; and, where softcap is given, the tanh of the scaled dot product over softcap
 * into t[] and that argument's magnitude (sum_x |q_x k_x| |scale| / softcap) into arg_mag[]
 * (both may be NULL). Returns the row maximum, or NaN when a visible score is NaN, so
 * that NaN inputs propagate to the row's results. max_score tracks the largest finite |score|. */
static double ref_scores_t(const ref_problem* p, const mfa_tensor* q, const mfa_tensor* k,
                           int64_t b, int64_t h, int64_t i, double* s, double* t, double* arg_mag,
                           double* max_score) {
    const int64_t hk = h / (p->heads_q / p->heads_kv);
    double m = -INFINITY;
    for (int64_t j = 0; j < p->seq_k; ++j) {
        s[j] = -INFINITY;
        if (!ref_visible(p, i, j)) continue;
        if (p->mask && p->mask->dtype == MFA_DTYPE_BOOL && ref_mask_at(p->mask, b, h, i, j) == 0)
            continue;
        double dot = 0, dot_mag = 0;
        for (int64_t x = 0; x < p->head_dim; ++x) {
            const double product = test_get(q, b, h, i, x) * test_get(k, b, hk, j, x);
            dot += product;
            dot_mag += fabs(product);
        }
        double score = dot * p->scale;
        if (p->softcap > 0) {
            const double th = tanh(score / p->softcap);
            if (t) t[j] = th;
            if (arg_mag) arg_mag[j] = dot_mag * fabs(p->scale) / p->softcap;
            score = p->softcap * th;
        }
        if (p->alibi) {
            const int64_t distance = ref_position(p, i) - j;
            score -= p->alibi[b * p->heads_q + h] * (double)(distance < 0 ? -distance : distance);
        }
        if (p->mask && p->mask->dtype != MFA_DTYPE_BOOL) score += ref_mask_at(p->mask, b, h, i, j);
        s[j] = score;
        if (isfinite(s[j]) && fabs(s[j]) > *max_score) *max_score = fabs(s[j]);
        if (isnan(s[j]) || isnan(m))
            m = NAN;
        else if (s[j] > m)
            m = s[j];
    }
    return m;
}

static double ref_scores(const ref_problem* p, const mfa_tensor* q, const mfa_tensor* k, int64_t b,
                         int64_t h, int64_t i, double* s, double* max_score) {
    return ref_scores_t(p, q, k, b, h, i, s, NULL, NULL, max_score);
}

/* The sink logit of query head h, or -inf (no term) without sinks. */
static double ref_sink(const ref_problem* p, int64_t h) {
    return p->sinks ? p->sinks[h] : -INFINITY;
}

/* out and lse of the forward pass, the sink's e^t_h joining each row's denominator. Rows that
 * see no key: out 0, lse -inf (with a sink: lse = t_h). */
static ref_result ref_forward(const ref_problem* p, const mfa_tensor* q, const mfa_tensor* k,
                              const mfa_tensor* v) {
    ref_result r;
    memset(&r, 0, sizeof r);
    const int64_t rows = p->batch * p->heads_q * p->seq_q;
    r.out = ref_zeros(rows * p->head_dim_v);
    r.out_mag = ref_zeros(rows * p->head_dim_v);
    r.lse = ref_zeros(rows);
    r.lse_mag = ref_zeros(rows);
    double* s = ref_zeros(p->seq_k);
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t h = 0; h < p->heads_q; ++h) {
            const int64_t hk = h / (p->heads_q / p->heads_kv);
            const double sink = ref_sink(p, h);
            for (int64_t i = 0; i < p->seq_q; ++i) {
                const int64_t row = (b * p->heads_q + h) * p->seq_q + i;
                double m = ref_scores(p, q, k, b, h, i, s, &r.max_score);
                if (isnan(sink) || sink > m) m = sink;
                if (m == -INFINITY) {
                    r.lse[row] = -INFINITY;
                    continue;
                }
                double l = sink == -INFINITY ? 0 : exp(sink - m);
                for (int64_t j = 0; j < p->seq_k; ++j) l += exp(s[j] - m);
                r.lse[row] = m + log(l);
                /* lse = m + log(l) may cancel; l's relative error becomes an absolute one. */
                r.lse_mag[row] = fabs(m) + fabs(log(l)) + 1;
                for (int64_t j = 0; j < p->seq_k; ++j) {
                    const double pj = exp(s[j] - m) / l;
                    if (pj == 0) continue;
                    for (int64_t y = 0; y < p->head_dim_v; ++y) {
                        const double vy = test_get(v, b, hk, j, y);
                        r.out[row * p->head_dim_v + y] += pj * vy;
                        r.out_mag[row * p->head_dim_v + y] += pj * fabs(vy);
                    }
                }
            }
        }
    free(s);
    return r;
}

/* Stores a forward's out and lse into out [B, Hq, Nq, Dv] and lse [B, Hq, Nq, 1], rounded to
 * their dtypes: the given forward of a backward whose check must not depend on the library's
 * own forward. */
static void ref_store_forward(const ref_result* f, const mfa_tensor* out, const mfa_tensor* lse) {
    const int64_t dv = out->shape[3];
    int64_t row = 0;
    for (int64_t b = 0; b < out->shape[0]; ++b)
        for (int64_t h = 0; h < out->shape[1]; ++h)
            for (int64_t s = 0; s < out->shape[2]; ++s, ++row) {
                test_set(lse, b, h, s, 0, (float)f->lse[row]);
                for (int64_t y = 0; y < dv; ++y)
                    test_set(out, b, h, s, y, (float)f->out[row * dv + y]);
            }
}

/* dq, dk, dv as the backward contract defines them: P = exp(S - lse), delta = rowsum(dout * out),
 * dS = P (dP - delta), through the tanh of softcap (times 1 - tanh^2); with sinks, dsinks(h) =
 * -sum over b and i of exp(t_h - lse) * delta. Rows whose lse is -inf get no gradient. out and
 * lse are read from the given tensors (the stored forward, as the library's backward sees it)
 * or, where NULL, from `forward` (a ref_forward result): a test that passes NULL keeps the
 * library's own forward results out of its gradient reference. */
static ref_result ref_backward(const ref_problem* p, const mfa_tensor* q, const mfa_tensor* k,
                               const mfa_tensor* v, const mfa_tensor* out, const mfa_tensor* dout,
                               const mfa_tensor* lse, const ref_result* forward) {
    ref_result r;
    memset(&r, 0, sizeof r);
    const int64_t group = p->heads_q / p->heads_kv;
    r.dq = ref_zeros(p->batch * p->heads_q * p->seq_q * p->head_dim);
    r.dq_mag = ref_zeros(p->batch * p->heads_q * p->seq_q * p->head_dim);
    r.dk = ref_zeros(p->batch * p->heads_kv * p->seq_k * p->head_dim);
    r.dk_mag = ref_zeros(p->batch * p->heads_kv * p->seq_k * p->head_dim);
    r.dv = ref_zeros(p->batch * p->heads_kv * p->seq_k * p->head_dim_v);
    r.dv_mag = ref_zeros(p->batch * p->heads_kv * p->seq_k * p->head_dim_v);
    r.dsinks = ref_zeros(p->heads_q);
    r.dsinks_mag = ref_zeros(p->heads_q);
    double* s = ref_zeros(p->seq_k);
    double* t = ref_zeros(p->seq_k);
    double* arg_mag = ref_zeros(p->seq_k);
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t h = 0; h < p->heads_q; ++h) {
            const int64_t hk = h / group;
            for (int64_t i = 0; i < p->seq_q; ++i) {
                const int64_t row = (b * p->heads_q + h) * p->seq_q + i;
                const double lse_i = lse ? test_get(lse, b, h, i, 0) : forward->lse[row];
                const double m = ref_scores_t(p, q, k, b, h, i, s, t, arg_mag, &r.max_score);
                if (lse_i == -INFINITY || (m == -INFINITY && !p->sinks)) continue;
                double delta = 0, delta_mag = 0;
                for (int64_t y = 0; y < p->head_dim_v; ++y) {
                    const double out_y =
                        out ? test_get(out, b, h, i, y) : forward->out[row * p->head_dim_v + y];
                    const double x = test_get(dout, b, h, i, y) * out_y;
                    delta += x;
                    delta_mag += fabs(x);
                }
                if (p->sinks) {
                    const double p_sink = exp(p->sinks[h] - lse_i);
                    r.dsinks[h] -= p_sink * delta;
                    r.dsinks_mag[h] += p_sink * delta_mag;
                }
                for (int64_t j = 0; j < p->seq_k; ++j) {
                    const double pj = exp(s[j] - lse_i);
                    if (pj == 0) continue;
                    const int64_t krow = (b * p->heads_kv + hk) * p->seq_k + j;
                    double dp = 0, dp_mag = 0;
                    for (int64_t y = 0; y < p->head_dim_v; ++y) {
                        const double x = test_get(dout, b, h, i, y) * test_get(v, b, hk, j, y);
                        dp += x;
                        dp_mag += fabs(x);
                        r.dv[krow * p->head_dim_v + y] += pj * test_get(dout, b, h, i, y);
                        r.dv_mag[krow * p->head_dim_v + y] += pj * fabs(test_get(dout, b, h, i, y));
                    }
                    /* Through softcap, dS is multiplied by 1 - tanh^2 of arg = x / softcap. An
                     * error in arg, relative to its magnitude, changes that factor by 2 |tanh|
                     * times as much, relative to it: a softcap far below the scores (or a dot
                     * product that cancels) makes the gradient that ill-conditioned. */
                    const double chain = p->softcap > 0 ? 1 - t[j] * t[j] : 1;
                    const double chain_mag =
                        p->softcap > 0 ? chain * (1 + 2 * fabs(t[j]) * arg_mag[j]) : 1;
                    const double ds = pj * (dp - delta) * chain,
                                 ds_mag = pj * (dp_mag + delta_mag) * chain_mag;
                    for (int64_t x = 0; x < p->head_dim; ++x) {
                        const double kx = test_get(k, b, hk, j, x), qx = test_get(q, b, h, i, x);
                        r.dq[row * p->head_dim + x] += p->scale * ds * kx;
                        r.dq_mag[row * p->head_dim + x] += fabs(p->scale) * ds_mag * fabs(kx);
                        r.dk[krow * p->head_dim + x] += p->scale * ds * qx;
                        r.dk_mag[krow * p->head_dim + x] += fabs(p->scale) * ds_mag * fabs(qx);
                    }
                }
            }
        }
    free(s);
    free(t);
    free(arg_mag);
    return r;
}

/* Unit roundoff 2^-p of the storage dtype's p-bit significand. */
static double ref_unit_roundoff(mfa_dtype dtype) {
    switch (dtype) {
        case MFA_DTYPE_F16: return ldexp(1.0, -11);
        case MFA_DTYPE_BF16: return ldexp(1.0, -8);
        default: return ldexp(1.0, -24);
    }
}

/* Spacing of the storage dtype's subnormals: results smaller than this may round to 0. */
static double ref_underflow(mfa_dtype dtype) {
    switch (dtype) {
        case MFA_DTYPE_F16: return ldexp(1.0, -24);
        case MFA_DTYPE_BF16: return ldexp(1.0, -133);
        default: return ldexp(1.0, -149);
    }
}

/* The largest |got - want| accepted for an element whose absolute-value sum is `magnitude`:
 * inputs are exact in the reference (read back from storage), so the error is (a) rounding to
 * the storage dtype, once for the result (4 u * max|want|) and once for each probability or dS
 * fed to a second product on matrix hardware: u relative to each term of that product's sum,
 * so u * magnitude, which is far above u * |want| where the terms cancel (a dq whose dS of
 * nearly equal keys have opposite signs: found by the fuzzer, bf16, 2 keys, 200x cancellation),
 * 2 u * magnitude with a margin; plus (b) fp32 arithmetic over sums
 * of n terms, growing like a random walk (8 u32 sqrt(n)), on terms whose own error is amplified
 * by exp() of scores computed with relative error u32 (the 1 + max_score factor); plus (c)
 * the storage dtype's subnormal spacing, below which a result may round to 0, and that of
 * f32 once per term, for sums of subnormal fp32 terms (absolute, not relative, rounding). */
static double ref_allowed_error(mfa_dtype dtype, double max_abs_want, double magnitude,
                                int64_t reduction_length, double max_score) {
    const double u32 = ldexp(1.0, -24);
    return 4 * ref_unit_roundoff(dtype) * max_abs_want + 2 * ref_unit_roundoff(dtype) * magnitude +
           8 * u32 * sqrt((double)reduction_length) * (1 + max_score) * magnitude +
           ref_underflow(dtype) + (double)reduction_length * ref_underflow(MFA_DTYPE_F32);
}

static double ref_max_abs(const double* x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; ++i)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* Compare a library result (strided view t of logical shape [B, H, S, D]) with the reference:
 * within ref_allowed_error where the reference is finite, equal where it is infinite, NaN where
 * it is NaN. Writes a description of the first mismatch into why (size n) and returns 0 then. */
static int ref_compare(const mfa_tensor* t, mfa_dtype dtype, const double* want,
                       const double* magnitude, int64_t reduction_length, double max_score,
                       char* why, size_t n) {
    const int64_t count = test_element_count(t);
    const double max_want = ref_max_abs(want, count);
    int64_t at = 0;
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d, ++at) {
                    const double got = test_get(t, b, h, s, d);
                    const double allowed = ref_allowed_error(
                        dtype, max_want, magnitude ? magnitude[at] : fabs(want[at]),
                        reduction_length, max_score);
                    const int ok = isnan(want[at])      ? isnan(got)
                                   : isfinite(want[at]) ? fabs(got - want[at]) <= allowed
                                                        : got == want[at];
                    if (!ok) {
                        snprintf(why, n,
                                 "element [%lld, %lld, %lld, %lld] is %.9g, reference %.9g "
                                 "(allowed error %.3g)",
                                 (long long)b, (long long)h, (long long)s, (long long)d, got,
                                 want[at], allowed);
                        return 0;
                    }
                }
    return 1;
}

/* mfa_attention_merge as mfa.h defines it, in double, from `count` parts as stored: outs[i]
 * [B, H, N, Dv] and lses[i] [B, H, N, 1] (the sizes of outs[0]) into out [b][h][n][d] and lse
 * [b][h][n]. A part with lse -inf is left out (its out is not read); a NaN or +inf lse makes
 * the row NaN. */
static void ref_merge(int count, const mfa_tensor* const* outs, const mfa_tensor* const* lses,
                      double* out, double* lse) {
    const int64_t* shape = outs[0]->shape;
    const int64_t dv = shape[3];
    for (int64_t b = 0; b < shape[0]; ++b)
        for (int64_t h = 0; h < shape[1]; ++h)
            for (int64_t n = 0; n < shape[2]; ++n) {
                const int64_t row = (b * shape[1] + h) * shape[2] + n;
                double m = -INFINITY;
                int invalid = 0;
                for (int i = 0; i < count; ++i) {
                    const double l = test_get(lses[i], b, h, n, 0);
                    if (isnan(l) || l == INFINITY) invalid = 1;
                    if (l > m) m = l;
                }
                double total = 0;
                for (int i = 0; i < count && !invalid && m > -INFINITY; ++i)
                    total += exp(test_get(lses[i], b, h, n, 0) - m);
                lse[row] = invalid ? NAN : m == -INFINITY ? -INFINITY : m + log(total);
                for (int64_t d = 0; d < dv; ++d) {
                    double sum = 0;
                    for (int i = 0; i < count && !invalid && m > -INFINITY; ++i) {
                        const double l = test_get(lses[i], b, h, n, 0);
                        if (l > -INFINITY) sum += exp(l - m) * test_get(outs[i], b, h, n, d);
                    }
                    out[row * dv + d] = invalid ? NAN : m == -INFINITY ? 0.0 : sum / total;
                }
            }
}

/* A merge's result against ref_merge's: it is rounded once to its dtype from a double
 * computation, so within one unit of rounding of the dtype (2^-24 f32, 2^-11 f16, 2^-8 bf16
 * relative) of the reference, plus double's own error, negligible next to it. Values are
 * weighted averages of numbers in [-1, 1], so 2 u relative to max(|want|, 2^-10) covers
 * subnormal-free outputs (an infinite one, from infinite parts, must be exact); lse (NULL: not
 * compared) is f32, within 2^-23 relative. Writes the
 * first mismatch into why (size n) and returns 0 then. */
static int ref_compare_merge(const mfa_tensor* out, const mfa_tensor* lse, const double* want_out,
                             const double* want_lse, char* why, size_t n) {
    const double u = ref_unit_roundoff(out->dtype);
    const int64_t* shape = out->shape;
    for (int64_t b = 0; b < shape[0]; ++b)
        for (int64_t h = 0; h < shape[1]; ++h)
            for (int64_t r = 0; r < shape[2]; ++r) {
                const int64_t row = (b * shape[1] + h) * shape[2] + r;
                for (int64_t d = 0; d < shape[3]; ++d) {
                    const double got = test_get(out, b, h, r, d),
                                 want = want_out[row * shape[3] + d];
                    const int ok = isnan(want) ? isnan(got)
                                   : isinf(want)
                                       ? got == want
                                       : fabs(got - want) <= 2 * u * fmax(fabs(want), 0x1p-10);
                    if (!ok) {
                        snprintf(why, n, "out[%lld, %lld, %lld, %lld] = %.9g, reference %.9g",
                                 (long long)b, (long long)h, (long long)r, (long long)d, got, want);
                        return 0;
                    }
                }
                if (lse == NULL) continue;
                const double got = test_get(lse, b, h, r, 0), want = want_lse[row];
                const int ok = isnan(want) ? isnan(got)
                               : want == -INFINITY
                                   ? got == -INFINITY
                                   : fabs(got - want) <= 0x1p-23 * fmax(fabs(want), 1);
                if (!ok) {
                    snprintf(why, n, "lse[%lld, %lld, %lld] = %.9g, reference %.9g", (long long)b,
                             (long long)h, (long long)r, got, want);
                    return 0;
                }
            }
    return 1;
}

TEST_ORACLE_END

#endif
