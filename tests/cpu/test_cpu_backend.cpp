/*
 * White-box test of the CPU backend: the dtype conversions against independent float64
 * arithmetic, then every kernel build this CPU can run (AVX-512, AVX2, the portable one) through
 * the backend's entry points against a float64 reference written here, then concurrent callers
 * on one context. The backend is hidden inside libmfa, so this compiles its sources itself, with
 * the core's error recording (core/errors.c); it stands in for the one other core function they
 * call, mfa_dtype_size.
 */
#include "core/backend.h"
#include "core/validate.h"
#include "cpu/convert.h"
#include "cpu/merge.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

extern "C" size_t mfa_dtype_size(mfa_dtype dtype) { return dtype == MFA_DTYPE_F32 ? 4 : 2; }

static int failures = 0;

static void fail(const char* format, ...) {
    if (++failures > 25) return;
    va_list args;
    va_start(args, format);
    printf("  FAIL: ");
    vprintf(format, args);
    printf("\n");
    va_end(args);
}

/* ---- Conversions ---------------------------------------------------------------------------- */

/* The value of an IEEE half from its fields. */
static double half_value(uint16_t h) {
    const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
    double magnitude;
    if (exponent == 0)
        magnitude = ldexp(mantissa, -24);
    else if (exponent == 31)
        magnitude = mantissa ? NAN : INFINITY;
    else
        magnitude = ldexp(1024 + mantissa, exponent - 25);
    return sign ? -magnitude : magnitude;
}

/* x rounded to nearest even on a grid of `quantum` (a power of two, so x / quantum is exact). */
static double round_to_grid(double x, double quantum) { return nearbyint(x / quantum) * quantum; }

/* What rounding x to a float type with `mantissa_bits` stored bits, minimum normal exponent
 * `min_exponent` and largest finite `largest` gives, computed in float64. */
static double reference_round(float x, int mantissa_bits, int min_exponent, double largest) {
    int exponent;
    frexp(x, &exponent); /* x = f * 2^exponent, 0.5 <= |f| < 1 */
    const int e = std::max(exponent - 1, min_exponent);
    const double rounded = round_to_grid(x, ldexp(1.0, e - mantissa_bits));
    /* Past the largest finite value, round-to-nearest goes to infinity at the halfway point. */
    const double halfway = largest + ldexp(1.0, (int)floor(log2(largest)) - mantissa_bits - 1);
    if (fabs(x) >= halfway) return x > 0 ? INFINITY : -INFINITY;
    return rounded;
}

static void test_conversions() {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        const uint16_t h = (uint16_t)bits;
        const double want = half_value(h);
        const float got = mfa_cpu_f16_to_f32(h);
        if (isnan(want) ? !isnan(got) : (got != want || signbit(got) != signbit(want)))
            fail("f16 0x%04x -> %g, want %g", bits, (double)got, want);
        const float widened = mfa_cpu_bf16_to_f32(h);
        if (mfa_cpu_f32_bits(widened) != bits << 16)
            fail("bf16 0x%04x widened to bits 0x%08x", bits, mfa_cpu_f32_bits(widened));
    }

    /* f32 -> f16 / bf16 over a stride of all bit patterns plus every halfway case near 1. */
    std::vector<uint32_t> samples;
    for (uint64_t bits = 0; bits < (1ull << 32); bits += 4093) samples.push_back((uint32_t)bits);
    for (uint32_t m = 0; m < 1024; ++m) {
        samples.push_back(0x3f800000u | (m << 13) | 0x1000u); /* f16 halfway points near 1 */
        samples.push_back(mfa_cpu_f32_bits(ldexpf((float)m + 0.5f, -24))); /* f16 subnormal */
    }
    for (uint32_t m = 0; m < 128; ++m)
        samples.push_back(0x3f800000u | (m << 16) | 0x8000u); /* bf16 halfway points near 1 */
    const uint32_t edges[] = {0x477ff000u, 0x477fefffu, 0x477fe000u, 0x38800000u, 0x387fffffu,
                              0x33000000u, 0x33000001u, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu,
                              0x00000001u, 0x80000000u, 0x7f800000u, 0xff800000u};
    samples.insert(samples.end(), edges, edges + sizeof edges / sizeof *edges);
    for (uint32_t bits : samples) {
        for (uint32_t sign : {0u, 0x80000000u}) {
            const float x = mfa_cpu_f32_from_bits(bits ^ sign);
            const float half = mfa_cpu_f16_to_f32(mfa_cpu_f32_to_f16(x));
            const float brain = mfa_cpu_bf16_to_f32(mfa_cpu_f32_to_bf16(x));
            if (isnan(x)) {
                if (!isnan(half) || !isnan(brain))
                    fail("NaN 0x%08x not kept NaN (f16 %g, bf16 %g)", bits ^ sign, half, brain);
                continue;
            }
            const double want_half = reference_round(x, 10, -14, 65504.0);
            const double want_brain = reference_round(x, 7, -126, ldexp(255.0, 120));
            if (half != want_half || signbit(half) != signbit(x))
                fail("f32 %a -> f16 %a, want %a", (double)x, (double)half, want_half);
            if (brain != want_brain || signbit(brain) != signbit(x))
                fail("f32 %a -> bf16 %a, want %a", (double)x, (double)brain, want_brain);
        }
    }
}

