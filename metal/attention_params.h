/*
 * attention_params.h - the argument block shared by the attention kernels and their host.
 *
 * Compiled three ways: as MSL by the Metal compiler, as C++ by the metal-sim compatibility
 * layer, and as C11 by the planner and the Objective-C host. So: fixed-width types, no
 * pointers, no enums (indices are integer #defines, usable in attributes), every field
 * naturally aligned, 64-bit fields first.
 *
 * Everything that varies per call (lengths, strides, scale, window, softcap) lives here rather
 * than in function constants, so that one pipeline serves every sequence length. Function
 * constants (indices below) carry only the compiled variant: dtype, head dimensions, block
 * shape, and which operands and score modifiers the call has.
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

/* Per-call arguments of every kernel of the attention family; bound with setBytes at
 * MFA_BUFFER_PARAMS. A kernel reads only the fields of the operands and features it was
 * compiled for (function constants); the planner zeroes the rest. */
typedef struct mfa_kernel_params {
    mfa_operand_layout q, k, v, o, l, delta, dout, dq, dk, dv; /* l, delta: stride[3] unused */
    /* Score modifiers (mfa.h, mfa_attention_args): the mask over (b, h, i, j) with local i, j;
     * its summary over (b, h, i / MFA_MASK_BLOCK, j / MFA_MASK_BLOCK); ALiBi slopes over
     * (b, h); sinks and dsinks over h (stride[1]). Broadcast axes have stride 0. */
    mfa_operand_layout mask, block_mask, alibi, sinks, dsinks;
    /* Packed sequences: entry b of cu_seqlens_q / _k at stride[3] * b. Paged caches: entry
     * (b, i) of block_table at stride[0] * b + stride[3] * i, entry b of cache_seqlens at
     * stride[0] * b; k_new / v_new over (b, kv head, n, feature). */
    mfa_operand_layout cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens, k_new, v_new;
    /* f32 scratch of split-key passes: the normalised partial result of each split over
     * (b, h, s, feature), laid out as o is (packed where o is), split_stride_o elements apart,
     * and its log-sum-exp over (b, h, s), split_stride_l apart. */
    mfa_operand_layout partial_o, partial_l;
    int64_t split_stride_o;
    int64_t split_stride_l;
    int32_t group; /* heads_q / heads_kv: query head h reads key/value head h / group */
    int32_t seq_q;
    int32_t seq_k;
    /* Key j is visible from query i iff  i + band_lo <= j <= i + band_hi: the validated
     * problem's band, clamped to [-seq_q, seq_k] so that "unbounded" is an ordinary value and no
     * sum below overflows 32 bits. Packed and paged problems derive each sequence's band in the
     * kernel from bottom_right and the windows, as mfa_problem_band does. */
    int32_t band_lo;
    int32_t band_hi;
    int32_t out_blocks;     /* threadgroups sharing one row block, each owning block_out columns */
    float scale;            /* multiplies Q K^T */
    float softcap;          /* > 0 with fc_has_softcap */
    float softcap_inverse;  /* 1 / softcap, rounded once on the host */
    int32_t bottom_right;   /* 1: p(i) = i + (Nk - Nq) (ALiBi, per-sequence bands); 0: p(i) = i */
    int32_t window_left;    /* -1 unbounded, else at most 2^31 - 1 (the same band) */
    int32_t window_right;   /* causal folded in: 0 */
    int32_t block_size;     /* paged: rows per cache block */
    int32_t new_len;        /* paged: keys appended per sequence (k_new.shape[2]) */
    int32_t splits;         /* split-key passes: partial results per row */
    int32_t split_keys;     /* keys of each split, a multiple of block_traversal */
    int32_t batch;          /* rows of the sink gradient: batch x rows_per_batch per head */
    int32_t rows_per_batch; /* (packed: 1 x total_q) */
    /* Bit MFA_OPERAND_x: operand x's rows may be read MFA_VECTOR_ELEMENTS elements at a time
     * (one 8- or 16-byte load): its features are contiguous and every row starts at an address
     * that is a multiple of MFA_VECTOR_ELEMENTS elements (mfa_plan_*). */
    uint32_t vector_operands;
} mfa_kernel_params;

/* C and MSL must agree on the layout; both sides assert this size. */
#define MFA_KERNEL_PARAMS_SIZE 1016

/* Elements per vector load of a staged row: a half4/bfloat4 (8 bytes) or a float4 (16). */
#define MFA_VECTOR_ELEMENTS 4

/* The operands of the attention kernels, the first ten numbered as in MFA. Operand x is bound at
 * [[buffer(MFA_OPERAND_x)]]; the planner, the Metal host and metal-sim all index by these. */
