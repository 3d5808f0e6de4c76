/*
 * Products on AMX-BF16 tiles (Intel Sapphire Rapids and later), for the AMX build: the operands
 * are gemm_bf16.inl's bf16 pairs, packed the same way, and only the two products change. One
 * TDPBF16PS multiplies a 16 x 16-pair A tile by a 16-pair x 16 B tile into 16 x 16 f32, 8192
 * multiply-adds per instruction against vdpbf16ps's 32, so the matrix products stop being what
 * the bf16 forward spends its time on; the softmax passes and packing stay AVX-512.
 *
 * Layouts, and why no repacking is needed: an A row of pairs (lda units apart) is already an A
 * tile row; a B panel (gemm.inl: depth steps of NR = 32 units) holds, at each reduction step,
 * one pair per column, which is the VNNI layout TDPBF16PS wants for B, so a B tile is 16 steps of
 * one half of a panel, loaded with a stride of NR units. Tiles cover whole 16-row blocks, and a
 * reduction's last partial step on tiles of its own shape; the remaining rows go through the
 * vdpbf16ps micro-kernel.
 *
 * Tile state: a task's products share one configuration. The first product of a task loads it
 * (or the one for a partial last step that a product needs: use_tiles), and it stays loaded until
 * the task ends (release_tiles, which every task of the AMX build calls on its way out). Another
 * library may use AMX on the same thread (oneDNN does, under torch), but only between calls, so
 * no configuration is assumed at a task's start, and a thread between tasks holds no tile state,
 * which costs its context switches nothing. A configuration loaded per product, as before, cost
 * some 60 ns a product on Emerald Rapids: a fifth of a backward product at D 64.
 */
#ifndef MFA_CPU_GEMM_AMX_INL
#define MFA_CPU_GEMM_AMX_INL

#include "cpu/gemm_bf16.inl"

#include <immintrin.h>
#include <stdint.h>

namespace {

/* The tiles of one product: C blocks of 16 rows x 16 columns in 0-3, A blocks in 4-5, B halves
 * of a panel in 6-7; every tile is 16 rows of 64 bytes. */
struct amx_tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
};

static const int64_t kTileRows = 16;  /* rows of A and C per tile */
static const int64_t kTileSteps = 16; /* pairs of the reduction per tile */
static const int64_t kTileCols = 16;  /* columns of B and C per tile */
static_assert(NR == 2 * kTileCols, "a B panel is two tiles wide");

static inline void configure_tiles(void) {
    amx_tile_config config = {};
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
        config.bytes_per_row[t] = 64;
        config.rows[t] = (uint8_t)kTileRows;
    }
    _tile_loadconfig(&config);
}

/* The tiles of a product whose reduction ends in a partial step of `tail` pairs (1 .. 15): C
 * blocks of 16 x 16 in 0-1, the whole steps' A block in 2 and B halves in 4-5, and the last
 * step's A block in 3 (16 rows of `tail` pairs) and B halves in 6-7 (`tail` rows). */
static inline void configure_tiles_with_tail(int64_t tail) {
    amx_tile_config config = {};
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
        config.bytes_per_row[t] = 64;
        config.rows[t] = (uint8_t)kTileRows;
    }
    config.bytes_per_row[3] = (uint16_t)(tail * 4);
    config.rows[6] = config.rows[7] = (uint8_t)tail;
    _tile_loadconfig(&config);
}

/* The configuration this thread's tiles hold: -1 none, 0 configure_tiles's, 1 .. 15 that of
 * configure_tiles_with_tail(tail). */
static thread_local int64_t loaded_tiles = -1;

/* The tiles configured for products whose reduction ends in a partial step of `tail` pairs (0:
 * none), loading the configuration only where the thread holds another or none. */
static inline void use_tiles(int64_t tail) {
    if (loaded_tiles == tail) return;
    if (tail)
        configure_tiles_with_tail(tail);
    else
        configure_tiles();
    loaded_tiles = tail;
}

/* The end of a task: the thread's tile state released, if it holds one. */
static inline void release_tiles(void) {
    if (loaded_tiles < 0) return;
    _tile_release();
    loaded_tiles = -1;
}

