// The compiled variant of an attention kernel, as function constants (values from the planner;
// indices in attention_params.h). Per-call values live in mfa_kernel_params instead.
#ifndef MFA_ATTENTION_CONSTANTS_H
#define MFA_ATTENTION_CONSTANTS_H

#include "../attention_params.h"

static_assert(sizeof(mfa_kernel_params) == MFA_KERNEL_PARAMS_SIZE,
              "mfa_kernel_params must have the layout the planner fills");

constant uint fc_dtype [[function_constant(MFA_FC_DTYPE)]];
constant uint fc_head_dim [[function_constant(MFA_FC_HEAD_DIM)]];
constant uint fc_head_dim_v [[function_constant(MFA_FC_HEAD_DIM_V)]];
constant uint fc_block_parallel [[function_constant(MFA_FC_BLOCK_PARALLEL)]];
constant uint fc_block_traversal [[function_constant(MFA_FC_BLOCK_TRAVERSAL)]];
constant uint fc_block_head [[function_constant(MFA_FC_BLOCK_HEAD)]];
constant uint fc_block_out [[function_constant(MFA_FC_BLOCK_OUT)]];
constant bool fc_cache_parallel [[function_constant(MFA_FC_CACHE_PARALLEL)]];
constant bool fc_cache_parallel2 [[function_constant(MFA_FC_CACHE_PARALLEL2)]];
constant bool fc_has_lse [[function_constant(MFA_FC_HAS_LSE)]];
constant bool fc_pack_group [[function_constant(MFA_FC_PACK_GROUP)]];
constant bool fc_has_mask [[function_constant(MFA_FC_HAS_MASK)]];
constant uint fc_mask_dtype [[function_constant(MFA_FC_MASK_DTYPE)]];
constant bool fc_has_block_mask [[function_constant(MFA_FC_HAS_BLOCK_MASK)]];
constant bool fc_has_softcap [[function_constant(MFA_FC_HAS_SOFTCAP)]];
constant bool fc_has_alibi [[function_constant(MFA_FC_HAS_ALIBI)]];
constant bool fc_has_sinks [[function_constant(MFA_FC_HAS_SINKS)]];
constant bool fc_varlen [[function_constant(MFA_FC_VARLEN)]];
constant bool fc_paged [[function_constant(MFA_FC_PAGED)]];
constant bool fc_initial_state [[function_constant(MFA_FC_INITIAL_STATE)]];
constant bool fc_split_keys [[function_constant(MFA_FC_SPLIT_KEYS)]];
constant bool fc_direct_loads [[function_constant(MFA_FC_DIRECT_LOADS)]];

// One simdgroup per 8 rows of the parallel block.
constant uint fc_threads = fc_block_parallel / 8 * 32;

// Staged tiles keep the operands' precision: bytes per element, and elements per padded row
// (mfa_staging_bytes).
constant uint fc_element_size = fc_dtype == MFA_KERNEL_DTYPE_F32 ? 4 : 2;
constant uint fc_staging_pitch = MFA_STAGING_PITCH(fc_block_head, fc_element_size);
// Rows of the parallel and traversed operands' staging tiles: none when every fragment comes
// from device memory.
constant uint fc_staged_parallel = fc_direct_loads ? 0 : fc_block_parallel;
constant uint fc_staged_traversal = fc_direct_loads ? 0 : fc_block_traversal;

#endif
