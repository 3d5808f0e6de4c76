/*
 * Products on bf16 operands with f32 accumulation, for builds whose CPU has a bf16 dot-product
 * instruction: each f32 lane adds the products of one pair of bf16 values (AVX512_BF16's
 * vdpbf16ps, ARMv8.6 BF16's bfdot). Operands are packed in pairs of consecutive reduction
 * indices (plan.h), so the micro-kernel is gemm.inl's with a pair in place of a float: per step
 * it loads NV vectors of B pairs and broadcasts one A pair per row. A bf16 row in memory is
 * already its own pair layout. Three primitives differ per architecture (below): the dot
 * product with a broadcast pair, and the two roundings of f32 tiles to pairs.
 *
 * What is rounded: Q, K, V and dO are bf16 inputs, so their products are exact in f32. P and dS
 * are rounded to bf16 (round to nearest even) before they multiply V, dO, K and Q, as GPU
 * FlashAttention does; sums and the softmax statistics stay f32.
 */
#ifndef MFA_CPU_GEMM_BF16_INL
#define MFA_CPU_GEMM_BF16_INL

#include "cpu/gemm.inl"
#include "cpu/pack.inl"
#include "cpu/simd.inl"

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace {

/* ---- bf16 pairs (bf16 inputs only: the values are copied, never rounded) ------------------ */

typedef uint32_t vu __attribute__((vector_size(MFA_CPU_VECTOR_BYTES)));

static inline uint32_t bf16_bits(const char* p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* Values d and d + 1 of a row as one unit; past width, zeros. */
static inline uint32_t bf16_pair(const char* row, int64_t elem_step, int64_t d, int64_t width) {
    const uint32_t lo = d < width ? bf16_bits(row + d * elem_step) : 0u;
    const uint32_t hi = d + 1 < width ? bf16_bits(row + (d + 1) * elem_step) : 0u;
    return lo | hi << 16;
}

/* A operand: row r as ld pairs at dst + r * ld, zero past width. */
static void pack_pair_rows(const strided_rows& src, int64_t count, int64_t width, float* dst,
                           int64_t ld) {
    for (int64_t r = 0; r < count; ++r) {
        if (r + kRowsAhead < count) src.prefetch(r + kRowsAhead, width, 2);
        uint16_t* out = (uint16_t*)(dst + r * ld);
        const char* row = src.row(r);
        if (src.elem_step == 2) {
            memcpy(out, row, (size_t)width * 2);
        } else {
            for (int64_t d = 0; d < width; ++d)
                out[d] = (uint16_t)bf16_bits(row + d * src.elem_step);
        }
        for (int64_t d = width; d < 2 * ld; ++d) out[d] = 0;
    }
}

/* Row panels of pairs of rows: unit (r / 2, x) of panel p holds column p * NR + x of rows r and
 * r + 1; zero past width and past count up to the next multiple of NR. */
static void pack_pair_panels(const strided_rows& src, int64_t count, int64_t width, float* dst,
                             int64_t panel_stride) {
    const int64_t panels = (width + NR - 1) / NR;
    const int64_t padded = (count + NR - 1) / NR * NR;
    for (int64_t p = 0; p < panels; ++p) {
        const int64_t d0 = p * NR;
        const int64_t n = width - d0 < NR ? width - d0 : NR;
        uint32_t* panel = (uint32_t*)(dst + p * panel_stride);
        for (int64_t r = 0; r < padded; r += 2) {
            uint32_t* out = panel + r / 2 * NR;
            for (int64_t ahead = r + kRowsAhead; p == 0 && ahead < r + kRowsAhead + 2; ++ahead)
                if (ahead < count) src.prefetch(ahead, width, 2);
            const char* lo = r < count ? src.row(r) + d0 * src.elem_step : (const char*)0;
            const char* hi = r + 1 < count ? src.row(r + 1) + d0 * src.elem_step : (const char*)0;
            int64_t x = 0;
            if (lo && src.elem_step == 2) {
                /* W columns at once: each row's bf16 values widened to 32-bit lanes, the second
                 * row's moved to the high halves. */
                for (; x + W <= n; x += W) {
                    vh a, b = vh{};
                    memcpy(&a, lo + 2 * x, sizeof a);
                    if (hi) memcpy(&b, hi + 2 * x, sizeof b);
                    const vu high = __builtin_convertvector(b, vu) << 16;
                    const vu pairs = __builtin_convertvector(a, vu) | high;
                    memcpy(out + x, &pairs, sizeof pairs);
                }
            }
            for (; x < NR; ++x) {
                const uint32_t a = lo && x < n ? bf16_bits(lo + x * src.elem_step) : 0u;
                const uint32_t b = hi && x < n ? bf16_bits(hi + x * src.elem_step) : 0u;
                out[x] = a | b << 16;
            }
        }
    }
}

/* Transposed panels of pairs: unit (u, r % NR) of panel r / NR holds values 2u and 2u + 1 of row
 * r; zero past depth and past count up to the next multiple of NR. */
static void pack_pair_panels_transposed(const strided_rows& src, int64_t count, int64_t depth,
                                        float* dst) {
    if (src.elem_step == 2 && depth % 2 == 0) {
        /* A row's pairs are adjacent 32-bit units: the f32 transposition moves them unchanged. */
        strided_rows units_of_rows = src;
        units_of_rows.elem_step = 4;
        pack_f32_panels_transposed<f32_storage>(units_of_rows, count, depth / 2, dst);
        return;
    }
    const int64_t padded = (count + NR - 1) / NR * NR;
    const int64_t units = (depth + 1) / 2;
    for (int64_t r = 0; r < padded; ++r) {
        uint32_t* column = (uint32_t*)dst + (r / NR) * units * NR + r % NR;
        if (r >= count) {
            for (int64_t u = 0; u < units; ++u) column[u * NR] = 0u;
            continue;
        }
        if (r + kRowsAhead < count) src.prefetch(r + kRowsAhead, depth, 2);
        const char* row = src.row(r);
        for (int64_t u = 0; u < units; ++u)
            column[u * NR] = bf16_pair(row, src.elem_step, 2 * u, depth);
    }
}

/* ---- Per architecture ---------------------------------------------------------------------- */

#if defined(__x86_64__)
/* acc += the pairwise products of b's bf16 pairs with the pair at a (aligned to 2 bytes at
 * least), broadcast to every lane. Inline assembly, because clang 16 crashes selecting vdpbf16ps
 * with a folded broadcast from the intrinsic (and the memory-broadcast form is the one wanted: it
 * costs no register); the operand is the pair's 4 bytes, with no alignment of a wider type. */
static inline vf dot_pairs(vf acc, vf b, const void* a) {
    typedef char pair_bytes[4];
    __m512 sum = (__m512)acc;
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0"
            : "+v"(sum)
            : "v"((__m512)b), "m"(*(const pair_bytes*)a));
    return (vf)sum;
}

/* 2W consecutive f32 values, lo then hi, rounded to bf16 (nearest even) as W pairs at dst. */
static inline void store_bf16_pairs(float* dst, vf lo, vf hi) {
    const __m512bh pairs = _mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
    _mm512_storeu_ps(dst, __builtin_bit_cast(__m512, pairs));
}

/* Lane r of lo and of hi rounded to bf16 (nearest even) as the pair in lane r. */
static inline __m512i round_lane_pairs(__m512 lo, __m512 hi) {
    const __m512i interleave =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i halves = __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo));
    return _mm512_permutexvar_epi16(interleave, halves);
}

