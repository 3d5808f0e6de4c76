/*
 * White-box test of the CPU backend: the dtype conversions against independent float64
 * arithmetic and the merge of partial states, then every kernel build this CPU can run (AVX-512
 * + BF16, AVX-512, AVX2, the portable one; NEON + BF16 and NEON on arm64) through the backend's
 * entry points against the float64 reference of test_reference.h: dense problems with every
 * score modifier (masks of each kind and broadcast, with and without their block summaries,
 * softcap, ALiBi in both alignments, sinks and their gradient), packed sequences (forward and
 * backward), paged caches with appended keys, initial states, decoding with split keys in each
 * layout; then concurrent callers on one context. The backend is hidden inside libmfa, so this
 * compiles its sources itself, with the core's error recording (core/errors.c), and builds the
 * problems the core would hand it; it stands in for the one other core function they call,
 * mfa_dtype_size.
 */
#include "core/backend.h"
#include "cpu/convert.h"
#include "cpu/merge.h"
#include "cpu/thread_pool.h"

#include "check.h"
#include "sanitizer.h"
#include "test_reference.h"

#include <math.h>
#include <stdio.h>
#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

/* Random inputs from the generator's raw bits. libstdc++'s real distributions compute a
   long-double logarithm for every draw (std::generate_canonical), which made drawing the inputs
   half of this test's time. */
static float uniform_between(std::mt19937& rng, float low, float high) {
    return low + (high - low) * (float)(rng() >> 8) * 0x1p-24f;
}

/* A deviate of mean 0 and variance 1, close to normal and bounded by +-sqrt(12): the centred sum
   of four uniform 16-bit integers (Irwin-Hall), each of variance 2^32 / 12. Box-Muller's
   logarithm and cosine took a quarter of this test's time. */
static double near_normal(std::mt19937& rng) {
    const uint32_t a = rng(), b = rng();
    const double sum =
        (double)(a & 0xffff) + (double)(a >> 16) + (double)(b & 0xffff) + (double)(b >> 16);
    return (sum - 2.0 * 65535.0) * (1.7320508075688772 / 65536.0);
}

extern "C" size_t mfa_dtype_size(mfa_dtype dtype) {
    switch (dtype) {
        case MFA_DTYPE_F32:
        case MFA_DTYPE_I32: return 4;
        case MFA_DTYPE_F16:
        case MFA_DTYPE_BF16: return 2;
        case MFA_DTYPE_BOOL: return 1;
    }
    return 0;
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
        CHECK(isnan(want) ? isnan(got) : (got == want && signbit(got) == signbit(want)),
              "f16 0x%04x -> %g, want %g", bits, (double)got, want);
        const float widened = mfa_cpu_bf16_to_f32(h);
        CHECK(mfa_cpu_f32_bits(widened) == bits << 16, "bf16 0x%04x widened to bits 0x%08x", bits,
              mfa_cpu_f32_bits(widened));
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
                CHECK(isnan(half) && isnan(brain), "NaN 0x%08x not kept NaN (f16 %g, bf16 %g)",
                      bits ^ sign, half, brain);
                continue;
            }
            const double want_half = reference_round(x, 10, -14, 65504.0);
            const double want_brain = reference_round(x, 7, -126, ldexp(255.0, 120));
            CHECK(half == want_half && signbit(half) == signbit(x), "f32 %a -> f16 %a, want %a",
                  (double)x, (double)half, want_half);
            CHECK(brain == want_brain && signbit(brain) == signbit(x), "f32 %a -> bf16 %a, want %a",
                  (double)x, (double)brain, want_brain);
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
        CHECK(fabs(lse - (peak + log(total))) <= 2e-6 * (1 + fabs(peak)), "merge: lse %g, want %g",
              lse, peak + log(total));
        for (int x = 0; x < width; ++x) {
            double want = 0;
            for (int j = 0; j < keys; ++j) want += exp(score[j] - peak) / total * value[j][x];
            /* An empty part's out is NaN here: weight 0 must keep it out of the sum. */
            CHECK(fabs(out[x] - want) <= 1e-6, "merge: out[%d] = %g, want %g", x, out[x], want);
        }
    }
    float lse[3] = {-INFINITY, -INFINITY, -INFINITY}, weights[3], rows[3] = {7, 8, 9}, out[1];
    CHECK(mfa_cpu_merge_weights(lse, 1, 3, weights) == -INFINITY,
          "merge: parts that saw no key do not give lse -inf");
    mfa_cpu_merge_rows(rows, 1, 3, weights, 1, out);
    CHECK(out[0] == 0, "merge: parts that saw no key give out %g, not 0", out[0]);
    lse[1] = NAN;
    lse[2] = 1;
    CHECK(isnan(mfa_cpu_merge_weights(lse, 1, 3, weights)), "merge: a NaN lse was dropped");
    mfa_cpu_merge_rows(rows, 1, 3, weights, 1, out);
    CHECK(isnan(out[0]), "merge: a NaN lse did not reach out");
}

/* ---- Tensors, masks and modifiers ----------------------------------------------------------- */

/* A rank-4 tensor in one of several memory layouts, read and written through its view. */
struct Tensor {
    mfa_dtype dtype;
    int64_t shape[4];
    std::vector<char> memory;
    mfa_view view;

    /* layout 0: [B,H,N,D]; 1: [B,N,H,D]; 2: padded strides with every other element; 3: as 0,
     * one element past the start of its memory (16-bit rows 2 bytes past a 4-byte boundary, as
     * a numpy view x[..., 1:] has them: pairs read in place may assume no wider alignment);
     * reverse: the sequence axis runs backwards (negative stride). */
    Tensor(mfa_dtype type, int64_t b, int64_t h, int64_t n, int64_t d, int layout = 0,
           bool reverse = false)
        : dtype(type), shape{b, h, n, d} {
        int64_t s[4] = {0, 0, 0, 0};
        const int64_t lead = layout == 3 ? 1 : 0;
        if (layout == 0 || layout == 3) {
            s[3] = 1, s[2] = d, s[1] = n * d, s[0] = h * n * d;
        } else if (layout == 1) {
            s[3] = 1, s[1] = d, s[2] = h * d, s[0] = n * h * d;
        } else {
            s[3] = 2, s[2] = 2 * d + 3, s[1] = s[2] * n + 5, s[0] = s[1] * h;
        }
        int64_t span = lead + 1;
        for (int i = 0; i < 4; ++i) span += (shape[i] - 1) * s[i];
        memory.assign((size_t)std::max<int64_t>(span, 1) * mfa_dtype_size(dtype), 0);
        view = mfa_view{};
        view.data = memory.data() + lead * (int64_t)mfa_dtype_size(dtype);
        for (int i = 0; i < 4; ++i) view.stride[i] = s[i];
        if (reverse && n > 0) {
            view.data += (n - 1) * s[2] * (int64_t)mfa_dtype_size(dtype);
            view.stride[2] = -s[2];
        }
    }

    /* Moves keep the memory, and so the view; copies would not. */
    Tensor(Tensor&&) = default;
    Tensor& operator=(Tensor&&) = default;
    Tensor(const Tensor&) = delete;
    Tensor& operator=(const Tensor&) = delete;

    char* at(int64_t b, int64_t h, int64_t n, int64_t d) {
        return view.data +
               (int64_t)mfa_dtype_size(dtype) * (b * view.stride[0] + h * view.stride[1] +
                                                 n * view.stride[2] + d * view.stride[3]);
    }

    double get(int64_t b, int64_t h, int64_t n, int64_t d) {
        return test_get_value(at(b, h, n, d));
    }

    double test_get_value(const char* p) const {
        if (dtype == MFA_DTYPE_BOOL) return *p != 0;
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
        if (dtype == MFA_DTYPE_BOOL) {
            *p = x != 0;
            return;
        }
        if (dtype == MFA_DTYPE_F32) {
            memcpy(p, &x, 4);
            return;
        }
        const uint16_t bits =
            dtype == MFA_DTYPE_F16 ? mfa_cpu_f32_to_f16(x) : mfa_cpu_f32_to_bf16(x);
        memcpy(p, &bits, 2);
    }

    void fill_near_normal(std::mt19937& rng, double magnitude = 1) {
        for (int64_t b = 0; b < shape[0]; ++b)
            for (int64_t h = 0; h < shape[1]; ++h)
                for (int64_t n = 0; n < shape[2]; ++n)
                    for (int64_t d = 0; d < shape[3]; ++d)
                        set(b, h, n, d, (float)(near_normal(rng) * magnitude));
    }

    void fill(float x) {
        for (int64_t b = 0; b < shape[0]; ++b)
            for (int64_t h = 0; h < shape[1]; ++h)
                for (int64_t n = 0; n < shape[2]; ++n)
                    for (int64_t d = 0; d < shape[3]; ++d) set(b, h, n, d, x);
    }

    /* The same elements as the reference reads them. */
    mfa_tensor tensor() const { return sub(0, shape[0], 0, shape[2]); }