/* ---- Merging partial states ----------------------------------------------------------------- */

/* Attention over 12 keys of one row, split into parts at the given boundaries (empty parts
 * included), merged, against the unsplit float64 result; then the edge cases. */
static void test_merge() {
    const int keys = 12, width = 3;
    double score[keys], value[keys][width];
    for (int j = 0; j < keys; ++j) {
        score[j] = 0.7 * j - 3.1 * (j % 3) + (j == 5 ? 40 : 0); /* one dominant key */
        for (int x = 0; x < width; ++x) value[j][x] = sin(1.0 + j + 0.3 * x);
    }
    const int bounds[][6] = {{0, 12, 12, 12, 12, 12}, {0, 0, 5, 6, 6, 12}, {0, 3, 6, 9, 11, 12}};
    for (const auto& b : bounds) {
        const int parts = 5;
        float part_out[parts][width], part_lse[parts], weights[parts], out[width];
        for (int k = 0; k < parts; ++k) {
            double peak = -INFINITY, total = 0, o[width] = {0, 0, 0};
            for (int j = b[k]; j < b[k + 1]; ++j) peak = std::max(peak, score[j]);
            for (int j = b[k]; j < b[k + 1]; ++j) {
                total += exp(score[j] - peak);
                for (int x = 0; x < width; ++x) o[x] += exp(score[j] - peak) * value[j][x];
            }
            part_lse[k] = total == 0 ? -INFINITY : (float)(peak + log(total));
            for (int x = 0; x < width; ++x)
                part_out[k][x] = total == 0 ? NAN : (float)(o[x] / total);
        }
        const float lse = mfa_cpu_merge_weights(part_lse, 1, parts, weights);
        mfa_cpu_merge_rows(&part_out[0][0], width, parts, weights, width, out);
        double peak = -INFINITY, total = 0;
        for (int j = 0; j < keys; ++j) peak = std::max(peak, score[j]);
        for (int j = 0; j < keys; ++j) total += exp(score[j] - peak);
        if (!(fabs(lse - (peak + log(total))) <= 2e-6 * (1 + fabs(peak))))
            fail("merge: lse %g, want %g", lse, peak + log(total));
        for (int x = 0; x < width; ++x) {
            double want = 0;
            for (int j = 0; j < keys; ++j) want += exp(score[j] - peak) / total * value[j][x];
            /* An empty part's out is NaN here: weight 0 must keep it out of the sum. */
            if (!(fabs(out[x] - want) <= 1e-6))
                fail("merge: out[%d] = %g, want %g", x, out[x], want);
        }
    }
    float lse[3] = {-INFINITY, -INFINITY, -INFINITY}, weights[3], rows[3] = {7, 8, 9}, out[1];
    if (mfa_cpu_merge_weights(lse, 1, 3, weights) != -INFINITY)
        fail("merge: parts that saw no key do not give lse -inf");
    mfa_cpu_merge_rows(rows, 1, 3, weights, 1, out);
    if (out[0] != 0) fail("merge: parts that saw no key give out %g, not 0", out[0]);
    lse[1] = NAN;
    lse[2] = 1;
    if (!isnan(mfa_cpu_merge_weights(lse, 1, 3, weights))) fail("merge: a NaN lse was dropped");
    mfa_cpu_merge_rows(rows, 1, 3, weights, 1, out);
    if (!isnan(out[0])) fail("merge: a NaN lse did not reach out");
}

