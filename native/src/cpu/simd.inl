/*
 * Vector type and element-wise math for one ISA build (see isa_select.cpp for why GCC/Clang
 * vector extensions). Expects MFA_CPU_VECTOR_BYTES from the kernels_<isa>.cpp including it; like
 * every kernel .inl it puts its code in the translation unit's anonymous namespace. Loads and
 * stores accept any alignment: tiles start 64-byte aligned but row offsets into them need not
 * be, and unaligned moves of aligned data cost nothing extra on the targets we build for.
 */
#ifndef MFA_CPU_SIMD_INL
#define MFA_CPU_SIMD_INL

#ifndef MFA_CPU_VECTOR_BYTES
#error "simd.inl is compiled through a kernels_<isa>.cpp that defines MFA_CPU_VECTOR_BYTES"
#endif

#include <stdint.h>
#include <string.h>
#if (MFA_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)) ||                                        \
    (MFA_CPU_VECTOR_BYTES == 32 && defined(__AVX__))
#include <immintrin.h>
#endif
#if MFA_CPU_VECTOR_BYTES == 16 && defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace {

typedef float vf __attribute__((vector_size(MFA_CPU_VECTOR_BYTES)));
typedef int32_t vi __attribute__((vector_size(MFA_CPU_VECTOR_BYTES)));
typedef float vf_unaligned
    __attribute__((vector_size(MFA_CPU_VECTOR_BYTES), aligned(4), may_alias));
typedef float vf_bytes __attribute__((vector_size(MFA_CPU_VECTOR_BYTES), aligned(1), may_alias));

static const int W = MFA_CPU_VECTOR_BYTES / 4;

static const float kLn2 = 0.693147180559945309f;
static const float kLog2e = 1.44269504088896341f;

/* p, which the optimizer can no longer see through, so that loads from it keep the addressing
 * they are written with. GCC 12 otherwise rewrites loads at constant offsets from a row pointer,
 * p + c for c = 0, 1, ..., as the row's base plus one loop-invariant register per offset; those
 * overflow the general registers and live in vector ones, each load then paying a move on an FMA
 * port (the f32 decode of 16 rows in the lanes ran 10-16 % faster with opaque rows on Emerald
 * Rapids). And it rewrites loads from several rows lda apart, row[r][k], as one address advanced
 * by lda from row to row, an add per row and step in the micro-kernel's loop (gemm.inl). */
template <class T>
static inline T opaque(T p) {
    __asm__("" : "+r"(p));
    return p;
}

static inline vf vload(const float* p) { return *(const vf_unaligned*)p; }
static inline void vstore(float* p, vf x) { *(vf_unaligned*)p = x; }
/* W 32-bit units from memory aligned only to 2 bytes: f32 values, or pairs of 16-bit values read
 * in place from a row that may start at any element (a bf16 view one element into its buffer).
 * One unaligned vector load, as vload is. */
static inline vf vload_units(const char* p) { return *(const vf_bytes*)p; }
/* x - (+0) is x for every x, -0 included, so compilers fold this to a plain broadcast (x + 0
 * would not fold: -0 + 0 is +0). */
static inline vf vsplat(float x) { return x - vf{}; }

static inline vf vselect(vi mask, vf if_set, vf if_clear) {
    return (vf)((mask & (vi)if_set) | (~mask & (vi)if_clear));
}

/* a > b ? a : b (b where either is NaN), and a < b ? a : b: what maxps and minps compute, so
 * one instruction each on x86; GCC leaves the generic form as a compare and two logic ops, whose
 * latency a running max over a row of scores pays on every vector. */
#if MFA_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)
static inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
static inline vf vmin(vf a, vf b) { return (vf)_mm512_min_ps((__m512)a, (__m512)b); }
#elif MFA_CPU_VECTOR_BYTES == 32 && defined(__AVX__)
static inline vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)a, (__m256)b); }
static inline vf vmin(vf a, vf b) { return (vf)_mm256_min_ps((__m256)a, (__m256)b); }
#else
static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }
static inline vf vmin(vf a, vf b) { return vselect(a < b, a, b); }
#endif

/* Whether any lane of a comparison's result is set. */
static inline bool vany(vi mask) {
#if MFA_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)
    return _mm512_test_epi32_mask((__m512i)mask, (__m512i)mask) != 0;
#else
    uint64_t words[MFA_CPU_VECTOR_BYTES / 8];
    memcpy(words, &mask, sizeof words);
    uint64_t any = 0;
    for (int i = 0; i < MFA_CPU_VECTOR_BYTES / 8; ++i) any |= words[i];
    return any != 0;
#endif
}