    /* Batches [b0, b0 + nb) and rows [s0, s0 + ns) of every head. */
    mfa_tensor sub(int64_t b0, int64_t nb, int64_t s0, int64_t ns) const {
        mfa_tensor t;
        t.data = view.data +
                 (int64_t)mfa_dtype_size(dtype) * (b0 * view.stride[0] + s0 * view.stride[2]);
        t.dtype = dtype;
        t.shape[0] = nb, t.shape[1] = shape[1], t.shape[2] = ns, t.shape[3] = shape[3];
        for (int i = 0; i < 4; ++i) t.strides[i] = view.stride[i];
        return t;
    }
};

enum MaskKind { kNoMask, kBoolMask, kAdditiveF32, kAdditiveDtype };
enum Summary { kNoSummary, kSummary, kLyingSummary };
/* Axes along which a mask has size 1 (broadcast). */
enum { kOneBatch = 1, kOneHead = 2, kOneQuery = 4, kOneKey = 8 };

/* The modifiers of a case. alibi: 0 none, 1 slopes [1, Hq], 2 slopes [B, Hq]. */
struct Modifiers {
    MaskKind mask = kNoMask;
    int broadcast = 0;
    Summary summary = kNoSummary;
    float softcap = 0;
    int alibi = 0;
    bool sinks = false;
};

/* The view of a tensor as the core hands it over: zero strides along size-1 axes. */
static mfa_view broadcast_view(const Tensor& t) {
    mfa_view v = t.view;
    for (int i = 0; i < 4; ++i)
        if (t.shape[i] == 1) v.stride[i] = 0;
    return v;
}

/* A mask over documents: a pair is visible when query and key fall into the same document
 * (90 positions, shifted per batch and head); odd documents have holes and a few rows that see
 * nothing, even ones are whole, with additive value 0. So a mask has blocks of all three
 * summary codes. Additive values elsewhere are drawn from [-1.5, 1.5]. */
struct Mask {
    mfa_dtype dtype = MFA_DTYPE_BOOL;
    Tensor values;
    std::vector<uint8_t> summary;
    int64_t summary_shape[4] = {0, 0, 0, 0};
    Tensor effective; /* what a lying summary makes of the mask: the reference's mask */
    bool lying = false;

    Mask() : values(MFA_DTYPE_BOOL, 1, 1, 1, 1), effective(MFA_DTYPE_BOOL, 1, 1, 1, 1) {}

    mfa_view view() const { return broadcast_view(values); }
    const Tensor& reference() const { return lying ? effective : values; }

    mfa_view summary_view() {
        mfa_view v = {};
        v.data = (char*)summary.data();
        v.stride[3] = 1;
        v.stride[2] = summary_shape[3];
        v.stride[1] = summary_shape[2] * summary_shape[3];
        v.stride[0] = summary_shape[1] * v.stride[1];
        for (int i = 0; i < 2; ++i)
            if (summary_shape[i] == 1) v.stride[i] = 0;
        return v;
    }
};

static double mask_value(const Tensor& m, int64_t b, int64_t h, int64_t i, int64_t j) {
    mfa_tensor t = m.tensor();
    return ref_mask_at(&t, b, h, i, j);
}

static bool pair_visible(mfa_dtype dtype, double value) {
    return dtype == MFA_DTYPE_BOOL ? value != 0 : value != -INFINITY;
}

/* The summary code of the pairs [i0, i1) x [j0, j1), from mfa.h's definition. */
static uint8_t summary_code_of(const Tensor& m, int64_t b, int64_t h, int64_t i0, int64_t i1,
                               int64_t j0, int64_t j1) {
    bool any_visible = false, all_plain = true;
    for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) {
            const double x = mask_value(m, b, h, i, j);
            const bool visible = pair_visible(m.dtype, x);
            any_visible |= visible;
            all_plain &= visible && (m.dtype == MFA_DTYPE_BOOL || x == 0);
        }
    return all_plain ? 2 : any_visible ? 1 : 0;
}

static Mask make_mask(MaskKind kind, mfa_dtype dtype, int64_t batch, int64_t heads, int64_t nq,
                      int64_t nk, int broadcast, Summary summary, std::mt19937& rng) {
    Mask mask;
    mask.dtype = kind == kBoolMask ? MFA_DTYPE_BOOL : kind == kAdditiveF32 ? MFA_DTYPE_F32 : dtype;
    const int64_t mb = broadcast & kOneBatch ? 1 : batch, mh = broadcast & kOneHead ? 1 : heads;
    const int64_t mq = broadcast & kOneQuery ? 1 : nq, mk = broadcast & kOneKey ? 1 : nk;
    mask.values = Tensor(mask.dtype, mb, mh, mq, mk);
    std::uniform_int_distribution<int> hole(0, 9);
    for (int64_t b = 0; b < mb; ++b)
        for (int64_t h = 0; h < mh; ++h) {
            const int64_t shift = (b * 7 + h * 13) % 50;
            for (int64_t i = 0; i < mq; ++i)
                for (int64_t j = 0; j < mk; ++j) {
                    const int64_t di = (i + shift) / 90, dj = (j + shift) / 90;
                    const bool odd = di % 2 == 1;
                    const bool visible =
                        di == dj && !(odd && i % 41 == 3) && !(odd && hole(rng) == 0);
                    float value = visible ? 1.0f : 0.0f;
                    if (kind != kBoolMask)
                        value = !visible ? -INFINITY
                                : odd    ? uniform_between(rng, -1.5f, 1.5f)
                                         : 0.0f;
                    mask.values.set(b, h, i, j, value);
                }
        }
    if (summary == kNoSummary) return mask;
    const int64_t bs = MFA_MASK_BLOCK;
    const int64_t rows = (nq + bs - 1) / bs, cols = (nk + bs - 1) / bs;
    const int64_t shape[4] = {mb, mh, rows, cols};
    memcpy(mask.summary_shape, shape, sizeof shape);
    mask.summary.assign((size_t)(mb * mh * rows * cols), 0);
    int lies = 0;
    for (int64_t b = 0; b < mb; ++b)
        for (int64_t h = 0; h < mh; ++h)
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t c = 0; c < cols; ++c) {
                    uint8_t code =
                        summary_code_of(mask.values, b, h, r * bs, std::min((r + 1) * bs, nq),
                                        c * bs, std::min((c + 1) * bs, nk));
                    /* A lying summary: the backend must trust it, skipping a mixed block it
                     * marks hidden and adding nothing where it says so, without reading. */
                    if (summary == kLyingSummary && code == 1) code = (uint8_t)(lies++ % 3);
                    mask.summary[(size_t)(((b * mh + h) * rows + r) * cols + c)] = code;
                }
    if (summary != kLyingSummary) return mask;
    mask.lying = true;
    mask.effective = Tensor(mask.dtype, mb, mh, nq, nk);
    for (int64_t b = 0; b < mb; ++b)
        for (int64_t h = 0; h < mh; ++h)
            for (int64_t i = 0; i < nq; ++i)
                for (int64_t j = 0; j < nk; ++j) {
                    const uint8_t code =
                        mask.summary[(size_t)(((b * mh + h) * rows + i / bs) * cols + j / bs)];
                    const double original = mask_value(mask.values, b, h, i, j);
                    const double hidden = mask.dtype == MFA_DTYPE_BOOL ? 0.0 : -INFINITY;
                    const double plain = mask.dtype == MFA_DTYPE_BOOL ? 1.0 : 0.0;
                    mask.effective.set(b, h, i, j,
                                       (float)(code == 0   ? hidden
                                               : code == 2 ? plain
                                                           : original));
                }
    return mask;
}

/* A call's modifiers: their arrays, the problem's views of them, and the reference's copies. */
struct ModifierArrays {
    Mask mask;
    std::vector<float> slopes, sinks, dsinks;
    std::vector<double> slopes_ref, sinks_ref;
    mfa_tensor mask_ref;

    /* Set up for B sequences (or batches), Hq query heads, and a mask over nq x nk. */
    void make(const Modifiers& m, mfa_dtype dtype, int64_t batch, int64_t heads, int64_t nq,
              int64_t nk, std::mt19937& rng) {
        if (m.mask != kNoMask) {
            mask = make_mask(m.mask, dtype, batch, heads, nq, nk, m.broadcast, m.summary, rng);
            mask_ref = mask.reference().tensor();
        }
        if (m.alibi) {
            const int64_t rows = m.alibi == 2 ? batch : 1;
            for (int64_t b = 0; b < rows; ++b)
                for (int64_t h = 0; h < heads; ++h)
                    slopes.push_back((float)((b + 1) * exp2(-8.0 * (h + 1) / (double)heads)));
            for (int64_t b = 0; b < batch; ++b)
                for (int64_t h = 0; h < heads; ++h)
                    slopes_ref.push_back(slopes[(size_t)((m.alibi == 2 ? b : 0) * heads + h)]);
        }
        if (m.sinks) {
            for (int64_t h = 0; h < heads; ++h) {
                sinks.push_back(h % 3 == 2 ? 4.0f : 0.7f * (float)h - 1.0f);
                sinks_ref.push_back(sinks.back());
            }
            dsinks.assign((size_t)heads, NAN);
        }
    }

