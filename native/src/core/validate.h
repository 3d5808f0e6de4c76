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

/* Check every argument of a forward (backward == false) or backward call against the API's
 * rules and the backend's capabilities, and fill *problem. Reports through mfa_set_error and
 * returns its status; nothing is written anywhere but *problem. */
mfa_status mfa_build_problem(const mfa_capabilities* caps, const char* backend_name,
                             const mfa_attention_params* params, const mfa_call_tensors* tensors,
                             bool backward, mfa_problem* problem);

#endif
