// Placeholder until the attention kernels land: the metal-sim backend reports itself unavailable.
#include "core/backend.h"

namespace {
int available() { return 0; }
mfa_status create(const mfa_context_options*, void**) {
    return mfa_set_error(MFA_ERROR_BACKEND_UNAVAILABLE,
                         "metal-sim: the attention kernels are not built into this library yet");
}
void destroy(void*) {}
const char* device_name(void*) { return "metal-sim"; }
void capabilities(void*, mfa_capabilities*) {}
mfa_status unavailable(void*, const mfa_problem*) { return create(nullptr, nullptr); }
const mfa_backend_ops ops = {MFA_BACKEND_METAL_SIM, available, create, destroy, device_name,
                             capabilities, unavailable, unavailable};
}  // namespace

extern "C" const mfa_backend_ops* mfa_metal_sim_backend_ops(void) { return &ops; }