    /* Into a problem with `heads` query heads. */
    void attach(const Modifiers& m, int64_t heads, mfa_problem* p) {
        p->softcap = m.softcap;
        if (m.mask != kNoMask) {
            p->mask = mask.view();
            p->mask_dtype = mask.dtype;
            if (m.summary != kNoSummary) p->block_mask = mask.summary_view();
        }
        if (m.alibi) {
            p->alibi_slopes.data = (char*)slopes.data();
            p->alibi_slopes.stride[0] = m.alibi == 2 ? heads : 0;
            p->alibi_slopes.stride[1] = 1;
        }
        if (m.sinks) {
            p->sinks.data = (char*)sinks.data();
            p->sinks.stride[1] = 1;
            p->dsinks.data = (char*)dsinks.data();
            p->dsinks.stride[1] = 1;
        }
    }

    /* Into the reference of sequence b (0 for a dense problem of all batches). */
    void refer(const Modifiers& m, int64_t b, int64_t heads, ref_problem* r) {
        r->softcap = m.softcap;
        r->alibi = m.alibi ? slopes_ref.data() + b * heads : NULL;
        r->sinks = m.sinks ? sinks_ref.data() : NULL;
        r->mask = m.mask != kNoMask ? &mask_ref : NULL;
    }
};

/* A library result against the reference. */
static void check_result(const char* label, const char* what, const mfa_tensor& got,
                         mfa_dtype dtype, const double* want, const double* magnitude,
                         int64_t reduction, double max_score) {
    char why[256];
    CHECK(ref_compare(&got, dtype, want, magnitude, reduction, max_score, why, sizeof why),
          "%s: %s: %s", label, what, why);
}

/* dsinks (f32 [Hq]) against the reference's, summed over the sequences' references. */
static void check_dsinks(const char* label, const std::vector<float>& got,
                         const std::vector<double>& want, const std::vector<double>& magnitude,
                         int64_t rows, double max_score) {
    Tensor t(MFA_DTYPE_F32, 1, (int64_t)got.size(), 1, 1);
    for (size_t h = 0; h < got.size(); ++h) t.set(0, (int64_t)h, 0, 0, got[h]);
    check_result(label, "dsinks", t.tensor(), MFA_DTYPE_F32, want.data(), magnitude.data(), rows,
                 max_score);
}

/* ---- Dense problems against float64 --------------------------------------------------------- */

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
    Modifiers mods = Modifiers();
};

static Modifiers with_mask(MaskKind kind, int broadcast = 0, Summary summary = kNoSummary) {
    Modifiers m;
    m.mask = kind;
    m.broadcast = broadcast;
    m.summary = summary;
    return m;
}

static Modifiers with(Modifiers m, float softcap, int alibi, bool sinks) {
    m.softcap = softcap;
    m.alibi = alibi;
    m.sinks = sinks;
    return m;
}

static const Modifiers kPlain = Modifiers();

/* A case with score modifiers: the fields before them as a Case, then the modifiers. */
static Case modified(Case c, const Modifiers& mods) {
    c.mods = mods;
    return c;
}

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
    /* bf16 rows read in place as pairs (the K^T panels, decoding's keys) from memory aligned to 2
     * bytes only: decoding's 2 rows take the dot-product path, its 16 the lanes (or AMX) path. */
    {"bf16 rows 2 bytes off 4-byte alignment, causal, GQA", MFA_DTYPE_BF16, 1, 4, 2, 150, 170, 64,
     48, -1, 0, true, 3, false},
    {"decode bf16 2 rows, 2 bytes off 4-byte alignment", MFA_DTYPE_BF16, 1, 4, 2, 1, 700, 64, 64,
     -1, -1, true, 3, false},
    {"decode bf16 16 rows, 2 bytes off 4-byte alignment", MFA_DTYPE_BF16, 1, 8, 1, 2, 700, 64, 64,
     -1, -1, true, 3, false, 1, 1, 0, kNoGradients},
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
    /* Scores with the rows in the lanes (more than W / 2 rows, at most W): 4 rows at W 4 (the
     * portable build; NEON, bf16 as pairs); AVX2 (W 8) takes its 6 rows in passes of 4 and 2
     * rows instead. */
    {"decode f32 6 rows", MFA_DTYPE_F32, 1, 6, 2, 2, 1300, 64, 64, -1, -1, true, 0, false},
    {"decode bf16 4 rows", MFA_DTYPE_BF16, 1, 4, 2, 2, 1300, 64, 64, -1, -1, true, 0, false},
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
    /* Plain scores spread wide (logits of standard deviation ~20) over several key blocks: a
     * row's max moves by more than the forward's rescaling lag in some blocks and by less in
     * others, so both its rescaled and its kept-max paths run, beside the causal diagonal's
     * strips. */
    {"wide logits over many key blocks, causal", MFA_DTYPE_F32, 1, 2, 1, 300, 700, 16, 16, -1, 0,
     true, 0, false, 4, 4},
    {"bf16 wide logits over many key blocks", MFA_DTYPE_BF16, 1, 2, 2, 140, 600, 32, 32, -1, -1,
     true, 1, false, 3, 3},
    /* Score modifiers, pairwise over mask kind and broadcast x summary x causal / window x GQA x
     * softcap x ALiBi (both alignments, both slope shapes) x sinks x dtype x path. */
    modified(
        {"bool mask, causal, GQA", MFA_DTYPE_F32, 2, 4, 2, 150, 200, 32, 24, -1, 0, true, 0, false},
        with_mask(kBoolMask)),
    modified({"bool mask + summary, window, heads broadcast", MFA_DTYPE_BF16, 1, 2, 1, 200, 200, 64,
              64, 80, 20, true, 1, false},
             with_mask(kBoolMask, kOneHead, kSummary)),
    modified({"lying summary, additive f32, batch broadcast", MFA_DTYPE_F32, 2, 2, 2, 130, 260, 16,
              16, -1, -1, true, 2, true},
             with_mask(kAdditiveF32, kOneBatch, kLyingSummary)),
    modified({"additive f16 mask, softcap 5, queries broadcast", MFA_DTYPE_F16, 1, 4, 4, 100, 140,
              48, 48, -1, -1, true, 0, false},
             with(with_mask(kAdditiveDtype, kOneQuery), 5.0f, 0, false)),
    modified({"softcap 3, ALiBi [Hq], causal, Nq < Nk", MFA_DTYPE_F32, 1, 4, 1, 70, 200, 40, 40, -1,
              0, true, 1, false, 2, 2},
             with(kPlain, 3.0f, 1, false)),
    modified({"ALiBi [B, Hq] top-left causal, Nq > Nk", MFA_DTYPE_BF16, 2, 2, 2, 150, 90, 32, 32,
              -1, 0, false, 0, false},
             with(kPlain, 0.0f, 2, false)),
    modified({"ALiBi bottom-right window, Nq < Nk", MFA_DTYPE_F32, 1, 3, 3, 60, 170, 16, 16, 30, 10,
              true, 2, false},
             with(kPlain, 0.0f, 1, false)),
    modified({"sinks, Nq > Nk causal: rows see only the sink", MFA_DTYPE_F32, 1, 6, 2, 100, 60, 24,
              24, -1, 0, true, 0, false},
             with(kPlain, 0.0f, 0, true)),
    modified({"sinks, softcap 2, bool mask + summary, ALiBi", MFA_DTYPE_BF16, 2, 4, 2, 180, 150, 64,
              32, -1, -1, true, 1, true},
             with(with_mask(kBoolMask, 0, kSummary), 2.0f, 2, true)),
    modified({"everything f16: additive q-dtype mask + summary, window", MFA_DTYPE_F16, 1, 4, 1,
              140, 170, 32, 40, 60, 15, false, 0, false},
             with(with_mask(kAdditiveDtype, kOneBatch, kSummary), 8.0f, 1, true)),
    modified({"mask broadcast on keys: whole rows hidden", MFA_DTYPE_F32, 2, 2, 1, 120, 100, 16, 16,
              -1, -1, true, 0, false},
             with(with_mask(kBoolMask, kOneKey), 0, 0, true)),
    modified({"softcap 1e-3 saturates, softcap 1e4 is linear", MFA_DTYPE_F32, 1, 2, 2, 70, 80, 16,
              16, -1, -1, true, 0, false},
             with(kPlain, 1e-3f, 0, false)),
    modified({"softcap 1e4", MFA_DTYPE_BF16, 1, 2, 2, 70, 80, 16, 16, -1, 0, true, 0, false},
             with(kPlain, 1e4f, 1, false)),
    modified({"softcap with scale 3e38: every score at +-softcap", MFA_DTYPE_F32, 1, 2, 1, 20, 30,
              8, 8, -1, -1, true, 0, false, 1e-30, 1, 3e38f},
             with(kPlain, 4.0f, 0, true)),
    /* Decoding with modifiers: split keys, masks read per row through their summaries. */
    modified({"decode bool mask + summary, sinks, split keys", MFA_DTYPE_F32, 1, 8, 2, 2, 3000, 64,
              64, -1, -1, true, 0, false},
             with(with_mask(kBoolMask, kOneBatch, kSummary), 0, 0, true)),
    modified({"decode additive bf16 mask, ALiBi, softcap", MFA_DTYPE_BF16, 2, 4, 4, 1, 1500, 128,
              128, -1, -1, true, 1, false},
             with(with_mask(kAdditiveDtype, kOneHead), 10.0f, 2, false)),
    modified({"decode f16 lying summary, causal, GQA 4 x Nq 4", MFA_DTYPE_F16, 1, 8, 2, 4, 1300, 40,
              24, -1, 0, true, 2, false},
             with(with_mask(kAdditiveF32, 0, kLyingSummary), 0, 1, true)),
    modified({"decode 16 rows in lanes, window, sinks", MFA_DTYPE_BF16, 1, 8, 1, 2, 2500, 64, 64,
              900, 0, false, 1, false},
             with(kPlain, 0.0f, 0, true)),
    modified({"decode f32 16 rows, bool mask, softcap", MFA_DTYPE_F32, 1, 4, 1, 4, 1800, 128, 32,
              -1, -1, true, 0, false},
             with(with_mask(kBoolMask, kOneQuery, kSummary), 6.0f, 0, false)),
    /* The rows in the lanes through the whole block (more than W / 2 rows): per-head masks that
     * make some rows' blocks hidden, some plain and some biased at once, per-row ALiBi slopes and
     * visible ends, odd key counts (a bf16 pair of keys with one missing), rows that see nothing,
     * converted f16 and strided f32 rows, and a NaN that must reach its group's rows. Forward
     * only: decoding is a forward path (the backward of these shapes is covered above). */
    modified({"decode 16 rows in lanes: additive mask, ALiBi, causal", MFA_DTYPE_BF16, 1, 8, 2, 4,
              999, 128, 128, -1, 0, true, 0, false, 1, 1, 0, kNoGradients},
             with(with_mask(kAdditiveF32), 0.0f, 1, false)),
    modified({"decode f16 16 rows converted, window, softcap, sinks", MFA_DTYPE_F16, 1, 8, 1, 2,
              701, 40, 24, 100, 0, true, 1, false, 1, 1, 0, kNoGradients},
             with(kPlain, 5.0f, 0, true)),
    modified({"decode 16 rows, Nq > Nk causal, bool mask", MFA_DTYPE_F32, 1, 4, 1, 4, 3, 64, 64, -1,
              0, true, 0, false, 1, 1, 0, kNoGradients},
             with_mask(kBoolMask)),
    {"decode f32 16 rows strided, MQA", MFA_DTYPE_F32, 1, 16, 1, 1, 701, 64, 32, -1, -1, true, 2,
     false, 1, 1, 0, kNoGradients},
    {"decode NaN key, 16 rows in lanes", MFA_DTYPE_BF16, 1, 8, 2, 4, 700, 64, 64, -1, -1, true, 0,
     false, 1, 1, 0, kNoGradients, true},
};

