// expect: kernel_attribute\.metal:6: error: the \[\[kernel\]\] attribute is not supported by metal-sim
#include <metal_stdlib>
using namespace metal;

// The project writes kernels as `kernel void name(...)`.
[[kernel]] void spelled_as_attribute(device float* out [[buffer(0)]],
                                     uint i [[thread_position_in_grid]]) {
    out[i] = 1.0f;
}
