// expect: poisoned identifier.*throw 1
#include <metal_stdlib>
using namespace metal;

kernel void throws(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    if (i > 1000) throw 1;
    out[i] = 1.0f;
}
