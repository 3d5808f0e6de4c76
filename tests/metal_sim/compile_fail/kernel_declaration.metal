// expect: kernel_declaration\.metal:6: error: kernel 'declared' is declared without its definition
#include <metal_stdlib>
using namespace metal;

// A separate declaration would be a second place for the bindings to disagree.
kernel void declared(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]);

kernel void declared(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = 1.0f;
}