/* count f32 rows of ld values (ld a multiple of 16) rounded to bf16 and paired across rows:
 * unit k * ld + r holds value r of rows 2k and 2k + 1 (zero past count). */
static inline void round_pairs_across_rows(const float* src, int64_t count, int64_t ld,
                                           float* dst) {
    for (int64_t k = 0; 2 * k < count; ++k) {
        const float* lo = src + 2 * k * ld;
        const bool odd = 2 * k + 1 < count;
        for (int64_t r = 0; r < ld; r += 16) {
            const __m512 a = _mm512_loadu_ps(lo + r);
            const __m512 b = odd ? _mm512_loadu_ps(lo + ld + r) : _mm512_setzero_ps();
            _mm512_storeu_si512(dst + k * ld + r, round_lane_pairs(a, b));
        }
    }
}
#elif defined(__aarch64__)
static inline vf dot_pairs(vf acc, vf b, const void* a) {
    uint32_t unit;
    memcpy(&unit, a, sizeof unit);
    const bfloat16x8_t pair = vreinterpretq_bf16_u32(vdupq_n_u32(unit));
    return (vf)vbfdotq_f32((float32x4_t)acc, vreinterpretq_bf16_f32((float32x4_t)b), pair);
}

/* BFCVTN rounds to nearest even under the default FPCR. */
static inline void store_bf16_pairs(float* dst, vf lo, vf hi) {
    const bfloat16x8_t pairs =
        vcvtq_high_bf16_f32(vcvtq_low_bf16_f32((float32x4_t)lo), (float32x4_t)hi);
    vst1q_f32(dst, vreinterpretq_f32_bf16(pairs));
}

