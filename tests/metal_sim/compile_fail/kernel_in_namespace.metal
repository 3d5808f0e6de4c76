// expect: kernel_in_namespace\.metal:7: error: kernel 'inside' is inside a namespace
#include <metal_stdlib>
using namespace metal;

namespace helpers {

kernel void inside(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = 1.0f;
}

} // namespace helpers
