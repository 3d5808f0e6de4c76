// expect: recursion, which Metal does not allow: factorial\(float\) -> factorial\(float\)
#include <metal_stdlib>
using namespace metal;

float factorial(float n) { return n <= 1.0f ? 1.0f : n * factorial(n - 1.0f); }

kernel void recursion(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = factorial(float(i));
}