/* C rows [0, 16 * BLOCKS) x one panel's 32 columns (+)= A * B over `steps` pairs (a multiple of
 * 16). A row r, pair k, is at a + r * lda + k; B's pair k of column x at b + k * NR + x. */
template <int BLOCKS>
static inline void amx_panel(int64_t steps, const uint32_t* a, int64_t lda, const float* b,
                             float* c, int64_t ldc, bool accumulate) {
    const long c_stride = (long)(ldc * 4), a_stride = (long)(lda * 4), b_stride = (long)(NR * 4);
    if (accumulate) {
        _tile_loadd(0, c, c_stride);
        _tile_loadd(1, c + kTileCols, c_stride);
        if (BLOCKS == 2) {
            _tile_loadd(2, c + kTileRows * ldc, c_stride);
            _tile_loadd(3, c + kTileRows * ldc + kTileCols, c_stride);
        }
    } else {
        _tile_zero(0);
        _tile_zero(1);
        if (BLOCKS == 2) {
            _tile_zero(2);
            _tile_zero(3);
        }
    }
    /* Each step's first product waits for two loads, not three: the second B half loads while
     * it runs (1 % faster over the bf16 README grid on Emerald Rapids). */
    for (int64_t k = 0; k < steps; k += kTileSteps) {
        _tile_loadd(4, a + k, a_stride);
        _tile_loadd(6, b + k * NR, b_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b + k * NR + kTileCols, b_stride);
        _tile_dpbf16ps(1, 4, 7);
        if (BLOCKS == 2) {
            _tile_loadd(5, a + kTileRows * lda + k, a_stride);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c, c_stride);
    _tile_stored(1, c + kTileCols, c_stride);
    if (BLOCKS == 2) {
        _tile_stored(2, c + kTileRows * ldc, c_stride);
        _tile_stored(3, c + kTileRows * ldc + kTileCols, c_stride);
    }
}

/* C rows [0, 16) x one panel's 32 columns (+)= A * B over `steps` whole steps and then, with
 * `tail`, the partial step configure_tiles_with_tail shaped (on its tiles either way). */
static inline void amx_panel_with_tail(int64_t steps, bool tail, const uint32_t* a, int64_t lda,
                                       const float* b, float* c, int64_t ldc, bool accumulate) {
    const long c_stride = (long)(ldc * 4), a_stride = (long)(lda * 4), b_stride = (long)(NR * 4);
    if (accumulate) {
        _tile_loadd(0, c, c_stride);
        _tile_loadd(1, c + kTileCols, c_stride);
    } else {
        _tile_zero(0);
        _tile_zero(1);
    }
    for (int64_t k = 0; k < steps; k += kTileSteps) {
        _tile_loadd(4, b + k * NR, b_stride);
        _tile_loadd(5, b + k * NR + kTileCols, b_stride);
        _tile_loadd(2, a + k, a_stride);
        _tile_dpbf16ps(0, 2, 4);
        _tile_dpbf16ps(1, 2, 5);
    }
    if (tail) {
        _tile_loadd(6, b + steps * NR, b_stride);
        _tile_loadd(7, b + steps * NR + kTileCols, b_stride);
        _tile_loadd(3, a + steps, a_stride);
        _tile_dpbf16ps(0, 3, 6);
        _tile_dpbf16ps(1, 3, 7);
    }
    _tile_stored(0, c, c_stride);
    _tile_stored(1, c + kTileCols, c_stride);
}

/* Rows of A per group in gemm_amx: the product runs a group of rows at a time against every
 * panel, so that the group's A tiles (up to 16 KiB: a third of the L1d, beside a B panel of up to
 * 16 KiB) are loaded from L1 while B's panels pass through once per group. Panels outermost,
 * over all rows, reloaded all of A from L2 for each panel where A outgrew L1 beside one: with
 * these groups Q K^T runs 22 % faster at D 128 (64-row groups) and 11 % at D 256 (32), and
 * the same at D 64, where all 128 rows make one group (single-thread product on Emerald Rapids). */
static const int64_t kGroupBytes = 16384;

static inline int64_t amx_row_group(int64_t depth) {
    const int64_t pair = 2 * kTileRows;
    const int64_t rows = kGroupBytes / (depth * 4) / pair * pair;
    return rows > pair ? rows : pair;
}

/* C[m x cols] (+)= A * B over `depth` pairs, A rows of pairs lda units apart (gemm_packed_bf16's
 * contract): the whole 16-row blocks on tiles, the rest on vdpbf16ps. A reduction that ends in a
 * partial step (head dimensions 80, 112, ...) takes it on tiles configured for it, 16 rows at a
 * time; on vdpbf16ps, its 8 pairs of D = 80 took as long as the 32 before them. */
static void gemm_amx(int64_t m, int64_t cols, int64_t depth, const float* a_units, int64_t lda,
                     const float* b, int64_t panel_stride, float* c, int64_t ldc, bool accumulate) {
    const int64_t rows = m / kTileRows * kTileRows, steps = depth / kTileSteps * kTileSteps;
    if (rows == 0) {
        gemm_packed_bf16(m, cols, depth, a_units, lda, b, panel_stride, c, ldc, accumulate);
        return;
    }
    const uint32_t* a = (const uint32_t*)a_units;
    const int64_t panels = (cols + NR - 1) / NR;
    const int64_t group = amx_row_group(depth);
    use_tiles(depth - steps);
    for (int64_t r0 = 0; r0 < rows; r0 += group) {
        const int64_t r1 = r0 + group < rows ? r0 + group : rows;
        for (int64_t p = 0; p < panels; ++p) {
            const float* bp = b + p * panel_stride;
            if (steps < depth) {
                for (int64_t r = r0; r < r1; r += kTileRows)
                    amx_panel_with_tail(steps, true, a + r * lda, lda, bp, c + r * ldc + p * NR,
                                        ldc, accumulate);
                continue;
            }
            int64_t r = r0;
            for (; r + 2 * kTileRows <= r1; r += 2 * kTileRows)
                amx_panel<2>(steps, a + r * lda, lda, bp, c + r * ldc + p * NR, ldc, accumulate);
            if (r < r1)
                amx_panel<1>(steps, a + r * lda, lda, bp, c + r * ldc + p * NR, ldc, accumulate);
        }
    }
    if (rows < m)
        gemm_packed_bf16(m - rows, cols, depth, a_units + rows * lda, lda, b, panel_stride,
                         c + rows * ldc, ldc, accumulate);
}

/* v[i]'s lane j becomes v[j]'s lane i (16 x 16 units): blocks of h lanes swapped between rows h
 * apart, h = 8, 4, 2, 1. Unrolled whole, so that the 16 vectors and the permutations stay in
 * registers (a loop over h kept them on the stack, where each round waited on the last one's
 * stores). */
static inline void transpose_units(__m512i* v) {
#pragma GCC unroll 4
    for (int h = 8; h > 0; h /= 2) {
        int32_t low[16], high[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) {
            low[j] = (j & h) ? 16 + j - h : j;
            high[j] = (j & h) ? 16 + j : j + h;
        }
        const __m512i to_low = _mm512_loadu_si512(low), to_high = _mm512_loadu_si512(high);
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i)
            if (!(i & h)) {
                const __m512i a = v[i], b = v[i + h];
                v[i] = _mm512_permutex2var_epi32(a, to_low, b);
                v[i + h] = _mm512_permutex2var_epi32(a, to_high, b);
            }
    }
}