/* ---- Attention against float64 ------------------------------------------------------------- */

/* A rank-4 tensor in one of several memory layouts, read and written through its view. */
struct Tensor {
    mfa_dtype dtype;
    int64_t shape[4];
    std::vector<char> memory;
    mfa_view view;

    /* layout 0: [B,H,N,D]; 1: [B,N,H,D]; 2: padded strides with every other element;
     * reverse: the sequence axis runs backwards (negative stride). */
    Tensor(mfa_dtype type, int64_t b, int64_t h, int64_t n, int64_t d, int layout, bool reverse)
        : dtype(type), shape{b, h, n, d} {
        int64_t s[4];
        if (layout == 0) {
            s[3] = 1, s[2] = d, s[1] = n * d, s[0] = h * n * d;
        } else if (layout == 1) {
            s[3] = 1, s[1] = d, s[2] = h * d, s[0] = n * h * d;
        } else {
            s[3] = 2, s[2] = 2 * d + 3, s[1] = s[2] * n + 5, s[0] = s[1] * h;
        }
        int64_t span = 1;
        for (int i = 0; i < 4; ++i) span += (shape[i] - 1) * s[i];
        memory.assign((size_t)span * mfa_dtype_size(dtype), 0);
        view.data = memory.data();
        for (int i = 0; i < 4; ++i) view.stride[i] = s[i];
        if (reverse) {
            view.data += (n - 1) * s[2] * (int64_t)mfa_dtype_size(dtype);
            view.stride[2] = -s[2];
        }
    }

    char* at(int64_t b, int64_t h, int64_t n, int64_t d) {
        return view.data +
               (int64_t)mfa_dtype_size(dtype) * (b * view.stride[0] + h * view.stride[1] +
                                                 n * view.stride[2] + d * view.stride[3]);
    }

    double get(int64_t b, int64_t h, int64_t n, int64_t d) {
        const char* p = at(b, h, n, d);
        if (dtype == MFA_DTYPE_F32) {
            float x;
            memcpy(&x, p, 4);
            return x;
        }
        uint16_t bits;
        memcpy(&bits, p, 2);
        return dtype == MFA_DTYPE_F16 ? mfa_cpu_f16_to_f32(bits) : mfa_cpu_bf16_to_f32(bits);
    }

    void set(int64_t b, int64_t h, int64_t n, int64_t d, float x) {
        char* p = at(b, h, n, d);
        if (dtype == MFA_DTYPE_F32) {
            memcpy(p, &x, 4);
            return;
        }
        const uint16_t bits =
            dtype == MFA_DTYPE_F16 ? mfa_cpu_f32_to_f16(x) : mfa_cpu_f32_to_bf16(x);
        memcpy(p, &bits, 2);
    }

    void fill_normal(std::mt19937& rng, double magnitude = 1) {
        std::normal_distribution<double> normal(0.0, 1.0);
        for (int64_t b = 0; b < shape[0]; ++b)
            for (int64_t h = 0; h < shape[1]; ++h)
                for (int64_t n = 0; n < shape[2]; ++n)
                    for (int64_t d = 0; d < shape[3]; ++d)
                        set(b, h, n, d, (float)(normal(rng) * magnitude));
    }
};

/* What a case asserts beyond the forward: every gradient against the reference (the default),
 * none (the reference gradient itself overflows f32), or only that each gradient is finite
 * (logits of 1e9, where the reference's exact zeros meet f32 rounding times the scale). */
enum Gradients { kCheckGradients, kNoGradients, kFiniteGradients };

struct Case {
    const char* name;
    mfa_dtype dtype;
    int64_t batch, heads_q, heads_kv, seq_q, seq_k, dim, dim_v;
    int64_t window_left, window_right; /* causal is window_right = 0, as the core hands it over */
    bool bottom_right;
    int layout;
    bool reverse;
    /* q and k are drawn from N(0, 1) times these; scale 0 means 1.3 / sqrt(D). */
    double q_magnitude = 1, k_magnitude = 1;
    float scale = 0;
    Gradients gradients = kCheckGradients;
    /* A NaN in one key of batch 0, key/value head 0: every output of that group depends on it. */
    bool nan_key = false;
};

