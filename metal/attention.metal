// The three attention kernels. Bodies live in attention/*.h; this file only declares the
// entry points with their bindings (indices shared with the planner via attention_params.h).
// Every Metal function of the library is named kernel_<what it runs>: the mfa_ prefix belongs to
// the public C API (mfa_attention_forward is a C function), and the kernel_ prefix keeps an entry
// point apart from the body it calls (attention_forward in attention/forward.h).
#include <metal_stdlib>
using namespace metal;

#include "attention/forward.h"
#include "attention/backward_query.h"
#include "attention/backward_key_value.h"

kernel void
kernel_attention_forward(device const uchar* q [[buffer(MFA_OPERAND_Q)]],
                         device const uchar* k [[buffer(MFA_OPERAND_K)]],
                         device const uchar* v [[buffer(MFA_OPERAND_V)]],
                         device uchar* o [[buffer(MFA_OPERAND_O)]],
                         device float* l [[buffer(MFA_OPERAND_L), function_constant(fc_has_lse)]],
                         constant mfa_kernel_params& params [[buffer(MFA_BUFFER_PARAMS)]],
                         threadgroup float* staging [[threadgroup(MFA_THREADGROUP_STAGING)]],
                         uint3 group [[threadgroup_position_in_grid]],
                         ushort thread_index [[thread_index_in_threadgroup]],
                         ushort simd_index [[simdgroup_index_in_threadgroup]],
                         ushort lane [[thread_index_in_simdgroup]]) {
    attention_forward(q, k, v, o, l, params, staging, group, thread_index, simd_index, lane);
}

kernel void kernel_attention_backward_query(device const uchar* q [[buffer(MFA_OPERAND_Q)]],
                                            device const uchar* k [[buffer(MFA_OPERAND_K)]],
                                            device const uchar* v [[buffer(MFA_OPERAND_V)]],
                                            device const uchar* o [[buffer(MFA_OPERAND_O)]],
                                            device const float* l [[buffer(MFA_OPERAND_L)]],
                                            device float* delta [[buffer(MFA_OPERAND_DELTA)]],
                                            device const uchar* dout [[buffer(MFA_OPERAND_DOUT)]],
                                            device uchar* dq [[buffer(MFA_OPERAND_DQ)]],
                                            constant mfa_kernel_params& params
                                            [[buffer(MFA_BUFFER_PARAMS)]],
                                            threadgroup float* staging
                                            [[threadgroup(MFA_THREADGROUP_STAGING)]],
                                            uint3 group [[threadgroup_position_in_grid]],
                                            ushort thread_index [[thread_index_in_threadgroup]],
                                            ushort simd_index [[simdgroup_index_in_threadgroup]],
                                            ushort lane [[thread_index_in_simdgroup]]) {
    attention_backward_query(q, k, v, o, l, delta, dout, dq, params, staging, group, thread_index,
                             simd_index, lane);
}

kernel void kernel_attention_backward_key_value(
    device const uchar* q [[buffer(MFA_OPERAND_Q)]],
    device const uchar* k [[buffer(MFA_OPERAND_K)]],
    device const uchar* v [[buffer(MFA_OPERAND_V)]],
    device const float* l [[buffer(MFA_OPERAND_L)]],
    device const float* delta [[buffer(MFA_OPERAND_DELTA)]],
    device const uchar* dout [[buffer(MFA_OPERAND_DOUT)]],
    device uchar* dv [[buffer(MFA_OPERAND_DV)]], device uchar* dk [[buffer(MFA_OPERAND_DK)]],
    constant mfa_kernel_params& params [[buffer(MFA_BUFFER_PARAMS)]],
    threadgroup float* staging [[threadgroup(MFA_THREADGROUP_STAGING)]],
    uint3 group [[threadgroup_position_in_grid]],
    ushort thread_index [[thread_index_in_threadgroup]],
    ushort simd_index [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
    attention_backward_key_value(q, k, v, l, delta, dout, dv, dk, params, staging, group,
                                 thread_index, simd_index, lane);
}
