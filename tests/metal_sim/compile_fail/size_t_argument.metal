// expect: parameter 'count' has type size_t
#include <metal_stdlib>
using namespace metal;

kernel void size_t_argument(device float* out [[buffer(0)]], constant size_t& count [[buffer(1)]],
                            uint i [[thread_position_in_grid]]) {
    if (i < count) out[i] = 1.0f;
}
