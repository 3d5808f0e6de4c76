/* Validation of public arguments into the problems of backend.h. One validation path: the 0.1
 * entry points, mfa_attention_compute and mfa_attention_encode all go through
 * mfa_build_problem; merge and mask summary through their own builders over the same array
 * checks. Nothing here writes anywhere but the problem being built. */
#ifndef MFA_CORE_VALIDATE_H
#define MFA_CORE_VALIDATE_H

#include <stdbool.h>

#include "core/backend.h"

/* The input structs as the release that introduced them laid them out: frozen copies, so that
 * their sizes stay the smallest struct_size accepted whatever mfa.h appends later. validate.c
 * asserts that mfa.h's structs start with exactly these fields. */
typedef struct mfa_attention_params_0_1_0 {
    size_t struct_size;
    float scale;
    int32_t causal;
    mfa_alignment alignment;
    int64_t window_left;
    int64_t window_right;
} mfa_attention_params_0_1_0;

typedef struct mfa_context_options_0_1_0 {
    size_t struct_size;
    int32_t num_threads;
    mfa_gpu_family gpu_family;
    uint64_t sim_schedule_seed;
} mfa_context_options_0_1_0;

typedef struct mfa_attention_args_0_2_0 {
    size_t struct_size;
    float softcap;
    int32_t initial_state;
    int64_t max_seqlen_q;
    int64_t max_seqlen_k;
    const mfa_array *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    const mfa_array *mask, *block_mask, *alibi_slopes, *sinks, *dsinks;
    const mfa_array *cu_seqlens_q, *cu_seqlens_k;
    const mfa_array *block_table, *cache_seqlens, *k_new, *v_new;
} mfa_attention_args_0_2_0;

#define MFA_ATTENTION_PARAMS_FIRST_SIZE sizeof(mfa_attention_params_0_1_0)
#define MFA_CONTEXT_OPTIONS_FIRST_SIZE  sizeof(mfa_context_options_0_1_0)
#define MFA_ATTENTION_ARGS_FIRST_SIZE   sizeof(mfa_attention_args_0_2_0)

/* Read a caller's input struct (its first field is struct_size) over *resolved, which holds the
 * defaults and is current_size bytes long. Any struct_size from first_size (the size in the
 * release that introduced it, `first_release`) to current_size is accepted: the caller's bytes
 * up to its struct_size are taken and every field beyond keeps its default. Larger and smaller
 * sizes fail, naming `name` ("params") and the struct's type and init function. */
mfa_status mfa_read_input_struct(const void* given, void* resolved, size_t first_size,
                                 size_t current_size, const char* first_release, const char* name,
                                 const char* type);

/* The context a call is validated for. */
typedef struct mfa_target {
    const mfa_capabilities* caps;
    const char* backend;          /* its name, for messages */
    const mfa_device_ops* device; /* NULL: host memory only */
    void* state;                  /* the backend's, for device's members */
    bool tensors; /* the call came through mfa_tensor (0.1): its arrays have no buffer field */
} mfa_target;

#define MFA_ANY_SIZE (-1)

/* What one array must be. Unset members (zero) mean: no dtype accepted, any size, default
 * dimension names (batch, heads, seq, head dim). */
typedef struct mfa_array_rule {
    uint32_t dtypes;        /* bit (1u << dtype) per dtype accepted */
    const char* dtype_rule; /* why, for messages ("lse is always f32") */
    int64_t size[4];        /* expected sizes, MFA_ANY_SIZE where free */
    const char* from[4];    /* where a size comes from ("q.shape[0]"); NULL: a fixed size */
    bool or_one[4];         /* the size may be 1 instead (broadcast) */
    const char* const* dim_names;
    bool output;
    int in_place_group; /* nonzero: may be exactly the same view as arrays of its group */
} mfa_array_rule;

/* A rule with every size free and the given dtypes. */
mfa_array_rule mfa_rule(uint32_t dtypes, const char* dtype_rule, bool output);
/* Expect size for dim d (from: its origin for messages, NULL for a fixed size). */
void mfa_rule_size(mfa_array_rule* rule, int d, int64_t size, const char* from, bool or_one);

/* A checked array: its view for the problem, and the bytes it reaches, for overlap checks. */
typedef struct mfa_checked {
    const char* name;
    const mfa_array* array;
    mfa_view view;     /* strides of size-1 dims set to 0 */
    const void* space; /* NULL for host memory, else the buffer */
    uintptr_t lo, hi;  /* bytes reached, [lo, hi): addresses, or offsets in the buffer */
    bool output;
    int in_place_group; /* nonzero: may coincide exactly with others of the same group */
} mfa_checked;

/* The arrays of one call, as they are checked. The first array fixes the call's memory. */
typedef struct mfa_checks {
    const mfa_target* target;
    int memory; /* an mfa_memory, or -1 before the first array */
    const char* memory_of;
    int count, capacity;
    mfa_checked* items;
} mfa_checks;

void mfa_checks_init(mfa_checks* checks, const mfa_target* target, mfa_checked* storage,
                     int capacity);

/* Check `array` (called `name`, which must outlive the checks) against rule: not NULL, memory
 * (host, or a buffer of a backend with device buffers; the call's kind), dtype, shape, strides
 * (every offset and byte count without overflow, inside the address space or the buffer,
 * aligned, and for outputs no element twice). On success appends it and, if out is not NULL,
 * points *out at its record. */
mfa_status mfa_check_array(mfa_checks* checks, const char* name, const mfa_array* array,
                           const mfa_array_rule* rule, const mfa_checked** out);

/* Outputs overlap no other checked array (except exact coincidences within an in-place group). */
mfa_status mfa_check_no_overlap(const mfa_checks* checks);

/* Whether two checked arrays are exactly the same view: memory, origin, dtype, shape, strides. */
bool mfa_same_view(const mfa_checked* a, const mfa_checked* b);

/* The host address of a checked array's origin (device memory: through buffer_contents), to
 * read integer arrays while validating. Fails when the CPU cannot see the buffer. */
mfa_status mfa_host_origin(const mfa_checks* checks, const mfa_checked* array, const char** origin);

/* Check every argument of an attention call against the API's rules and the backend's
 * capabilities, and fill *problem. args is the caller's (struct_size rules applied here);
 * encode: for mfa_attention_encode (device arrays only). Reports through mfa_set_error and
 * returns its status; nothing is written anywhere but *problem. */
mfa_status mfa_build_problem(const mfa_target* target, mfa_direction direction,
                             const mfa_attention_params* params, const mfa_attention_args* args,
                             bool encode, mfa_problem* problem);

/* mfa_attention_merge's arguments into *problem, whose parts are `parts` (count of them). */
mfa_status mfa_build_merge(const mfa_target* target, int32_t count, const mfa_array* const* outs,
                           const mfa_array* const* lses, const mfa_array* out, const mfa_array* lse,
                           mfa_merge_part* parts, mfa_merge_problem* problem);

/* mfa_mask_summarize's arguments into *problem. */
mfa_status mfa_build_summary(const mfa_target* target, const mfa_array* mask, int64_t seq_q,
                             int64_t seq_k, const mfa_array* summary, mfa_summary_problem* problem);

#endif
