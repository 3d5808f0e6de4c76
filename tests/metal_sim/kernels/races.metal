// Kernels with each kind of data race the race detector must report, and their corrected
// forms, which it must accept. Each thread of a threadgroup owns one element of `tile`.
#include <metal_stdlib>
using namespace metal;

// Read-after-write: a thread reads its neighbour's element with no barrier after the write.
kernel void missing_leading_barrier(device float* output [[buffer(0)]],
                                    threadgroup float* tile [[threadgroup(0)]],
                                    uint tid [[thread_index_in_threadgroup]],
                                    uint threads [[threads_per_threadgroup]]) {
    tile[tid] = float(tid);
    output[tid] = tile[tid == 0 ? threads - 1 : tid - 1];
}

// Two rounds of publish, barrier, read the neighbour: without the trailing barrier a thread
// overwrites its element for round 2 while its neighbour may still read round 1's
// (write-after-read).
template <bool trailing_barrier>
inline void two_rounds(device float* output, threadgroup float* tile, uint tid, uint threads) {
    float sum = 0.0f;
    for (uint round = 0; round < 2; ++round) {
        tile[tid] = float(tid + round);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        sum += tile[(tid + 1) % threads];
        if (trailing_barrier) threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    output[tid] = sum;
}

kernel void missing_trailing_barrier(device float* output [[buffer(0)]],
                                     threadgroup float* tile [[threadgroup(0)]],
                                     uint tid [[thread_index_in_threadgroup]],
                                     uint threads [[threads_per_threadgroup]]) {
    two_rounds<false>(output, tile, tid, threads);
}

kernel void both_barriers(device float* output [[buffer(0)]],
                          threadgroup float* tile [[threadgroup(0)]],
                          uint tid [[thread_index_in_threadgroup]],
                          uint threads [[threads_per_threadgroup]]) {
    two_rounds<true>(output, tile, tid, threads);
}

// A barrier that orders no memory (mem_none), or the wrong memory (mem_device for a
// threadgroup tile, mem_threadgroup for a device buffer), is an execution barrier only.
kernel void barrier_without_memory(device float* output [[buffer(0)]],
                                   threadgroup float* tile [[threadgroup(0)]],
                                   uint tid [[thread_index_in_threadgroup]],
                                   uint threads [[threads_per_threadgroup]]) {
    tile[tid] = float(tid);
    threadgroup_barrier(mem_flags::mem_none);
    output[tid] = tile[(tid + 1) % threads];
}

kernel void device_barrier_for_threadgroup_memory(device float* output [[buffer(0)]],
                                                  threadgroup float* tile [[threadgroup(0)]],
                                                  uint tid [[thread_index_in_threadgroup]],
                                                  uint threads [[threads_per_threadgroup]]) {
    tile[tid] = float(tid);
    threadgroup_barrier(mem_flags::mem_device);
    output[tid] = tile[(tid + 1) % threads];
}

kernel void threadgroup_barrier_for_device_memory(device float* output [[buffer(0)]],
                                                  uint tid [[thread_index_in_threadgroup]],
                                                  uint threads [[threads_per_threadgroup]]) {
    output[tid] = float(tid);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    output[threads + tid] = output[(tid + 1) % threads];
}

kernel void device_barrier_for_device_memory(device float* output [[buffer(0)]],
                                             uint tid [[thread_index_in_threadgroup]],
                                             uint threads [[threads_per_threadgroup]]) {
    output[tid] = float(tid);
    threadgroup_barrier(mem_flags::mem_device);
    output[threads + tid] = output[(tid + 1) % threads];
}

// Write-after-write: every thread stores its own value to one element.
kernel void all_write_one_element(device float* output [[buffer(0)]],
                                  threadgroup float* tile [[threadgroup(0)]],
                                  uint tid [[thread_index_in_threadgroup]]) {
    if (tid % 32 == 0) tile[0] = float(tid);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    output[tid] = tile[0];
}

// Threads of different threadgroups write the same element of a device buffer, which the
// detector does not check (only threads of one threadgroup); each threadgroup's own threads
// write disjoint halves of an element pair, which is no race either.
kernel void halves_of_one_word(device half* output [[buffer(0)]],
                               uint tid [[thread_index_in_threadgroup]]) {
    output[tid] = half(tid);
}

// simdgroup_store into a tile from SIMD-group 0, read by every thread: the accesses of a
// matrix store count for the lanes that own the elements, so the barrier is what matters.
template <bool barrier>
inline void store_then_read(device float* output, threadgroup float* tile, uint tid) {
    if (tid < 32) {
        simdgroup_float8x8 m = make_filled_simdgroup_matrix<float, 8, 8>(float(1.0f));
        simdgroup_store(m, tile, 8);
    }
    if (barrier) threadgroup_barrier(mem_flags::mem_threadgroup);
    output[tid] = tile[tid % 64];
}

kernel void matrix_store_then_barrier(device float* output [[buffer(0)]],
                                      threadgroup float* tile [[threadgroup(0)]],
                                      uint tid [[thread_index_in_threadgroup]]) {
    store_then_read<true>(output, tile, tid);
}

kernel void matrix_store_without_barrier(device float* output [[buffer(0)]],
                                         threadgroup float* tile [[threadgroup(0)]],
                                         uint tid [[thread_index_in_threadgroup]]) {
    store_then_read<false>(output, tile, tid);
}

// A matrix constructor reached by half of the SIMD-group, like any SIMD-group function.
kernel void filled_matrix_in_branch(device float* output [[buffer(0)]],
                                    uint tid [[thread_index_in_threadgroup]],
                                    ushort lane [[thread_index_in_simdgroup]]) {
    float x = 0.0f;
    if (lane < 16) x = make_filled_simdgroup_matrix<float, 8, 8>(2.0f).thread_elements()[0];
    output[tid] = x;
}
