// expect: a call through a function pointer, which Metal does not allow
#include <metal_stdlib>
using namespace metal;

float twice(float x) { return 2.0f * x; }
float thrice(float x) { return 3.0f * x; }

kernel void function_pointer(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    float (*scale)(float) = i % 2 ? twice : thrice;
    out[i] = scale(1.0f);
}
