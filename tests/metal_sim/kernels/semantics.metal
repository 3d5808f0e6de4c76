// Kernels that are right, and kernels with the mistakes the simulator must catch.
#include <metal_stdlib>
using namespace metal;

// Each thread publishes a value, then reads its neighbour's; each threadgroup writes its own
// part of the output.
kernel void neighbour_with_barrier(device const float* input [[buffer(0)]],
                                   device float* output [[buffer(1)]],
                                   threadgroup float* shared [[threadgroup(0)]],
                                   uint tid [[thread_index_in_threadgroup]],
                                   uint gid [[thread_position_in_grid]]) {
    shared[tid] = input[tid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    output[gid] = shared[tid == 0 ? 0 : tid - 1];
}

// The same without the barrier: right only if every thread happens to run after its neighbour.
kernel void neighbour_without_barrier(device const float* input [[buffer(0)]],
                                      device float* output [[buffer(1)]],
                                      threadgroup float* shared [[threadgroup(0)]],
                                      uint tid [[thread_index_in_threadgroup]]) {
    shared[tid] = input[tid];
    output[tid] = shared[tid == 0 ? 0 : tid - 1];
}

kernel void barrier_in_branch(device float* output [[buffer(0)]],
                              uint tid [[thread_index_in_threadgroup]]) {
    if (tid < 16) threadgroup_barrier(mem_flags::mem_threadgroup);
    output[tid] = 1.0f;
}

kernel void barriers_in_both_branches(device float* output [[buffer(0)]],
                                      uint tid [[thread_index_in_threadgroup]]) {
    if (tid % 2 == 0) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    output[tid] = 1.0f;
}

kernel void return_before_barrier(device float* output [[buffer(0)]],
                                  uint tid [[thread_index_in_threadgroup]]) {
    if (tid == 5) return;
    threadgroup_barrier(mem_flags::mem_device);
    output[tid] = 1.0f;
}

kernel void simd_sum_in_branch(device float* output [[buffer(0)]],
                               uint tid [[thread_index_in_threadgroup]],
                               ushort lane [[thread_index_in_simdgroup]]) {
    float x = 1.0f;
    if (lane < 16) x = simd_sum(x);
    output[tid] = x;
}

kernel void simd_sums_in_both_branches(device float* output [[buffer(0)]],
                                       uint tid [[thread_index_in_threadgroup]],
                                       ushort lane [[thread_index_in_simdgroup]]) {
    float x = float(tid);
    if (lane % 2 == 0) {
        x = simd_sum(x);
    } else {
        x = simd_sum(x);
    }
    output[tid] = x;
}

kernel void matrix_in_partial_simdgroup(device const float* input [[buffer(0)]],
                                        device float* output [[buffer(1)]]) {
    simdgroup_float8x8 m;
    simdgroup_load(m, input);
    simdgroup_store(m, output);
}

// Copies threadgroup memory that nothing wrote.
kernel void read_unwritten_threadgroup_memory(device uint* output [[buffer(0)]],
                                              threadgroup uint* shared [[threadgroup(0)]],
                                              uint tid [[thread_index_in_threadgroup]],
                                              uint3 group [[threadgroup_position_in_grid]],
                                              uint threads [[threads_per_threadgroup]]) {
    output[group.x * threads + tid] = shared[tid];
}
