// expect: poisoned identifier.*new float
#include <metal_stdlib>
using namespace metal;

kernel void allocates(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    float* scratch = new float[4];
    out[i] = scratch[0];
}
