// The kernel declaration forms the code generator supports, each bound and registered by host
// name: a kernel in a namespace, a template kernel with extra attributes instantiated through a
// macro with its full signature and with decltype from outside the namespace, function
// constants (plain and derived) inside a namespace, and a non-template [[kernel]].
#include <metal_stdlib>
using namespace metal;

namespace forms {

constant bool fc_triple [[function_constant(20)]];
constant uint fc_factor = fc_triple ? 3u : 1u;

struct Count {
    uint n;
};

template <typename T, int N>
[[kernel, max_total_threads_per_threadgroup(256)]] void
scaled(const device T* input [[buffer(0)]], device T* output [[buffer(1)]],
       constant Count& count [[buffer(2)]], uint2 position [[thread_position_in_grid]]) {
    if (position.x < count.n) output[position.x] = input[position.x] * T(N * int(fc_factor));
}

#define instantiate_scaled(name, T, N)                                                             \
    template [[host_name(#name "_" #T)]] [[kernel]] void scaled<T, N>(                             \
        const device T* input [[buffer(0)]], device T* output [[buffer(1)]],                       \
        constant Count& count [[buffer(2)]], uint2 position [[thread_position_in_grid]]);
instantiate_scaled(scaled_by_2, float, 2) instantiate_scaled(scaled_by_3, int, 3)

    kernel
    void in_namespace(device uint* output [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    output[i] = i * fc_factor;
}

} // namespace forms

template [[host_name(
    "scaled_by_5_float")]] [[kernel]] decltype(forms::scaled<float, 5>) forms::scaled<float, 5>;

[[kernel]] void attribute_spelled(device float* output [[buffer(0)]],
                                  ushort i [[thread_index_in_threadgroup]]) {
    output[i] = float(i) + 0.5f;
}
