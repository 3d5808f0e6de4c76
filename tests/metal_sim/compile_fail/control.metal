// expect-success
// The control: valid MSL going through the same steps must compile.
#include <metal_stdlib>
using namespace metal;

kernel void control(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = float(i) * 0.5f;
}
