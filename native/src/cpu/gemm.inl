/*
 * The one place where inner products happen: C (+)= A * B for small tiles, with A row-major and
 * B packed as panels of NR units (NR = NV vectors) per reduction step. Every product of the
 * forward and backward passes (S = Q K^T, O += P V, dP = dO V^T, dQ += dS K, and their key-side
 * mirrors) is this shape once its B operand is packed.
 *
 * Register blocking: an MR x NR block of C lives in MR * NV vector registers while the reduction
 * runs; per step it loads NV vectors of B and broadcasts MR scalars of A. MR * NV accumulators
 * hide the FMA latency (4 cycles x 2 pipes needs >= 8 independent chains) and, with the NV + 1
 * operands, must fit the register file: MR comes from the ISA build (MFA_CPU_ROWS).
 *
 * Operands come in one of two forms, each a policy the passes are written against: f32_operands
 * (one f32 per 32-bit unit, FMAs) here, and, in builds with a bf16 dot-product instruction,
 * bf16_pair_operands (gemm_bf16.inl).
 */
#ifndef MFA_CPU_GEMM_INL
#define MFA_CPU_GEMM_INL

#ifndef MFA_CPU_ROWS
#error "gemm.inl is compiled through a kernels_<isa>.cpp that defines MFA_CPU_ROWS"
#endif

#include "cpu/pack.inl"
#include "cpu/simd.inl"

#include <stdint.h>