/* Horizontal reductions by halving, so that one costs log2(W) shuffles and operations. */
typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi4 __attribute__((vector_size(16)));

static inline vf4 vmax4(vf4 a, vf4 b) {
    const vi4 pick = a > b;
    return (vf4)((pick & (vi4)a) | (~pick & (vi4)b));
}

static inline float hmax4(vf4 x) {
    x = vmax4(x, __builtin_shufflevector(x, x, 2, 3, 0, 1));
    x = vmax4(x, __builtin_shufflevector(x, x, 1, 0, 3, 2));
    return x[0];
}

static inline float hsum4(vf4 x) {
    x += __builtin_shufflevector(x, x, 2, 3, 0, 1);
    x += __builtin_shufflevector(x, x, 1, 0, 3, 2);
    return x[0];
}

#if MFA_CPU_VECTOR_BYTES >= 32
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));

static inline float hsum8(vf8 x) {
    return hsum4(__builtin_shufflevector(x, x, 0, 1, 2, 3) +
                 __builtin_shufflevector(x, x, 4, 5, 6, 7));
}
#endif

/* The largest lane (NaN lanes are the callers' to look for). */
static inline float hmax(vf x) {
#if MFA_CPU_VECTOR_BYTES == 64
    const vf8 half = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7);
    const vf8 other = __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
    const vf8 m8 = (vf8)(((half > other) & (vi8)half) | (~(half > other) & (vi8)other));
    return hmax4(vmax4(__builtin_shufflevector(m8, m8, 0, 1, 2, 3),
                       __builtin_shufflevector(m8, m8, 4, 5, 6, 7)));
#elif MFA_CPU_VECTOR_BYTES == 32
    return hmax4(vmax4(__builtin_shufflevector(x, x, 0, 1, 2, 3),
                       __builtin_shufflevector(x, x, 4, 5, 6, 7)));
#else
    return hmax4(x);
#endif
}

static inline float hsum(vf x) {
#if MFA_CPU_VECTOR_BYTES == 64
    return hsum8(__builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15));
#elif MFA_CPU_VECTOR_BYTES == 32
    return hsum8(x);
#else
    return hsum4(x);
#endif
}

/* Sums of many vectors at once, for dot products of several keys: fold<L>(a, b) takes a and b
 * each holding W / L groups of L lanes (one partial sum per lane of a group) and returns the
 * groups of a then those of b, each with its two halves added: W / L * 2 groups of L / 2 lanes.
 * Folding `count` vectors down to one leaves the sum of vector c in lanes of group c, for 2
 * shuffles and an add per fold instead of log2(W) of each per vector. */
static constexpr int fold_lane(int i, int lanes, int high) {
    /* Lane i of the result: group i / (lanes / 2) of a, then of b, the first or second half. */
    return (i / (lanes / 2) < W / lanes ? (i / (lanes / 2)) * lanes
                                        : W + (i / (lanes / 2) - W / lanes) * lanes) +
           i % (lanes / 2) + high * (lanes / 2);
}

#if MFA_CPU_VECTOR_BYTES == 64
#define MFA_CPU_LANES(F)                                                                           \
    F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7), F(8), F(9), F(10), F(11), F(12), F(13), F(14), \
        F(15)
#elif MFA_CPU_VECTOR_BYTES == 32
#define MFA_CPU_LANES(F) F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7)
#else
#define MFA_CPU_LANES(F) F(0), F(1), F(2), F(3)
#endif

template <int L>
static inline vf fold(vf a, vf b) {
#define MFA_CPU_LOW(i)  fold_lane(i, L, 0)
#define MFA_CPU_HIGH(i) fold_lane(i, L, 1)
    return __builtin_shufflevector(a, b, MFA_CPU_LANES(MFA_CPU_LOW)) +
           __builtin_shufflevector(a, b, MFA_CPU_LANES(MFA_CPU_HIGH));
#undef MFA_CPU_LOW
#undef MFA_CPU_HIGH
}

/* Folds `count` vectors of groups of LANES lanes pairwise into count / 2, then the one left onto
 * itself, down to single lanes: v[0] then holds the sum of the original v[c] in lane c. */
