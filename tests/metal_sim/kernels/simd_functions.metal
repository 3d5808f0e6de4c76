// Every SIMD-group permutation and reduction, written to memory so the test can compare each
// lane's result with the function's definition.
#include <metal_stdlib>
using namespace metal;

struct PermuteParams {
    uint argument; // lane, mask or delta, depending on the function
};

// output[f * threads + tid] holds function f's result in thread tid.
kernel void simd_permutations(device const float* input [[buffer(0)]],
                              device float* output [[buffer(1)]],
                              device float4* output4 [[buffer(2)]],
                              constant PermuteParams& params [[buffer(3)]],
                              uint tid [[thread_index_in_threadgroup]],
                              ushort lane [[thread_index_in_simdgroup]],
                              uint threads [[threads_per_threadgroup]]) {
    const float x = input[tid];
    const ushort a = ushort(params.argument);
    output[0 * threads + tid] = simd_shuffle(x, ushort((lane * 7 + a) % 32));
    output[1 * threads + tid] = simd_shuffle_xor(x, a);
    output[2 * threads + tid] = simd_shuffle_up(x, a);
    output[3 * threads + tid] = simd_shuffle_down(x, a);
    output[4 * threads + tid] = simd_shuffle_rotate_up(x, a);
    output[5 * threads + tid] = simd_shuffle_rotate_down(x, a);
    output[6 * threads + tid] = simd_broadcast(x, a);
    output[7 * threads + tid] = simd_broadcast_first(x);
    output4[tid] = simd_shuffle_xor(float4(x, x + 1.0f, x + 2.0f, x + 3.0f), a);
}

// Threads may number any count: the last SIMD-group can be partial.
kernel void simd_reductions(device const int* input [[buffer(0)]], device int* output [[buffer(1)]],
                            device uint* products [[buffer(2)]],
                            device float* float_sums [[buffer(3)]],
                            uint tid [[thread_index_in_threadgroup]],
                            uint threads [[threads_per_threadgroup]]) {
    const int x = input[tid];
    output[0 * threads + tid] = simd_sum(x);
    output[1 * threads + tid] = simd_max(x);
    output[2 * threads + tid] = simd_min(x);
    output[3 * threads + tid] = simd_and(x);
    output[4 * threads + tid] = simd_or(x);
    output[5 * threads + tid] = simd_xor(x);
    output[6 * threads + tid] = simd_prefix_inclusive_sum(x);
    output[7 * threads + tid] = simd_prefix_exclusive_sum(x);
    output[8 * threads + tid] = simd_all(x > -1000) ? 1 : 0;
    output[9 * threads + tid] = simd_any(x == 7) ? 1 : 0;
    output[10 * threads + tid] = simd_is_first() ? 1 : 0;
    products[tid] = simd_product(uint(x));
    float_sums[tid] = simd_sum(float(x) * 0.5f);
    simdgroup_barrier(mem_flags::mem_none);
}
