// The attention kernels. Bodies live in attention/*.h; this file only declares the entry points
// with their bindings (indices shared with the planner via attention_params.h). Every Metal
// function of the library is named kernel_<what it runs>: the mfa_ prefix belongs to the public
// C API (mfa_attention_forward is a C function), and the kernel_ prefix keeps an entry point
// apart from the body it calls (attention_forward in attention/forward.h). An operand that only
// some calls have is bound under the function constant that compiles in its use, so a pipeline
// without it needs no buffer there.
#include <metal_stdlib>
using namespace metal;

#include "attention/forward.h"
#include "attention/backward_query.h"
#include "attention/backward_key_value.h"
#include "attention/row_passes.h"

kernel void kernel_attention_forward(
    device const uchar* q [[buffer(MFA_OPERAND_Q)]],
    device const uchar* k [[buffer(MFA_OPERAND_K)]],
    device const uchar* v [[buffer(MFA_OPERAND_V)]], device uchar* o [[buffer(MFA_OPERAND_O)]],
    device float* l [[buffer(MFA_OPERAND_L), function_constant(fc_has_lse)]],
    device const uchar* mask [[buffer(MFA_OPERAND_MASK), function_constant(fc_has_mask)]],
    device const uchar* block_mask
    [[buffer(MFA_OPERAND_BLOCK_MASK), function_constant(fc_has_block_mask)]],
    device const float* alibi [[buffer(MFA_OPERAND_ALIBI), function_constant(fc_has_alibi)]],
    device const float* sinks [[buffer(MFA_OPERAND_SINKS), function_constant(fc_has_sinks)]],
    device const int* cu_seqlens_q
    [[buffer(MFA_OPERAND_CU_SEQLENS_Q), function_constant(fc_varlen)]],
    device const int* cu_seqlens_k
    [[buffer(MFA_OPERAND_CU_SEQLENS_K), function_constant(fc_varlen)]],
    device const int* block_table [[buffer(MFA_OPERAND_BLOCK_TABLE), function_constant(fc_paged)]],
    device const int* cache_seqlens
    [[buffer(MFA_OPERAND_CACHE_SEQLENS), function_constant(fc_paged)]],
    device float* partial_o [[buffer(MFA_OPERAND_PARTIAL_O), function_constant(fc_split_keys)]],
    device float* partial_l [[buffer(MFA_OPERAND_PARTIAL_L), function_constant(fc_split_keys)]],
    constant mfa_kernel_params& params [[buffer(MFA_BUFFER_PARAMS)]],
    threadgroup float* staging [[threadgroup(MFA_THREADGROUP_STAGING)]],
    uint3 group [[threadgroup_position_in_grid]],
    ushort thread_index [[thread_index_in_threadgroup]],
    ushort simd_index [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
    forward_extras x;
    x.mask = mask;
    x.block_mask = block_mask;
    x.alibi = alibi;
    x.sinks = sinks;
    x.cu_seqlens_q = cu_seqlens_q;
    x.cu_seqlens_k = cu_seqlens_k;
    x.block_table = block_table;
    x.cache_seqlens = cache_seqlens;
    x.partial_o = partial_o;
    x.partial_l = partial_l;
    attention_forward(q, k, v, o, l, x, params, staging, group, thread_index, simd_index, lane);
}

kernel void kernel_attention_backward_query(
    device const uchar* q [[buffer(MFA_OPERAND_Q)]],
    device const uchar* k [[buffer(MFA_OPERAND_K)]],
    device const uchar* v [[buffer(MFA_OPERAND_V)]],
    device const uchar* o [[buffer(MFA_OPERAND_O)]],
    device const float* l [[buffer(MFA_OPERAND_L)]],
    device float* delta [[buffer(MFA_OPERAND_DELTA)]],
    device const uchar* dout [[buffer(MFA_OPERAND_DOUT)]],
    device uchar* dq [[buffer(MFA_OPERAND_DQ)]],
    device const uchar* mask [[buffer(MFA_OPERAND_MASK), function_constant(fc_has_mask)]],
    device const uchar* block_mask
    [[buffer(MFA_OPERAND_BLOCK_MASK), function_constant(fc_has_block_mask)]],
    device const float* alibi [[buffer(MFA_OPERAND_ALIBI), function_constant(fc_has_alibi)]],
    device const int* cu_seqlens_q
    [[buffer(MFA_OPERAND_CU_SEQLENS_Q), function_constant(fc_varlen)]],
    device const int* cu_seqlens_k
    [[buffer(MFA_OPERAND_CU_SEQLENS_K), function_constant(fc_varlen)]],
    constant mfa_kernel_params& params [[buffer(MFA_BUFFER_PARAMS)]],
    threadgroup float* staging [[threadgroup(MFA_THREADGROUP_STAGING)]],
    uint3 group [[threadgroup_position_in_grid]],
    ushort thread_index [[thread_index_in_threadgroup]],
    ushort simd_index [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
    backward_extras x;
    x.mask = mask;
    x.block_mask = block_mask;
    x.alibi = alibi;
    x.cu_seqlens_q = cu_seqlens_q;
    x.cu_seqlens_k = cu_seqlens_k;
    attention_backward_query(q, k, v, o, l, delta, dout, dq, x, params, staging, group,
                             thread_index, simd_index, lane);
}

kernel void kernel_attention_backward_key_value(
    device const uchar* q [[buffer(MFA_OPERAND_Q)]],
    device const uchar* k [[buffer(MFA_OPERAND_K)]],
    device const uchar* v [[buffer(MFA_OPERAND_V)]],
    device const float* l [[buffer(MFA_OPERAND_L)]],
    device const float* delta [[buffer(MFA_OPERAND_DELTA)]],
    device const uchar* dout [[buffer(MFA_OPERAND_DOUT)]],
    device uchar* dv [[buffer(MFA_OPERAND_DV)]], device uchar* dk [[buffer(MFA_OPERAND_DK)]],
    device const uchar* mask [[buffer(MFA_OPERAND_MASK), function_constant(fc_has_mask)]],
    device const uchar* block_mask
    [[buffer(MFA_OPERAND_BLOCK_MASK), function_constant(fc_has_block_mask)]],
    device const float* alibi [[buffer(MFA_OPERAND_ALIBI), function_constant(fc_has_alibi)]],
    device const int* cu_seqlens_q
    [[buffer(MFA_OPERAND_CU_SEQLENS_Q), function_constant(fc_varlen)]],
    device const int* cu_seqlens_k
    [[buffer(MFA_OPERAND_CU_SEQLENS_K), function_constant(fc_varlen)]],
    constant mfa_kernel_params& params [[buffer(MFA_BUFFER_PARAMS)]],
    threadgroup float* staging [[threadgroup(MFA_THREADGROUP_STAGING)]],
    uint3 group [[threadgroup_position_in_grid]],
    ushort thread_index [[thread_index_in_threadgroup]],
    ushort simd_index [[simdgroup_index_in_threadgroup]],
    ushort lane [[thread_index_in_simdgroup]]) {
    backward_extras x;
    x.mask = mask;
    x.block_mask = block_mask;
    x.alibi = alibi;
    x.cu_seqlens_q = cu_seqlens_q;
    x.cu_seqlens_k = cu_seqlens_k;
    attention_backward_key_value(q, k, v, l, delta, dout, dv, dk, x, params, staging, group,
                                 thread_index, simd_index, lane);
}

kernel void kernel_attention_sink_gradient(device const float* l [[buffer(MFA_OPERAND_L)]],
                                           device const float* delta [[buffer(MFA_OPERAND_DELTA)]],
                                           device const float* sinks [[buffer(MFA_OPERAND_SINKS)]],
                                           device float* dsinks [[buffer(MFA_OPERAND_DSINKS)]],
                                           constant mfa_kernel_params& params
                                           [[buffer(MFA_BUFFER_PARAMS)]],
                                           threadgroup float* staging
                                           [[threadgroup(MFA_THREADGROUP_STAGING)]],
                                           uint3 group [[threadgroup_position_in_grid]],
                                           ushort thread_index [[thread_index_in_threadgroup]],
                                           ushort simd_index [[simdgroup_index_in_threadgroup]],
                                           ushort lane [[thread_index_in_simdgroup]]) {
    attention_sink_gradient(l, delta, sinks, dsinks, params, staging, group.x, thread_index,
                            simd_index, lane);
}

kernel void
kernel_attention_append(device const uchar* k_new [[buffer(MFA_OPERAND_K_NEW)]],
                        device const uchar* v_new [[buffer(MFA_OPERAND_V_NEW)]],
                        device uchar* k [[buffer(MFA_OPERAND_K)]],
                        device uchar* v [[buffer(MFA_OPERAND_V)]],
                        device const int* block_table [[buffer(MFA_OPERAND_BLOCK_TABLE)]],
                        device const int* cache_seqlens [[buffer(MFA_OPERAND_CACHE_SEQLENS)]],
                        constant mfa_kernel_params& params [[buffer(MFA_BUFFER_PARAMS)]],
                        uint3 group [[threadgroup_position_in_grid]],
                        ushort thread_index [[thread_index_in_threadgroup]]) {
    attention_append(k_new, v_new, k, v, block_table, cache_seqlens, params, group, thread_index);
}

kernel void
kernel_attention_combine(device const float* partial_o [[buffer(MFA_OPERAND_PARTIAL_O)]],
                         device const float* partial_l [[buffer(MFA_OPERAND_PARTIAL_L)]],
                         device const float* sinks
                         [[buffer(MFA_OPERAND_SINKS), function_constant(fc_has_sinks)]],
                         device uchar* o [[buffer(MFA_OPERAND_O)]],
                         device float* l [[buffer(MFA_OPERAND_L), function_constant(fc_has_lse)]],
                         constant mfa_kernel_params& params [[buffer(MFA_BUFFER_PARAMS)]],
                         uint3 group [[threadgroup_position_in_grid]],
                         ushort thread_index [[thread_index_in_threadgroup]]) {
    attention_combine(partial_o, partial_l, sinks, o, l, params, group, thread_index);
}