static const Case cases[] = {
    {"tiny, no mask", MFA_DTYPE_F32, 1, 2, 1, 7, 5, 3, 3, -1, -1, true, 0, false},
    {"causal, GQA, Dv < D", MFA_DTYPE_F32, 2, 4, 2, 130, 70, 33, 17, -1, 0, true, 0, false},
    {"causal top-left, Nq < Nk, bshd", MFA_DTYPE_F32, 1, 3, 3, 70, 130, 64, 80, -1, 0, false, 1,
     true},
    {"Nq > Nk causal: rows see nothing", MFA_DTYPE_F32, 1, 2, 1, 100, 60, 8, 8, -1, 0, true, 2,
     true},
    {"window 5/3", MFA_DTYPE_F32, 1, 2, 2, 90, 90, 16, 16, 5, 3, true, 0, false},
    {"diagonal only", MFA_DTYPE_F32, 1, 2, 2, 90, 90, 16, 16, 0, 0, true, 1, false},
    {"D = 1", MFA_DTYPE_F32, 1, 1, 1, 40, 50, 1, 1, -1, -1, true, 0, false},
    {"one query, one key", MFA_DTYPE_F32, 1, 1, 1, 1, 1, 2, 2, -1, -1, true, 0, false},
    {"MQA, left window only", MFA_DTYPE_F32, 1, 4, 1, 200, 129, 128, 64, 20, -1, false, 1, false},
    {"D = 1024, Dv = 7", MFA_DTYPE_F32, 1, 1, 1, 30, 40, 1024, 7, -1, -1, true, 0, false},
    {"window over many blocks, GQA", MFA_DTYPE_F32, 2, 4, 2, 300, 600, 40, 24, 100, 50, true, 1,
     true},
    {"f16 causal", MFA_DTYPE_F16, 1, 2, 1, 77, 130, 64, 64, -1, 0, true, 0, false},
    {"f16 window, Nq > Nk", MFA_DTYPE_F16, 1, 2, 2, 300, 150, 16, 48, 30, -1, true, 2, false},
    {"bf16 causal, Dv < D", MFA_DTYPE_BF16, 1, 2, 2, 77, 130, 96, 40, -1, 0, true, 1, true},
    {"bf16 top-left causal, MQA", MFA_DTYPE_BF16, 1, 4, 1, 270, 140, 64, 64, -1, 0, false, 0,
     false},
    {"bf16 D = 512", MFA_DTYPE_BF16, 1, 1, 1, 65, 65, 512, 512, -1, -1, true, 0, false},
    /* 16 query heads' packs and dQ sums of 260 x 1024 rows (94 MB) exceed the 64 MiB pack
     * budget: the backward takes the group in two passes and carries dK and dV between them. */
    {"MQA group over several backward passes", MFA_DTYPE_F32, 1, 16, 1, 260, 8, 1024, 1024, 100, -1,
     false, 0, false},
    /* Tails of the bf16 pair packing: odd D and Dv, odd sequence lengths, a reversed layout. */
    {"bf16 odd D, odd lengths, window", MFA_DTYPE_BF16, 2, 3, 1, 99, 141, 37, 19, 40, 7, true, 2,
     true},
    {"bf16 GQA bshd, Nq > Nk causal", MFA_DTYPE_BF16, 1, 6, 2, 150, 100, 80, 96, -1, 0, true, 1,
     false},
    /* Decoding (group x Nq <= 16): K and V read in place or converted per block, keys split over
     * tasks (3 threads want 12 tasks: these heads split 4 to 6 ways) and merged. */
    {"decode GQA 4, Nq 4, causal, split keys", MFA_DTYPE_F32, 1, 8, 2, 4, 3000, 64, 64, -1, 0, true,
     0, false},
    {"decode bf16 in place, bshd, left window", MFA_DTYPE_BF16, 2, 4, 4, 1, 2100, 128, 128, 1500,
     -1, true, 1, false},
    {"decode f16 converted, D % 16 != 0", MFA_DTYPE_F16, 1, 2, 1, 3, 1500, 40, 24, -1, -1, true, 0,
     true},
    {"decode strided elements, MQA", MFA_DTYPE_F32, 1, 4, 1, 2, 1100, 32, 16, -1, -1, true, 2,
     false},
    {"decode top-left causal, group 16", MFA_DTYPE_F32, 1, 16, 1, 1, 2000, 16, 32, -1, 0, false, 0,
     false},
    {"decode Nq > Nk causal: rows see nothing", MFA_DTYPE_BF16, 1, 2, 1, 5, 3, 16, 16, -1, 0, true,
     0, false},
    {"decode window inside the cache", MFA_DTYPE_F32, 1, 2, 2, 2, 5000, 64, 48, 700, 300, false, 1,
     true},
    /* Logits that fit f32 although an operand times the scale would not: the scale must
     * multiply the dot product. q 1e38 times scale 10 overflows; scale 3e38 times log2(e)
     * overflows. */
    {"q 1e38, k 1e-38, scale 10", MFA_DTYPE_F32, 1, 2, 1, 20, 30, 8, 8, -1, -1, true, 0, false,
     1e38, 1e-38, 10.0f, kNoGradients},
    {"decode q 1e38, k 1e-38, scale 10", MFA_DTYPE_F32, 1, 2, 1, 1, 30, 8, 8, -1, -1, true, 0,
     false, 1e38, 1e-38, 10.0f, kNoGradients},
    {"scale 3e38, q 1e-30", MFA_DTYPE_F32, 1, 2, 1, 20, 30, 8, 8, -1, 0, true, 0, false, 1e-30, 1,
     3e38f, kFiniteGradients},
    {"bf16 scale 3e38, q 1e-30", MFA_DTYPE_BF16, 1, 2, 1, 20, 30, 8, 8, -1, 0, true, 0, false,
     1e-30, 1, 3e38f, kFiniteGradients},
    /* NaN propagation through every path. */
    {"NaN key", MFA_DTYPE_F32, 2, 4, 2, 40, 70, 16, 16, -1, -1, true, 0, false, 1, 1, 0,
     kCheckGradients, true},
    {"bf16 NaN key", MFA_DTYPE_BF16, 1, 4, 2, 40, 70, 16, 16, -1, -1, true, 1, false, 1, 1, 0,
     kCheckGradients, true},
    {"decode NaN key, split keys", MFA_DTYPE_F32, 1, 4, 2, 1, 2000, 16, 16, -1, -1, true, 0, false,
     1, 1, 0, kCheckGradients, true},
};

