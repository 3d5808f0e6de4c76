// The other file defining `same_name`.
#include <metal_stdlib>
using namespace metal;

kernel void same_name(device float* out [[buffer(0)]]) { out[0] = 2.0f; }
