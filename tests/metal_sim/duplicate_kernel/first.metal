// One of two files defining a kernel of the same name: their binary's kernel table must not build.
#include <metal_stdlib>
using namespace metal;

kernel void same_name(device float* out [[buffer(0)]]) { out[0] = 1.0f; }
