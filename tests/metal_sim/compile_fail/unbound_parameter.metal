// expect: parameter 'count': no Metal binding attribute
#include <metal_stdlib>
using namespace metal;

kernel void unbound_parameter(device float* out [[buffer(0)]], uint count) {
    out[0] = float(count);
}