/* Relative error bound of a result element, scaled by (1 + |reference|). f32: accumulation over
 * up to a few thousand terms in f32 (~1e-6 each) with margin. f16/bf16: the reference is computed
 * from the same rounded inputs, so what remains is the output's own rounding (2^-11, 2^-8)
 * plus f32 accumulation; gradients combine several rounded products, hence twice the bound. */
static double tolerance(mfa_dtype dtype) {
    return dtype == MFA_DTYPE_F32 ? 2e-5 : dtype == MFA_DTYPE_F16 ? 2e-3 : 1.6e-2;
}

static void expect_close(const char* what, double got, double want, double bound, int64_t b,
                         int64_t h, int64_t n, int64_t d) {
    if (isnan(want) ? !isnan(got) : !(fabs(got - want) <= bound * (1.0 + fabs(want))))
        fail("%s[%lld,%lld,%lld,%lld] = %.9g, want %.9g", what, (long long)b, (long long)h,
             (long long)n, (long long)d, got, want);
}

static void check_gradient(const Case& c, const char* what, double got, double want, double bound,
                           int64_t b, int64_t h, int64_t n, int64_t d) {
    if (c.gradients == kCheckGradients) {
        expect_close(what, got, want, bound, b, h, n, d);
    } else if (c.gradients == kFiniteGradients && !isfinite(got)) {
        fail("%s[%lld,%lld,%lld,%lld] = %g, want a finite value", what, (long long)b, (long long)h,
             (long long)n, (long long)d, got);
    }
}

