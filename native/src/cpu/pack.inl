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
#include "cpu/simd.inl"

#include <stdint.h>
#include <string.h>

namespace {

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

/* Rows s0, s0+1, ... of head (b, h) of a view, as byte addresses and steps. */
struct strided_rows {
    char* first;
    int64_t row_step;
    int64_t elem_step;
    char* row(int64_t r) const { return first + r * row_step; }
};

static inline strided_rows rows_of(const mfa_view& view, int64_t elem_size, int64_t b, int64_t h,
                                   int64_t s0) {
    strided_rows rows;
    rows.first =
        view.data + elem_size * (b * view.stride[0] + h * view.stride[1] + s0 * view.stride[2]);
    rows.row_step = elem_size * view.stride[2];
    rows.elem_step = elem_size * view.stride[3];
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
            if (filled)
                load_row<Storage>(src.row(r) + d0 * src.elem_step, src.elem_step, filled,
                                  panel + r * NR, 1);
            for (int64_t x = filled; x < NR; ++x) panel[r * NR + x] = 0.0f;
        }
    }
}

/* Rows [0, count) of src as transposed panels (plan.h) of the given depth starting at dst, zero
 * past count up to the next multiple of NR. */
template <class Storage>
static void pack_f32_panels_transposed(const strided_rows& src, int64_t count, int64_t depth,
                                       float* dst) {
    const int64_t padded = (count + NR - 1) / NR * NR;
    for (int64_t r = 0; r < padded; ++r) {
        float* column = dst + (r / NR) * depth * NR + r % NR;
        if (r < count) {
            load_row<Storage>(src.row(r), src.elem_step, depth, column, NR);
        } else {
            for (int64_t d = 0; d < depth; ++d) column[d * NR] = 0.0f;
        }
    }
}

/* dst row r = src[r * ld + 0 .. width) * mul, converted to the storage dtype. */
template <class Storage>
static void store_rows(const strided_rows& dst, int64_t count, int64_t width, const float* src,
                       int64_t ld, float mul) {
    for (int64_t r = 0; r < count; ++r) {
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