namespace {

static const int MR = MFA_CPU_ROWS;

/* VECS (1 .. NV) vectors of each panel row: fewer than NV for a last panel whose columns
 * past VECS * W are only padding. */
template <int ROWS, int VECS>
static inline void micro_tile(int64_t depth, const float* a, int64_t lda, const float* b, float* c,
                              int64_t ldc, bool accumulate) {
    vf acc[ROWS][VECS];
    /* A's rows through their own addresses (opaque), each load one base register plus k:
     * computed from a and lda, GCC advances one address by lda from row to row, an add per row
     * and step (seven of the loop's 31 instructions at AVX2's 6 x 16, eight at AVX-512's 8 x 32).
     * With them the AVX2 f32 forward ran 1-3 % faster in the median of each of three runs on
     * 2 cores of an AMD EPYC (Zen 3), each cell 0.98-1.09x. */
    const float* row[ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
        row[r] = opaque(a + r * lda);
        for (int v = 0; v < VECS; ++v) acc[r][v] = vsplat(0.0f);
    }
    /* Four steps a loop iteration (here and in micro_tile_at): on an AMD EPYC (Zen 3), clang 16's
     * one-step AVX2 loop of 23 instructions ran the 6 x 16 tile at 59-83 GFLOP/s on one thread in
     * a scratch loop, four steps at 77-89 (the FMA probe: 80-94); in the library, f32 forward +
     * backward 1.01-1.12x as fast, the forward 0.99-1.12x (both builds in one process). On 2
     * threads of an Intel Xeon with AMX (GCC 13): the AVX-512 build 0.83-1.13x (geometric mean
     * 1.01), the AMX build's f32 1.07; NEON unmeasured. */
#pragma GCC unroll 4
    for (int64_t k = 0; k < depth; ++k) {
        vf bk[VECS];
        for (int v = 0; v < VECS; ++v) bk[v] = vload(b + k * NR + v * W);
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) {
            const vf ar = vsplat(row[r][k]);
            for (int v = 0; v < VECS; ++v) acc[r][v] += ar * bk[v];
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < VECS; ++v) {
            float* cv = c + r * ldc + v * W;
            vstore(cv, accumulate ? acc[r][v] + vload(cv) : acc[r][v]);
        }
}

/* The row remainder of a tile (1 .. MR-1 rows) through the same kernel at a smaller height. */
template <int ROWS, int VECS>
struct row_remainder {
    static inline void run(int rows, int64_t depth, const float* a, int64_t lda, const float* b,
                           float* c, int64_t ldc, bool accumulate) {
        if (rows == ROWS)
            micro_tile<ROWS, VECS>(depth, a, lda, b, c, ldc, accumulate);
        else
            row_remainder<ROWS - 1, VECS>::run(rows, depth, a, lda, b, c, ldc, accumulate);
    }
};

template <int VECS>
struct row_remainder<0, VECS> {
    static inline void run(int, int64_t, const float*, int64_t, const float*, float*, int64_t,
                           bool) {}
};

/* One panel's columns for all m rows. */
template <int VECS>
static inline void gemm_panel(int64_t m, int64_t depth, const float* a, int64_t lda, const float* b,
                              float* c, int64_t ldc, bool accumulate) {
    int64_t r = 0;
    for (; r + MR <= m; r += MR)
        micro_tile<MR, VECS>(depth, a + r * lda, lda, b, c + r * ldc, ldc, accumulate);
    row_remainder<MR - 1, VECS>::run((int)(m - r), depth, a + r * lda, lda, b, c + r * ldc, ldc,
                                     accumulate);
}

/* C[m x cols] (+)= A[m x depth] * B, where B is ceil(cols / NR) panels of depth x NR floats,
 * panel_stride floats apart, and C has row stride ldc >= round_up(cols, NR). depth may be 0.
 * When C accumulates (its padding columns are never read as results), a last panel with at most
 * W columns is multiplied by its first vector only: D = 80 pads its outputs to 96 columns, and
 * the FMAs of the last 16 would be a sixth of those products. */
static void gemm_packed(int64_t m, int64_t cols, int64_t depth, const float* a, int64_t lda,
                        const float* b, int64_t panel_stride, float* c, int64_t ldc,
                        bool accumulate) {
    const int64_t panels = (cols + NR - 1) / NR;
    for (int64_t p = 0; p < panels; ++p) {
        const float* bp = b + p * panel_stride;
        if (NV > 1 && accumulate && cols - p * NR <= W)
            gemm_panel<1>(m, depth, a, lda, bp, c + p * NR, ldc, accumulate);
        else
            gemm_panel<NV>(m, depth, a, lda, bp, c + p * NR, ldc, accumulate);
    }
}

/* The same product with A stored transposed: A(r, k) at a[k * a_stride + r] (the backward's
 * dQ += dS K reads the key-major dS^T tile this way, so it needs no transposition). */
template <int ROWS, int VECS>
static inline void micro_tile_at(int64_t depth, const float* a, int64_t a_stride, const float* b,
                                 float* c, int64_t ldc) {
    vf acc[ROWS][VECS];
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < VECS; ++v) acc[r][v] = vsplat(0.0f);
#pragma GCC unroll 4
    for (int64_t k = 0; k < depth; ++k) {
        vf bk[VECS];
        for (int v = 0; v < VECS; ++v) bk[v] = vload(b + k * NR + v * W);
        const float* ak = a + k * a_stride;
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) {
            const vf ar = vsplat(ak[r]);
            for (int v = 0; v < VECS; ++v) acc[r][v] += ar * bk[v];
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < VECS; ++v) {
            float* cv = c + r * ldc + v * W;
            vstore(cv, acc[r][v] + vload(cv));
        }
}

template <int ROWS, int VECS>
struct row_remainder_at {
    static inline void run(int rows, int64_t depth, const float* a, int64_t a_stride,
                           const float* b, float* c, int64_t ldc) {
        if (rows == ROWS)
            micro_tile_at<ROWS, VECS>(depth, a, a_stride, b, c, ldc);
        else
            row_remainder_at<ROWS - 1, VECS>::run(rows, depth, a, a_stride, b, c, ldc);
    }
};

template <int VECS>
struct row_remainder_at<0, VECS> {
    static inline void run(int, int64_t, const float*, int64_t, const float*, float*, int64_t) {}
};

