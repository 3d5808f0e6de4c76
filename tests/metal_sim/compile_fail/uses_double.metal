// expect: poisoned identifier.*double wide
#include <metal_stdlib>
using namespace metal;

kernel void uses_double(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    double wide = 0.5;
    out[i] = float(wide);
}
