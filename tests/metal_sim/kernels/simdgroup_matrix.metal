// simdgroup_matrix: the lane layout seen through thread_elements(), loads and stores with
// stride, origin and transpose, and the products.
#include <metal_stdlib>
using namespace metal;

// Each lane writes its two elements of an 8x8 matrix loaded from row-major memory.
kernel void matrix_lane_layout(device const float* matrix [[buffer(0)]],
                               device float* elements [[buffer(1)]],
                               ushort lane [[thread_index_in_simdgroup]]) {
    simdgroup_float8x8 m;
    simdgroup_load(m, matrix);
    elements[lane * 2 + 0] = m.thread_elements()[0];
    elements[lane * 2 + 1] = m.thread_elements()[1];
}

// Writes lane-tagged values through thread_elements() and stores them: the inverse direction.
kernel void matrix_lane_tags(device float* matrix [[buffer(0)]],
                             ushort lane [[thread_index_in_simdgroup]]) {
    simdgroup_float8x8 m;
    m.thread_elements()[0] = float(lane * 2 + 0);
    m.thread_elements()[1] = float(lane * 2 + 1);
    simdgroup_store(m, matrix);
}

struct TransferParams {
    uint load_stride;
    uint load_origin_x;
    uint load_origin_y;
    uint load_transpose;
    uint store_stride;
    uint store_origin_x;
    uint store_origin_y;
    uint store_transpose;
};

// device --load(params)--> matrix --store--> threadgroup --load--> matrix --store(params)--> device
kernel void matrix_transfer(device const float* source [[buffer(0)]],
                            device float* destination [[buffer(1)]],
                            constant TransferParams& p [[buffer(2)]],
                            threadgroup float* staging [[threadgroup(0)]]) {
    simdgroup_float8x8 a;
    simdgroup_load(a, source, p.load_stride, ulong2(p.load_origin_x, p.load_origin_y),
                   p.load_transpose != 0);
    simdgroup_store(a, staging, 8);
    simdgroup_float8x8 b;
    simdgroup_load(b, staging);
    simdgroup_store(b, destination, p.store_stride, ulong2(p.store_origin_x, p.store_origin_y),
                    p.store_transpose != 0);
}

// d = a * b + c and e = a * b, in the element type T: one plain kernel per type, over a helper
// template, as the project's kernels are written. The helper takes the pointers as they come:
// the address-space check leaves bfloat pointers generic.
template <typename T, typename Input, typename Output>
void matrix_products(Input a, Input b, Input c, Output d, Output e) {
    simdgroup_matrix<T, 8, 8> A, B, C, D;
    simdgroup_load(A, a);
    simdgroup_load(B, b);
    simdgroup_load(C, c);
    simdgroup_multiply_accumulate(D, A, B, C);
    simdgroup_store(D, d);
    simdgroup_multiply(C, A, B);
    simdgroup_store(C, e);
}

#define MATRIX_PRODUCTS_KERNEL(T)                                                                  \
    kernel void matrix_products_##T(                                                               \
        device const T* a [[buffer(0)]], device const T* b [[buffer(1)]],                          \
        device const T* c [[buffer(2)]], device T* d [[buffer(3)]], device T* e [[buffer(4)]]) {   \
        matrix_products<T>(a, b, c, d, e);                                                         \
    }
MATRIX_PRODUCTS_KERNEL(float)
MATRIX_PRODUCTS_KERNEL(half)
MATRIX_PRODUCTS_KERNEL(bfloat)

// half inputs, a float accumulator updated in place twice: c + 2ab.
kernel void matrix_mixed_accumulate(device const half* a [[buffer(0)]],
                                    device const half* b [[buffer(1)]],
                                    device float* c [[buffer(2)]]) {
    simdgroup_half8x8 A, B;
    simdgroup_float8x8 C;
    simdgroup_load(A, a);
    simdgroup_load(B, b);
    simdgroup_load(C, c);
    simdgroup_multiply_accumulate(C, A, B, C);
    simdgroup_multiply_accumulate(C, A, B, C);
    simdgroup_store(C, c);
}

kernel void matrix_constructors(device float* diagonal [[buffer(0)]],
                                device float* filled [[buffer(1)]]) {
    simdgroup_float8x8 identity_times_two(2.0f);
    simdgroup_store(identity_times_two, diagonal);
    simdgroup_store(make_filled_simdgroup_matrix<float, 8, 8>(3.0f), filled);
}
