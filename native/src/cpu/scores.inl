/*
 * Scores: from the dot products of a tile to the values the softmax reads, with mfa.h's
 * modifiers in its order (scale, softcap, ALiBi, the mask) and the visibility band.
 *
 * The band is one range of visible columns per row, clipped to the tile's real width, so that
 * padding columns (past it) count as hidden and the softmax needs no edge cases. A mask is read
 * tile by tile into an additive f32 bias (-inf hides, a boolean mask gives 0 or -inf), through
 * its block summary where the call gives one: blocks the summary marks hidden are filled
 * without reading the mask, and a tile that is hidden everywhere is reported so that its
 * products are skipped. Each pass below touches every element once; the modifiers a call lacks
 * cost nothing, because each combination is its own loop (chosen once per row).
 */
#ifndef MFA_CPU_SCORES_INL
#define MFA_CPU_SCORES_INL

#include "cpu/pack.inl"
#include "cpu/plan.h"
#include "cpu/simd.inl"

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace {

struct visible_range {
    int64_t begin, end; /* 0 <= begin <= end <= width */
};

static inline visible_range clip_range(int64_t begin, int64_t end, int64_t width) {
    if (end > width) end = width;
    if (begin < 0) begin = 0;
    if (begin > end) begin = end;
    visible_range range = {begin, end};
    return range;
}

/* Row i of a tile whose columns are keys j0 .. j0 + width - 1. */
static inline visible_range keys_of_query(const mfa_cpu_sequence& s, int64_t i, int64_t j0,
                                          int64_t width) {
    return clip_range(mfa_cpu_key_begin(&s, i) - j0, mfa_cpu_key_end(&s, i) - j0, width);
}

/* Row j of a tile whose columns are queries i0 .. i0 + width - 1. */
static inline visible_range queries_of_key(const mfa_cpu_sequence& s, int64_t j, int64_t i0,
                                           int64_t width) {
    return clip_range(mfa_cpu_query_begin(&s, j) - i0, mfa_cpu_query_end(&s, j) - i0, width);
}

/* ---- The modifiers of one (sequence, query head) ------------------------------------------ */

enum { kSoftcap = 1, kAlibi = 2, kBias = 4 };

struct score_modifiers {
    float scale;
    float softcap;     /* 0: none */
    float tanh_factor; /* -2 log2(e) / softcap (vtanh_scaled), at least -FLT_MAX */
    float neg_slope;   /* -slope(b, h) with ALiBi */
    int kinds;         /* kSoftcap | kAlibi */
    int64_t diag;      /* p(i) = i + diag */
};

static inline float f32_at(const mfa_view& view, int64_t b, int64_t h) {
    float x;
    memcpy(&x, view.data + 4 * (b * view.stride[0] + h * view.stride[1]), sizeof x);
    return x;
}

static inline score_modifiers modifiers_of(const mfa_cpu_plan* plan, const mfa_cpu_sequence& s,
                                           int64_t h) {
    const mfa_problem* p = plan->problem;
    score_modifiers m;
    m.scale = p->scale;
    m.softcap = p->softcap;
    m.kinds = 0;
    m.tanh_factor = 0.0f;
    if (p->softcap > 0.0f) {
        m.kinds |= kSoftcap;
        /* The quotient overflows for a subnormal softcap; the most negative float keeps 0 at 0
         * there and still sends every other score to tanh's ends, where such a softcap puts
         * them anyway. */
        const float factor = -2.0f * kLog2e / p->softcap;
        m.tanh_factor = factor > -3.4028235e38f ? factor : -3.4028235e38f;
    }
    m.neg_slope = 0.0f;
    if (mfa_view_present(&p->alibi_slopes)) {
        m.kinds |= kAlibi;
        m.neg_slope = -f32_at(p->alibi_slopes, s.batch, h);
    }
    m.diag = s.diag;
    return m;
}

/* The sink logit of query head h, or -inf without sinks (then it adds e^-inf = 0). */
static inline float sink_of(const mfa_cpu_plan* plan, int64_t h) {
    const mfa_problem* p = plan->problem;
    return mfa_view_present(&p->sinks) ? f32_at(p->sinks, 0, h) : -__builtin_inff();
}

/* A row's modifiers as vectors, made once per row. */
struct score_vectors {
    vf scale, softcap, tanh_factor, neg_slope;
};

static inline score_vectors vectors_of(const score_modifiers& m) {
    score_vectors v = {vsplat(m.scale), vsplat(m.softcap), vsplat(m.tanh_factor),
                       vsplat(m.neg_slope)};
    return v;
}

/* One score from a dot product, before the band: steps 1 to 4 of mfa.h. The scale multiplies
 * the finished dot product, never an operand, so the scores are finite wherever the logits are
 * (softcap divides the scaled score inside the tanh, for the same reason). `distance` holds
 * p(i) - j per lane; with SECH2, the derivative of the softcapped score by the scaled one goes
 * to *sech2. */
template <int KINDS, bool SECH2>
static inline vf score_of(vf dot, const score_vectors& m, vf distance, const float* bias,
                          vf* sech2) {
    vf v = dot * m.scale;
    if (KINDS & kSoftcap) v = m.softcap * vtanh_scaled<SECH2>(v, m.tanh_factor, sech2);
    if (KINDS & kAlibi) v += m.neg_slope * vabs(distance);
    if (KINDS & kBias) v += vload(bias);
    return v;
}

/* ---- Forward: rows are queries --------------------------------------------------------------
 * x[0 .. n) (n a multiple of W) holds query row i's dot products with keys j0 + c; x becomes
 * the scores, -inf outside the row's visible range. `distance` is p(i) - j0; bias the row of
 * the mask's bias (kBias). Returns the largest score, or NaN if any is NaN (a plain max would
 * skip it). */
template <int KINDS>
static float scores_row(float* x, int64_t n, const score_modifiers& m, int64_t distance,
                        const float* bias, visible_range range) {
    const vf hidden = vsplat(-__builtin_inff());
    const score_vectors mv = vectors_of(m);
    vf dist = vsplat((float)distance) - lane_offsets();
    vf top = hidden, unused;
    vi nan = vi{};
    for (int64_t c = 0; c < n; c += W) {
        vf v = score_of<KINDS, false>(vload(x + c), mv, dist, (KINDS & kBias) ? bias + c : nullptr,
                                      &unused);
        if (KINDS & kAlibi) dist -= vsplat((float)W);
        if (c < range.begin || c + W > range.end)
            v = vselect(lanes_within(c, range.begin, range.end), v, hidden);
        vstore(x + c, v);
        top = vmax(top, v);
        nan |= v != v;
    }
    for (int i = 0; i < W; ++i)
        if (nan[i]) return __builtin_nanf("");
    return hmax(top);
}

typedef float (*scores_row_fn)(float*, int64_t, const score_modifiers&, int64_t, const float*,
                               visible_range);

/* The loop for a row's modifiers, bias included when the row has one. */
static inline scores_row_fn scores_row_for(const score_modifiers& m, bool bias) {
    static const scores_row_fn loops[8] = {
        scores_row<0>,
        scores_row<kSoftcap>,
        scores_row<kAlibi>,
        scores_row<kSoftcap | kAlibi>,
        scores_row<kBias>,
        scores_row<kSoftcap | kBias>,
        scores_row<kAlibi | kBias>,
        scores_row<kSoftcap | kAlibi | kBias>,
    };
    return loops[m.kinds | (bias ? kBias : 0)];
}

/* ---- Backward: rows are keys ----------------------------------------------------------------
 * x[0 .. n) holds key row j's dot products with queries i0 + c; x becomes the probabilities
 * P = e^(score - lse) with the score of a hidden column taken as -inf. That gives 0 there, and
 * NaN where the query's lse is NaN, so a NaN row reaches every gradient of its group as the
 * contract says. A row that sees no key carries lse = +inf, which gives 0 whatever x is; the
 * exponent is formed in natural units, so nothing overflows where the logits fit. A probability
 * is at most 1: where logits are so large that their f32 rounding exceeds 1, a score recomputed
 * here may round above the lse the forward stored, and its P is taken as 1 instead of
 * e^(rounding). (A NaN exponent compares false and stays NaN.) With softcap the derivative of
 * the score by the scaled dot product, 1 - tanh^2, goes to softcap_grad. `distance` is
 * p(i0) - j. */
template <int KINDS>
static void probabilities_row(float* x, int64_t n, const score_modifiers& m, int64_t distance,
                              const float* bias, const float* lse, visible_range range,
                              float* softcap_grad) {
    const vf hidden = vsplat(-__builtin_inff()), log2e = vsplat(kLog2e), zero = vsplat(0.0f);
    const score_vectors mv = vectors_of(m);
    vf dist = vsplat((float)distance) + lane_offsets();
    /* One vector's P; `edge`: the vector may hold hidden columns. */
    const auto probabilities = [&](int64_t c, bool edge) {
        vf sech2 = vf{};
        vf v = score_of<KINDS, true>(vload(x + c), mv, dist, (KINDS & kBias) ? bias + c : nullptr,
                                     &sech2);
        if (KINDS & kSoftcap) vstore(softcap_grad + c, sech2);
        if (KINDS & kAlibi) dist += vsplat((float)W);
        if (edge && (c < range.begin || c + W > range.end))
            v = vselect(lanes_within(c, range.begin, range.end), v, hidden);
        const vf exponent = v - vload(lse + c);
        vstore(x + c, vexp2(vselect(exponent > zero, zero, exponent) * log2e));
    };
    /* Rows that see every column (most of them) run without the range tests. */
    if (range.begin <= 0 && range.end >= n) {
        for (int64_t c = 0; c < n; c += W) probabilities(c, false);
    } else {
        for (int64_t c = 0; c < n; c += W) probabilities(c, true);
    }
}

typedef void (*probabilities_row_fn)(float*, int64_t, const score_modifiers&, int64_t, const float*,
                                     const float*, visible_range, float*);

static inline probabilities_row_fn probabilities_row_for(const score_modifiers& m, bool bias) {
    static const probabilities_row_fn loops[8] = {
        probabilities_row<0>,
        probabilities_row<kSoftcap>,
        probabilities_row<kAlibi>,
        probabilities_row<kSoftcap | kAlibi>,
        probabilities_row<kBias>,
        probabilities_row<kSoftcap | kBias>,
        probabilities_row<kAlibi | kBias>,
        probabilities_row<kSoftcap | kAlibi | kBias>,
    };
    return loops[m.kinds | (bias ? kBias : 0)];
}

/* ---- Masks ----------------------------------------------------------------------------------
 * What a tile of the mask amounts to: hidden everywhere (its products are skipped), nothing
 * added anywhere (every pair visible with bias 0: no bias pass), or a bias tile. */
enum mask_tile_kind { kTileHidden, kTilePlain, kTileBias };

struct mask_bool {
    enum { size = 1 };
    static float load(const char* p) { return *p ? 0.0f : -__builtin_inff(); }
};

/* Bias of the mask over queries [i0, i0 + nq) and keys [j0, j0 + nk), at bias[q * q_step +
 * k * k_step] for the pair (i0 + q, j0 + k). Returns whether any pair is visible; *zero stays
 * true only while every value read is an additive 0. NaN counts as visible (it must reach the
 * result). */
template <class Elem>
static bool read_mask(const mfa_view& mask, int64_t b, int64_t h, int64_t i0, int64_t nq,
                      int64_t j0, int64_t nk, float* bias, int64_t q_step, int64_t k_step,
                      bool* zero) {
    const int64_t es = Elem::size;
    const char* origin = mask.data + es * (b * mask.stride[0] + h * mask.stride[1] +
                                           i0 * mask.stride[2] + j0 * mask.stride[3]);
    const int64_t row_step = es * mask.stride[2], elem_step = es * mask.stride[3];
    bool visible = false, all_zero = true;
    for (int64_t q = 0; q < nq; ++q) {
        const char* row = origin + q * row_step;
        float* out = bias + q * q_step;
        if (k_step == 1 && elem_step == es) {
            for (int64_t k = 0; k < nk; ++k) out[k] = Elem::load(row + k * es);
        } else {
            for (int64_t k = 0; k < nk; ++k) out[k * k_step] = Elem::load(row + k * elem_step);
        }
        for (int64_t k = 0; k < nk; ++k) {
            const float value = out[k * k_step];
            visible |= !(value == -__builtin_inff());
            all_zero &= value == 0.0f;
        }
    }
    *zero = *zero && all_zero;
    return visible;
}

static bool read_mask_values(const mfa_problem* p, int64_t b, int64_t h, int64_t i0, int64_t nq,
                             int64_t j0, int64_t nk, float* bias, int64_t q_step, int64_t k_step,
                             bool* zero) {
    switch (p->mask_dtype) {
        case MFA_DTYPE_BOOL:
            return read_mask<mask_bool>(p->mask, b, h, i0, nq, j0, nk, bias, q_step, k_step, zero);
        case MFA_DTYPE_F32:
            return read_mask<f32_storage>(p->mask, b, h, i0, nq, j0, nk, bias, q_step, k_step,
                                          zero);
        case MFA_DTYPE_F16:
            return read_mask<f16_storage>(p->mask, b, h, i0, nq, j0, nk, bias, q_step, k_step,
                                          zero);
        default:
            return read_mask<bf16_storage>(p->mask, b, h, i0, nq, j0, nk, bias, q_step, k_step,
                                           zero);
    }
}

static void fill_rect(float* bias, int64_t nq, int64_t nk, int64_t q_step, int64_t k_step,
                      float value) {
    for (int64_t q = 0; q < nq; ++q)
        for (int64_t k = 0; k < nk; ++k) bias[q * q_step + k * k_step] = value;
}

/* Summary code of the mask block holding (query i, key j) for query head h of sequence b. */
static inline uint8_t summary_code(const mfa_view& summary, int64_t b, int64_t h, int64_t i,
                                   int64_t j) {
    return (uint8_t)summary
        .data[b * summary.stride[0] + h * summary.stride[1] +
              i / MFA_MASK_BLOCK * summary.stride[2] + j / MFA_MASK_BLOCK * summary.stride[3]];
}

/* A boolean mask's tile with contiguous rows, classified eight bytes at a time, without
 * writing anything: kTileHidden (every byte 0), kTilePlain (every byte nonzero: true, with
 * nothing added) or kTileBias (mixed, to be read). Most tiles of masks like documents' or
 * padding's are one or the other, and this costs a fraction of reading them into floats. */
static mask_tile_kind classify_bool_tile(const mfa_view& mask, int64_t b, int64_t h, int64_t i0,
                                         int64_t nq, int64_t j0, int64_t nk) {
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    const char* origin =
        mask.data + b * mask.stride[0] + h * mask.stride[1] + i0 * mask.stride[2] + j0;
    uint64_t any = 0, zero_bytes = 0; /* zero_bytes: nonzero once a byte 0 was seen */
    for (int64_t q = 0; q < nq; ++q) {
        const char* row = origin + q * mask.stride[2];
        int64_t k = 0;
        for (; k + 8 <= nk; k += 8) {
            uint64_t word;
            memcpy(&word, row + k, 8);
            any |= word;
            zero_bytes |= (word - ones) & ~word & highs; /* nonzero iff word has a zero byte */
        }
        for (; k < nk; ++k) {
            any |= (uint8_t)row[k];
            zero_bytes |= row[k] == 0;
        }
        if (any && zero_bytes) return kTileBias;
    }
    return zero_bytes ? kTileHidden : kTilePlain;
}

/* The mask over queries [i0, i0 + nq) and keys [j0, j0 + nk) of sequence b, query head h (local
 * indices), into a tile of `ld` floats per row: query rows (key_major false: bias[q * ld + k])
 * or key rows (bias[k * ld + q]). The rows' columns past nk (or nq) up to `width` are set to 0.
 * Nothing is written for kTileHidden and kTilePlain. */
static mask_tile_kind mask_tile(const mfa_cpu_plan* plan, int64_t b, int64_t h, int64_t i0,
                                int64_t nq, int64_t j0, int64_t nk, bool key_major, float* bias,
                                int64_t ld, int64_t width) {
    const mfa_problem* p = plan->problem;
    if (!mfa_view_present(&p->mask) || nq <= 0 || nk <= 0) return kTilePlain;
    const int64_t q_step = key_major ? 1 : ld, k_step = key_major ? ld : 1;
    bool visible = false, zero = true;
    if (mfa_view_present(&p->block_mask)) {
        const int64_t bs = MFA_MASK_BLOCK;
        bool any_hidden = false, any_read = false, any_plain = false;
        for (int64_t bi = i0 / bs * bs; bi < i0 + nq; bi += bs)
            for (int64_t bj = j0 / bs * bs; bj < j0 + nk; bj += bs) {
                const uint8_t code = summary_code(p->block_mask, b, h, bi, bj);
                any_hidden |= code == 0;
                any_plain |= code == 2;
                any_read |= code == 1;
            }
        if (!any_read && !any_plain) return kTileHidden;
        if (!any_read && !any_hidden) return kTilePlain;
        visible = any_plain;
        for (int64_t bi = i0 / bs * bs; bi < i0 + nq; bi += bs)
            for (int64_t bj = j0 / bs * bs; bj < j0 + nk; bj += bs) {
                const int64_t qa = bi > i0 ? bi : i0, ka = bj > j0 ? bj : j0;
                const int64_t qn = (bi + bs < i0 + nq ? bi + bs : i0 + nq) - qa;
                const int64_t kn = (bj + bs < j0 + nk ? bj + bs : j0 + nk) - ka;
                float* rect = bias + (qa - i0) * q_step + (ka - j0) * k_step;
                const uint8_t code = summary_code(p->block_mask, b, h, bi, bj);
                if (code == 1)
                    visible |=
                        read_mask_values(p, b, h, qa, qn, ka, kn, rect, q_step, k_step, &zero);
                else
                    fill_rect(rect, qn, kn, q_step, k_step, code == 0 ? -__builtin_inff() : 0.0f);
            }
    } else {
        if (p->mask_dtype == MFA_DTYPE_BOOL && p->mask.stride[3] == 1) {
            const mask_tile_kind kind = classify_bool_tile(p->mask, b, h, i0, nq, j0, nk);
            if (kind != kTileBias) return kind;
        }
        visible = read_mask_values(p, b, h, i0, nq, j0, nk, bias, q_step, k_step, &zero);
        if (zero) return kTilePlain;
    }
    if (!visible) return kTileHidden;
    const int64_t rows = key_major ? nk : nq, cols = key_major ? nq : nk;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = cols; c < width; ++c) bias[r * ld + c] = 0.0f;
    return kTileBias;
}

} // namespace

#endif /* MFA_CPU_SCORES_INL */