template <int LANES>
static inline void fold_all(vf* v, int count) {
    if constexpr (LANES > 1) {
        if (count > 1)
            for (int c = 0; c < count / 2; ++c) v[c] = fold<LANES>(v[2 * c], v[2 * c + 1]);
        else
            v[0] = fold<LANES>(v[0], v[0]);
        fold_all<LANES / 2>(v, count > 1 ? count / 2 : 1);
    }
}

/* out[c] = the sum of the lanes of v[c] for c < COUNT; v is clobbered. Folded W vectors at a
 * time, then what is left in powers of 2. */
template <int COUNT>
static inline void hsums(vf* v, float* out) {
    enum { kFolded = COUNT >= W ? W : 1 << (31 - __builtin_clz(COUNT)) };
    fold_all<W>(v, kFolded);
    if (kFolded == W)
        vstore(out, v[0]);
    else
        memcpy(out, &v[0], kFolded * sizeof(float));
    if constexpr (COUNT > kFolded) hsums<COUNT - kFolded>(v + kFolded, out + kFolded);
}

/* A W x W block of 32-bit values, row i in v[i], transposed in place: log2(W) rounds of the
 * perfect shuffle, each interleaving rows i and i + W / 2 into rows 2i and 2i + 1; after them
 * v[i] holds column i. W two-source shuffles per round (vpermt2ps on AVX-512, zip1/zip2 on
 * NEON), so a W x W block costs W log2(W) shuffles where element by element it would cost W^2
 * scalar stores. */
#define MFA_CPU_ZIP_LOW(i)  ((i) % 2 ? W + (i) / 2 : (i) / 2)
#define MFA_CPU_ZIP_HIGH(i) ((i) % 2 ? W + W / 2 + (i) / 2 : W / 2 + (i) / 2)
static inline void transpose_square(vf* v) {
    for (int round = 1; round < W; round *= 2) {
        vf out[W];
#pragma GCC unroll 16
        for (int i = 0; i < W / 2; ++i) {
            out[2 * i] =
                __builtin_shufflevector(v[i], v[i + W / 2], MFA_CPU_LANES(MFA_CPU_ZIP_LOW));
            out[2 * i + 1] =
                __builtin_shufflevector(v[i], v[i + W / 2], MFA_CPU_LANES(MFA_CPU_ZIP_HIGH));
        }
#pragma GCC unroll 16
        for (int i = 0; i < W; ++i) v[i] = out[i];
    }
}
#undef MFA_CPU_ZIP_LOW
#undef MFA_CPU_ZIP_HIGH

/* W bf16 values at p, widened to f32 (exactly: a bf16 is the top half of an f32). */
typedef uint16_t vh __attribute__((vector_size(MFA_CPU_VECTOR_BYTES / 2)));

static inline vf vload_bf16(const char* p) {
#if MFA_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)
    /* One widening load: GCC splits the generic conversion into 128-bit halves, six
     * instructions where two do. */
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return (vf)_mm512_slli_epi32(wide, 16);
#else
    vh h;
    memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vi) << 16);
#endif
}

/* 2^x for x <= 127, relative error below 1.1e-7 (at most 0.95 ulp of the result with FMAs,
 * 1.22 without, over 7e8 floats spread over [-126, 127]); exactly 0 below -126 (below -126.5 on
 * AVX2 and NEON: a subnormal between, so -inf gives 0 everywhere); NaN stays NaN, so a
 * non-finite input is never turned into a finite probability.
 * x = n + f with n = round(x), |f| <= 1/2: 2^f from the degree-6 polynomial with the smallest
 * largest relative error over [-1/2, 1/2] (Remez exchange; 1.9e-9 before f32 rounding), times
 * 2^n. One FMA fewer than the degree-7 Taylor series it replaces, at the same accuracy. */
static inline vf exp2_fraction(vf f) {
    vf p = vsplat(1.53458124e-4f);
    p = p * f + 1.33999309e-3f;
    p = p * f + 9.61848907e-3f;
    p = p * f + 5.55032864e-2f;
    p = p * f + 2.40226462e-1f;
    p = p * f + 6.93147182e-1f;
    p = p * f + 1.0f;
    return p;
}

