// expect: poisoned identifier.*double
// Metal's restrictions hold from a kernel's first line, also before it includes <metal_stdlib>.
inline float halve(float x) { return float(double(x) / 2); }

#include <metal_stdlib>
using namespace metal;

kernel void halves(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = halve(float(i));
}
