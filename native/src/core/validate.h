/* Validation of public arguments into an mfa_problem (see backend.h). */
#ifndef MFA_CORE_VALIDATE_H
#define MFA_CORE_VALIDATE_H

#include <stdbool.h>

#include "core/backend.h"

/* The tensors of one call; unused roles are NULL (lse may be NULL in forward). */
typedef struct mfa_call_tensors {
    const mfa_tensor* q;
    const mfa_tensor* k;
    const mfa_tensor* v;
    const mfa_tensor* out;
    const mfa_tensor* lse;
    const mfa_tensor* dout; /* backward only */
    const mfa_tensor* dq;
    const mfa_tensor* dk;
    const mfa_tensor* dv;
} mfa_call_tensors;

/* The input structs as libmfa 0.1.0, the first release, laid them out: frozen copies, so that
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

#define MFA_ATTENTION_PARAMS_FIRST_SIZE sizeof(mfa_attention_params_0_1_0)
#define MFA_CONTEXT_OPTIONS_FIRST_SIZE  sizeof(mfa_context_options_0_1_0)

/* Read a caller's input struct (its first field is struct_size) over *resolved, which holds the
 * defaults and is current_size bytes long. Any struct_size from first_size (the first release's
 * size) to current_size is accepted: the caller's bytes up to its struct_size are taken and every
 * field beyond keeps its default. Larger and smaller sizes fail, naming `name` ("params") and the
 * struct's type and init function. */
mfa_status mfa_read_input_struct(const void* given, void* resolved, size_t first_size,
                                 size_t current_size, const char* name, const char* type);

/* Check every argument of a forward (backward == false) or backward call against the API's
 * rules and the backend's capabilities, and fill *problem. Reports through mfa_set_error and
 * returns its status; nothing is written anywhere but *problem. */
mfa_status mfa_build_problem(const mfa_capabilities* caps, const char* backend_name,
                             const mfa_attention_params* params, const mfa_call_tensors* tensors,
                             bool backward, mfa_problem* problem);

#endif
