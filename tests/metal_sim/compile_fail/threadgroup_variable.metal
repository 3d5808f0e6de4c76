// expect: threadgroup variables declared inside a function are not supported
#include <metal_stdlib>
using namespace metal;

kernel void threadgroup_variable(device float* out [[buffer(0)]],
                                 uint i [[thread_index_in_threadgroup]]) {
    threadgroup float tile[64];
    tile[i] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = tile[63 - i];
}
