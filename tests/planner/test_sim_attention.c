/*
 * The attention kernels on metal-sim, through the public C API, against a float64 reference
 * written here. Cases are chosen to reach every kernel path rather than to be large: sequence
 * lengths that are not multiples of any block, D % 8 != 0, head dimensions that force the
 * uncached slab and split output columns, causal masks in both alignments (including rows that
 * see no key), sliding windows, GQA and MQA (including decode shapes, where the forward packs a
 * group's query heads into one threadgroup), Dv != D, strided and reversed views, f32/f16/bf16,
 * and every simulated family's tables.
 *
 * Tolerance model: the kernels compute in f32 from the dtype-rounded inputs (which the
 * reference also uses), so the error is f32 accumulation (~1e-5 relative for these sizes)
 * plus one rounding of each output to its dtype (half an ulp: 2^-11 f16, 2^-8 bf16, relative).
 * Each element must satisfy |got - ref| <= rtol * |ref| + atol * max|ref| with
 *   f32  rtol 1e-4   atol 2e-5
 *   f16  rtol 2^-10  atol 2e-4
 *   bf16 rtol 2^-7   atol 2e-3
 * i.e. about two output ulps plus a small absolute floor for elements that cancel. The floor
 * scales with max(max|ref|, 1): inputs are uniform in [-1, 1], so every term entering a result
 * is O(1) even when the result itself cancels to (near) zero, as dQ and dK do when a row sees a
 * single key.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mfa.h"

static int failures = 0;

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            ++failures;                                                                \
        }                                                                              \
    } while (0)

/* ---- dtype conversions, independent of the library ---- */

