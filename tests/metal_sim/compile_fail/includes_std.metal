// expect: 'vector' file not found
#include <metal_stdlib>
#include <vector>
using namespace metal;

kernel void includes_std(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = 1.0f;
}