static void run_case(const mfa_backend_ops* ops, void* state, const Case& c, std::mt19937& rng) {
    const int64_t B = c.batch, Hq = c.heads_q, Hkv = c.heads_kv, Nq = c.seq_q, Nk = c.seq_k;
    const int64_t D = c.dim, Dv = c.dim_v, group = Hq / Hkv;
    Tensor q(c.dtype, B, Hq, Nq, D, c.layout, c.reverse);
    Tensor k(c.dtype, B, Hkv, Nk, D, (c.layout + 1) % 3, false);
    Tensor v(c.dtype, B, Hkv, Nk, Dv, c.layout, c.reverse);
    Tensor out(c.dtype, B, Hq, Nq, Dv, c.layout, false);
    Tensor lse(MFA_DTYPE_F32, B, Hq, Nq, 1, 0, c.reverse);
    Tensor dout(c.dtype, B, Hq, Nq, Dv, c.layout, false);
    Tensor dq(c.dtype, B, Hq, Nq, D, c.layout, c.reverse);
    Tensor dk(c.dtype, B, Hkv, Nk, D, c.layout, false);
    Tensor dv(c.dtype, B, Hkv, Nk, Dv, (c.layout + 2) % 3, c.reverse);
    q.fill_normal(rng, c.q_magnitude);
    k.fill_normal(rng, c.k_magnitude);
    v.fill_normal(rng);
    dout.fill_normal(rng);
    if (c.nan_key) k.set(0, 0, Nk / 2, 0, NAN);

    mfa_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = c.dtype;
    p.batch = B, p.heads_q = Hq, p.heads_kv = Hkv, p.group = group;
    p.seq_q = Nq, p.seq_k = Nk, p.head_dim = D, p.head_dim_v = Dv;
    p.scale = c.scale != 0 ? c.scale : 1.3f / sqrtf((float)D);
    const int64_t diag_offset = c.bottom_right ? Nk - Nq : 0;
    mfa_visibility_band(Nq, Nk, diag_offset, c.window_left, c.window_right, &p.band_lo, &p.band_hi);
    p.q = q.view, p.k = k.view, p.v = v.view, p.out = out.view, p.lse = lse.view;
    p.dout = dout.view, p.dq = dq.view, p.dk = dk.view, p.dv = dv.view;
    if (ops->forward(state, &p) != MFA_OK || ops->backward(state, &p) != MFA_OK) {
        fail("%s: call failed: %s", c.name, mfa_last_error());
        return;
    }

    const double bound = tolerance(c.dtype);
    std::vector<double> dk_want((size_t)(B * Hkv * Nk * D)), dv_want((size_t)(B * Hkv * Nk * Dv));
    std::vector<double> weight((size_t)Nk);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t hk = h / group;
            for (int64_t i = 0; i < Nq; ++i) {
                /* Row i's softmax in float64 from the (rounded) inputs as stored. */
                const int64_t aligned = i + diag_offset;
                double peak = -INFINITY;
                for (int64_t j = 0; j < Nk; ++j) {
                    const bool visible = (c.window_left < 0 || j >= aligned - c.window_left) &&
                                         (c.window_right < 0 || j <= aligned + c.window_right);
                    double score = 0;
                    for (int64_t x = 0; x < D; ++x) score += q.get(b, h, i, x) * k.get(b, hk, j, x);
                    weight[j] = visible ? score * p.scale : -INFINITY;
                    peak = std::max(peak, weight[j]);
                }
                double total = 0;
                for (int64_t j = 0; j < Nk; ++j) {
                    weight[j] = weight[j] == -INFINITY ? 0.0 : exp(weight[j] - peak);
                    total += weight[j];
                }
                if (total == 0) {
                    if (lse.get(b, h, i, 0) != -INFINITY)
                        fail("%s: lse of a row that sees nothing = %g", c.name,
                             lse.get(b, h, i, 0));
                } else {
                    expect_close("lse", lse.get(b, h, i, 0), peak + log(total), 2e-6, b, h, i, 0);
                }
                double row_dot = 0;
                for (int64_t x = 0; x < Dv; ++x) {
                    double o = 0;
                    for (int64_t j = 0; j < Nk; ++j) o += weight[j] * v.get(b, hk, j, x);
                    o = total == 0 ? 0 : o / total;
                    expect_close("out", out.get(b, h, i, x), o, bound, b, h, i, x);
                    row_dot += dout.get(b, h, i, x) * o;
                }
                std::vector<double> dq_want((size_t)D, 0.0);
                for (int64_t j = 0; j < Nk; ++j) {
                    if (weight[j] == 0) continue;
                    const double prob = weight[j] / total;
                    double dp = 0;
                    for (int64_t x = 0; x < Dv; ++x) {
                        dp += dout.get(b, h, i, x) * v.get(b, hk, j, x);
                        dv_want[(size_t)(((b * Hkv + hk) * Nk + j) * Dv + x)] +=
                            prob * dout.get(b, h, i, x);
                    }
                    const double ds = prob * (dp - row_dot) * p.scale;
                    for (int64_t x = 0; x < D; ++x) {
                        dq_want[(size_t)x] += ds * k.get(b, hk, j, x);
                        dk_want[(size_t)(((b * Hkv + hk) * Nk + j) * D + x)] +=
                            ds * q.get(b, h, i, x);
                    }
                }
                for (int64_t x = 0; x < D; ++x)
                    check_gradient(c, "dq", dq.get(b, h, i, x), dq_want[(size_t)x], 2 * bound, b, h,
                                   i, x);
            }
        }
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t j = 0; j < Nk; ++j) {
                for (int64_t x = 0; x < D; ++x)
                    check_gradient(c, "dk", dk.get(b, h, j, x),
                                   dk_want[(size_t)(((b * Hkv + h) * Nk + j) * D + x)], 2 * bound,
                                   b, h, j, x);
                for (int64_t x = 0; x < Dv; ++x)
                    check_gradient(c, "dv", dv.get(b, h, j, x),
                                   dv_want[(size_t)(((b * Hkv + h) * Nk + j) * Dv + x)], 2 * bound,
                                   b, h, j, x);
            }
}