#if MFA_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)
/* AVX-512: vrndscaleps rounds, vscalefps multiplies by 2^n (and gives inf past the range), and a
 * mask zeroes what lies below -126: about 12 instructions where the generic version below takes
 * 20, which is a tenth of a forward pass at D = 64. max(-127, x) keeps NaN (the second operand
 * of maxps is returned for NaN), and the "not less than, unordered" compare keeps it too. */
static inline vf vexp2(vf x) {
    const __m512 clamped = _mm512_max_ps(_mm512_set1_ps(-127.0f), (__m512)x);
    const __mmask16 kept = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    const __m512 n = _mm512_roundscale_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf p = exp2_fraction((vf)_mm512_sub_ps(clamped, n));
    return (vf)_mm512_maskz_scalef_ps(kept, (__m512)p, n);
}
#elif MFA_CPU_VECTOR_BYTES == 32 && defined(__AVX2__)
/* AVX2: the bounds through vmaxps and vminps with x as their second operand, which they return
 * for NaN, so that NaN stays NaN without a compare and a blend (its fraction is NaN, and the
 * exponent bits that vcvtps2dq's 0x80000000 leaves are a finite scale); vroundps rounds. Below
 * -126.5 the scale's exponent field is 0 and the result 0; from -126.5 to -126 it is 2^x as a
 * subnormal rather than 0 (every other input gives the generic version's bits). 14 instructions
 * where that version takes 20: the exponentials are the larger part of the softmax passes, a
 * sixth of a forward pass at D = 64. */
static inline vf vexp2(vf x) {
    const __m256 clamped =
        _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_max_ps(_mm256_set1_ps(-127.0f), (__m256)x));
    const __m256 n = _mm256_round_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf p = exp2_fraction((vf)_mm256_sub_ps(clamped, n));
    const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return p * (vf)_mm256_slli_epi32(biased, 23);
}
#elif MFA_CPU_VECTOR_BYTES == 16 && defined(__aarch64__)
/* NEON: as AVX2's, in the same 14 instructions where the generic version takes 21: fmax and fmin
 * return NaN for a NaN operand, whichever it is, so the bounds keep NaN (fcvtns makes its scale
 * 1); frintn rounds. The generic version's bits outside [-126.5, -126) (checked under qemu on
 * 3.3e8 floats spread over every exponent), as AVX2's. */
static inline vf vexp2(vf x) {
    const float32x4_t clamped =
        vminq_f32(vdupq_n_f32(127.0f), vmaxq_f32(vdupq_n_f32(-127.0f), (float32x4_t)x));
    const float32x4_t n = vrndnq_f32(clamped);
    const vf p = exp2_fraction((vf)vsubq_f32(clamped, n));
    const int32x4_t biased = vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127));
    return p * (vf)vshlq_n_s32(biased, 23);
}
#else
static inline vf vexp2(vf x) {
    const vi nan = x != x;
    const vf input = x;
    const vi underflow = x < vsplat(-126.0f);
    x = vmin(vmax(x, vsplat(-126.0f)), vsplat(127.0f));
    const vf round_shift = vsplat(12582912.0f); /* 1.5 * 2^23: adding it rounds to integer */
    const vf n = (x + round_shift) - round_shift;
    const vf p = exp2_fraction(x - n);
    const vi exponent = (__builtin_convertvector(n, vi) + 127) << 23;
    const vf result = p * (vf)exponent;
    return vselect(nan, input, (vf)((vi)result & ~underflow));
}
#endif

static inline vf vabs(vf x) { return (vf)((vi)x & 0x7fffffff); }

/* {0, 1, ..., W - 1}. */
static inline vf lane_offsets() {
    vf lane;
    for (int i = 0; i < W; ++i) lane[i] = (float)i;
    return lane;
}

/* x rounded to an integer (|x| < 2^22), and integer-valued n as 2^n for n in [-127, 127] with
 * 2^-127 built as 0. */