/* The reference problem of a dense case, as the core resolves it. */
static ref_problem reference_problem(int64_t batch, int64_t heads_q, int64_t heads_kv,
                                     int64_t seq_q, int64_t seq_k, int64_t dim, int64_t dim_v,
                                     float scale, int64_t window_left, int64_t window_right,
                                     bool bottom_right) {
    ref_problem r;
    memset(&r, 0, sizeof r);
    r.batch = batch, r.heads_q = heads_q, r.heads_kv = heads_kv;
    r.seq_q = seq_q, r.seq_k = seq_k, r.head_dim = dim, r.head_dim_v = dim_v;
    r.scale = scale;
    r.causal = 0;
    r.alignment = bottom_right ? MFA_ALIGN_BOTTOM_RIGHT : MFA_ALIGN_TOP_LEFT;
    r.window_left = window_left;
    r.window_right = window_right;
    return r;
}

static void fill_problem_shape(mfa_problem* p, mfa_dtype dtype, int64_t batch, int64_t heads_q,
                               int64_t heads_kv, int64_t seq_q, int64_t seq_k, int64_t dim,
                               int64_t dim_v, float scale, int64_t window_left,
                               int64_t window_right, bool bottom_right) {
    memset(p, 0, sizeof *p);
    p->dtype = dtype;
    p->batch = batch, p->heads_q = heads_q, p->heads_kv = heads_kv, p->group = heads_q / heads_kv;
    p->seq_q = seq_q, p->seq_k = seq_k, p->head_dim = dim, p->head_dim_v = dim_v;
    p->scale = scale;
    p->alignment = bottom_right ? MFA_ALIGN_BOTTOM_RIGHT : MFA_ALIGN_TOP_LEFT;
    p->window_left = window_left;
    p->window_right = window_right;
    mfa_problem_band(p, seq_q, seq_k, &p->band_lo, &p->band_hi);
}

static void check_finite(const char* label, const char* what, Tensor& t) {
    for (int64_t b = 0; b < t.shape[0]; ++b)
        for (int64_t h = 0; h < t.shape[1]; ++h)
            for (int64_t n = 0; n < t.shape[2]; ++n)
                for (int64_t d = 0; d < t.shape[3]; ++d)
                    if (!isfinite(t.get(b, h, n, d))) {
                        CHECK(false, "%s: %s[%lld, %lld, %lld, %lld] = %g, want a finite value",
                              label, what, (long long)b, (long long)h, (long long)n, (long long)d,
                              t.get(b, h, n, d));
                        return;
                    }
}

static void run_case(const mfa_backend_ops* ops, void* state, const Case& c, std::mt19937& rng) {
    const int64_t B = c.batch, Hq = c.heads_q, Hkv = c.heads_kv, Nq = c.seq_q, Nk = c.seq_k;
    const int64_t D = c.dim, Dv = c.dim_v;
    /* k and dv mix the other layouts in, but for layout 3, which every tensor has. */
    const int k_layout = c.layout == 3 ? 3 : (c.layout + 1) % 3;
    const int dv_layout = c.layout == 3 ? 3 : (c.layout + 2) % 3;
    Tensor q(c.dtype, B, Hq, Nq, D, c.layout, c.reverse);
    Tensor k(c.dtype, B, Hkv, Nk, D, k_layout, false);
    Tensor v(c.dtype, B, Hkv, Nk, Dv, c.layout, c.reverse);
    Tensor out(c.dtype, B, Hq, Nq, Dv, c.layout, false);
    Tensor lse(MFA_DTYPE_F32, B, Hq, Nq, 1, 0, c.reverse);
    Tensor dout(c.dtype, B, Hq, Nq, Dv, c.layout, false);
    Tensor dq(c.dtype, B, Hq, Nq, D, c.layout, c.reverse);
    Tensor dk(c.dtype, B, Hkv, Nk, D, c.layout, false);
    Tensor dv(c.dtype, B, Hkv, Nk, Dv, dv_layout, c.reverse);
    q.fill_near_normal(rng, c.q_magnitude);
    k.fill_near_normal(rng, c.k_magnitude);
    v.fill_near_normal(rng);
    dout.fill_near_normal(rng);
    /* Outputs start as NaN, so an element the backend does not write shows. */
    for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) t->fill(NAN);
    if (c.nan_key) k.set(0, 0, Nk / 2, 0, NAN);
    ModifierArrays mods;
    mods.make(c.mods, c.dtype, B, Hq, Nq, Nk, rng);

    mfa_problem p;
    const float scale = c.scale != 0 ? c.scale : 1.3f / sqrtf((float)D);
    fill_problem_shape(&p, c.dtype, B, Hq, Hkv, Nq, Nk, D, Dv, scale, c.window_left, c.window_right,
                       c.bottom_right);
    p.q = q.view, p.k = k.view, p.v = v.view, p.out = out.view, p.lse = lse.view;
    p.dout = dout.view, p.dq = dq.view, p.dk = dk.view, p.dv = dv.view;
    mods.attach(c.mods, Hq, &p);
    if (ops->forward(state, &p) != MFA_OK || ops->backward(state, &p) != MFA_OK) {
        CHECK(false, "%s: call failed: %s", c.name, mfa_last_error());
        return;
    }

    ref_problem r = reference_problem(B, Hq, Hkv, Nq, Nk, D, Dv, scale, c.window_left,
                                      c.window_right, c.bottom_right);
    mods.refer(c.mods, 0, Hq, &r);
    const mfa_tensor tq = q.tensor(), tk = k.tensor(), tv = v.tensor(), tout = out.tensor();
    const mfa_tensor tlse = lse.tensor(), tdout = dout.tensor();
    ref_result f = ref_forward(&r, &tq, &tk, &tv);
    check_result(c.name, "out", tout, c.dtype, f.out, f.out_mag, Nk, f.max_score);
    check_result(c.name, "lse", tlse, MFA_DTYPE_F32, f.lse, f.lse_mag, Nk, f.max_score);
    if (c.gradients == kCheckGradients) {
        /* The gradients of the forward as stored, which is what the backward reads. */
        ref_result g = ref_backward(&r, &tq, &tk, &tv, &tout, &tdout, &tlse, NULL);
        const int64_t longest = std::max(Nq, Nk);
        check_result(c.name, "dq", dq.tensor(), c.dtype, g.dq, g.dq_mag, longest, g.max_score);
        check_result(c.name, "dk", dk.tensor(), c.dtype, g.dk, g.dk_mag, longest * Hq, g.max_score);
        check_result(c.name, "dv", dv.tensor(), c.dtype, g.dv, g.dv_mag, longest * Hq, g.max_score);
        if (c.mods.sinks)
            check_dsinks(c.name, mods.dsinks, std::vector<double>(g.dsinks, g.dsinks + Hq),
                         std::vector<double>(g.dsinks_mag, g.dsinks_mag + Hq), B * Nq * Nk,
                         g.max_score);
        ref_free(&g);
    } else if (c.gradients == kFiniteGradients) {
        check_finite(c.name, "dq", dq);
        check_finite(c.name, "dk", dk);
        check_finite(c.name, "dv", dv);
    }
    ref_free(&f);
}