/* Several caller threads share one context; each must get exactly what it gets alone. */
static void test_concurrent_callers(const mfa_backend_ops* ops, void* state) {
    const int64_t N = 300, D = 32, H = 2;
    const int callers = 6;
    struct Problem {
        std::vector<float> qkv, out;
        mfa_problem p;
    };
    auto make = [&](int seed, Problem& problem) {
        std::mt19937 rng((unsigned)seed);
        std::normal_distribution<float> normal;
        problem.qkv.resize((size_t)(H * N * D));
        for (float& x : problem.qkv) x = normal(rng);
        problem.out.assign((size_t)(H * N * D), 0.0f);
        mfa_problem& p = problem.p;
        memset(&p, 0, sizeof p);
        p.dtype = MFA_DTYPE_F32, p.batch = 1, p.heads_q = H, p.heads_kv = H, p.group = 1;
        p.seq_q = N, p.seq_k = N, p.head_dim = D, p.head_dim_v = D, p.scale = 0.2f;
        mfa_visibility_band(N, N, 0, -1, seed % 2 ? 0 : -1, &p.band_lo, &p.band_hi);
        mfa_view view = {(char*)problem.qkv.data(), {H * N * D, N * D, D, 1}};
        p.q = p.k = p.v = view;
        view.data = (char*)problem.out.data();
        p.out = view;
    };
    std::vector<Problem> alone((size_t)callers);
    for (int t = 0; t < callers; ++t) {
        make(t, alone[(size_t)t]);
        ops->forward(state, &alone[(size_t)t].p);
    }
    std::vector<int> mismatches((size_t)callers, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < callers; ++t)
        threads.emplace_back([&, t] {
            Problem mine;
            make(t, mine);
            for (int repeat = 0; repeat < 10; ++repeat) {
                std::fill(mine.out.begin(), mine.out.end(), 0.0f);
                if (ops->forward(state, &mine.p) != MFA_OK ||
                    memcmp(mine.out.data(), alone[(size_t)t].out.data(), mine.out.size() * 4))
                    ++mismatches[(size_t)t];
            }
        });
    for (std::thread& thread : threads) thread.join();
    for (int t = 0; t < callers; ++t)
        if (mismatches[(size_t)t])
            fail("concurrent caller %d: %d of 10 results differ from its result alone", t,
                 mismatches[(size_t)t]);
}

/* Peak virtual memory of the process (VmPeak), in bytes; -1 where /proc is not there. */
static long long peak_virtual_bytes() {
    FILE* status = fopen("/proc/self/status", "r");
    if (!status) return -1;
    char line[256];
    long long kib = -1;
    while (fgets(line, sizeof line, status))
        if (sscanf(line, "VmPeak: %lld kB", &kib) == 1) break;
    fclose(status);
    return kib < 0 ? -1 : kib * 1024;
}

/* Scratch follows the work, not the context: a one-query, one-key call on a context of many
 * threads reserves what its two tasks need, not a tile set per thread (which was 2 MiB per
 * thread for the backward at D = 1024). */
