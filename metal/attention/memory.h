// Element access in device memory: every operand is f32, f16 or bf16 (fc_dtype; a mask or a
// merge's output may have a dtype of its own), addressed by 64-bit element offsets so no product
// of dimensions can overflow.
#ifndef MFA_ATTENTION_MEMORY_H
#define MFA_ATTENTION_MEMORY_H

#include "constants.h"

// bf16 is handled as raw bits so that it needs neither MSL 3.1 nor hardware bfloat; stores
// round to nearest even, with NaNs kept quiet (a payload in the high half survives).
inline float bf16_bits_to_float(ushort bits) { return as_type<float>(uint(bits) << 16); }

inline ushort float_to_bf16_bits(float value) {
    uint bits = as_type<uint>(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return ushort((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return ushort(bits >> 16);
}

inline float load_element_as(uint dtype, device const uchar* base, long index) {
    switch (dtype) {
        case MFA_KERNEL_DTYPE_F16: return float(((device const half*)base)[index]);
        case MFA_KERNEL_DTYPE_BF16: return bf16_bits_to_float(((device const ushort*)base)[index]);
        default: return ((device const float*)base)[index];
    }
}

inline void store_element_as(uint dtype, device uchar* base, long index, float value) {
    switch (dtype) {
        case MFA_KERNEL_DTYPE_F16: ((device half*)base)[index] = half(value); break;
        case MFA_KERNEL_DTYPE_BF16:
            ((device ushort*)base)[index] = float_to_bf16_bits(value);
            break;
        default: ((device float*)base)[index] = value; break;
    }
}

inline float load_element(device const uchar* base, long index) {
    return load_element_as(fc_dtype, base, index);
}

inline void store_element(device uchar* base, long index, float value) {
    store_element_as(fc_dtype, base, index, value);
}

// Entry (b, i) of an int32 operand (sequence offsets, block tables, cache lengths).
inline int load_int(device const int* base, constant mfa_operand_layout& layout, long b, long i) {
    return base[layout.origin + b * layout.stride[0] + i * layout.stride[3]];
}

// One (batch, head) slice of a strided operand: rows are sequence positions, columns features.
struct operand_slice {
    long base; // element offset of (row 0, column 0)
    long row_stride;
    long col_stride;

    long at(int row, uint col) const {
        return base + long(row) * row_stride + long(col) * col_stride;
    }
};

inline operand_slice slice_of(constant mfa_operand_layout& layout, uint batch, uint head) {
    operand_slice s;
    s.base = layout.origin + long(batch) * layout.stride[0] + long(head) * layout.stride[1];
    s.row_stride = layout.stride[2];
    s.col_stride = layout.stride[3];
    return s;
}

// The same slice with its rows starting at row `first_row` of the operand: one sequence of a
// packed operand (whose batch stride is 0).
inline operand_slice slice_from_row(constant mfa_operand_layout& layout, uint batch, uint head,
                                    long first_row) {
    operand_slice s = slice_of(layout, batch, head);
    s.base += first_row * layout.stride[2];
    return s;
}

#endif