/* Sequence b of a packed or paged case against the dense reference: its problem (nq queries, nk
 * keys, the case's band and heads) with its batch's modifiers, the mask cut to its batch, rows
 * and keys (into *mask), and a label naming it. */
template <class SequenceCase>
static ref_problem sequence_problem(const SequenceCase& c, ModifierArrays& mods, int64_t b,
                                    int64_t nq, int64_t nk, float scale, char* label,
                                    size_t label_size, mfa_tensor* mask) {
    snprintf(label, label_size, "%s, sequence %lld", c.name, (long long)b);
    ref_problem r = reference_problem(1, c.heads_q, c.heads_kv, nq, nk, c.dim, c.dim_v, scale,
                                      c.window_left, c.window_right, c.bottom_right);
    mods.refer(c.mods, b, c.heads_q, &r);
    if (r.mask) {
        *mask = *r.mask;
        if (mask->shape[0] > 1)
            mask->data = (char*)mask->data + mfa_dtype_size(mask->dtype) * b * mask->strides[0];
        mask->shape[0] = 1;
        if (mask->shape[2] > 1) mask->shape[2] = nq;
        if (mask->shape[3] > 1) mask->shape[3] = nk;
        r.mask = mask;
    }
    return r;
}

/* out and lse of one sequence against the reference forward over its nk keys. */
static void check_forward(const char* label, const ref_problem& r, const mfa_tensor& q,
                          const mfa_tensor& k, const mfa_tensor& v, const mfa_tensor& out,
                          const mfa_tensor& lse, mfa_dtype dtype, int64_t nk) {
    ref_result f = ref_forward(&r, &q, &k, &v);
    check_result(label, "out", out, dtype, f.out, f.out_mag, nk, f.max_score);
    check_result(label, "lse", lse, MFA_DTYPE_F32, f.lse, f.lse_mag, nk, f.max_score);
    ref_free(&f);
}

/* ---- Packed sequences ------------------------------------------------------------------------
 * q [1, Hq, total_q, D] and k, v [1, Hkv, total_k, .] with offsets cu_q, cu_k; each sequence
 * against the dense reference of its own rows (its lengths, its band, its row of the mask and of
 * the slopes). Sequences of length 0 and 1 included, and bounds max_seqlen_q / _k above the
 * longest sequence, as callers give them. */
struct VarlenCase {
    const char* name;
    mfa_dtype dtype;
    int64_t heads_q, heads_kv, dim, dim_v;
    std::vector<int64_t> lengths_q, lengths_k;
    int64_t window_left, window_right;
    bool bottom_right;
    int layout;
    Modifiers mods;
};

/* Packed by hand: clang-format gives each field of a row holding lists a line of its own. */
/* clang-format off */
static const VarlenCase varlen_cases[] = {
    {"varlen causal, GQA, empty and single sequences", MFA_DTYPE_F32, 4, 2, 32, 32,
     {70, 0, 1, 200, 33, 5}, {70, 9, 1, 200, 40, 0}, -1, 0, true, 0, Modifiers()},
    {"varlen bshd, window, ALiBi [B, Hq], sinks", MFA_DTYPE_BF16, 2, 1, 64, 48, {130, 17, 256},
     {120, 30, 256}, 40, 8, true, 1, with(kPlain, 0.0f, 2, true)},
    {"varlen bool mask + summary, softcap, top-left", MFA_DTYPE_F16, 2, 2, 16, 16, {90, 140, 3},
     {150, 60, 80}, -1, 0, false, 0,
     with(with_mask(kBoolMask, kOneHead, kSummary), 4.0f, 0, false)},
    {"varlen additive mask, batch broadcast", MFA_DTYPE_F32, 3, 3, 24, 8, {50, 75}, {75, 50}, -1,
     -1, true, 1, with_mask(kAdditiveF32, kOneBatch)},
    /* Decoding rows (group x longest query <= 16): split keys per sequence. */
    {"varlen decode, sinks, split keys", MFA_DTYPE_BF16, 8, 2, 64, 64, {1, 2, 0, 1},
     {2000, 700, 300, 1}, -1, 0, true, 0, with(kPlain, 0.0f, 1, true)},
    {"varlen decode f32, lying summary", MFA_DTYPE_F32, 4, 4, 32, 32, {3, 1}, {1500, 2100}, -1, -1,
     true, 1, with_mask(kBoolMask, 0, kLyingSummary)},
    /* 16 rows in the lanes for one sequence, 8 (rows path at W 16) for another. */
    {"varlen decode 16 and 8 rows, ALiBi", MFA_DTYPE_BF16, 16, 2, 64, 64, {2, 1, 0}, {1500, 333, 50},
     -1, 0, true, 0, with(kPlain, 0.0f, 1, false)},
};
/* clang-format on */

static void run_varlen_case(const mfa_backend_ops* ops, void* state, const VarlenCase& c,
                            std::mt19937& rng) {
    const int64_t B = (int64_t)c.lengths_q.size(), Hq = c.heads_q, Hkv = c.heads_kv;
    const int64_t D = c.dim, Dv = c.dim_v;
    std::vector<int32_t> cu_q(1, 0), cu_k(1, 0);
    int64_t longest_q = 0, longest_k = 0;
    for (int64_t b = 0; b < B; ++b) {
        cu_q.push_back(cu_q.back() + (int32_t)c.lengths_q[(size_t)b]);
        cu_k.push_back(cu_k.back() + (int32_t)c.lengths_k[(size_t)b]);
        longest_q = std::max(longest_q, c.lengths_q[(size_t)b]);
        longest_k = std::max(longest_k, c.lengths_k[(size_t)b]);
    }
    const int64_t max_q = longest_q + 5, max_k = longest_k + 3;
    const int64_t total_q = cu_q.back(), total_k = cu_k.back();
    Tensor q(c.dtype, 1, Hq, total_q, D, c.layout), k(c.dtype, 1, Hkv, total_k, D, c.layout);
    Tensor v(c.dtype, 1, Hkv, total_k, Dv, c.layout), out(c.dtype, 1, Hq, total_q, Dv, c.layout);
    Tensor lse(MFA_DTYPE_F32, 1, Hq, total_q, 1), dout(c.dtype, 1, Hq, total_q, Dv, c.layout);
    Tensor dq(c.dtype, 1, Hq, total_q, D, c.layout), dk(c.dtype, 1, Hkv, total_k, D, c.layout);
    Tensor dv(c.dtype, 1, Hkv, total_k, Dv, c.layout);
    for (Tensor* t : {&q, &k, &v, &dout}) t->fill_near_normal(rng);
    for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) t->fill(NAN);
    ModifierArrays mods;
    mods.make(c.mods, c.dtype, B, Hq, max_q, max_k, rng);

    mfa_problem p;
    const float scale = 1.1f / sqrtf((float)D);
    fill_problem_shape(&p, c.dtype, B, Hq, Hkv, max_q, max_k, D, Dv, scale, c.window_left,
                       c.window_right, c.bottom_right);
    p.layout = MFA_LAYOUT_VARLEN;
    p.q = q.view, p.k = k.view, p.v = v.view, p.out = out.view, p.lse = lse.view;
    p.dout = dout.view, p.dq = dq.view, p.dk = dk.view, p.dv = dv.view;
    for (mfa_view* view : {&p.q, &p.k, &p.v, &p.out, &p.lse, &p.dout, &p.dq, &p.dk, &p.dv})
        view->stride[0] = 0;
    p.varlen.cu_seqlens_q.data = (char*)cu_q.data();
    p.varlen.cu_seqlens_q.stride[3] = 1;
    p.varlen.cu_seqlens_k.data = (char*)cu_k.data();
    p.varlen.cu_seqlens_k.stride[3] = 1;
    p.varlen.total_q = total_q, p.varlen.total_k = total_k;
    p.varlen.longest_q = longest_q, p.varlen.longest_k = longest_k;
    mods.attach(c.mods, Hq, &p);
    if (ops->forward(state, &p) != MFA_OK || ops->backward(state, &p) != MFA_OK) {
        CHECK(false, "%s: call failed: %s", c.name, mfa_last_error());
        return;
    }
    std::vector<double> dsinks((size_t)Hq, 0.0), dsinks_mag((size_t)Hq, 0.0);
    double max_score = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t nq = c.lengths_q[(size_t)b], nk = c.lengths_k[(size_t)b];
        const int64_t q0 = cu_q[(size_t)b], k0 = cu_k[(size_t)b];
        char label[160];
        mfa_tensor mask;
        ref_problem r = sequence_problem(c, mods, b, nq, nk, scale, label, sizeof label, &mask);
        const mfa_tensor tq = q.sub(0, 1, q0, nq), tk = k.sub(0, 1, k0, nk),
                         tv = v.sub(0, 1, k0, nk);
        const mfa_tensor tout = out.sub(0, 1, q0, nq), tlse = lse.sub(0, 1, q0, nq);
        const mfa_tensor tdout = dout.sub(0, 1, q0, nq);
        check_forward(label, r, tq, tk, tv, tout, tlse, c.dtype, nk);
        ref_result g = ref_backward(&r, &tq, &tk, &tv, &tout, &tdout, &tlse, NULL);
        const int64_t longest = std::max(nq, nk);
        check_result(label, "dq", dq.sub(0, 1, q0, nq), c.dtype, g.dq, g.dq_mag, longest,
                     g.max_score);
        check_result(label, "dk", dk.sub(0, 1, k0, nk), c.dtype, g.dk, g.dk_mag, longest * Hq,
                     g.max_score);
        check_result(label, "dv", dv.sub(0, 1, k0, nk), c.dtype, g.dv, g.dv_mag, longest * Hq,
                     g.max_score);
        for (int64_t h = 0; h < Hq && c.mods.sinks; ++h) {
            dsinks[(size_t)h] += g.dsinks[h];
            dsinks_mag[(size_t)h] += g.dsinks_mag[h];
        }
        max_score = std::max(max_score, g.max_score);
        ref_free(&g);
    }
    if (c.mods.sinks)
        check_dsinks(c.name, mods.dsinks, dsinks, dsinks_mag, total_q * longest_k, max_score);
}

