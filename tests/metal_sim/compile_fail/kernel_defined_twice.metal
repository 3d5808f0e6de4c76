// expect: kernel_defined_twice\.metal:8: error: kernel 'twice' is defined twice
#include <metal_stdlib>
using namespace metal;

// Metal does not overload kernels; a host finds each by its name alone.
kernel void twice(device float* out [[buffer(0)]]) { out[0] = 1.0f; }

kernel void twice(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = 2.0f;
}
