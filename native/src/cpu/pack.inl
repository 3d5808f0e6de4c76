/*
 * Moving tiles between the caller's strided tensors (any dtype, any signed strides) and the
 * contiguous f32 tiles the micro-kernels read. Conversion to f32 happens here, once per tile
 * (gemm_bf16.inl packs bf16 pairs instead). Each loop has a unit-stride twin so the compiler
 * vectorizes the common dense layout.
 */
#ifndef MFA_CPU_PACK_INL
#define MFA_CPU_PACK_INL

#include "core/backend.h"
#include "cpu/convert.h"
#include "cpu/plan.h"
#include "cpu/simd.inl"

#include <stdint.h>
#include <string.h>

namespace {

/* How far ahead of the row they read the row loops below ask for rows (strided_rows::prefetch):
 * enough rows in flight to cover a memory latency. */
static const int64_t kRowsAhead = 8;

/* A packed panel is NV vectors wide: the micro-kernel's B operand (gemm.inl). */
static const int NV = 2;
static const int64_t NR = NV * W;

struct f32_storage {
    enum { size = 4 };
    static float load(const char* p) {
        float x;
        memcpy(&x, p, sizeof x);
        return x;
    }
    static void store(char* p, float x) { memcpy(p, &x, sizeof x); }
};

struct f16_storage {
    enum { size = 2 };
    static float load(const char* p) {
        uint16_t h;
        memcpy(&h, p, sizeof h);
        return mfa_cpu_f16_to_f32(h);
    }
    static void store(char* p, float x) {
        const uint16_t h = mfa_cpu_f32_to_f16(x);
        memcpy(p, &h, sizeof h);
    }
};

struct bf16_storage {
    enum { size = 2 };
    static float load(const char* p) {
        uint16_t h;
        memcpy(&h, p, sizeof h);
        return mfa_cpu_bf16_to_f32(h);
    }
    static void store(char* p, float x) {
        const uint16_t h = mfa_cpu_f32_to_bf16(x);
        memcpy(p, &h, sizeof h);
    }
};

/* Rows s0, s0+1, ... of one head of a view, as byte addresses and steps. In a paged cache
 * (table set) row r is row (row0 + r) % block_size of block table[(row0 + r) / block_size],
 * the blocks block_step bytes apart; otherwise rows are row_step bytes apart from first. */
struct strided_rows {
    char* first;
    int64_t row_step;
    int64_t elem_step;
    const char* table; /* the sequence's block table entries, table_step bytes apart; or NULL */
    int64_t table_step;
    int64_t block_size;
    int64_t block_step;
    int64_t row0;

    char* row(int64_t r) const {
        if (!table) return first + r * row_step;
        const int64_t j = row0 + r;
        const int64_t block = mfa_cpu_read_i32(table + j / block_size * table_step);
        return first + block * block_step + j % block_size * row_step;
    }

    /* Asks for row r (width elements of elem_size bytes) ahead of its use (write: to be
     * stored). Rows of packed sequences, and of any [B, N, H, D] layout, lie H x D elements
     * apart, a few to a page, where the hardware prefetchers do not follow them, and a loop over
     * rows would wait on memory once per row; consecutive rows are asked for too, because a
     * call's packs read its inputs straight from memory and still waited on them (Zen 4: the
     * loads of the packs were where their samples fell). Rows of elements that are not adjacent
     * are left to the hardware. */
    void prefetch(int64_t r, int64_t width, int64_t elem_size, bool write = false) const {
        const int64_t bytes = width * elem_size;
        if (elem_step != elem_size) return;
        const char* p = row(r);
        for (int64_t b = 0; b < bytes; b += 64) {
            if (write)
                __builtin_prefetch(p + b, 1);
            else
                __builtin_prefetch(p + b);
        }
    }

