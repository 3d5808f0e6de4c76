/*
 * planner.h - how to run one attention call on an Apple GPU: which kernels, in which order,
 * with which function constants, grid, threadgroup memory and buffer bindings.
 *
 * Portable C11, no Metal types. A plan is plain data owned by the caller; planning is pure and
 * thread-safe. The plan runner (runner.h) carries a plan out on a device, the Metal host's or
 * metal-sim's, so both run exactly the same configuration. What a plan asks, pass by pass in
 * order:
 *   1. function  = library function `kernel_name`, specialised with every entry of
 *                  `function_constants` (setConstantValue:type:atIndex: with the entry's
 *                  type code; bool values are one byte, uint values four).
 *   2. pipeline  = from that function. If the pipeline's maxTotalThreadsPerThreadgroup is below
 *                  `threads_per_threadgroup`, plan again passing that maximum.
 *   3. bindings  = for each entry, the operand's memory from (view data + byte_offset) for
 *                  byte_length bytes at buffer index `index`; `params` with setBytes at
 *                  `params_index`; threadgroup memory `threadgroup_memory_length` at index 0.
 *   4. dispatch  = dispatchThreadgroups:`threadgroups` threadsPerThreadgroup:
 *                  (threads_per_threadgroup, 1, 1). Passes whose threadgroup count is zero
 *                  have no work and are skipped.
 * Scratch operands (delta of the backward, the partial results of split keys) are f32 memory of
 * the call alone, byte_length bytes each, written by one pass and read by a later one; encode
 * the passes in order in one queue.
 */
#ifndef MFA_PLANNER_PLANNER_H
#define MFA_PLANNER_PLANNER_H

#include <stdint.h>

#include "attention_params.h"
#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mfa_pass_kind {
    MFA_PASS_FORWARD = 0,            /* O and L, or one split's partial results */
    MFA_PASS_BACKWARD_QUERY = 1,     /* delta = rowsum(dO * O), then dQ */
    MFA_PASS_BACKWARD_KEY_VALUE = 2, /* dK and dV */
    MFA_PASS_SINK_GRADIENT = 3,      /* dsinks from L and delta */
    MFA_PASS_APPEND = 4,             /* k_new / v_new into a paged cache, before the forward */
    MFA_PASS_COMBINE = 5             /* the splits' partial results (and sinks, initial state) */
} mfa_pass_kind;
#define MFA_PASS_KIND_COUNT 6

/* The memory a binding refers to: one of MFA_OPERAND_* (attention_params.h), which is also the
 * kernel argument index the operand is bound at. */
typedef uint32_t mfa_operand;

/* MTLDataType codes used for function constants. */
#define MFA_CONSTANT_TYPE_UINT 33
#define MFA_CONSTANT_TYPE_BOOL 53

typedef struct mfa_function_constant {
    uint32_t index; /* [[function_constant(index)]] */
    uint32_t type;  /* MFA_CONSTANT_TYPE_* */
    uint32_t value; /* for BOOL: 0 or 1, to be passed as one byte */
} mfa_function_constant;

typedef struct mfa_buffer_binding {
    uint32_t index; /* [[buffer(index)]] */
    mfa_operand operand;
    int32_t writable;    /* the kernel writes through this binding */
    int64_t byte_offset; /* from the operand view's data pointer to the first byte bound; <= 0
                              when strides are negative; 0 for scratch operands */
    int64_t byte_length; /* bytes from there that the kernel may touch (exact extent); 0 when
                              the operand has no elements: the kernel never reads it, but the
                              index still needs some buffer bound */
} mfa_buffer_binding;

#define MFA_PLAN_MAX_CONSTANTS 32
#define MFA_PLAN_MAX_BINDINGS  16
#define MFA_PLAN_MAX_PASSES    3

typedef struct mfa_pass_plan {
    mfa_pass_kind kind;
    const char* kernel_name; /* static storage */
    /* Block shape (also present among the function constants). */
    uint32_t block_parallel;  /* rows of the parallel operand per threadgroup */
    uint32_t block_traversal; /* rows of the traversed operand per loop step */
    uint32_t block_head;      /* feature columns staged through threadgroup memory at once */
    uint32_t block_out;       /* output feature columns accumulated per threadgroup */
    uint32_t cached_operands; /* bit (1u << mfa_operand) per operand held in registers */
    uint32_t num_constants;
    mfa_function_constant constants[MFA_PLAN_MAX_CONSTANTS];
    uint64_t threadgroups
        [3]; /* threadgroups per grid (x: row blocks * out blocks, y: heads, z: batch) */
    uint32_t threads_per_threadgroup;   /* 1-D threadgroups: 32 * block_parallel / 8 */
    uint32_t threadgroup_memory_length; /* bytes at [[threadgroup(0)]]; multiple of 16, <= 32 KB */
    uint32_t num_bindings;
    mfa_buffer_binding bindings[MFA_PLAN_MAX_BINDINGS];
    uint32_t params_index; /* [[buffer(params_index)]] receives `params` */
    mfa_kernel_params params;
} mfa_pass_plan;

