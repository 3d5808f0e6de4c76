// expect: threadgroup_variable\.metal:8: error: threadgroup variables declared in a function body are not supported by metal-sim
#include <metal_stdlib>
using namespace metal;

// Threadgroup memory comes from the dispatch, as [[threadgroup(i)]] parameters.
kernel void reverse(device float* data [[buffer(0)]], uint tid [[thread_index_in_threadgroup]],
                    uint threads [[threads_per_threadgroup]]) {
    threadgroup float tile[256];
    tile[tid] = data[tid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    data[tid] = tile[threads - 1 - tid];
}
