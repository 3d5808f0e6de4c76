// expect: unsupported_attribute\.metal:6: error: \[\[max_total_threads_per_threadgroup\]\] is not supported by metal-sim
#include <metal_stdlib>
using namespace metal;

// An attribute the simulator does not model fails rather than being ignored.
[[max_total_threads_per_threadgroup(256)]] kernel void limited(device float* out [[buffer(0)]],
                                                               uint i [[thread_position_in_grid]]) {
    out[i] = 1.0f;
}
