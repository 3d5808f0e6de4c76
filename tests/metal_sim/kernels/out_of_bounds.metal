// Writes one element past the end of its buffer (thread `count` exists, element `count` does
// not): AddressSanitizer must report it.
#include <metal_stdlib>
using namespace metal;

kernel void write_past_end(device float* output [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    output[i] = float(i);
}