static inline void round_pairs_across_rows(const float* src, int64_t count, int64_t ld,
                                           float* dst) {
    for (int64_t k = 0; 2 * k < count; ++k) {
        const float* lo = src + 2 * k * ld;
        const bool odd = 2 * k + 1 < count;
        for (int64_t r = 0; r < ld; r += 4) {
            const uint16x4_t a = vreinterpret_u16_bf16(vcvt_bf16_f32(vld1q_f32(lo + r)));
            const uint16x4_t b =
                odd ? vreinterpret_u16_bf16(vcvt_bf16_f32(vld1q_f32(lo + ld + r))) : vdup_n_u16(0);
            vst1q_u16((uint16_t*)(dst + k * ld + r),
                      vcombine_u16(vzip1_u16(a, b), vzip2_u16(a, b)));
        }
    }
}
#else
#error "gemm_bf16.inl: no bf16 dot product for this architecture"
#endif

/* f32 rows (ld floats, a multiple of 2W) rounded to bf16 (nearest even) rows of ld / 2 pairs. */
static inline void round_rows_to_bf16(const float* src, int64_t rows, int64_t ld, float* dst) {
    for (int64_t i = 0; i < rows * ld; i += 2 * W)
        store_bf16_pairs(dst + i / 2, vload(src + i), vload(src + i + W));
}

/* ---- Products ------------------------------------------------------------------------------ */

/* VECS (1 .. NV) vectors of each panel row, as in gemm.inl's micro_tile. */
template <int ROWS, int VECS>
static inline void micro_tile_bf16(int64_t depth, const uint32_t* a, int64_t lda, const float* b,
                                   float* c, int64_t ldc, bool accumulate) {
    vf acc[ROWS][VECS];
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < VECS; ++v) acc[r][v] = vsplat(0.0f);
    for (int64_t k = 0; k < depth; ++k) {
        vf bk[VECS];
        for (int v = 0; v < VECS; ++v) bk[v] = vload(b + k * NR + v * W);
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r)
            for (int v = 0; v < VECS; ++v) acc[r][v] = dot_pairs(acc[r][v], bk[v], a + r * lda + k);
    }
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < VECS; ++v) {
            float* cv = c + r * ldc + v * W;
            vstore(cv, accumulate ? acc[r][v] + vload(cv) : acc[r][v]);
        }
}

template <int ROWS, int VECS>
static inline void micro_tile_bf16_rows(int rows, int64_t depth, const uint32_t* a, int64_t lda,
                                        const float* b, float* c, int64_t ldc, bool accumulate) {
    if constexpr (ROWS > 0) {
        if (rows == ROWS)
            micro_tile_bf16<ROWS, VECS>(depth, a, lda, b, c, ldc, accumulate);
        else
            micro_tile_bf16_rows<ROWS - 1, VECS>(rows, depth, a, lda, b, c, ldc, accumulate);
    }
}

/* One panel's columns for all m rows. */
template <int VECS>
static inline void gemm_panel_bf16(int64_t m, int64_t depth, const uint32_t* a, int64_t lda,
                                   const float* b, float* c, int64_t ldc, bool accumulate) {
    int64_t r = 0;
    for (; r + MR <= m; r += MR)
        micro_tile_bf16<MR, VECS>(depth, a + r * lda, lda, b, c + r * ldc, ldc, accumulate);
    micro_tile_bf16_rows<MR - 1, VECS>((int)(m - r), depth, a + r * lda, lda, b, c + r * ldc, ldc,
                                       accumulate);
}

/* gemm_packed with A and B in bf16 pairs: depth, lda and panel_stride count pairs. Like it, a
 * last panel of at most W columns is multiplied by its first vector only when C accumulates
 * (D = 80 pads P V's outputs to 96 columns: a sixth of its products). */
static void gemm_packed_bf16(int64_t m, int64_t cols, int64_t depth, const float* a_units,
                             int64_t lda, const float* b, int64_t panel_stride, float* c,
                             int64_t ldc, bool accumulate) {
    const uint32_t* a = (const uint32_t*)a_units;
    const int64_t panels = (cols + NR - 1) / NR;
    for (int64_t p = 0; p < panels; ++p) {
        const float* bp = b + p * panel_stride;
        if (NV > 1 && accumulate && cols - p * NR <= W)
            gemm_panel_bf16<1>(m, depth, a, lda, bp, c + p * NR, ldc, accumulate);
        else
            gemm_panel_bf16<NV>(m, depth, a, lda, bp, c + p * NR, ldc, accumulate);
    }
}