/* ---- Paged caches ----------------------------------------------------------------------------
 * k and v as caches of blocks in flash-attn's memory order ([num_blocks, block_size, Hkv, D]),
 * blocks dealt to the sequences in a shuffled order, partial last blocks, block table entries
 * past each sequence's reach set to ids that do not exist (they must not be read), every cache
 * row no sequence holds set to NaN (a stray read shows), and k_new / v_new appended. Each
 * sequence against the dense reference of its keys; the caches afterwards hold exactly the new
 * rows in their places and nothing else changed. */
struct PagedCase {
    const char* name;
    mfa_dtype dtype;
    int64_t heads_q, heads_kv, seq_q, dim, dim_v;
    std::vector<int64_t> cached;
    int64_t new_len, block_size;
    int64_t window_left, window_right;
    bool bottom_right;
    Modifiers mods;
};

/* Packed by hand: clang-format gives each field of a row holding lists a line of its own. */
/* clang-format off */
static const PagedCase paged_cases[] = {
    {"paged decode, GQA, split keys, appended key", MFA_DTYPE_BF16, 8, 2, 1, 64, 64,
     {1999, 700, 0, 4095}, 1, 16, -1, 0, true, Modifiers()},
    {"paged decode f32, block 24, sinks, ALiBi", MFA_DTYPE_F32, 4, 4, 2, 32, 16, {300, 1000}, 2, 24,
     -1, 0, true, with(kPlain, 0.0f, 2, true)},
    {"paged decode 16 rows in lanes, block 48, appended keys", MFA_DTYPE_BF16, 16, 4, 4, 64, 64,
     {999, 2100}, 4, 48, -1, 0, true, with(kPlain, 0.0f, 1, false)},
    {"paged decode f32 16 rows, block 40", MFA_DTYPE_F32, 16, 1, 1, 128, 64, {1000, 77}, 1, 40, -1,
     0, true, Modifiers()},
    /* Pages of 40 keys: the AMX build's groups of 16 keys that cross a page are copied. */
    {"paged decode bf16 12 rows, block 40, sinks", MFA_DTYPE_BF16, 6, 1, 2, 128, 64, {1000, 333},
     3, 40, -1, 0, true, with(kPlain, 0.0f, 0, true)},
    {"paged decode f16, no new keys, bool mask + summary", MFA_DTYPE_F16, 2, 1, 3, 16, 16,
     {130, 517, 64}, 0, 8, -1, -1, true, with_mask(kBoolMask, kOneHead, kSummary)},
    {"paged chunked prefill, causal, softcap", MFA_DTYPE_F32, 4, 2, 40, 32, 32, {100, 0, 250}, 40,
     32, -1, 0, true, with(kPlain, 5.0f, 0, false)},
    {"paged prefill bf16, block 256, window, additive mask", MFA_DTYPE_BF16, 2, 2, 30, 64, 48,
     {600, 3}, 30, 256, 50, 0, true, with_mask(kAdditiveDtype, kOneBatch)},
};
/* clang-format on */

static void run_paged_case(const mfa_backend_ops* ops, void* state, const PagedCase& c,
                           std::mt19937& rng) {
    const int64_t B = (int64_t)c.cached.size(), Hq = c.heads_q, Hkv = c.heads_kv, Nq = c.seq_q;
    const int64_t D = c.dim, Dv = c.dim_v, bs = c.block_size, N_new = c.new_len;
    std::vector<int64_t> keys((size_t)B);
    int64_t longest = 0, needed = 0;
    for (int64_t b = 0; b < B; ++b) {
        keys[(size_t)b] = c.cached[(size_t)b] + N_new;
        longest = std::max(longest, keys[(size_t)b]);
        needed += (keys[(size_t)b] + bs - 1) / bs;
    }
    const int64_t max_blocks = (longest + bs - 1) / bs + 1, num_blocks = needed + 3;
    std::vector<int32_t> order((size_t)num_blocks), table((size_t)(B * max_blocks), 0);
    for (int64_t i = 0; i < num_blocks; ++i) order[(size_t)i] = (int32_t)i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int32_t> lengths((size_t)B);
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
        lengths[(size_t)b] = (int32_t)c.cached[(size_t)b];
        const int64_t reached = (keys[(size_t)b] + bs - 1) / bs;
        for (int64_t i = 0; i < max_blocks; ++i)
            table[(size_t)(b * max_blocks + i)] = i < reached ? order[next++] : -12345 - (int32_t)i;
    }
    auto block_of = [&](int64_t b, int64_t j) { return table[(size_t)(b * max_blocks + j / bs)]; };

    Tensor q(c.dtype, B, Hq, Nq, D), out(c.dtype, B, Hq, Nq, Dv), lse(MFA_DTYPE_F32, B, Hq, Nq, 1);
    Tensor logical_k(c.dtype, B, Hkv, longest, D), logical_v(c.dtype, B, Hkv, longest, Dv);
    Tensor k_cache(c.dtype, num_blocks, Hkv, bs, D, 1),
        v_cache(c.dtype, num_blocks, Hkv, bs, Dv, 1);
    Tensor k_want(c.dtype, num_blocks, Hkv, bs, D, 1), v_want(c.dtype, num_blocks, Hkv, bs, Dv, 1);
    Tensor k_new(c.dtype, B, Hkv, N_new, D), v_new(c.dtype, B, Hkv, N_new, Dv);
    for (Tensor* t : {&q, &logical_k, &logical_v}) t->fill_near_normal(rng);
    for (Tensor* t : {&out, &lse, &k_cache, &v_cache, &k_want, &v_want}) t->fill(NAN);
    /* Each sequence's rows into its blocks of the cache, or into the appended rows past its
     * cached length; the cache expected afterwards holds them all. */
    auto place = [&](Tensor& logical, Tensor& cache, Tensor& appended, Tensor& want,
                     int64_t width) {
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < Hkv; ++h)
                for (int64_t j = 0; j < keys[(size_t)b]; ++j)
                    for (int64_t x = 0; x < width; ++x) {
                        const float value = (float)logical.get(b, h, j, x);
                        if (j < c.cached[(size_t)b])
                            cache.set(block_of(b, j), h, j % bs, x, value);
                        else
                            appended.set(b, h, j - c.cached[(size_t)b], x, value);
                        want.set(block_of(b, j), h, j % bs, x, value);
                    }
    };
    place(logical_k, k_cache, k_new, k_want, D);
    place(logical_v, v_cache, v_new, v_want, Dv);
    ModifierArrays mods;
    mods.make(c.mods, c.dtype, B, Hq, Nq, max_blocks * bs, rng);

    mfa_problem p;
    const float scale = 0.9f / sqrtf((float)D);
    fill_problem_shape(&p, c.dtype, B, Hq, Hkv, Nq, max_blocks * bs, D, Dv, scale, c.window_left,
                       c.window_right, c.bottom_right);
    p.layout = MFA_LAYOUT_PAGED;
    p.q = q.view, p.k = k_cache.view, p.v = v_cache.view, p.out = out.view, p.lse = lse.view;
    p.paged.block_size = bs, p.paged.num_blocks = num_blocks, p.paged.max_blocks = max_blocks;
    p.paged.block_table.data = (char*)table.data();
    p.paged.block_table.stride[0] = max_blocks;
    p.paged.block_table.stride[3] = 1;
    p.paged.cache_seqlens.data = (char*)lengths.data();
    p.paged.cache_seqlens.stride[0] = 1;
    if (N_new > 0) p.paged.k_new = k_new.view, p.paged.v_new = v_new.view;
    p.paged.new_len = N_new;
    p.paged.longest_k = longest;
    mods.attach(c.mods, Hq, &p);
    p.dsinks = mfa_view{};
    if (ops->forward(state, &p) != MFA_OK) {
        CHECK(false, "%s: call failed: %s", c.name, mfa_last_error());
        return;
    }
    CHECK(memcmp(k_cache.memory.data(), k_want.memory.data(), k_cache.memory.size()) == 0 &&
              memcmp(v_cache.memory.data(), v_want.memory.data(), v_cache.memory.size()) == 0,
          "%s: the caches do not hold exactly their rows and the appended ones", c.name);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t nk = keys[(size_t)b];
        char label[160];
        mfa_tensor mask;
        ref_problem r = sequence_problem(c, mods, b, Nq, nk, scale, label, sizeof label, &mask);
        const mfa_tensor tq = q.sub(b, 1, 0, Nq), tk = logical_k.sub(b, 1, 0, nk);
        const mfa_tensor tv = logical_v.sub(b, 1, 0, nk);
        check_forward(label, r, tq, tk, tv, out.sub(b, 1, 0, Nq), lse.sub(b, 1, 0, Nq), c.dtype,
                      nk);
    }
}

