// expect: cannot pass pointer to address space '1' as a pointer to generic address space
#include <metal_stdlib>
using namespace metal;

// An unqualified pointer parameter points to thread memory in MSL.
float first(const float* values) { return values[0]; }

kernel void device_as_thread(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],
                             uint i [[thread_position_in_grid]]) {
    out[i] = first(in);
}
