// expect: unsupported_builtin\.metal:6: error: \[\[thread_execution_width\]\] is not supported by metal-sim
#include <metal_stdlib>
using namespace metal;

// One name per built-in: threads_per_simdgroup, not its alias.
kernel void width(device uint* out [[buffer(0)]], uint w [[thread_execution_width]]) { out[0] = w; }