template <int ROWS>
static inline void micro_tile_bf16_at(int64_t depth, const uint32_t* a, int64_t a_stride,
                                      const float* b, float* c, int64_t ldc) {
    vf acc[ROWS][NV];
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = vsplat(0.0f);
    for (int64_t k = 0; k < depth; ++k) {
        vf bk[NV];
        for (int v = 0; v < NV; ++v) bk[v] = vload(b + k * NR + v * W);
        const uint32_t* ak = a + k * a_stride;
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r)
            for (int v = 0; v < NV; ++v) acc[r][v] = dot_pairs(acc[r][v], bk[v], ak + r);
    }
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < NV; ++v) {
            float* cv = c + r * ldc + v * W;
            vstore(cv, acc[r][v] + vload(cv));
        }
}

template <int ROWS>
static inline void micro_tile_bf16_at_rows(int rows, int64_t depth, const uint32_t* a,
                                           int64_t a_stride, const float* b, float* c,
                                           int64_t ldc) {
    if (rows == ROWS)
        micro_tile_bf16_at<ROWS>(depth, a, a_stride, b, c, ldc);
    else
        micro_tile_bf16_at_rows<ROWS - 1>(rows, depth, a, a_stride, b, c, ldc);
}

template <>
inline void micro_tile_bf16_at_rows<0>(int, int64_t, const uint32_t*, int64_t, const float*, float*,
                                       int64_t) {}

static void gemm_packed_bf16_at(int64_t m, int64_t cols, int64_t depth, const float* a_units,
                                int64_t a_stride, const float* b, int64_t panel_stride, float* c,
                                int64_t ldc) {
    const uint32_t* a = (const uint32_t*)a_units;
    const int64_t panels = (cols + NR - 1) / NR;
    for (int64_t p = 0; p < panels; ++p) {
        const float* bp = b + p * panel_stride;
        float* cp = c + p * NR;
        int64_t r = 0;
        for (; r + MR <= m; r += MR)
            micro_tile_bf16_at<MR>(depth, a + r, a_stride, bp, cp + r * ldc, ldc);
        micro_tile_bf16_at_rows<MR - 1>((int)(m - r), depth, a + r, a_stride, bp, cp + r * ldc,
                                        ldc);
    }
}

struct bf16_pair_operands {
    static int64_t units(int64_t depth) { return (depth + 1) / 2; }

    /* Rows per strip of a banded tile: f32_operands::strip_rows. */
    static constexpr int64_t strip_rows = MR;

    template <class Storage>
    static void pack_rows(const strided_rows& src, int64_t count, int64_t width, float* dst,
                          int64_t ld) {
        pack_pair_rows(src, count, width, dst, ld);
    }
    template <class Storage>
    static void pack_panels(const strided_rows& src, int64_t count, int64_t width, float* dst,
                            int64_t panel_stride) {
        pack_pair_panels(src, count, width, dst, panel_stride);
    }
    template <class Storage>
    static void pack_panels_transposed(const strided_rows& src, int64_t count, int64_t depth,
                                       float* dst) {
        pack_pair_panels_transposed(src, count, depth, dst);
    }

    static const float* operand(const float* rows, int64_t count, int64_t ld, float* scratch) {
        round_rows_to_bf16(rows, count, ld, scratch);
        return scratch;
    }

    static float* operand_row(float*, float* scratch, int64_t row, int64_t ld) {
        return scratch + row * units(ld);
    }
    static void store_operand_pair(float* row, int64_t c, vf lo, vf hi) {
        store_bf16_pairs(row + c / 2, lo, hi);
    }

    static const float* operand_at(const float* rows, int64_t count, int64_t ld, float* scratch) {
        round_pairs_across_rows(rows, count, ld, scratch);
        return scratch;
    }

    static void gemm(int64_t m, int64_t cols, int64_t depth, const float* a, int64_t lda,
                     const float* b, int64_t panel_stride, float* c, int64_t ldc, bool accumulate) {
        gemm_packed_bf16(m, cols, depth, a, lda, b, panel_stride, c, ldc, accumulate);
    }

    static void gemm_at(int64_t m, int64_t cols, int64_t depth, const float* a, int64_t a_stride,
                        const float* b, int64_t panel_stride, float* c, int64_t ldc) {
        gemm_packed_bf16_at(m, cols, depth, a, a_stride, b, panel_stride, c, ldc);
    }
};

} // namespace

#endif /* MFA_CPU_GEMM_BF16_INL */