typedef struct mfa_plan {
    uint32_t num_passes; /* forward: [append,] forward[, combine]; backward: 2[, sinks] */
    mfa_pass_plan passes[MFA_PLAN_MAX_PASSES];
    int64_t scratch_bytes; /* bytes of all scratch operands together (delta, partials) */
    uint32_t splits;       /* forward: splits of the keys (0: the forward stores O itself) */
} mfa_plan;

/* Largest threadgroup memory a plan requests (Apple4+: 32 KB). */
#define MFA_PLAN_THREADGROUP_MEMORY_LIMIT 32768
/* Largest D and Dv the kernels accept. */
#define MFA_PLAN_MAX_HEAD_DIM 1024

/* What the kernels compute through these plans, forward and backward (mfa_capabilities): both
 * GPU backends declare these, because the Metal host and metal-sim run the same plans through
 * the same runner; metal-sim's runs check every bit against the float64 reference. Paged caches
 * and initial states are forward-only, as in mfa.h. */
#define MFA_PLAN_SCORE_MODIFIERS                                                                   \
    (MFA_FEATURE_MASK | MFA_FEATURE_BLOCK_MASK | MFA_FEATURE_SOFTCAP | MFA_FEATURE_ALIBI |         \
     MFA_FEATURE_SINKS)
#define MFA_PLAN_BACKWARD_FEATURES                                                                 \
    (MFA_FEATURE_CAUSAL | MFA_FEATURE_WINDOW | MFA_FEATURE_GQA | MFA_FEATURE_VALUE_HEAD_DIM |      \
     MFA_FEATURE_STRIDES | MFA_PLAN_SCORE_MODIFIERS | MFA_FEATURE_VARLEN)
#define MFA_PLAN_FEATURES                                                                          \
    (MFA_FEATURE_BACKWARD | MFA_FEATURE_LSE | MFA_PLAN_BACKWARD_FEATURES | MFA_FEATURE_PAGED_KV |  \
     MFA_FEATURE_INITIAL_STATE)

/* mfa_plan_forward() / mfa_plan_backward(): fill *plan for problem on family (APPLE7, 8 or 9).
 * max_threads_per_threadgroup bounds the threadgroup size (1024 unless a pipeline reported
 * less). Fails with mfa_set_error (INVALID_ARGUMENT for a bad family or limit, UNSUPPORTED for
 * shapes outside the kernels' range, SIZE_OVERFLOW for extents beyond 64 bits) and leaves
 * *plan unspecified. */
mfa_status mfa_plan_forward(const mfa_problem* problem, mfa_gpu_family family,
                            uint32_t max_threads_per_threadgroup, mfa_plan* plan);
mfa_status mfa_plan_backward(const mfa_problem* problem, mfa_gpu_family family,
                             uint32_t max_threads_per_threadgroup, mfa_plan* plan);

/* mfa_pass_kernel_name(): the kernel that runs passes of kind (kernel_attention_forward, ...);
 * NULL for an unknown kind. Static storage. */
const char* mfa_pass_kernel_name(mfa_pass_kind kind);

/* The memory behind an operand of problem: the caller's view (NULL for a scratch operand:
 * mfa_operand_is_scratch), the shape the problem gives it (a scratch operand: the shape of one
 * split, laid out as out or lse are, contiguous) and its element size. Shapes follow the
 * problem's layout: packed operands span [1, H, total rows, D], paged caches
 * [num_blocks, Hkv, block_size, D]. */
typedef struct mfa_operand_view {
    const mfa_view* view;
    int64_t shape[4];
    int64_t element_size;
} mfa_operand_view;

/* mfa_problem_operand(): fill *out for operand; 0 for an operand that is not an MFA_OPERAND_*. */
int mfa_problem_operand(const mfa_problem* problem, mfa_operand operand, mfa_operand_view* out);

/* mfa_operand_is_scratch(): delta, partial_o and partial_l: memory of the call, not the caller. */
int mfa_operand_is_scratch(mfa_operand operand);

/* mfa_operand_name(): the operand as messages name it: the public argument ("q", "out", "lse",
 * "mask", ...) or the scratch's name ("delta", "partial_o", "partial_l"); "?" otherwise. Static
 * storage. */
const char* mfa_operand_name(mfa_operand operand);

#ifdef __cplusplus
}
#endif

#endif /* MFA_PLANNER_PLANNER_H */
