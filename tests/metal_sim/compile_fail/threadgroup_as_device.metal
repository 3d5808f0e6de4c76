// expect: cannot pass pointer to address space '3' as a pointer to address space '1'
#include <metal_stdlib>
using namespace metal;

void store_result(device float* destination, float value) { destination[0] = value; }

kernel void threadgroup_as_device(device float* out [[buffer(0)]],
                                  threadgroup float* scratch [[threadgroup(0)]],
                                  uint i [[thread_index_in_threadgroup]]) {
    store_result(scratch, float(i));
    out[i] = scratch[0];
}
