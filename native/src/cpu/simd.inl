/*
 * Vector type and element-wise math for one ISA build (see isa_select.cpp for why GCC/Clang
 * vector extensions). Included inside the build's private namespace; expects
 * MFA_CPU_VECTOR_BYTES. Loads and stores accept any alignment: tiles start 64-byte aligned but
 * row offsets into them need not be, and unaligned moves of aligned data cost nothing extra on
 * the targets we build for.
 */

typedef float vf __attribute__((vector_size(MFA_CPU_VECTOR_BYTES)));
typedef int32_t vi __attribute__((vector_size(MFA_CPU_VECTOR_BYTES)));
typedef float vf_unaligned
    __attribute__((vector_size(MFA_CPU_VECTOR_BYTES), aligned(4), may_alias));

static const int W = MFA_CPU_VECTOR_BYTES / 4;

static const float kLn2 = 0.693147180559945309f;

static inline vf vload(const float* p) { return *(const vf_unaligned*)p; }
static inline void vstore(float* p, vf x) { *(vf_unaligned*)p = x; }
/* x - (+0) is x for every x, -0 included, so compilers fold this to a plain broadcast (x + 0
 * would not fold: -0 + 0 is +0). */
static inline vf vsplat(float x) { return x - vf{}; }

static inline vf vselect(vi mask, vf if_set, vf if_clear) {
    return (vf)((mask & (vi)if_set) | (~mask & (vi)if_clear));
}

static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }
static inline vf vmin(vf a, vf b) { return vselect(a < b, a, b); }

static inline float hmax(vf x) {
    float m = x[0];
    for (int i = 1; i < W; ++i) m = x[i] > m ? x[i] : m;
    return m;
}

static inline float hsum(vf x) {
    float s = 0.0f;
    for (int i = 0; i < W; ++i) s += x[i];
    return s;
}

/* 2^x for x <= 127, relative error below 2e-7; exactly 0 below -126 (so -inf gives 0); NaN
 * stays NaN, so a non-finite input is never turned into a finite probability.
 * x = n + f with n = round(x), |f| <= 1/2: 2^f from its degree-7 Taylor series in f*ln2
 * (truncation error (ln2/2)^8/8! < 1e-8), 2^n assembled in the exponent field. */
static inline vf vexp2(vf x) {
    const vi nan = x != x;
    const vf input = x;
    const vi underflow = x < vsplat(-126.0f);
    x = vmin(vmax(x, vsplat(-126.0f)), vsplat(127.0f));
    const vf round_shift = vsplat(12582912.0f); /* 1.5 * 2^23: adding it rounds to integer */
    const vf n = (x + round_shift) - round_shift;
    const vf f = x - n;
    vf p = vsplat(1.5252734e-5f);
    p = p * f + 1.5403530e-4f;
    p = p * f + 1.3333558e-3f;
    p = p * f + 9.6181291e-3f;
    p = p * f + 5.5504109e-2f;
    p = p * f + 2.4022651e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    const vi exponent = (__builtin_convertvector(n, vi) + 127) << 23;
    const vf result = p * (vf)exponent;
    return vselect(nan, input, (vf)((vi)result & ~underflow));
}

/* The largest of x[0 .. n), or NaN if any is NaN (a plain max would skip it). */
static inline float row_max(const float* x, int64_t n) {
    vf m = vsplat(-__builtin_inff());
    vi nan = vi{};
    for (int64_t i = 0; i < n; i += W) {
        const vf v = vload(x + i);
        m = vmax(m, v);
        nan |= v != v;
    }
    for (int i = 0; i < W; ++i)
        if (nan[i]) return __builtin_nanf("");
    return hmax(m);
}

/* x = 2^(x - shift) in place; returns the sum. n is a multiple of W. */
static inline float exp2_shifted_sum(float* x, int64_t n, float shift) {
    const vf s = vsplat(shift);
    vf sum = vsplat(0.0f);
    for (int64_t i = 0; i < n; i += W) {
        const vf e = vexp2(vload(x + i) - s);
        vstore(x + i, e);
        sum += e;
    }
    return hsum(sum);
}

static inline void scale_row(float* x, int64_t n, float factor) {
    const vf f = vsplat(factor);
    for (int64_t i = 0; i < n; i += W) vstore(x + i, vload(x + i) * f);
}