static double bf16_to_double(uint16_t bits) {
    uint32_t x = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t double_to_bf16(double value) {
    float f = (float)value;
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static size_t dtype_size(mfa_dtype t) { return t == MFA_DTYPE_F32 ? 4 : 2; }

static double read_elem(const void* base, int64_t index, mfa_dtype t) {
    switch (t) {
    case MFA_DTYPE_F16: return (double)((const _Float16*)base)[index];
    case MFA_DTYPE_BF16: return bf16_to_double(((const uint16_t*)base)[index]);
    default: return ((const float*)base)[index];
    }
}

static void write_elem(void* base, int64_t index, mfa_dtype t, double value) {
    switch (t) {
    case MFA_DTYPE_F16: ((_Float16*)base)[index] = (_Float16)value; break;
    case MFA_DTYPE_BF16: ((uint16_t*)base)[index] = double_to_bf16(value); break;
    default: ((float*)base)[index] = (float)value; break;
    }
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static double uniform(void) { /* [-1, 1) */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 0x2545F4914F6CDD1Dull) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* ---- strided tensors ---- */

/* A tensor inside its own allocation, with a layout (bhsd, bshd, or bhsd with the sequence
 * reversed through a negative stride). The allocation is exactly the tensor's extent so that
 * AddressSanitizer builds catch any access outside it. */
typedef enum layout { BHSD, BSHD, REVERSED } layout;

typedef struct tensor {
    mfa_tensor t;
    void* alloc;
} tensor;

static tensor make_tensor(mfa_dtype dtype, int64_t b, int64_t h, int64_t s, int64_t d, layout l) {
    tensor x;
    memset(&x, 0, sizeof x);
    x.t.dtype = dtype;
    x.t.shape[0] = b;
    x.t.shape[1] = h;
    x.t.shape[2] = s;
    x.t.shape[3] = d;
    const int64_t n = b * h * s * d;
    x.alloc = malloc((size_t)(n ? n : 1) * dtype_size(dtype));
    char* base = x.alloc;
    if (l == BSHD) {
        x.t.strides[0] = s * h * d;
        x.t.strides[1] = d;
        x.t.strides[2] = h * d;
        x.t.strides[3] = 1;
    } else {
        x.t.strides[0] = h * s * d;
        x.t.strides[1] = s * d;
        x.t.strides[2] = d;
        x.t.strides[3] = 1;
    }
    if (l == REVERSED && s > 0) {
        base += (size_t)((s - 1) * d) * dtype_size(dtype);
        x.t.strides[2] = -d;
    }
    x.t.data = base;
    return x;
}

static int64_t offset_of(const mfa_tensor* t, int64_t b, int64_t h, int64_t s, int64_t d) {
    return b * t->strides[0] + h * t->strides[1] + s * t->strides[2] + d * t->strides[3];
}

static double get(const tensor* x, int64_t b, int64_t h, int64_t s, int64_t d) {
    return read_elem(x->t.data, offset_of(&x->t, b, h, s, d), x->t.dtype);
}

static void fill_random(tensor* x) {
    for (int64_t b = 0; b < x->t.shape[0]; ++b)
        for (int64_t h = 0; h < x->t.shape[1]; ++h)
            for (int64_t s = 0; s < x->t.shape[2]; ++s)
                for (int64_t d = 0; d < x->t.shape[3]; ++d)
                    write_elem(x->t.data, offset_of(&x->t, b, h, s, d), x->t.dtype, uniform());
}

static void fill_nan(tensor* x) {
    for (int64_t b = 0; b < x->t.shape[0]; ++b)
        for (int64_t h = 0; h < x->t.shape[1]; ++h)
            for (int64_t s = 0; s < x->t.shape[2]; ++s)
                for (int64_t d = 0; d < x->t.shape[3]; ++d)
                    write_elem(x->t.data, offset_of(&x->t, b, h, s, d), x->t.dtype, NAN);
}

/* ---- the case ---- */

typedef struct attention_case {
    const char* name;
    mfa_gpu_family family;
    mfa_dtype dtype;
    int64_t b, hq, hkv, nq, nk, d, dv;
    int causal;
    mfa_alignment alignment;
    int64_t window_left, window_right;
    float scale; /* 0: default */
    layout q_layout, kv_layout;
    int with_lse;
    int backward;
    uint64_t schedule_seed;
} attention_case;

static int visible(const attention_case* c, int64_t i, int64_t j) {
    const int64_t p = i + (c->alignment == MFA_ALIGN_BOTTOM_RIGHT ? c->nk - c->nq : 0);
    if (c->causal && j > p) return 0;
    if (c->window_left >= 0 && j < p - c->window_left) return 0;
    if (c->window_right >= 0 && j > p + c->window_right) return 0;
    return 1;
}

/* Compares one tensor against a reference array in (b, h, s, d) order. */
static void compare(const char* case_name, const char* what, const tensor* got, const double* ref,
                    mfa_dtype out_dtype) {
    const double rtol = out_dtype == MFA_DTYPE_F32 ? 1e-4 : out_dtype == MFA_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
    const double atol = out_dtype == MFA_DTYPE_F32 ? 2e-5 : out_dtype == MFA_DTYPE_F16 ? 2e-4 : 2e-3;
    const mfa_tensor* t = &got->t;
    const int64_t n = t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
    double ref_max = 1;
    for (int64_t i = 0; i < n; ++i)
        if (isfinite(ref[i]) && fabs(ref[i]) > ref_max) ref_max = fabs(ref[i]);
    int64_t bad = 0, idx = 0;
    double worst = 0;
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t s = 0; s < t->shape[2]; ++s)
                for (int64_t d = 0; d < t->shape[3]; ++d, ++idx) {
                    const double g = get(got, b, h, s, d), r = ref[idx];
                    int ok;
                    if (isinf(r)) ok = g == r;
                    else ok = isfinite(g) && fabs(g - r) <= rtol * fabs(r) + atol * ref_max;
                    if (!ok) {
                        if (bad < 3)
                            fprintf(stderr, "  %s %s[%lld,%lld,%lld,%lld] = %.8g, expected %.8g\n",
                                    case_name, what, (long long)b, (long long)h, (long long)s,
                                    (long long)d, g, r);
                        ++bad;
                    }
                    if (isfinite(r) && fabs(g - r) > worst) worst = fabs(g - r);
                }
    CHECK(bad == 0, "%s: %s: %lld of %lld elements outside tolerance (max |err| %.3g, max |ref| %.3g)",
          case_name, what, (long long)bad, (long long)n, worst, ref_max);
}

static void run_case(const attention_case* c) {
    mfa_context_options options;
    mfa_context_options_init(&options);
    options.gpu_family = c->family;
    options.sim_schedule_seed = c->schedule_seed;
    mfa_context* ctx = NULL;
    mfa_status status = mfa_context_create(MFA_BACKEND_METAL_SIM, &options, &ctx);
    CHECK(status == MFA_OK, "%s: context: %s", c->name, mfa_last_error());
    if (status != MFA_OK) return;

    mfa_attention_params params;
    mfa_attention_params_init(&params);
    params.causal = c->causal;
    params.alignment = c->alignment;
    params.window_left = c->window_left;
    params.window_right = c->window_right;
    params.scale = c->scale;
    const double scale = c->scale != 0 ? c->scale : 1.0 / sqrt((double)c->d);

    tensor q = make_tensor(c->dtype, c->b, c->hq, c->nq, c->d, c->q_layout);
    tensor k = make_tensor(c->dtype, c->b, c->hkv, c->nk, c->d, c->kv_layout);
    tensor v = make_tensor(c->dtype, c->b, c->hkv, c->nk, c->dv, c->kv_layout);
    tensor o = make_tensor(c->dtype, c->b, c->hq, c->nq, c->dv, c->q_layout);
    tensor lse = make_tensor(MFA_DTYPE_F32, c->b, c->hq, c->nq, 1, BHSD);
    fill_random(&q);
    fill_random(&k);
    fill_random(&v);
    fill_nan(&o);
    fill_nan(&lse);
    const int need_lse = c->with_lse || c->backward;
    status = mfa_attention_forward(ctx, &params, &q.t, &k.t, &v.t, &o.t, need_lse ? &lse.t : NULL);
    CHECK(status == MFA_OK, "%s: forward: %s", c->name, mfa_last_error());

    /* float64 reference from the rounded inputs */
    const int64_t group = c->hq / c->hkv;
    const int64_t rows = c->b * c->hq * c->nq;
    double* ref_o = calloc((size_t)(rows * c->dv + 1), sizeof(double));
    double* ref_l = calloc((size_t)(rows + 1), sizeof(double));
    double* p = calloc((size_t)(c->nk + 1), sizeof(double));
    for (int64_t b = 0; b < c->b; ++b)
        for (int64_t h = 0; h < c->hq; ++h)
            for (int64_t i = 0; i < c->nq; ++i) {
                const int64_t row = (b * c->hq + h) * c->nq + i, hk = h / group;
                double m = -INFINITY;
                for (int64_t j = 0; j < c->nk; ++j) {
                    if (!visible(c, i, j)) {
                        p[j] = -INFINITY;
                        continue;
                    }
                    double s = 0;
                    for (int64_t d = 0; d < c->d; ++d) s += get(&q, b, h, i, d) * get(&k, b, hk, j, d);
                    p[j] = s * scale;
                    if (p[j] > m) m = p[j];
                }
                double sum = 0;
                for (int64_t j = 0; j < c->nk; ++j) {
                    p[j] = isinf(p[j]) ? 0 : exp(p[j] - m);
                    sum += p[j];
                }
                ref_l[row] = sum > 0 ? m + log(sum) : -INFINITY;
                for (int64_t d = 0; d < c->dv; ++d) {
                    double acc = 0;
                    for (int64_t j = 0; j < c->nk; ++j) acc += p[j] * get(&v, b, hk, j, d);
                    ref_o[row * c->dv + d] = sum > 0 ? acc / sum : 0;
                }
            }
    if (status == MFA_OK) {
        compare(c->name, "out", &o, ref_o, c->dtype);
        if (need_lse) compare(c->name, "lse", &lse, ref_l, MFA_DTYPE_F32);
    }

    if (c->backward && status == MFA_OK) {
        tensor dout = make_tensor(c->dtype, c->b, c->hq, c->nq, c->dv, c->q_layout);
        tensor dq = make_tensor(c->dtype, c->b, c->hq, c->nq, c->d, c->q_layout);
        tensor dk = make_tensor(c->dtype, c->b, c->hkv, c->nk, c->d, c->kv_layout);
        tensor dv = make_tensor(c->dtype, c->b, c->hkv, c->nk, c->dv, c->kv_layout);
        fill_random(&dout);
        fill_nan(&dq);
        fill_nan(&dk);
        fill_nan(&dv);
        status = mfa_attention_backward(ctx, &params, &q.t, &k.t, &v.t, &o.t, &dout.t, &lse.t,
                                        &dq.t, &dk.t, &dv.t);
        CHECK(status == MFA_OK, "%s: backward: %s", c->name, mfa_last_error());
        /* Reference gradients; D uses the out tensor as given, as the API defines. */
        double* ref_dq = calloc((size_t)(rows * c->d + 1), sizeof(double));
        double* ref_dk = calloc((size_t)(c->b * c->hkv * c->nk * c->d + 1), sizeof(double));
        double* ref_dv = calloc((size_t)(c->b * c->hkv * c->nk * c->dv + 1), sizeof(double));
        for (int64_t b = 0; b < c->b; ++b)
            for (int64_t h = 0; h < c->hq; ++h)
                for (int64_t i = 0; i < c->nq; ++i) {
                    const int64_t row = (b * c->hq + h) * c->nq + i, hk = h / group;
                    if (isinf(ref_l[row])) continue;
                    double delta = 0;
                    for (int64_t d = 0; d < c->dv; ++d) delta += get(&dout, b, h, i, d) * get(&o, b, h, i, d);
                    for (int64_t j = 0; j < c->nk; ++j) {
                        if (!visible(c, i, j)) continue;
                        double s = 0, dp = 0;
                        for (int64_t d = 0; d < c->d; ++d) s += get(&q, b, h, i, d) * get(&k, b, hk, j, d);
                        const double pij = exp(s * scale - ref_l[row]);
                        for (int64_t d = 0; d < c->dv; ++d) dp += get(&dout, b, h, i, d) * get(&v, b, hk, j, d);
                        const double ds = pij * (dp - delta);
                        const int64_t krow = (b * c->hkv + hk) * c->nk + j;
                        for (int64_t d = 0; d < c->d; ++d) {
                            ref_dq[row * c->d + d] += scale * ds * get(&k, b, hk, j, d);
                            ref_dk[krow * c->d + d] += scale * ds * get(&q, b, h, i, d);
                        }
                        for (int64_t d = 0; d < c->dv; ++d)
                            ref_dv[krow * c->dv + d] += pij * get(&dout, b, h, i, d);
                    }
                }
        if (status == MFA_OK) {
            compare(c->name, "dq", &dq, ref_dq, c->dtype);
            compare(c->name, "dk", &dk, ref_dk, c->dtype);
            compare(c->name, "dv", &dv, ref_dv, c->dtype);
        }
        free(ref_dq);
        free(ref_dk);
        free(ref_dv);
        free(dout.alloc);
        free(dq.alloc);
        free(dk.alloc);
        free(dv.alloc);
    }
    free(ref_o);
    free(ref_l);
    free(p);
    free(q.alloc);
    free(k.alloc);
    free(v.alloc);
    free(o.alloc);
    free(lse.alloc);
    mfa_context_destroy(ctx);
}

/* bf16 stores must round to nearest even. With q = 0 both keys get probability exactly 1/2,
 * so out = (v0 + v1) / 2 is exact in f32 and, for these v, lies exactly halfway between two
 * bf16 values: ties that truncation, round-half-up and round-to-nearest-even all resolve
 * differently. Checked bit for bit. */
static void test_bf16_ties(void) {
    /* pairs (v0, v1) as bf16 bit patterns; 0x3f80 = 1.0, one bf16 ulp at 1.0 is 2^-7 */
    static const uint16_t v0[4] = {0x3f80, 0x3f81, 0xbf81, 0x3f80};
    static const uint16_t v1[4] = {0x3f81, 0x3f82, 0xbf82, 0x3f84};
    mfa_context* ctx = NULL;
    if (mfa_context_create(MFA_BACKEND_METAL_SIM, NULL, &ctx) != MFA_OK) {
        CHECK(0, "bf16 ties: context: %s", mfa_last_error());
        return;
    }
    tensor q = make_tensor(MFA_DTYPE_BF16, 1, 1, 1, 1, BHSD);
    tensor k = make_tensor(MFA_DTYPE_BF16, 1, 1, 2, 1, BHSD);
    tensor v = make_tensor(MFA_DTYPE_BF16, 1, 1, 2, 4, BHSD);
    tensor o = make_tensor(MFA_DTYPE_BF16, 1, 1, 1, 4, BHSD);
    ((uint16_t*)q.t.data)[0] = 0;
    ((uint16_t*)k.t.data)[0] = double_to_bf16(0.5);
    ((uint16_t*)k.t.data)[1] = double_to_bf16(-0.25);
    for (int d = 0; d < 4; ++d) {
        ((uint16_t*)v.t.data)[d] = v0[d];
        ((uint16_t*)v.t.data)[4 + d] = v1[d];
    }
    mfa_status status = mfa_attention_forward(ctx, NULL, &q.t, &k.t, &v.t, &o.t, NULL);
    CHECK(status == MFA_OK, "bf16 ties: forward: %s", mfa_last_error());
    for (int d = 0; d < 4 && status == MFA_OK; ++d) {
        const double mean = (bf16_to_double(v0[d]) + bf16_to_double(v1[d])) / 2;
        const uint16_t expected = double_to_bf16(mean), got = ((uint16_t*)o.t.data)[d];
        CHECK(got == expected, "bf16 ties: out[%d] = 0x%04x, expected 0x%04x (mean %.9g)", d, got,
              expected, mean);
    }
    free(q.alloc);
    free(k.alloc);
    free(v.alloc);
    free(o.alloc);
    mfa_context_destroy(ctx);
}

/* A row whose scores are all finite but far below any "nothing seen yet" floor still sees its
 * keys: scores -1e30, -3e30, -2e30 (q = 1, k as given, scale 1) give out = v[0] and
 * lse = -1e30 exactly (the other terms are exp(-1e30) = 0). */
static void test_very_negative_scores(void) {
    mfa_context* ctx = NULL;
    if (mfa_context_create(MFA_BACKEND_METAL_SIM, NULL, &ctx) != MFA_OK) {
        CHECK(0, "very negative scores: context: %s", mfa_last_error());
        return;
    }
    tensor q = make_tensor(MFA_DTYPE_F32, 1, 1, 1, 1, BHSD);
    tensor k = make_tensor(MFA_DTYPE_F32, 1, 1, 3, 1, BHSD);
    tensor v = make_tensor(MFA_DTYPE_F32, 1, 1, 3, 2, BHSD);
    tensor o = make_tensor(MFA_DTYPE_F32, 1, 1, 1, 2, BHSD);
    tensor lse = make_tensor(MFA_DTYPE_F32, 1, 1, 1, 1, BHSD);
    static const float keys[3] = {-1e30f, -3e30f, -2e30f};
    static const float values[6] = {0.25f, -0.5f, 7.0f, 8.0f, 9.0f, 10.0f};
    ((float*)q.t.data)[0] = 1.0f;
    memcpy(k.t.data, keys, sizeof keys);
    memcpy(v.t.data, values, sizeof values);
    mfa_attention_params params;
    mfa_attention_params_init(&params);
    params.scale = 1.0f;
    mfa_status status = mfa_attention_forward(ctx, &params, &q.t, &k.t, &v.t, &o.t, &lse.t);
    CHECK(status == MFA_OK, "very negative scores: forward: %s", mfa_last_error());
    if (status == MFA_OK) {
        const float* out = o.t.data;
        const float l = *(const float*)lse.t.data;
        CHECK(out[0] == values[0] && out[1] == values[1], "out = (%g, %g), expected (%g, %g)",
              out[0], out[1], values[0], values[1]);
        CHECK(fabs(l - -1e30) <= 1e-6 * 1e30, "lse = %g, expected -1e30", l);
    }
    free(q.alloc);
    free(k.alloc);
    free(v.alloc);
    free(o.alloc);
    free(lse.alloc);
    mfa_context_destroy(ctx);
}

int main(int argc, char** argv) {
    const mfa_gpu_family A7 = MFA_GPU_FAMILY_APPLE7, A8 = MFA_GPU_FAMILY_APPLE8,
                         A9 = MFA_GPU_FAMILY_APPLE9;
    const mfa_dtype F32 = MFA_DTYPE_F32, F16 = MFA_DTYPE_F16, BF16 = MFA_DTYPE_BF16;
    const mfa_alignment BR = MFA_ALIGN_BOTTOM_RIGHT, TL = MFA_ALIGN_TOP_LEFT;
    /* name, family, dtype, b, hq, hkv, nq, nk, d, dv, causal, align, wl, wr, scale,
       q layout, kv layout, lse, backward, seed */
    const attention_case cases[] = {
        {"plain_f32", A9, F32, 1, 2, 2, 37, 45, 40, 40, 0, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"gqa_dv_f32", A7, F32, 2, 4, 2, 19, 33, 24, 16, 0, BR, -1, -1, 0.3f, BHSD, BHSD, 1, 1, 7},
        {"causal_br_f16", A9, F16, 1, 2, 1, 20, 50, 64, 64, 1, BR, -1, -1, 0, BSHD, BSHD, 1, 1, 0},
        {"causal_br_empty_rows_bf16", A8, BF16, 1, 1, 1, 50, 20, 32, 32, 1, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"causal_tl_bf16", A9, BF16, 1, 3, 1, 41, 23, 16, 24, 1, TL, -1, -1, 0, BHSD, BSHD, 1, 1, 3},
        {"window_d9_f32", A9, F32, 1, 1, 1, 70, 70, 9, 9, 0, BR, 5, 3, 0, BHSD, BHSD, 1, 1, 0},
        {"window_diag_only_f16", A7, F16, 1, 2, 2, 33, 33, 8, 8, 0, TL, 0, 0, 0, BHSD, BHSD, 1, 1, 0},
        {"window_causal_mqa_f32", A7, F32, 1, 4, 1, 64, 80, 72, 72, 1, BR, 17, -1, 0, REVERSED, BHSD, 1, 1, 11},
        {"no_lse_f16", A9, F16, 2, 1, 1, 9, 130, 33, 65, 0, BR, -1, -1, 0, BHSD, BHSD, 0, 0, 0},
        {"wide_d300_f32", A9, F32, 1, 1, 1, 20, 21, 300, 300, 0, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"wide_d260_dv136_bf16", A7, BF16, 1, 2, 1, 17, 12, 260, 136, 1, TL, -1, -1, 0, BSHD, BHSD, 1, 1, 0},
        {"decode_gqa_f16", A9, F16, 2, 8, 2, 1, 77, 64, 64, 1, BR, -1, -1, 0, BSHD, BSHD, 1, 1, 13},
        {"packed_window_split_bf16", A7, BF16, 1, 6, 1, 5, 40, 40, 200, 0, TL, 3, 0, 0, BHSD, BSHD, 1, 1, 0},
        {"packed_empty_rows_f32", A9, F32, 1, 4, 2, 9, 3, 16, 16, 1, BR, -1, -1, 0, REVERSED, BHSD, 1, 1, 0},
        {"tiny_d1_dv3_f16", A9, F16, 1, 1, 1, 1, 1, 1, 3, 0, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"d2_causal_f32", A8, F32, 3, 2, 2, 5, 3, 2, 2, 1, BR, -1, -1, 2.5f, BSHD, BSHD, 1, 1, 9},
        {"d512_f16", A9, F16, 1, 1, 1, 9, 10, 512, 512, 0, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 0},
        {"d1024_dv1000_bf16", A7, BF16, 1, 2, 1, 7, 11, 1024, 1000, 1, BR, -1, -1, 0, BHSD, BHSD, 1, 1, 5},
    };
    const size_t count = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < count; ++i) {
        if (argc > 1 && strstr(cases[i].name, argv[1]) == NULL) continue;
        const int before = failures;
        run_case(&cases[i]);
        printf("%-28s %s\n", cases[i].name, failures == before ? "ok" : "FAILED");
        fflush(stdout);
    }
    if (argc <= 1) {
        const int before = failures;
        test_bf16_ties();
        printf("%-28s %s\n", "bf16_store_ties", failures == before ? "ok" : "FAILED");
        const int before2 = failures;
        test_very_negative_scores();
        printf("%-28s %s\n", "very_negative_scores", failures == before2 ? "ok" : "FAILED");
    }
    if (failures) {
        fprintf(stderr, "metal-sim attention: %d check(s) failed\n", failures);
        return 1;
    }
    printf("metal-sim attention: all cases passed\n");
    return 0;
}