    /* The addresses of rows [r0, r0 + count) into out: one division for the whole run, so that
     * paged rows cost no more than dense ones. */
    void addresses(int64_t r0, int64_t count, const char** out) const {
        if (!table) {
            for (int64_t r = 0; r < count; ++r) out[r] = first + (r0 + r) * row_step;
            return;
        }
        int64_t entry = (row0 + r0) / block_size, within = (row0 + r0) % block_size;
        const char* block = first + mfa_cpu_read_i32(table + entry * table_step) * block_step;
        for (int64_t r = 0; r < count; ++r) {
            if (within == block_size) {
                within = 0;
                block = first + mfa_cpu_read_i32(table + ++entry * table_step) * block_step;
            }
            out[r] = block + within++ * row_step;
        }
    }
};

static inline strided_rows rows_of(const mfa_view& view, int64_t elem_size, int64_t b, int64_t h,
                                   int64_t s0) {
    strided_rows rows = {};
    rows.first =
        view.data + elem_size * (b * view.stride[0] + h * view.stride[1] + s0 * view.stride[2]);
    rows.row_step = elem_size * view.stride[2];
    rows.elem_step = elem_size * view.stride[3];
    return rows;
}

/* Query-side rows (q, out, dout, dq; lse with elem_size 4) of sequence s, query head h, from its
 * row i0. */
static inline strided_rows query_rows(const mfa_view& view, int64_t elem_size,
                                      const mfa_cpu_sequence& s, int64_t h, int64_t i0) {
    return rows_of(view, elem_size, s.batch, h, s.q_first + i0);
}

/* Key-side rows (k, v, dk, dv) of sequence s, key/value head h, from its key j0: through the
 * block table when k and v are paged caches. */
static inline strided_rows key_rows(const mfa_cpu_plan* plan, const mfa_view& view,
                                    const mfa_cpu_sequence& s, int64_t h, int64_t j0) {
    const mfa_problem* p = plan->problem;
    if (p->layout != MFA_LAYOUT_PAGED)
        return rows_of(view, plan->elem_size, s.batch, h, s.k_first + j0);
    strided_rows rows = rows_of(view, plan->elem_size, 0, h, 0);
    const mfa_view& table = p->paged.block_table;
    rows.table = table.data + 4 * s.batch * table.stride[0];
    rows.table_step = 4 * table.stride[3];
    rows.block_size = p->paged.block_size;
    rows.block_step = plan->elem_size * view.stride[0];
    rows.row0 = j0;
    return rows;
}

/* dst[d * dst_step] = row[d] for d < count. */
template <class Storage>
static inline void load_row(const char* row, int64_t elem_step, int64_t count, float* dst,
                            int64_t dst_step) {
    if (elem_step == Storage::size && dst_step == 1) {
        for (int64_t d = 0; d < count; ++d) dst[d] = Storage::load(row + Storage::size * d);
    } else {
        for (int64_t d = 0; d < count; ++d) dst[d * dst_step] = Storage::load(row + elem_step * d);
    }
}

/* A operand: dst[r * ld + d] for r < count, d < width, zero-padded to ld. */
template <class Storage>
static void pack_f32_rows(const strided_rows& src, int64_t count, int64_t width, float* dst,
                          int64_t ld) {
    for (int64_t r = 0; r < count; ++r) {
        if (r + kRowsAhead < count) src.prefetch(r + kRowsAhead, width, Storage::size);
        load_row<Storage>(src.row(r), src.elem_step, width, dst + r * ld, 1);
        for (int64_t d = width; d < ld; ++d) dst[r * ld + d] = 0.0f;
    }
}

/* Rows [0, count) of src as row panels (plan.h): panel p of row r at dst + p * panel_stride +
 * r * NR, zero past width and, up to the next multiple of NR, past count. */
template <class Storage>
static void pack_f32_panels(const strided_rows& src, int64_t count, int64_t width, float* dst,
                            int64_t panel_stride) {
    const int64_t panels = (width + NR - 1) / NR;
    const int64_t padded = (count + NR - 1) / NR * NR;
    for (int64_t p = 0; p < panels; ++p) {
        const int64_t d0 = p * NR;
        const int64_t n = width - d0 < NR ? width - d0 : NR;
        float* panel = dst + p * panel_stride;
        for (int64_t r = 0; r < padded; ++r) {
            const int64_t filled = r < count ? n : 0;
            if (p == 0 && r + kRowsAhead < count)
                src.prefetch(r + kRowsAhead, width, Storage::size);
            if (filled)
                load_row<Storage>(src.row(r) + d0 * src.elem_step, src.elem_step, filled,
                                  panel + r * NR, 1);
            for (int64_t x = filled; x < NR; ++x) panel[r * NR + x] = 0.0f;
        }
    }
}

/* W consecutive values at p, converted to f32. */
template <class Storage>
static inline vf load_vector(const char* p) {
    vf x;
    for (int i = 0; i < W; ++i) x[i] = Storage::load(p + i * Storage::size);
    return x;
}
template <>
inline vf load_vector<f32_storage>(const char* p) {
    return vload_units(p);
}
template <>
inline vf load_vector<bf16_storage>(const char* p) {
    return vload_bf16(p);
}

/* Rows [0, count) of src as transposed panels (plan.h) of the given depth starting at dst, zero
 * past count up to the next multiple of NR. W rows at a time: where they are all there and their
 * values adjacent, W x W blocks are transposed in registers (transpose_square) and stored as W
 * whole vectors of the panel; the rest (the depth's tail, the last rows, strided rows) goes
 * value by value. */
template <class Storage>
static void pack_f32_panels_transposed(const strided_rows& src, int64_t count, int64_t depth,
                                       float* dst) {
    const int64_t padded = (count + NR - 1) / NR * NR;
    for (int64_t r0 = 0; r0 < padded; r0 += W) {
        float* columns = dst + (r0 / NR) * depth * NR + r0 % NR;
        const int64_t rows = count - r0 < 0 ? 0 : count - r0 < W ? count - r0 : W;
        const char* row[W];
        if (rows > 0) src.addresses(r0, rows, row);
        for (int64_t ahead = r0 + W; ahead < r0 + 2 * W && ahead < count; ++ahead)
            src.prefetch(ahead, depth, Storage::size);
        int64_t d0 = 0;
        if (rows == W && src.elem_step == Storage::size) {
            for (; d0 + W <= depth; d0 += W) {
                vf block[W];
#pragma GCC unroll 16
                for (int i = 0; i < W; ++i)
                    block[i] = load_vector<Storage>(row[i] + d0 * Storage::size);
                transpose_square(block);
#pragma GCC unroll 16
                for (int i = 0; i < W; ++i) vstore(columns + (d0 + i) * NR, block[i]);
            }
        }
        for (int64_t i = 0; i < W; ++i) {
            float* column = columns + i;
            if (i < rows) {
                for (int64_t d = d0; d < depth; ++d)
                    column[d * NR] = Storage::load(row[i] + d * src.elem_step);
            } else {
                for (int64_t d = d0; d < depth; ++d) column[d * NR] = 0.0f;
            }
        }
    }
}

/* dst row r = src[r * ld + 0 .. width) * mul, converted to the storage dtype. */
template <class Storage>
static void store_rows(const strided_rows& dst, int64_t count, int64_t width, const float* src,
                       int64_t ld, float mul) {
    for (int64_t r = 0; r < count; ++r) {
        if (r + kRowsAhead < count) dst.prefetch(r + kRowsAhead, width, Storage::size, true);
        char* row = dst.row(r);
        const float* s = src + r * ld;
        if (dst.elem_step == Storage::size) {
            for (int64_t d = 0; d < width; ++d) Storage::store(row + Storage::size * d, s[d] * mul);
        } else {
            for (int64_t d = 0; d < width; ++d) Storage::store(row + dst.elem_step * d, s[d] * mul);
        }
    }
}

} // namespace

#endif /* MFA_CPU_PACK_INL */
