// Scalar and vector types, conversions and the math library.
#include <metal_stdlib>
using namespace metal;

// float -> half and bfloat, rounded to nearest even; the bits and the values read back.
kernel void convert_rounding(device const float* input [[buffer(0)]],
                             device ushort* half_bits [[buffer(1)]],
                             device ushort* bfloat_bits [[buffer(2)]],
                             device float* widened [[buffer(3)]],
                             uint i [[thread_position_in_grid]]) {
    const half h = half(input[i]);
    const bfloat b = bfloat(input[i]);
    half_bits[i] = as_type<ushort>(h);
    bfloat_bits[i] = as_type<ushort>(b);
    widened[2 * i + 0] = float(h);
    widened[2 * i + 1] = float(b);
}

// Stores bfloat values through a device bfloat pointer and reads them back.
kernel void bfloat_memory(device const bfloat* input [[buffer(0)]],
                          device bfloat* output [[buffer(1)]], uint i [[thread_position_in_grid]]) {
    const bfloat x = input[i];
    output[i] = bfloat(float(x) * 2.0f) + x;
}

// Each result goes to its own slot; the test knows the slot order.
kernel void vectors_and_math(device const float* x [[buffer(0)]], device float* out [[buffer(1)]]) {
    const float a = x[0], b = x[1], c = x[2];
    const float4 v = float4(a, float2(b, c), 1.0f);
    const float4 w = v.wzyx;
    const half4 h = half4(v);
    const int2 n = int2(-3, 5);
    const uint2 u = uint2(7u);
    int slot = 0;
    out[slot++] = w.x;                     // 1
    out[slot++] = w.y;                     // c
    out[slot++] = dot(v.xy, float2(2.0f)); // 2a + 2b
    out[slot++] = float(h.y);              // b rounded to half
    out[slot++] = exp(a);
    out[slot++] = exp2(a);
    out[slot++] = log(c);
    out[slot++] = log2(c);
    out[slot++] = fast::exp2(b);
    out[slot++] = precise::exp(b);
    out[slot++] = rsqrt(c);
    out[slot++] = fma(a, b, c);
    out[slot++] = max(a, b);
    out[slot++] = min(a, b);
    out[slot++] = clamp(a, -0.5f, 0.5f);
    out[slot++] = abs(-c);
    out[slot++] = float(max(n.x, n.y)); // 5
    out[slot++] = float(min(u.x, 3u));  // 3
    out[slot++] = float(abs(n.x));      // 3
    out[slot++] = select(a, b, a < b);  // max(a, b)
    const float2 picked =
        select(float2(1.0f, 2.0f), float2(3.0f, 4.0f), float2(a, b) > float2(0.0f));
    out[slot++] = picked.x;
    out[slot++] = picked.y;
    out[slot++] = exp2(float2(a, b)).y;             // exp2(b)
    out[slot++] = as_type<float>(as_type<uint>(c)); // c
    out[slot++] = FLT_MAX;
    out[slot++] = numeric_limits<float>::infinity();
    out[slot++] = float(HALF_MAX);
    out[slot++] = float(1.5h);
    out[slot++] = float(bfloat(2.5f));
    out[slot++] = INFINITY;
    out[slot++] = float(max(h, half4(0.0h)).x); // max(a, 0) in half
    out[slot++] = isnan(a - a) ? 1.0f : 0.0f;   // 0 for finite a
}
