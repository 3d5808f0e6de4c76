// A FlashAttention-style forward pass (single head, N x D, D a multiple of 8), sized like the
// project's kernels: 4 SIMD-groups of 8 query rows per threadgroup, 8 keys per step staged
// through threadgroup memory behind barriers, 8x8 simdgroup_matrix products, online softmax
// with row reductions by shuffles. It measures the simulator, not the project's kernels.
#include <metal_stdlib>
using namespace metal;

struct AttentionParams {
    uint n;           // rows of Q, K, V and O; a multiple of 32
    float scale_log2; // softmax scale * log2(e)
};

// The body, for a head dimension D; the kernels below instantiate it.
template <uint D>
void attention_forward(device const float* q, device const float* k, device const float* v,
                       device float* o, constant AttentionParams& p, threadgroup float* staging,
                       uint3 group, ushort tid, ushort simd, ushort threads) {
    constexpr uint kTiles = D / 8;
    const uint row0 = group.x * 32 + simd * 8;
    simdgroup_float8x8 Q[kTiles], O[kTiles];
    for (uint d = 0; d < kTiles; ++d) {
        simdgroup_load(Q[d], q + row0 * D, D, ulong2(d * 8, 0));
        O[d] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
    // Running max (log2 domain) and sum of this lane's row.
    float m = -FLT_MAX, l = 0.0f;
    threadgroup float* keys = staging;
    threadgroup float* values = staging + 8 * D;
    for (uint key0 = 0; key0 < p.n; key0 += 8) {
        for (uint i = tid; i < 8 * D; i += threads) {
            keys[i] = k[key0 * D + i];
            values[i] = v[key0 * D + i];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);

        simdgroup_float8x8 S = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
        for (uint d = 0; d < kTiles; ++d) {
            simdgroup_float8x8 Kt;
            simdgroup_load(Kt, keys, D, ulong2(0, d * 8), true);
            simdgroup_multiply_accumulate(S, Q[d], Kt, S);
        }
        const float2 s = S.thread_elements() * p.scale_log2;
        // A row lives in lanes {L, L^1, L^8, L^9}.
        float row_max = max(s.x, s.y);
        row_max = max(row_max, simd_shuffle_xor(row_max, 1));
        row_max = max(row_max, simd_shuffle_xor(row_max, 8));
        const float m_new = max(m, row_max);
        const float correction = exp2(m - m_new);
        const float2 probabilities = exp2(s - m_new);
        float row_sum = probabilities.x + probabilities.y;
        row_sum += simd_shuffle_xor(row_sum, 1);
        row_sum += simd_shuffle_xor(row_sum, 8);
        l = l * correction + row_sum;
        m = m_new;

        simdgroup_float8x8 P;
        P.thread_elements() = probabilities;
        for (uint d = 0; d < kTiles; ++d) {
            O[d].thread_elements() *= correction;
            simdgroup_float8x8 V;
            simdgroup_load(V, values, D, ulong2(d * 8, 0));
            simdgroup_multiply_accumulate(O[d], P, V, O[d]);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (uint d = 0; d < kTiles; ++d) {
        O[d].thread_elements() /= l;
        simdgroup_store(O[d], o + row0 * D, D, ulong2(d * 8, 0));
    }
}

#define ATTENTION_FORWARD_KERNEL(D)                                                                \
    kernel void attention_forward_d##D(                                                            \
        device const float* q [[buffer(0)]], device const float* k [[buffer(1)]],                  \
        device const float* v [[buffer(2)]], device float* o [[buffer(3)]],                        \
        constant AttentionParams& p [[buffer(4)]], threadgroup float* staging [[threadgroup(0)]],  \
        uint3 group [[threadgroup_position_in_grid]], ushort tid [[thread_index_in_threadgroup]],  \
        ushort simd [[simdgroup_index_in_threadgroup]],                                            \
        ushort threads [[threads_per_threadgroup]]) {                                              \
        attention_forward<D>(q, k, v, o, p, staging, group, tid, simd, threads);                   \
    }
ATTENTION_FORWARD_KERNEL(64)
ATTENTION_FORWARD_KERNEL(128)
