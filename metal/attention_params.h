/*
 * attention_params.h - the argument block shared by the attention kernels and their host.
 *
 * Compiled three ways: as MSL by the Metal compiler, as C++ by the metal-sim compatibility
 * layer, and as C11 by the planner and the Objective-C host. So: fixed-width types, no
 * pointers, no enums (indices are integer #defines, usable in attributes), every field
 * naturally aligned, 64-bit fields first.
 *
 * Everything that varies per call (lengths, strides, scale, window) lives here rather than in
 * function constants, so that one pipeline serves every sequence length. Function constants
 * (indices below) carry only the compiled variant: dtype, head dimensions and block shape.
 */
#ifndef MFA_ATTENTION_PARAMS_H
#define MFA_ATTENTION_PARAMS_H

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
#else
#include <stdint.h>
#endif

/* Strided addressing of one operand. Element (b, h, s, d) is at
 *   origin + b*stride[0] + h*stride[1] + s*stride[2] + d*stride[3]
 * counted in elements from the start of the buffer bound for it. The host binds the lowest
 * address the view can touch, so origin >= 0 even when strides are negative. */
typedef struct mfa_operand_layout {
    int64_t origin;    /* element offset of (0, 0, 0, 0) within the bound buffer */
    int64_t stride[4]; /* elements, per (batch, head, sequence, feature) */
} mfa_operand_layout;

/* Per-call arguments of all three attention kernels; bound with setBytes at MFA_BUFFER_PARAMS. */
typedef struct mfa_kernel_params {
    mfa_operand_layout q, k, v, o, l, delta, dout, dq, dk, dv; /* l, delta: stride[3] unused */
    int32_t group; /* heads_q / heads_kv: query head h reads key/value head h / group */
    int32_t seq_q;
    int32_t seq_k;
    /* Key j is visible from query i iff  i + band_lo <= j <= i + band_hi: the validated
     * problem's band, clamped to [-seq_q, seq_k] so that "unbounded" is an ordinary value and no
     * sum below overflows 32 bits. */
    int32_t band_lo;
    int32_t band_hi;
    int32_t out_blocks; /* threadgroups sharing one row block, each owning block_out columns */
    float scale;        /* multiplies Q K^T */
} mfa_kernel_params;

/* C and MSL must agree on the layout; both sides assert this size. */
#define MFA_KERNEL_PARAMS_SIZE 432

/* The operands of the attention kernels, numbered as in MFA. Operand x is bound at
 * [[buffer(MFA_OPERAND_x)]]; the planner, the Metal host and metal-sim all index by these. */
#define MFA_OPERAND_Q           0
#define MFA_OPERAND_K           1
#define MFA_OPERAND_V           2
#define MFA_OPERAND_O           3
#define MFA_OPERAND_L           4 /* the log-sum-exp, f32 */
#define MFA_OPERAND_DELTA       5 /* the backward's delta = rowsum(dO * O): f32 scratch of the call */
#define MFA_OPERAND_DOUT        6
#define MFA_OPERAND_DV          7
#define MFA_OPERAND_DK          8
#define MFA_OPERAND_DQ          9
#define MFA_OPERAND_COUNT       10
#define MFA_BUFFER_PARAMS       10 /* the argument block, after the operands */
#define MFA_THREADGROUP_STAGING 0  /* [[threadgroup(0)]]: the one threadgroup allocation */

/* Function-constant indices of the attention family (100..199). */
#define MFA_FC_ATTENTION 100
#define MFA_FC_DTYPE                                                                               \
    (MFA_FC_ATTENTION + 0) /* uint: MFA_KERNEL_DTYPE_* of every operand in memory */
#define MFA_FC_HEAD_DIM   (MFA_FC_ATTENTION + 1) /* uint: D */
#define MFA_FC_HEAD_DIM_V (MFA_FC_ATTENTION + 2) /* uint: Dv */
#define MFA_FC_BLOCK_PARALLEL                                                                      \
    (MFA_FC_ATTENTION + 3) /* uint: rows per threadgroup, 8 per simdgroup */
#define MFA_FC_BLOCK_TRAVERSAL (MFA_FC_ATTENTION + 4) /* uint: rows per step of the inner loop */
#define MFA_FC_BLOCK_HEAD      (MFA_FC_ATTENTION + 5) /* uint: feature columns staged at a time */
#define MFA_FC_BLOCK_OUT       (MFA_FC_ATTENTION + 6) /* uint: output feature columns per threadgroup */
#define MFA_FC_CACHE_PARALLEL                                                                      \
    (MFA_FC_ATTENTION + 7) /* bool: keep the 1st parallel operand (Q or K) in registers */
#define MFA_FC_CACHE_PARALLEL2                                                                     \
    (MFA_FC_ATTENTION + 8)                    /* bool: keep the 2nd (dO or V) in registers */
#define MFA_FC_HAS_LSE (MFA_FC_ATTENTION + 9) /* bool: forward writes L */
#define MFA_FC_PACK_GROUP                                                                          \
    (MFA_FC_ATTENTION + 10) /* bool: forward rows are (query head of a
                                                          GQA group, query) pairs; grid y counts
                                                          key/value heads */

/* Values of MFA_FC_DTYPE; equal to mfa_dtype's. */
#define MFA_KERNEL_DTYPE_F32  0
#define MFA_KERNEL_DTYPE_F16  1
#define MFA_KERNEL_DTYPE_BF16 2

/* Register-array capacities compiled into the kernels; the planner never exceeds them. */
#define MFA_MAX_BLOCK_TRAVERSAL 128 /* S row tile: 8 x 128 per simdgroup */
#define MFA_MAX_BLOCK_OUT       128 /* accumulator tile: 8 x 128 per simdgroup */
#define MFA_MAX_CACHED_HEAD     256 /* a register-cached operand row: 8 x 256 per simdgroup */
#define MFA_MAX_BLOCK_PARALLEL  64  /* 8 simdgroups */
#define MFA_MAX_BLOCK_HEAD      64  /* a staged chunk of the slab: 8 x 64 per simdgroup */

/* Floats of threadgroup memory each kernel needs: one [block_parallel x block_head] staging tile
 * for the parallel operands, one [block_traversal x block_head] for the traversed operands, and,
 * for backward-key-value, the traversed rows' L and delta. Shared by kernels and planner so the
 * two can never disagree. */
static inline uint32_t mfa_staging_floats(uint32_t block_parallel, uint32_t block_traversal,
                                          uint32_t block_head, uint32_t per_row_vectors) {
    return (block_parallel + block_traversal) * block_head + per_row_vectors * block_traversal;
}

#endif /* MFA_ATTENTION_PARAMS_H */
