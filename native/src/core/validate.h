// Validation of public arguments into an mfa_problem (see backend.h).
#ifndef MFA_CORE_VALIDATE_H
#define MFA_CORE_VALIDATE_H

#include "core/backend.h"

namespace mfa {

// The tensors of one call; unused roles are NULL (lse may be NULL in forward).
struct CallTensors {
    const mfa_tensor* q = nullptr;
    const mfa_tensor* k = nullptr;
    const mfa_tensor* v = nullptr;
    const mfa_tensor* out = nullptr;
    const mfa_tensor* lse = nullptr;
    const mfa_tensor* dout = nullptr;  // backward only
    const mfa_tensor* dq = nullptr;
    const mfa_tensor* dk = nullptr;
    const mfa_tensor* dv = nullptr;
};

// Check every argument of a forward (backward == false) or backward call against the API's
// rules and the backend's capabilities, and fill *problem. Reports through mfa_set_error and
// returns its status; nothing is written anywhere but *problem.
mfa_status build_problem(const mfa_capabilities& caps, const char* backend_name,
                         const mfa_attention_params* params, const CallTensors& tensors,
                         bool backward, mfa_problem* problem);

}  // namespace mfa

#endif
