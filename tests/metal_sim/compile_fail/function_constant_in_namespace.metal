// expect: function_constant_in_namespace\.metal:6: error: function constant 'fc_scale' is inside a namespace
#include <metal_stdlib>
using namespace metal;

namespace config {
constant float fc_scale [[function_constant(0)]];
} // namespace config

kernel void scaled(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = config::fc_scale;
}