/* C[m x cols] += A^T * B, A's pair k of row r at a + k * a_stride + r (gemm_packed_bf16_at's
 * contract). Tiles read A by rows, so the pairs of each block of 32 rows (or 16) are transposed
 * into a buffer of at most kTransposedSteps steps first, 16 x 16 units at a time, once for all
 * panels; a partial last step runs on tiles shaped for it (gemm_amx), 16 rows at a time. The
 * rows past the last whole 16 go through vdpbf16ps. */
static const int64_t kTransposedSteps = 128;

/* Rows [r, r + 16 * blocks) of A^T, steps [k0, k0 + n), into block (kTransposedSteps units a
 * row); units past n in a last group of 16 steps are zero. */
static inline void transpose_steps(const uint32_t* a, int64_t a_stride, int64_t r, int64_t k0,
                                   int64_t n, int blocks, uint32_t* block) {
    for (int half = 0; half < blocks; ++half)
        for (int64_t k = 0; k < n; k += 16) {
            __m512i units[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; ++i)
                units[i] =
                    k + i < n
                        ? _mm512_loadu_si512(a + (k0 + k + i) * a_stride + r + half * kTileRows)
                        : _mm512_setzero_si512();
            transpose_units(units);
#pragma GCC unroll 16
            for (int j = 0; j < 16; ++j)
                _mm512_storeu_si512(block + (half * kTileRows + j) * kTransposedSteps + k,
                                    units[j]);
        }
}