#if MFA_CPU_VECTOR_BYTES == 64 && defined(__AVX512F__)
static inline vf vround(vf x) {
    return (vf)_mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline vf vpow2(vf n) {
    /* scalef gives 2^-127 as a subnormal; the contract (and tanh below) wants it 0. */
    const __mmask16 normal = _mm512_cmp_ps_mask((__m512)n, _mm512_set1_ps(-127.0f), _CMP_GT_OQ);
    return (vf)_mm512_maskz_scalef_ps(normal, _mm512_set1_ps(1.0f), (__m512)n);
}
/* 1 / d to f32 accuracy (the estimate's 2^-14 squared by one Newton step): the divider runs 512
 * bits at a fraction of the multipliers' rate. */
static inline vf vreciprocal(vf d) {
    const vf r = (vf)_mm512_rcp14_ps((__m512)d);
    return r * (2.0f - d * r);
}
#else
static inline vf vreciprocal(vf d) { return 1.0f / d; }
static inline vf vround(vf x) {
    const vf round_shift = vsplat(12582912.0f); /* 1.5 * 2^23: adding it rounds to integer */
    return (x + round_shift) - round_shift;
}
static inline vf vpow2(vf n) { return (vf)((__builtin_convertvector(n, vi) + 127) << 23); }
#endif

/* tanh(x c) for c > 0, given as k = -2 log2(e) c (finite: see tanh_factor), relative error
 * below 4e-7 over the whole range (odd, so computed on |x| c):
 * tanh(a) = -m / (2 + m) with m = e^(-2a) - 1, where m comes without cancellation near 0: with
 * -2a = (n + f) / log2(e), |f| <= 1/2, m = 2^n * f * q(f) + (2^n - 1), q(f) = (2^f - 1) / f from
 * its Taylor series (truncated after f^6: error below 2e-8). -2a log2(e) is clamped at -126.9
 * (a = 44), where 2^n is built as 0: tanh is +-1 and 1 - tanh^2 exactly 0 from there on (it
 * would be below 2^-124). NaN stays NaN: the clamp keeps it, and it flows through the rest. With
 * SECH2, also 1 - tanh^2 = 4 e / (2 + m)^2 with e = 2^n (1 + f q(f)) into *sech2, to the same
 * relative accuracy: 1 - t * t from a rounded t would cancel where tanh nears +-1 (at |x c| = 5
 * it would lose three digits). */
template <bool SECH2>
static inline vf vtanh_scaled(vf x, vf k, vf* sech2) {
    const vf scaled = vabs(x) * k;
    const vf z = vselect(scaled < vsplat(-126.9f), vsplat(-126.9f), scaled);
    const vf n = vround(z);
    const vf f = z - n;
    vf q = vsplat(1.5252734e-5f);
    q = q * f + 1.5403530e-4f;
    q = q * f + 1.3333558e-3f;
    q = q * f + 9.6181291e-3f;
    q = q * f + 5.5504109e-2f;
    q = q * f + 2.4022651e-1f;
    q = q * f + 6.9314718e-1f;
    const vf power = vpow2(n);
    const vf fq = f * q;
    const vf m = power * fq + (power - 1.0f);
    const vf inverse = vreciprocal(-2.0f - m); /* of a value in [-2, -1] */
    if (SECH2) {
        const vf e = power * fq + power;
        *sech2 = 4.0f * e * (inverse * inverse);
    }
    const vf t = m * inverse;
    return (vf)((vi)t | ((vi)x & (vi)vsplat(-0.0f)));
}

/* Lanes c0 .. c0 + W - 1 that lie in [begin, end). */
static inline vi lanes_within(int64_t c0, int64_t begin, int64_t end) {
    vi lane;
    for (int i = 0; i < W; ++i) lane[i] = i;
    /* Bounds are clamped to [c0 - 1, c0 + W] first, so they fit the 32-bit lanes. */
    const int64_t lo = begin < c0 - 1 ? -1 : begin > c0 + W ? W : begin - c0;
    const int64_t hi = end < c0 - 1 ? -1 : end > c0 + W ? W : end - c0;
    return (lane >= (int32_t)lo) & (lane < (int32_t)hi);
}

/* x = e^(x - shift) in place; returns the sum. n is a multiple of W. The difference is taken in
 * natural units before the change of base, so it cannot overflow for x <= shift. */
static inline float exp_shifted_sum(float* x, int64_t n, float shift) {
    const vf s = vsplat(shift), log2e = vsplat(kLog2e);
    vf sum = vsplat(0.0f);
    for (int64_t i = 0; i < n; i += W) {
        const vf e = vexp2((vload(x + i) - s) * log2e);
        vstore(x + i, e);
        sum += e;
    }
    return hsum(sum);
}

static inline void scale_row(float* x, int64_t n, float factor) {
    const vf f = vsplat(factor);
    for (int64_t i = 0; i < n; i += W) vstore(x + i, vload(x + i) * f);
}

} // namespace

#endif /* MFA_CPU_SIMD_INL */
