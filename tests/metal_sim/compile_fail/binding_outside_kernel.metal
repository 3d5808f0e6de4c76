// expect: binding_outside_kernel\.metal:6: error: \[\[buffer\]\] outside a kernel's parameters
#include <metal_stdlib>
using namespace metal;

// Only a kernel's signature binds arguments.
void store(device float* out [[buffer(0)]], float value) { out[0] = value; }

kernel void stores(device float* out [[buffer(0)]]) { store(out, 1.0f); }