/* ---- Initial states --------------------------------------------------------------------------
 * One call over keys [0, split) (with the sinks), a second over [split, Nk) folding them into
 * its out and lse: equal to one call over all keys. Rows whose state is then replaced by an
 * empty one (lse -inf, out NaN: it must not be read) get the second call's keys alone; entry
 * lses of NaN and +inf give NaN rows, as merging them would. */
struct StateCase {
    const char* name;
    mfa_dtype dtype;
    int64_t batch, heads_q, heads_kv, seq_q, seq_k, split, dim, dim_v;
    Modifiers mods; /* no ALiBi: its positions follow each call's own lengths */
};

static const StateCase state_cases[] = {
    {"initial state, forward path", MFA_DTYPE_F32, 2, 4, 2, 70, 300, 128, 32, 24,
     with(with_mask(kBoolMask, kOneHead, kSummary), 0.0f, 0, true)},
    {"initial state bf16, softcap, additive mask", MFA_DTYPE_BF16, 1, 2, 2, 40, 200, 64, 64, 64,
     with(with_mask(kAdditiveF32), 7.0f, 0, false)},
    {"initial state, decoding with split keys", MFA_DTYPE_F32, 1, 8, 2, 2, 4000, 1984, 64, 64,
     with(kPlain, 0.0f, 0, true)},
    {"initial state f16, decoding", MFA_DTYPE_F16, 2, 2, 1, 3, 900, 320, 16, 16,
     with(with_mask(kBoolMask, kOneBatch, kSummary), 3.0f, 0, false)},
    {"initial state bf16, decoding with split keys", MFA_DTYPE_BF16, 1, 8, 2, 2, 3000, 1001, 128,
     64, with(kPlain, 0.0f, 0, true)},
};

static void run_state_case(const mfa_backend_ops* ops, void* state, const StateCase& c,
                           std::mt19937& rng) {
    const int64_t B = c.batch, Hq = c.heads_q, Hkv = c.heads_kv, Nq = c.seq_q, Nk = c.seq_k;
    const int64_t D = c.dim, Dv = c.dim_v, split = c.split;
    Tensor q(c.dtype, B, Hq, Nq, D), k(c.dtype, B, Hkv, Nk, D, 1), v(c.dtype, B, Hkv, Nk, Dv);
    Tensor out(c.dtype, B, Hq, Nq, Dv, 1), lse(MFA_DTYPE_F32, B, Hq, Nq, 1);
    for (Tensor* t : {&q, &k, &v}) t->fill_near_normal(rng);
    for (Tensor* t : {&out, &lse}) t->fill(NAN);
    ModifierArrays mods;
    mods.make(c.mods, c.dtype, B, Hq, Nq, Nk, rng);
    const float scale = 1.0f / sqrtf((float)D);

    /* The first call: keys [0, split), the sinks. */
    mfa_problem first;
    fill_problem_shape(&first, c.dtype, B, Hq, Hkv, Nq, split, D, Dv, scale, -1, -1, true);
    first.q = q.view, first.k = k.view, first.v = v.view, first.out = out.view;
    first.lse = lse.view;
    mods.attach(c.mods, Hq, &first);
    first.dsinks = mfa_view{};
    /* The second: keys [split, Nk) from their own first row, mask columns and summary blocks
     * likewise (split is a multiple of MFA_MASK_BLOCK), no sinks, the state. */
    mfa_problem second = first;
    fill_problem_shape(&second, c.dtype, B, Hq, Hkv, Nq, Nk - split, D, Dv, scale, -1, -1, true);
    second.q = q.view, second.out = out.view, second.lse = lse.view;
    second.k = k.view, second.v = v.view;
    second.k.data = k.at(0, 0, split, 0);
    second.v.data = v.at(0, 0, split, 0);
    mods.attach(c.mods, Hq, &second);
    second.sinks = second.dsinks = mfa_view{};
    second.initial_state = 1;
    if (c.mods.mask != kNoMask) {
        second.mask.data += mfa_dtype_size(mods.mask.dtype) * split * second.mask.stride[3];
        if (c.mods.summary != kNoSummary)
            second.block_mask.data += split / MFA_MASK_BLOCK * second.block_mask.stride[3];
    }
    if (ops->forward(state, &first) != MFA_OK) {
        CHECK(false, "%s: first call failed: %s", c.name, mfa_last_error());
        return;
    }
    /* Rows replaced by special states: empty (out NaN, unread), NaN and +inf. */
    const float entries[3] = {-INFINITY, NAN, INFINITY};
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Nq; ++i) {
                const int64_t kind = (b * Hq * Nq + h * Nq + i) % 5;
                if (kind >= 3) continue;
                lse.set(b, h, i, 0, entries[kind]);
                for (int64_t x = 0; x < Dv; ++x) out.set(b, h, i, x, NAN);
            }
    std::vector<int> kinds((size_t)(B * Hq * Nq));
    for (size_t r = 0; r < kinds.size(); ++r) kinds[r] = (int)(r % 5);
    if (ops->forward(state, &second) != MFA_OK) {
        CHECK(false, "%s: second call failed: %s", c.name, mfa_last_error());
        return;
    }

    ref_problem r = reference_problem(B, Hq, Hkv, Nq, Nk, D, Dv, scale, -1, -1, true);
    mods.refer(c.mods, 0, Hq, &r);
    const mfa_tensor tq = q.tensor(), tk = k.tensor(), tv = v.tensor();
    ref_result all = ref_forward(&r, &tq, &tk, &tv);
    /* The second call's keys alone, without the sinks. */
    ref_problem tail_problem =
        reference_problem(B, Hq, Hkv, Nq, Nk - split, D, Dv, scale, -1, -1, true);
    mods.refer(c.mods, 0, Hq, &tail_problem);
    tail_problem.sinks = NULL;
    mfa_tensor tail_mask;
    if (tail_problem.mask) {
        tail_mask = *tail_problem.mask;
        if (tail_mask.shape[3] > 1) {
            tail_mask.data = (char*)tail_mask.data +
                             mfa_dtype_size(tail_mask.dtype) * split * tail_mask.strides[3];
            tail_mask.shape[3] = Nk - split;
        }
        tail_problem.mask = &tail_mask;
    }
    const mfa_tensor tk_tail = k.sub(0, B, split, Nk - split),
                     tv_tail = v.sub(0, B, split, Nk - split);
    ref_result tail = ref_forward(&tail_problem, &tq, &tk_tail, &tv_tail);
    for (size_t row = 0; row < kinds.size(); ++row) {
        const ref_result& from = kinds[row] == 0 ? tail : all;
        const bool nan = kinds[row] == 1 || kinds[row] == 2;
        all.lse[row] = nan ? NAN : from.lse[row];
        all.lse_mag[row] = from.lse_mag[row];
        for (int64_t x = 0; x < Dv; ++x) {
            const size_t at = row * (size_t)Dv + (size_t)x;
            all.out[at] = nan ? NAN : from.out[at];
            all.out_mag[at] = from.out_mag[at];
        }
    }
    const double max_score = std::max(all.max_score, tail.max_score);
    check_result(c.name, "out", out.tensor(), c.dtype, all.out, all.out_mag, Nk, max_score);
    check_result(c.name, "lse", lse.tensor(), MFA_DTYPE_F32, all.lse, all.lse_mag, Nk, max_score);
    ref_free(&all);
    ref_free(&tail);
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
        problem.qkv.resize((size_t)(H * N * D));
        for (float& x : problem.qkv) x = (float)near_normal(rng);
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
        CHECK(mismatches[(size_t)t] == 0,
              "concurrent caller %d: %d of 10 results differ from its result alone", t,
              mismatches[(size_t)t]);
}

