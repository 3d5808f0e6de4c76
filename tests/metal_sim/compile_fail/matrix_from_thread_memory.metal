// expect: no matching function for call to 'simdgroup_load'
#include <metal_stdlib>
using namespace metal;

// simdgroup_load reads device or threadgroup memory, never thread memory.
kernel void matrix_from_thread_memory(device float* out [[buffer(0)]]) {
    float local[64] = {};
    simdgroup_float8x8 m;
    simdgroup_load(m, local);
    simdgroup_store(m, out);
}