#define MFA_OPERAND_Q             0
#define MFA_OPERAND_K             1
#define MFA_OPERAND_V             2
#define MFA_OPERAND_O             3
#define MFA_OPERAND_L             4 /* the log-sum-exp, f32 */
#define MFA_OPERAND_DELTA         5 /* the backward's delta = rowsum(dO * O): f32 scratch of the call */
#define MFA_OPERAND_DOUT          6
#define MFA_OPERAND_DV            7
#define MFA_OPERAND_DK            8
#define MFA_OPERAND_DQ            9
#define MFA_OPERAND_MASK          10 /* boolean or additive */
#define MFA_OPERAND_BLOCK_MASK    11 /* the mask's summary: bytes 0, 1, 2 (mfa_mask_summarize) */
#define MFA_OPERAND_ALIBI         12 /* f32 slopes */
#define MFA_OPERAND_SINKS         13 /* f32 logits */
#define MFA_OPERAND_DSINKS        14 /* f32, the backward's gradient of the sinks */
#define MFA_OPERAND_CU_SEQLENS_Q  15 /* int32 offsets of packed sequences */
#define MFA_OPERAND_CU_SEQLENS_K  16
#define MFA_OPERAND_BLOCK_TABLE   17 /* int32 block ids of paged caches */
#define MFA_OPERAND_CACHE_SEQLENS 18 /* int32 keys already in each cache */
#define MFA_OPERAND_K_NEW         19 /* rows appended to the caches */
#define MFA_OPERAND_V_NEW         20
#define MFA_OPERAND_PARTIAL_O     21 /* f32 scratch: the split-key passes' partial results */
#define MFA_OPERAND_PARTIAL_L     22 /* f32 scratch: their log-sum-exps */
#define MFA_OPERAND_COUNT         23
#define MFA_BUFFER_PARAMS         23 /* the argument block, after the operands */
#define MFA_THREADGROUP_STAGING   0  /* [[threadgroup(0)]]: the one threadgroup allocation */

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
/* Score modifiers and layouts (mfa.h, mfa_attention_args): each is compiled in only where a call
 * uses it, so a call without it pays nothing. */
#define MFA_FC_HAS_MASK       (MFA_FC_ATTENTION + 11) /* bool: args.mask */
#define MFA_FC_MASK_DTYPE     (MFA_FC_ATTENTION + 12) /* uint: its mfa_dtype (BOOL: visibility) */
#define MFA_FC_HAS_BLOCK_MASK (MFA_FC_ATTENTION + 13) /* bool: its summary skips tiles */
#define MFA_FC_HAS_SOFTCAP    (MFA_FC_ATTENTION + 14) /* bool: args.softcap > 0 */
#define MFA_FC_HAS_ALIBI      (MFA_FC_ATTENTION + 15) /* bool: args.alibi_slopes */
#define MFA_FC_HAS_SINKS      (MFA_FC_ATTENTION + 16) /* bool: args.sinks join this pass */
#define MFA_FC_VARLEN         (MFA_FC_ATTENTION + 17) /* bool: packed sequences */
#define MFA_FC_PAGED          (MFA_FC_ATTENTION + 18) /* bool: paged K/V caches */
#define MFA_FC_INITIAL_STATE  (MFA_FC_ATTENTION + 19) /* bool: fold in the (O, L) read on entry */
#define MFA_FC_SPLIT_KEYS                                                                          \
    (MFA_FC_ATTENTION + 20) /* bool: forward writes per-split partials; combine merges them */
/* bool: each lane reads its fragments of every operand (the traversed ones, K and V or Q and dO,
 * and the parallel slab, cached or not) straight from device memory instead of from tiles staged
 * in threadgroup memory (Apple9, whose device loads go through the same cache as threadgroup
 * memory): the kernels stage nothing and need no barrier; never with MFA_FC_PAGED. */
#define MFA_FC_DIRECT_LOADS (MFA_FC_ATTENTION + 21)

/* Values of MFA_FC_DTYPE and MFA_FC_MASK_DTYPE; equal to mfa_dtype's. */
#define MFA_KERNEL_DTYPE_F32  0
#define MFA_KERNEL_DTYPE_F16  1
#define MFA_KERNEL_DTYPE_BF16 2
#define MFA_KERNEL_DTYPE_BOOL 3 /* masks only: one byte, visible where nonzero */

/* Queries and keys per side of one block of a mask summary: MFA_MASK_BLOCK of mfa.h. */
#define MFA_KERNEL_MASK_BLOCK 64

/* Register-array capacities compiled into the kernels; the planner never exceeds them. */
#define MFA_MAX_BLOCK_TRAVERSAL 128 /* S row tile: 8 x 128 per simdgroup */
#define MFA_MAX_BLOCK_OUT       128 /* accumulator tile: 8 x 128 per simdgroup */
#define MFA_MAX_CACHED_HEAD     256 /* a register-cached operand row: 8 x 256 per simdgroup */
#define MFA_MAX_BLOCK_PARALLEL  64  /* 8 simdgroups */
#define MFA_MAX_BLOCK_HEAD      64  /* a staged chunk of the slab: 8 x 64 per simdgroup */
/* Threads per threadgroup of the row-wise passes (append, combine, sink gradient): four
 * simdgroups, fixed, so their loops and reductions need no constant of their own. */
#define MFA_ROW_PASS_THREADS 128

/* Threadgroup memory of the tiled kernels. Staged tiles hold the operands in their own precision
 * (element_size 4 for f32, 2 for f16 and bf16, which stay 16-bit), each row padded by 16 bytes
 * as MLX pads its tiles, so that the rows a transposed fragment load touches start in different
 * banks. In order: the [staged_parallel x block_head] tile of the parallel operands and the
 * [staged_traversal x block_head] tile of the traversed ones (block_parallel and block_traversal
 * rows, or none where MFA_FC_DIRECT_LOADS reads every fragment from device memory), then
 * per_row_vectors 4-byte entries per traversed row (a forward over a paged cache: each key's
 * block and row in it). Shared by kernels and planner so the two can never disagree. */
#define MFA_STAGING_PITCH(block_head, element_size) ((block_head) + 16 / (element_size))

static inline uint32_t mfa_staging_bytes(uint32_t staged_parallel, uint32_t staged_traversal,
                                         uint32_t block_traversal, uint32_t block_head,
                                         uint32_t element_size, uint32_t per_row_vectors) {
    return (staged_parallel + staged_traversal) * MFA_STAGING_PITCH(block_head, element_size) *
               element_size +
           4 * per_row_vectors * block_traversal;
}

#endif /* MFA_ATTENTION_PARAMS_H */