#if defined(__linux__)
/* The CPUs in thread tid's affinity mask (0: the calling thread), or an empty set. */
static cpu_set_t affinity_of(pid_t tid) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(tid, sizeof set, &set) != 0) CPU_ZERO(&set);
    return set;
}

/* Every task of one thread-pool job waits for the others, so that each of the pool's threads
 * runs exactly one of them, and records the CPU it started on per slot. */
struct one_task_each {
    int threads;
    std::atomic<int> arrived{0};
    std::vector<int> cpu_of_slot;
    std::vector<cpu_set_t> affinity_of_slot; /* the thread's affinity as its task started */
    std::vector<pid_t> thread_of_slot;
};

static void one_task_each_task(void* context, int64_t, int slot) {
    one_task_each* job = static_cast<one_task_each*>(context);
    job->cpu_of_slot[(size_t)slot] = sched_getcpu();
    job->affinity_of_slot[(size_t)slot] = affinity_of(0);
    job->thread_of_slot[(size_t)slot] = (pid_t)syscall(SYS_gettid);
    ++job->arrived;
    for (int wait = 0; job->arrived.load() < job->threads && wait < 5000; ++wait) usleep(1000);
}

static void run_one_task_each(mfa_cpu::ThreadPool& pool, one_task_each& job) {
    job.threads = pool.threads();
    job.cpu_of_slot.assign((size_t)job.threads, -1);
    job.affinity_of_slot.resize((size_t)job.threads);
    job.thread_of_slot.assign((size_t)job.threads, 0);
    pool.run(job.threads, one_task_each_task, &job);
}

/* After an idle pause the pool starts a job with its workers kept off the caller's CPU
 * (thread_pool.h says why) and gives them every CPU back once they run; the caller's affinity is
 * never changed. The caller is pinned to one CPU of the process's set, then another. */
static void test_worker_placement() {
    const cpu_set_t start = affinity_of(0);
    std::vector<int> cpus;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
        if (CPU_ISSET(cpu, &start)) cpus.push_back(cpu);
    if (cpus.size() < 2) {
        printf("worker placement: skipped (%zu CPU)\n", cpus.size());
        return;
    }
    const int failures_before = test_failures;
    {
        mfa_cpu::ThreadPool pool(3);
        one_task_each warm_up;
        run_one_task_each(pool, warm_up); /* every worker has started */
        for (int cpu : {cpus.front(), cpus.back()}) {
            cpu_set_t pinned;
            CPU_ZERO(&pinned);
            CPU_SET(cpu, &pinned);
            CHECK(sched_setaffinity(0, sizeof pinned, &pinned) == 0, "pinning the caller to CPU %d",
                  cpu);
            usleep(5000); /* an idle pause */
            one_task_each job;
            run_one_task_each(pool, job);
            const std::vector<int>& started = job.cpu_of_slot;
            const std::vector<cpu_set_t>& affinities = job.affinity_of_slot;
            const cpu_set_t caller = affinity_of(0);
            CHECK(CPU_EQUAL(&caller, &pinned), "the job changed the caller's affinity");
            cpu_set_t held_off = start;
            CPU_CLR(cpu, &held_off);
            for (int slot = 0; slot + 1 < pool.threads(); ++slot) {
                CHECK(CPU_EQUAL(&affinities[(size_t)slot], &held_off),
                      "worker %d started its task after a pause on %d CPUs, not on the %zu "
                      "besides the caller's",
                      slot, CPU_COUNT(&affinities[(size_t)slot]), cpus.size() - 1);
                CHECK(started[(size_t)slot] >= 0 && started[(size_t)slot] != cpu,
                      "worker %d ran its first task after a pause on CPU %d, the caller's", slot,
                      started[(size_t)slot]);
            }
            for (int slot = 0; slot + 1 < pool.threads(); ++slot) {
                /* Each worker widens its affinity again right after its task. */
                const pid_t tid = job.thread_of_slot[(size_t)slot];
                cpu_set_t worker = affinity_of(tid);
                for (int wait = 0; wait < 1000 && !CPU_EQUAL(&worker, &start); ++wait) {
                    usleep(1000);
                    worker = affinity_of(tid);
                }
                CHECK(CPU_EQUAL(&worker, &start),
                      "a worker (thread %d) may run on %d CPUs after its task, not on all %zu",
                      (int)tid, CPU_COUNT(&worker), cpus.size());
            }
        }
    }
    CHECK(sched_setaffinity(0, sizeof start, &start) == 0, "restoring the caller's affinity");
    if (test_failures == failures_before)
        printf("worker placement: workers started off the caller's CPU, %zu CPUs\n", cpus.size());
}
#endif

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
#ifdef TEST_ASAN
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
        CHECK(false, "create with %d threads: %s", threads, mfa_last_error());
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
    CHECK(ops->forward(state, &p) == MFA_OK && ops->backward(state, &p) == MFA_OK,
          "scratch bound: call failed: %s", mfa_last_error());
    const long long rise = peak_virtual_bytes() - before;
    /* The inputs' own size is 36 KiB; 16 MiB leaves room for the allocator's arenas. */
    CHECK(rise <= (16ll << 20),
          "a 1 x 1 call at D = %lld on %d threads raised peak virtual memory by %lld MiB",
          (long long)D, threads, rise >> 20);
    printf("scratch bound: %d threads, 1 x 1 at D = %lld: peak virtual memory +%lld KiB\n", threads,
           (long long)D, rise >> 10);
    ops->destroy(state);
}

/* --quick (sanitized runs) leaves out the cases whose float64 reference costs the most, and
 * runs the f32 and f16 cases on no build with bf16 products on a dot-product instruction or
 * tiles (ISA names ending in bf16): there those problems run the f32-operand code of the build
 * of the same vector width, which runs them (plan.operand_pairs is for bf16 problems only).
 * --emulated (qemu) does the same with a fifth of --quick's work per case: every instruction
 * costs tens of times as much there, and what is particular to a build (its vector operations,
 * its bf16 products) shows in small problems as in large ones; the native runs take the rest. */
static int64_t quick_max_work = 0; /* 0: every case on every build */

static bool quick_skips(const Case& c, bool bf16_products) {
    return c.batch * c.heads_q * c.seq_q * c.seq_k * (c.dim + c.dim_v) > quick_max_work ||
           (bf16_products && c.dtype != MFA_DTYPE_BF16);
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
        CHECK(false, "create with MFA_CPU_ISA=%s: %s", isa, mfa_last_error());
        return;
    }
    printf("kernel build %s: %s\n", isa, ops->device_name(state));
    const bool bf16_products = strstr(isa, "bf16") != nullptr;
    std::mt19937 rng(7);
    for (const Case& c : cases)
        if (quick_max_work == 0 || !quick_skips(c, bf16_products)) run_case(ops, state, c, rng);
    for (const VarlenCase& c : varlen_cases) run_varlen_case(ops, state, c, rng);
    for (const PagedCase& c : paged_cases) run_paged_case(ops, state, c, rng);
    for (const StateCase& c : state_cases) run_state_case(ops, state, c, rng);
    test_concurrent_callers(ops, state);
    ops->destroy(state);
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--quick") == 0) quick_max_work = 20000000;
    if (argc > 1 && strcmp(argv[1], "--emulated") == 0) quick_max_work = 4000000;
    test_conversions();
    test_merge();

    const mfa_backend_ops* ops = mfa_cpu_backend_ops();
    CHECK(ops->backend == MFA_BACKEND_CPU && ops->available(),
          "the ops table is not an available cpu backend");
#if defined(__x86_64__)
    const char* builds[] = {"amxbf16", "avx512bf16", "avx512", "avx2", "portable"};
#elif defined(__aarch64__)
    const char* builds[] = {"neonbf16", "portable"};
#else
    const char* builds[] = {"portable"};
#endif
    for (const char* isa : builds) test_kernel_build(ops, isa);

    unsetenv("MFA_CPU_ISA");
    test_scratch_follows_work(ops);
#if defined(__linux__)
    test_worker_placement();
#endif

    setenv("MFA_CPU_ISA", "no-such-isa", 1);
    void* state = nullptr;
    CHECK_ERROR("MFA_CPU_ISA=no-such-isa", ops->create(nullptr, &state), MFA_ERROR_INVALID_ARGUMENT,
                "no-such-isa");
    unsetenv("MFA_CPU_ISA");
    return test_finish("cpu_backend_test");
}
