// expect: host_name\.metal:6: error: \[\[host_name\]\] is not supported by metal-sim
#include <metal_stdlib>
using namespace metal;

// A kernel is dispatched by the name in its signature.
[[host_name("renamed")]] kernel void original(device float* out [[buffer(0)]],
                                              uint i [[thread_position_in_grid]]) {
    out[i] = 1.0f;
}