static void gemm_amx_at(int64_t m, int64_t cols, int64_t depth, const float* a_units,
                        int64_t a_stride, const float* b, int64_t panel_stride, float* c,
                        int64_t ldc) {
    const int64_t rows = m / kTileRows * kTileRows, tail = depth % kTileSteps;
    if (rows == 0) {
        gemm_packed_bf16_at(m, cols, depth, a_units, a_stride, b, panel_stride, c, ldc);
        return;
    }
    const uint32_t* a = (const uint32_t*)a_units;
    const int64_t panels = (cols + NR - 1) / NR;
    alignas(64) uint32_t block[2 * kTileRows * kTransposedSteps];
    use_tiles(tail);
    /* Without a tail, two row blocks share each B tile; with one, its tiles leave room for one. */
    const int blocks = tail ? 1 : 2;
    for (int64_t r = 0; r < rows; r += kTileRows * blocks) {
        const int here = r + kTileRows * blocks <= rows ? blocks : 1;
        for (int64_t k0 = 0; k0 < depth; k0 += kTransposedSteps) {
            const int64_t n = depth - k0 < kTransposedSteps ? depth - k0 : kTransposedSteps;
            transpose_steps(a, a_stride, r, k0, n, here, block);
            const int64_t whole = n / kTileSteps * kTileSteps;
            for (int64_t p = 0; p < panels; ++p) {
                const float* bp = b + p * panel_stride + k0 * NR;
                float* cp = c + r * ldc + p * NR;
                if (tail)
                    amx_panel_with_tail(whole, whole < n, block, kTransposedSteps, bp, cp, ldc,
                                        true);
                else if (here == 2)
                    amx_panel<2>(n, block, kTransposedSteps, bp, cp, ldc, true);
                else
                    amx_panel<1>(n, block, kTransposedSteps, bp, cp, ldc, true);
            }
        }
    }
    if (rows < m)
        gemm_packed_bf16_at(m - rows, cols, depth, a_units + rows, a_stride, b, panel_stride,
                            c + rows * ldc, ldc);
}

/* bf16_pair_operands with the products on tiles. */
struct amx_pair_operands : bf16_pair_operands {
    /* Strips of a banded tile as tall as two tiles: a strip of fewer rows than a tile would
     * run on vdpbf16ps (gemm_amx's row remainder), some ten times slower than the tiles, which
     * more than pays for the hidden scores a taller strip computes. */
    static constexpr int64_t strip_rows = 2 * kTileRows;

    static void gemm(int64_t m, int64_t cols, int64_t depth, const float* a, int64_t lda,
                     const float* b, int64_t panel_stride, float* c, int64_t ldc, bool accumulate) {
        gemm_amx(m, cols, depth, a, lda, b, panel_stride, c, ldc, accumulate);
    }

    static void gemm_at(int64_t m, int64_t cols, int64_t depth, const float* a, int64_t a_stride,
                        const float* b, int64_t panel_stride, float* c, int64_t ldc) {
        gemm_amx_at(m, cols, depth, a, a_stride, b, panel_stride, c, ldc);
    }
};

} // namespace

#endif /* MFA_CPU_GEMM_AMX_INL */