static void test_scratch_follows_work(const mfa_backend_ops* ops) {
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MFA_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(MFA_TEST_ASAN)
    (void)ops;
    printf("scratch bound: skipped (AddressSanitizer's allocator maps memory of its own)\n");
    return;
#endif
    if (peak_virtual_bytes() < 0) {
        printf("scratch bound: skipped (no /proc/self/status)\n");
        return;
    }
    const int threads = 512;
    const int64_t D = 1024;
    mfa_context_options options;
    memset(&options, 0, sizeof options);
    options.num_threads = threads;
    void* state = nullptr;
    if (ops->create(&options, &state) != MFA_OK) {
        fail("create with %d threads: %s", threads, mfa_last_error());
        return;
    }
    std::vector<float> data((size_t)(9 * D), 0.5f), lse(1, 0.0f);
    mfa_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = MFA_DTYPE_F32, p.batch = 1, p.heads_q = 1, p.heads_kv = 1, p.group = 1;
    p.seq_q = 1, p.seq_k = 1, p.head_dim = D, p.head_dim_v = D, p.scale = 0.03f;
    mfa_visibility_band(1, 1, 0, -1, -1, &p.band_lo, &p.band_hi);
    mfa_view* views[] = {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.dq, &p.dk, &p.dv};
    for (int i = 0; i < 8; ++i) *views[i] = mfa_view{(char*)(data.data() + i * D), {D, D, D, 1}};
    p.lse = mfa_view{(char*)lse.data(), {1, 1, 1, 1}};
    const long long before = peak_virtual_bytes();
    if (ops->forward(state, &p) != MFA_OK || ops->backward(state, &p) != MFA_OK)
        fail("scratch bound: call failed: %s", mfa_last_error());
    const long long rise = peak_virtual_bytes() - before;
    /* The inputs' own size is 36 KiB; 16 MiB leaves room for the allocator's arenas. */
    if (rise > (16ll << 20))
        fail("a 1 x 1 call at D = %lld on %d threads raised peak virtual memory by %lld MiB",
             (long long)D, threads, rise >> 20);
    printf("scratch bound: %d threads, 1 x 1 at D = %lld: peak virtual memory +%lld KiB\n", threads,
           (long long)D, rise >> 10);
    ops->destroy(state);
}

/* --quick (for emulated runs) leaves out the cases whose float64 reference costs the most. */
static bool quick = false;

static bool is_large(const Case& c) {
    return c.batch * c.heads_q * c.seq_q * c.seq_k * (c.dim + c.dim_v) > 20000000;
}

static void test_kernel_build(const mfa_backend_ops* ops, const char* isa) {
    setenv("MFA_CPU_ISA", isa, 1);
    mfa_context_options options;
    memset(&options, 0, sizeof options);
    options.num_threads = 3;
    void* state = nullptr;
    const mfa_status status = ops->create(&options, &state);
    if (status == MFA_ERROR_UNSUPPORTED) {
        printf("kernel build %s: skipped (%s)\n", isa, mfa_last_error());
        return;
    }
    if (status != MFA_OK) {
        fail("create with MFA_CPU_ISA=%s: %s", isa, mfa_last_error());
        return;
    }
    printf("kernel build %s: %s\n", isa, ops->device_name(state));
    std::mt19937 rng(7);
    for (const Case& c : cases) {
        if (quick && is_large(c)) continue;
        const int before = failures;
        run_case(ops, state, c, rng);
        if (failures != before) printf("  in case \"%s\"\n", c.name);
    }
    test_concurrent_callers(ops, state);
    ops->destroy(state);
}

int main(int argc, char** argv) {
    quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    test_conversions();
    printf("conversions: %s\n", failures ? "FAILED" : "ok");
    test_merge();
    printf("merge: %s\n", failures ? "FAILED" : "ok");

    const mfa_backend_ops* ops = mfa_cpu_backend_ops();
    if (ops->backend != MFA_BACKEND_CPU || !ops->available())
        fail("the ops table is not an available cpu backend");
#if defined(__x86_64__)
    const char* builds[] = {"avx512bf16", "avx512", "avx2", "portable"};
#elif defined(__aarch64__)
    const char* builds[] = {"neonbf16", "portable"};
#else
    const char* builds[] = {"portable"};
#endif
    for (const char* isa : builds) test_kernel_build(ops, isa);

    unsetenv("MFA_CPU_ISA");
    test_scratch_follows_work(ops);

    setenv("MFA_CPU_ISA", "no-such-isa", 1);
    void* state = nullptr;
    if (ops->create(nullptr, &state) != MFA_ERROR_INVALID_ARGUMENT ||
        !strstr(mfa_last_error(), "no-such-isa"))
        fail("MFA_CPU_ISA=no-such-isa was not rejected with a message naming it");
    unsetenv("MFA_CPU_ISA");

    printf("%s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}