template <int VECS>
static inline void gemm_panel_at(int64_t m, int64_t depth, const float* a, int64_t a_stride,
                                 const float* b, float* c, int64_t ldc) {
    int64_t r = 0;
    for (; r + MR <= m; r += MR)
        micro_tile_at<MR, VECS>(depth, a + r, a_stride, b, c + r * ldc, ldc);
    row_remainder_at<MR - 1, VECS>::run((int)(m - r), depth, a + r, a_stride, b, c + r * ldc, ldc);
}

/* C[m x cols] += A B with A(r, k) = a[k * a_stride + r]; otherwise as gemm_packed (which it
 * follows for a last panel of at most W columns too). */
static void gemm_packed_at(int64_t m, int64_t cols, int64_t depth, const float* a, int64_t a_stride,
                           const float* b, int64_t panel_stride, float* c, int64_t ldc) {
    const int64_t panels = (cols + NR - 1) / NR;
    for (int64_t p = 0; p < panels; ++p) {
        const float* bp = b + p * panel_stride;
        if (NV > 1 && cols - p * NR <= W)
            gemm_panel_at<1>(m, depth, a, a_stride, bp, c + p * NR, ldc);
        else
            gemm_panel_at<NV>(m, depth, a, a_stride, bp, c + p * NR, ldc);
    }
}

/* f32 operands: every value its own unit, converted once when packed. */
struct f32_operands {
    static int64_t units(int64_t depth) { return depth; }

    /* Rows per strip where a band hides part of a tile (forward.inl, backward.inl): the
     * micro-kernel's height, so that strips cost no remainder rows. */
    static constexpr int64_t strip_rows = MR;

    template <class Storage>
    static void pack_rows(const strided_rows& src, int64_t count, int64_t width, float* dst,
                          int64_t ld) {
        pack_f32_rows<Storage>(src, count, width, dst, ld);
    }
    template <class Storage>
    static void pack_panels(const strided_rows& src, int64_t count, int64_t width, float* dst,
                            int64_t panel_stride) {
        pack_f32_panels<Storage>(src, count, width, dst, panel_stride);
    }
    template <class Storage>
    static void pack_panels_transposed(const strided_rows& src, int64_t count, int64_t depth,
                                       float* dst) {
        pack_f32_panels_transposed<Storage>(src, count, depth, dst);
    }

    /* The A operand of a product from f32 rows (P, dS): those rows themselves. */
    static const float* operand(const float* rows, int64_t, int64_t, float*) { return rows; }

    /* Where row `row` of such an operand lies, made from f32 rows of ld values at `rows` (in
     * place), scratch unused; store_operand_pair writes its values c .. c + 2W - 1 there (c a
     * multiple of 2W), so that a pass producing the f32 values leaves the operand directly. */
    static float* operand_row(float* rows, float*, int64_t row, int64_t ld) {
        return rows + row * ld;
    }
    static void store_operand_pair(float* row, int64_t c, vf lo, vf hi) {
        vstore(row + c, lo);
        vstore(row + c + W, hi);
    }

    /* The transposed A operand of gemm_at from `count` f32 rows of ld values (dS^T): A(r, k)
     * is row k's value r, at k * ld + r in units. */
    static const float* operand_at(const float* rows, int64_t, int64_t, float*) { return rows; }

    /* depth and lda in units, as everywhere in the policies. */
    static void gemm(int64_t m, int64_t cols, int64_t depth, const float* a, int64_t lda,
                     const float* b, int64_t panel_stride, float* c, int64_t ldc, bool accumulate) {
        gemm_packed(m, cols, depth, a, lda, b, panel_stride, c, ldc, accumulate);
    }

    static void gemm_at(int64_t m, int64_t cols, int64_t depth, const float* a, int64_t a_stride,
                        const float* b, int64_t panel_stride, float* c, int64_t ldc) {
        gemm_packed_at(m, cols, depth, a, a_stride, b, panel_stride, c, ldc);
    }
};

} // namespace

#endif /* MFA_CPU_GEMM_INL */
